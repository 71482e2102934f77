package riverfence

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/pgfence/pgfence/gofence"
)

// Defaults of Config.
const (
	// DefaultTTL is the longest TTL of an attempt's lease (Config.TTL).
	DefaultTTL = 30 * time.Second
	// DefaultAcquireTimeout is how long an attempt waits for its lease
	// (Config.AcquireTimeout).
	DefaultAcquireTimeout = 5 * time.Second
	// DefaultSnooze is the shortest snooze of an attempt that could not get
	// its lease (Config.Snooze).
	DefaultSnooze = time.Second
	// DefaultResourcePrefix names the resource of a job: prefix + job id
	// (Config.ResourcePrefix).
	DefaultResourcePrefix = "river_job:"
	// releaseTimeout bounds each Release the middleware sends: a lease whose
	// release cannot reach the server ends there at its expiry, which is
	// never later than the attempt's deadline.
	releaseTimeout = 5 * time.Second
	// minTTL is the kit's smallest TTL (fence.acquire refuses less).
	minTTL = 10 * time.Millisecond
)

var (
	// ErrNoAttempt: Lease, Tx or CompleteTx was called with a context that
	// no attempt of the middleware carries (outside Work, or in a client
	// whose Config.Middleware lacks it), or for another job than the
	// attempt's.
	ErrNoAttempt = errors.New("riverfence: no fenced River attempt in this context (install riverfence.Middleware in river.Config.Middleware, and pass Work's ctx)")
	// ErrLeaseUnavailable: the attempt could not get its lease within
	// Config.AcquireTimeout, because the job's previous attempt still holds
	// it (or still has a fenced transaction open). The attempt is snoozed:
	// the error returned to River also matches *river.JobSnoozeError.
	ErrLeaseUnavailable = errors.New("riverfence: the job's previous attempt still holds its lease")
	// ErrJobNotRunning: CompleteTx found the job row no longer running this
	// attempt (the rescuer moved it, River handed it to a newer attempt, or
	// finalized it): the transaction, results included, was rolled back, and
	// River's retry policy decides what runs next.
	ErrJobNotRunning = errors.New("riverfence: the job row no longer runs this attempt, so this attempt cannot complete it")
)

// Config configures a Middleware. The zero value (or a nil *Config) gives the
// documented defaults.
type Config struct {
	// JobTimeout must be the river.Config.JobTimeout of the client the
	// middleware is installed in: the deadline of an attempt whose worker
	// sets no Timeout of its own. Zero is River's default
	// (river.JobTimeoutDefault, 1 minute); -1 means no timeout, as in River.
	// River does not tell a middleware the timeout it computes, so the
	// middleware computes it the same way: Timeout (per kind, from
	// AddWorker) first, else JobTimeout.
	JobTimeout time.Duration
	// TTL is the longest TTL of an attempt's lease. An attempt with a
	// timeout takes min(TTL, timeout/3), so that the lease is renewed a few
	// times and its last renewal still ends by the attempt's deadline; an
	// attempt without a timeout takes TTL. Default DefaultTTL (30s). The
	// renewal interval, safety margin and retry interval follow from each
	// lease's TTL (gofence.LeaseOptions.TTL), so leave them unset in the
	// gofence.Config of the client: set there, they must fit the shortest
	// TTL, or the grant fails. A TTL shorter than a few round trips to the
	// database loses grants (a reply after the trust deadline is given
	// back, and the attempt fails): keep job timeouts well above three
	// round trips.
	TTL time.Duration
	// AcquireTimeout is how long an attempt waits for its lease when the
	// job's previous attempt still holds it (or still has a fenced
	// transaction open), before it gives up and snoozes. Default
	// DefaultAcquireTimeout (5s).
	AcquireTimeout time.Duration
	// Snooze is the shortest snooze of an attempt that could not get its
	// lease in time: it snoozes until the previous attempt's lease expires
	// by the server's clock, and at least this long. Default DefaultSnooze
	// (1s).
	Snooze time.Duration
	// ResourcePrefix names the resource of a job: ResourcePrefix followed by
	// the job's id. Default DefaultResourcePrefix ("river_job:"), the prefix
	// to give fence.protect_rows for tables keyed by job id.
	ResourcePrefix string
}

// Middleware is a River worker middleware (rivertype.WorkerMiddleware, for
// river.Config.Middleware) that runs every job attempt under a lease of its
// own on the job's resource (Config.ResourcePrefix + job id), so that each
// attempt has a larger fencing token than every attempt before it, and an
// attempt that River rescued while it was still running can no longer
// write through Tx or complete the job through CompleteTx. See the package
// documentation for the lease's lifetime.
type Middleware struct {
	river.MiddlewareDefaults

	client *gofence.Client
	cfg    Config

	mu       sync.RWMutex
	timeouts map[string]func(*rivertype.JobRow) time.Duration
}

var _ rivertype.WorkerMiddleware = (*Middleware)(nil)

// New returns a middleware that takes its leases through client (which it
// never closes). A nil cfg gives the defaults; invalid settings are reported
// here, once.
func New(client *gofence.Client, cfg *Config) (*Middleware, error) {
	if client == nil {
		return nil, errors.New("riverfence: New needs a *gofence.Client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.JobTimeout < -1 {
		return nil, fmt.Errorf("riverfence: JobTimeout %s must be -1 (no timeout), 0 (River's default) or positive, as river.Config.JobTimeout", c.JobTimeout)
	}
	if c.TTL < 0 || c.AcquireTimeout < 0 || c.Snooze < 0 {
		return nil, errors.New("riverfence: TTL, AcquireTimeout and Snooze must not be negative (zero gives the default)")
	}
	c.JobTimeout = cmp.Or(c.JobTimeout, river.JobTimeoutDefault)
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	if c.TTL < minTTL || c.TTL > 24*time.Hour {
		return nil, fmt.Errorf("riverfence: TTL %s must be between 10ms and 24h (the kit's limits)", c.TTL)
	}
	c.AcquireTimeout = cmp.Or(c.AcquireTimeout, DefaultAcquireTimeout)
	c.Snooze = cmp.Or(c.Snooze, DefaultSnooze)
	c.ResourcePrefix = cmp.Or(c.ResourcePrefix, DefaultResourcePrefix)
	return &Middleware{client: client, cfg: c, timeouts: map[string]func(*rivertype.JobRow) time.Duration{}}, nil
}

// Config returns the middleware's configuration with the defaults filled in.
func (m *Middleware) Config() Config { return m.cfg }

// AddWorker registers worker with workers (river.AddWorker, so it panics as
// that does) and tells m the worker's Timeout for its kind, so that the
// attempts of that kind get the deadline that River gives them. A worker
// registered with river.AddWorker directly gets m's Config.JobTimeout, which
// is wrong for a worker whose Timeout differs: a shorter Timeout leaves its
// attempt's lease live past River's deadline (a rescued job then snoozes
// until the lease expires), a longer one ends the lease early (the
// attempt's token still fences its writes until a newer attempt is granted).
func AddWorker[T river.JobArgs](m *Middleware, workers *river.Workers, worker river.Worker[T]) {
	river.AddWorker(workers, worker)
	var zero T
	m.mu.Lock()
	defer m.mu.Unlock()
	m.timeouts[zero.Kind()] = func(row *rivertype.JobRow) time.Duration {
		job := &river.Job[T]{JobRow: row}
		if err := json.Unmarshal(row.EncodedArgs, &job.Args); err != nil {
			return 0 // River fails such an attempt before Work; JobTimeout then
		}
		return worker.Timeout(job)
	}
}

// Resource is the lease resource of the job with id: Config.ResourcePrefix
// followed by the id, the resource of the job's rows in a table protected
// per row (fence.protect_rows(tbl, 'job_id', 'river_job:')).
func (m *Middleware) Resource(jobID int64) string {
	return m.cfg.ResourcePrefix + strconv.FormatInt(jobID, 10)
}

// Timeout is the timeout River gives an attempt of job: the worker's Timeout
// (registered with AddWorker), else Config.JobTimeout. Negative means none.
func (m *Middleware) Timeout(job *rivertype.JobRow) time.Duration {
	m.mu.RLock()
	f := m.timeouts[job.Kind]
	m.mu.RUnlock()
	var d time.Duration
	if f != nil {
		d = f(job)
	}
	return cmp.Or(d, m.cfg.JobTimeout)
}

// attempt is what the middleware puts in Work's context.
type attempt struct {
	lease *gofence.Lease
	jobID int64
}

type attemptKey struct{}

// Work runs one attempt of job under a lease of its own (rivertype.
// WorkerMiddleware). It takes the lease before doInner, waiting up to
// Config.AcquireTimeout while a previous attempt still holds it; when that
// fails because the lease is still held or busy, it snoozes the job (an
// error matching ErrLeaseUnavailable and *river.JobSnoozeError, which does
// not use up an attempt), and for any other failure (the database
// unreachable, the kit not installed) it returns an error that River
// retries as its retry policy says. The lease is renewed in the background
// until the attempt's deadline comes within one TTL, then released, so that
// its expiry on the server is never later than the deadline; it is released
// when doInner returns, whatever it returns.
func (m *Middleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	start := time.Now()
	timeout := m.Timeout(job)
	resource := m.Resource(job.ID)
	ttl := m.cfg.TTL
	if timeout > 0 {
		ttl = max(min(ttl, timeout/3), minTTL)
	}
	actx, cancel := context.WithTimeout(ctx, m.cfg.AcquireTimeout)
	lease, err := m.client.Acquire(actx, resource, &gofence.LeaseOptions{
		Wait:   true,
		TTL:    ttl,
		Holder: holderName(m.client.Holder(), job.Attempt),
	})
	cancel()
	if err != nil {
		if ctx.Err() != nil { // the attempt itself ended (the client stops)
			return fmt.Errorf("riverfence: job %d attempt %d: taking the lease on %s: %w", job.ID, job.Attempt, resource, err)
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, gofence.ErrHeld) || errors.Is(err, gofence.ErrBusy) {
			return m.snooze(ctx, job, resource, err)
		}
		return fmt.Errorf("riverfence: job %d attempt %d: taking the lease on %s (River retries the job as its retry policy says): %w", job.ID, job.Attempt, resource, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = lease.Release(rctx) // an unreachable server ends it at expiry, by the deadline
	}()
	if timeout > 0 {
		// The last renewal that may be sent is one whose expiry (send time
		// + ttl by the server's clock) is still by the deadline: stop the
		// keepalive then. Release is the only way to stop it; the token
		// stays the job's latest, and so keeps fencing the attempt's
		// writes, until the next attempt is granted one.
		stop := time.AfterFunc(time.Until(start.Add(timeout-ttl)), func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			defer cancel()
			_ = lease.Release(rctx)
		})
		defer stop.Stop()
	}
	return doInner(context.WithValue(ctx, attemptKey{}, &attempt{lease: lease, jobID: job.ID}))
}

// snooze is Work's answer to a lease it could not get in time: snooze until
// the holder's lease expires by the server's clock, at least Config.Snooze.
func (m *Middleware) snooze(ctx context.Context, job *rivertype.JobRow, resource string, cause error) error {
	d := m.cfg.Snooze
	lctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	info, ok, err := m.client.LeaseOf(lctx, resource)
	cancel()
	if err == nil && ok && info.Live && !info.ExpiresAt.IsZero() {
		d = max(d, info.ExpiresAt.Sub(info.ServerNow))
	}
	return fmt.Errorf("riverfence: job %d attempt %d: %w (%s: %v); snoozed for %s: %w",
		job.ID, job.Attempt, ErrLeaseUnavailable, resource, cause, d.Round(time.Millisecond), river.JobSnooze(d))
}

func holderName(client string, attempt int) string {
	const maxLen = 255 // fence.acquire's limit on holder names
	suffix := "/river-attempt-" + strconv.Itoa(attempt)
	if len(client)+len(suffix) > maxLen {
		client = client[:maxLen-len(suffix)]
	}
	return client + suffix
}

// Lease returns the lease of the attempt whose Work received ctx, or nil
// outside an attempt of the middleware. Its Token is the attempt's fencing
// token. The lease ends (ErrReleased) one TTL before the attempt's deadline
// and when Work returns; the token keeps fencing the attempt's writes until
// a newer attempt of the job is granted one, so do not read Err as "stop
// working": the database decides, in Tx and CompleteTx.
func Lease(ctx context.Context) *gofence.Lease {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	if a == nil {
		return nil
	}
	return a.lease
}

// Tx runs fn in a transaction begun on db (a pool, a connection or a pgx.Tx,
// as gofence.Tx takes it) under the token of the attempt whose Work received
// ctx (gofence.Lease.Tx): every statement of fn on a protected table is
// fenced, so once a newer attempt of the job has its token, the transaction
// fails with an error matching gofence.ErrStaleToken (FN001) and commits
// nothing. Outside an attempt it returns ErrNoAttempt.
func Tx(ctx context.Context, db gofence.Beginner, fn func(pgx.Tx) error) error {
	lease := Lease(ctx)
	if lease == nil {
		return ErrNoAttempt
	}
	return lease.Tx(ctx, db, fn)
}

// CompleteTx writes the attempt's results and completes job in one fenced
// transaction: it runs fn (nil for none) in Tx, then locks the job's row
// (River's JobUpdateTx, which changes nothing else), checks that the row
// still runs this attempt, and completes it with river.JobCompleteTx in the
// same transaction; it commits all of it or nothing. When a newer attempt of
// the job has its token, the transaction fails (gofence.ErrStaleToken,
// FN001) before fn runs, and until it ends no newer attempt can be granted
// its token; so an old attempt can neither write its results nor complete
// the job over the newer attempt's work. When the job row no longer runs
// this attempt (River rescued it and handed it to a newer attempt that has
// no token yet, or finalized it), it rolls back and returns an error
// matching ErrJobNotRunning. It needs Work's ctx (River's client is in it
// too) and the riverpgxv5 driver.
func CompleteTx[TArgs river.JobArgs](ctx context.Context, db gofence.Beginner, job *river.Job[TArgs], fn func(pgx.Tx) error) (*river.Job[TArgs], error) {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	if a == nil || job == nil || job.JobRow == nil || a.jobID != job.ID {
		return nil, ErrNoAttempt
	}
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return nil, fmt.Errorf("riverfence: completing job %d needs Work's ctx with River's pgx client in it: %w", job.ID, err)
	}
	var done *river.Job[TArgs]
	err = a.lease.Tx(ctx, db, func(tx pgx.Tx) error {
		if fn != nil {
			if err := fn(tx); err != nil {
				return err
			}
		}
		// River's completion updates the row by id while it is running,
		// whatever attempt runs it: the row may run a newer attempt that
		// River fetched after a rescue and that has not been granted its
		// token yet, so this token is still the latest. Lock the row and
		// look first; the lock keeps River from handing it on meanwhile.
		row, err := client.JobUpdateTx(ctx, tx, job.ID, nil)
		if err != nil {
			return fmt.Errorf("riverfence: locking job %d: %w", job.ID, err)
		}
		if !sameAttempt(row, job.JobRow) {
			return fmt.Errorf("%w (job %d is %s at attempt %d; this is attempt %d)", ErrJobNotRunning, job.ID, row.State, row.Attempt, job.Attempt)
		}
		done, err = river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		if err != nil {
			return fmt.Errorf("riverfence: completing job %d: %w", job.ID, err)
		}
		if done.State != rivertype.JobStateCompleted {
			return fmt.Errorf("%w (job %d is %s)", ErrJobNotRunning, job.ID, done.State)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// sameAttempt says whether row, as read now, still runs the attempt that
// job was fetched for: running, with the same attempt number and the same
// attempted_at (a snooze gives the number back, the fetch time differs).
func sameAttempt(row, job *rivertype.JobRow) bool {
	if row.State != rivertype.JobStateRunning || row.Attempt != job.Attempt {
		return false
	}
	if row.AttemptedAt == nil || job.AttemptedAt == nil {
		return row.AttemptedAt == job.AttemptedAt
	}
	return row.AttemptedAt.Equal(*job.AttemptedAt)
}
