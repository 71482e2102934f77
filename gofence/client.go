package gofence

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Config configures a Client. The zero value (or a nil *Config) gives the
// documented defaults.
type Config struct {
	// Holder names this process in fence.leases. Default: host/pid/random,
	// unique per Client.
	Holder string

	// TTL is the lease time to live on the server. Default 30s; allowed
	// 10ms to 24h (the SQL kit's limits).
	TTL time.Duration

	// RenewInterval is how often a lease renews itself. Default TTL/3, so a
	// lease survives two failed renewals before its trust deadline comes near.
	RenewInterval time.Duration

	// SafetyMargin is subtracted from the TTL to get the local trust deadline:
	// the time the acquire or last successful renew was sent + TTL -
	// SafetyMargin, on the local monotonic clock. It covers the difference in
	// rate between the local clock and the server's over one TTL, and the
	// scheduling delay of the loss signal. Default TTL/10.
	SafetyMargin time.Duration

	// RetryInterval is the pause between attempts of a renewal or release
	// that failed with a transient error. Four of them are also the
	// shortest bound of one attempt (see the package doc: an attempt on a
	// connection gone silent is cut off, and the next one takes another
	// connection). Default min(1s, RenewInterval/4).
	RetryInterval time.Duration

	// PollInterval is how often a waiting Acquire (LeaseOptions.Wait) asks
	// again while it waits, whatever the notifications say (they can be
	// lost, and poolers such as PgBouncer in transaction mode block LISTEN). Each wait is jittered by ±25%, and
	// shortened to the held lease's expiry when that comes sooner.
	// Default 1s.
	PollInterval time.Duration

	// DisableNotify turns off LISTEN/NOTIFY: waiters then rely on polling only.
	DisableNotify bool

	// ReleaseOnClose makes Close release every lease the client still holds,
	// as etcd's Session.Close revokes its lease, so the next holder need not
	// wait for a TTL. Default false: Close stops renewing the leases it
	// does not release (nothing of a Client runs after Close) and ends them
	// here (ErrLost, reason client_closed), but leaves a TTL lease live on
	// the server until its expiry, which a program that hands a token to
	// another process needs (pgfence acquire prints the token and exits,
	// leaving the lease held for its TTL); a session lease's session is
	// closed, which ends it on the server.
	ReleaseOnClose bool

	// Logger receives what the package notices on its own, in the
	// background: a lease lost (WARN), a renewal retried or the notification
	// listener reconnecting (INFO), a lease acquired (DEBUG). Default: none;
	// a library stays quiet unless asked, and every such event also reaches
	// the caller (Lease.Done and Lease.Err, errors of the calls).
	Logger *slog.Logger

	// Observer receives the client's events, synchronously: every acquire,
	// renewal attempt, release and end of a lease, every write the database
	// refused inside Tx, UseToken or Do, and every change of leadership in
	// Elect (see Observer; Observers combines several). It must not block;
	// a panic in it is recovered and logged. Default: none. Package
	// otelfence, a module of its own, records the events as OpenTelemetry
	// metrics and spans.
	Observer Observer
}

// Client hands out leases on resources of one database. It is safe for
// concurrent use. Create it with New; Close it when done.
type Client struct {
	pool  *pgxpool.Pool
	cfg   Config // with the defaults filled in
	given Config // as the caller set it, to derive per-lease timings (LeaseOptions.TTL)
	log   *slog.Logger

	installed atomic.Bool
	pooler    poolerCheck // pooler.go: the statement-cache check of the first calls

	mu     sync.Mutex // guards closed, notify, leases and stop
	closed bool
	notify *notifier
	leases map[*Lease]struct{} // held (neither released nor lost), for Close

	// inflight counts the calls that can still grant a lease (see begin);
	// Close waits for them. stop (made on first use) ends when Close stops
	// waiting: the calls then give up what they still wait for.
	inflight sync.WaitGroup
	pending  atomic.Int64 // the calls that inflight counts, for Close to tell whether it cut any off
	stop     context.Context
	stopAll  context.CancelFunc
}

// New returns a client over pool (which it never closes). A nil cfg gives
// the defaults; invalid settings are reported here, once.
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("pgfence: New needs a *pgxpool.Pool")
	}
	var given Config
	if cfg != nil {
		given = *cfg
	}
	c := given
	if c.Holder == "" {
		c.Holder = defaultHolder()
	}
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	t, err := timings(given, c.Holder, given.TTL, "Config.")
	if err != nil {
		return nil, err
	}
	c.TTL, c.RenewInterval, c.SafetyMargin, c.RetryInterval = t.ttl, t.renew, t.margin, t.retry
	if c.PollInterval <= 0 {
		return nil, errors.New("pgfence: Config.PollInterval must be positive")
	}
	return &Client{pool: pool, cfg: c, given: given, log: c.Logger, leases: map[*Lease]struct{}{}}, nil
}

// leaseTimings are the settings of one lease: the Client's, or those of the
// call's LeaseOptions (Holder, TTL).
type leaseTimings struct {
	holder                    string
	ttl, renew, margin, retry time.Duration
}

// timings fills in the defaults of a lease with the given TTL (0: the
// default 30s) from the caller's config, and validates them. The timings
// derived from the TTL (TTL/3, TTL/10, ...) follow it unless the config set
// them; field prefixes the names in errors ("Config." or
// "LeaseOptions.TTL: Config.").
func timings(given Config, holder string, ttl time.Duration, field string) (leaseTimings, error) {
	t := leaseTimings{holder: holder, ttl: cmp.Or(ttl, 30*time.Second)}
	t.renew = cmp.Or(given.RenewInterval, t.ttl/3)
	t.margin = cmp.Or(given.SafetyMargin, t.ttl/10)
	t.retry = cmp.Or(given.RetryInterval, min(time.Second, t.renew/4))
	switch {
	case len(t.holder) > 255:
		return t, fmt.Errorf("pgfence: holder name is %d bytes; the limit is 255 characters", len(t.holder))
	case t.ttl < 10*time.Millisecond || t.ttl > 24*time.Hour:
		return t, fmt.Errorf("pgfence: %sTTL %s is out of range: use 10ms to 24h", field, t.ttl)
	case t.margin <= 0 || t.margin >= t.ttl/2:
		return t, fmt.Errorf("pgfence: %sSafetyMargin %s must be positive and under half the TTL (%s)", field, t.margin, t.ttl)
	case t.renew <= 0 || t.renew >= t.ttl-t.margin:
		return t, fmt.Errorf("pgfence: %sRenewInterval %s must be positive and under TTL - SafetyMargin (%s), or the lease is lost between renewals",
			field, t.renew, t.ttl-t.margin)
	case t.retry <= 0:
		return t, fmt.Errorf("pgfence: %sRetryInterval must be positive", field)
	}
	return t, nil
}

// LeaseOptions says how one call takes its lease. Acquire, Do and Elect
// all take it (nil gives the defaults: a TTL lease under the Client's
// Config, tried once), so that one Client (one pool, one LISTEN connection)
// serves differently named workers, different TTLs, waiting and
// non-waiting callers, TTL and session leases.
type LeaseOptions struct {
	// Wait makes the call wait until the lease is granted, or ctx is done,
	// instead of trying once (a held resource then gives an error matching
	// ErrHeld, a busy one ErrBusy). A waiter is woken by the NOTIFY that
	// fence.release and fence.revoke send and asks again every
	// PollInterval (jittered), or when the held lease expires by the
	// server's clock, whichever comes first. Elect always waits: campaigning
	// is waiting.
	Wait bool

	// Session takes a session lease: one bound to a dedicated connection
	// taken out of the pool, with no TTL, that lives until Release or until
	// that connection breaks (fence.acquire_session). It refuses a pool
	// behind a connection pooler (ErrPooledSession) and a TTL.
	Session bool

	// Holder names the holder of this lease in fence.leases instead of
	// Config.Holder (up to 255 characters). Default: the Client's.
	Holder string

	// TTL is the TTL of this lease instead of Config.TTL (10ms to 24h). Its
	// renewal interval, safety margin and retry interval follow from it as
	// the defaults do from Config.TTL (TTL/3, TTL/10, min(1s, TTL/12)),
	// except those that the Config set explicitly, which must fit this TTL.
	// Zero keeps Config.TTL. Session leases have no TTL and refuse it.
	TTL time.Duration
}

// leaseTimings returns the options (zero for nil) and the settings of a
// lease taken with them.
func (c *Client) leaseTimings(opts *LeaseOptions) (LeaseOptions, leaseTimings, error) {
	var o LeaseOptions
	if opts != nil {
		o = *opts
	}
	holder := cmp.Or(o.Holder, c.cfg.Holder)
	switch {
	case o.Session && o.TTL != 0:
		return o, leaseTimings{}, errors.New("pgfence: LeaseOptions.TTL does not apply to a session lease (LeaseOptions.Session): it lives as long as its connection")
	case o.TTL == 0:
		t := leaseTimings{holder: holder, ttl: c.cfg.TTL, renew: c.cfg.RenewInterval, margin: c.cfg.SafetyMargin, retry: c.cfg.RetryInterval}
		if len(holder) > 255 {
			return o, t, fmt.Errorf("pgfence: LeaseOptions.Holder: the name is %d bytes; the limit is 255 characters", len(holder))
		}
		return o, t, nil
	case o.TTL < 10*time.Millisecond || o.TTL > 24*time.Hour:
		return o, leaseTimings{}, fmt.Errorf("pgfence: LeaseOptions.TTL %s is out of range: use 10ms to 24h", o.TTL)
	}
	t, err := timings(c.given, holder, o.TTL, "LeaseOptions.TTL: Config.")
	return o, t, err
}

// defaultHolder is host/pid/random: unique per process instance, and still
// telling a person where the holder runs.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Holder is the name this client holds leases under.
func (c *Client) Holder() string { return c.cfg.Holder }

// Config returns the client's configuration with the defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// Close stops the client: from its start, Acquire (and so Do and Elect)
// returns ErrClosed. It first waits for the acquires already in flight, so
// that none can grant a lease after Close returned: a grant that comes back
// during Close is given back at once (those calls return ErrClosed). That
// wait lasts as long as ctx allows: when ctx ends first, the acquires still
// waiting for the server are cut off (they return at once), Close reports
// it in its error, and if such a request reaches the server after all, the
// lease it grants is nobody's and ends at its TTL. With
// Config.ReleaseOnClose, Close then releases every lease the client still
// holds, under ctx too: they end with ErrReleased, and one whose release
// cannot reach the server in time stops renewing and ends on the server at
// its TTL (Close's error names it). Every lease Close does not release
// stops renewing and ends (ErrLost, reason client_closed): a TTL lease
// stays live on the server until its expiry (release it first, or use Do
// or Elect, which release), a session lease's session is closed. Last,
// Close stops the background listener: once Close returned (in time), no
// goroutine of the Client runs. Pass a ctx with a deadline: Close waits
// for nothing else. Close is idempotent; its error is nil when everything
// it waited for ended in time.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	n := c.notify
	c.mu.Unlock()
	var errs []error
	if err := c.waitInflight(ctx); err != nil {
		errs = append(errs, err)
	}
	var held []*Lease
	if c.cfg.ReleaseOnClose {
		c.mu.Lock()
		for l := range c.leases {
			held = append(held, l)
		}
		c.mu.Unlock()
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, l := range held {
		wg.Go(func() {
			if err := l.release(ctx, LossClientClosed); err != nil {
				c.log.Warn("pgfence: release at Close failed; the lease ends at its expiry", "resource", l.resource, "error", err.Error())
				mu.Lock()
				errs = append(errs, fmt.Errorf("pgfence: Close: %w", err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Nothing of the client runs after Close: the leases it did not
	// release stop renewing, and end here.
	c.mu.Lock()
	var left []*Lease
	for l := range c.leases {
		left = append(left, l)
	}
	c.mu.Unlock()
	for _, l := range left {
		wg.Go(func() { l.stopAtClose(ctx) })
	}
	wg.Wait()
	if n != nil {
		n.close()
	}
	return errors.Join(errs...)
}

// waitInflight waits until no call can grant a lease any more, or until
// ctx is done: then it stops the calls still in flight (each gives up what
// it waits for at once) and waits for them to return, and says so in its
// error.
func (c *Client) waitInflight(ctx context.Context) error {
	if c.pending.Load() == 0 {
		return nil // closed is set: no call can begin any more
	}
	idle := make(chan struct{})
	go func() {
		c.inflight.Wait()
		close(idle)
	}()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		if c.pending.Load() == 0 {
			return nil // they ended as ctx did
		}
	}
	c.mu.Lock()
	if c.stopAll != nil {
		c.stopAll()
	}
	c.mu.Unlock()
	c.log.Warn("pgfence: Close stopped acquires that the server did not answer in time; a grant that reaches the server later is nobody's and ends at its TTL")
	<-idle
	return fmt.Errorf("pgfence: Close stopped acquires that the server did not answer in time (a grant that reaches the server later is nobody's and ends at its TTL): %w", context.Cause(ctx))
}

// call is one acquire in flight, which Close waits for (Client.begin).
type call struct {
	// stop ends when Close stops waiting for the calls in flight.
	stop context.Context
	once *sync.Once
	c    *Client
}

// begin registers an acquire that can grant a lease; it refuses with
// ErrClosed once Close has begun. The call must end with done once nothing
// it started can grant any more and what it granted is either tracked (so
// that Close sees the lease) or given back.
func (c *Client) begin() (call, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return call{}, ErrClosed
	}
	if c.stop == nil {
		c.stop, c.stopAll = context.WithCancel(context.Background())
	}
	c.inflight.Add(1)
	c.pending.Add(1)
	return call{stop: c.stop, once: new(sync.Once), c: c}, nil
}

// done ends the call (once; later calls do nothing).
func (k call) done() {
	k.once.Do(func() {
		k.c.pending.Add(-1)
		k.c.inflight.Done()
	})
}

// ensureInstalled is Client.ensureInstalled, also cut off when Close stops
// waiting.
func (k call) ensureInstalled(ctx context.Context) error {
	ctx, cancel := k.bound(ctx)
	defer cancel()
	return k.c.ensureInstalled(ctx)
}

// bound derives from ctx a context that also ends when Close stops waiting.
func (k call) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(k.stop, cancel)
	return ctx, func() { stop(); cancel() }
}

// track registers a new lease for Close, until it ends. It refuses (false)
// once the client is closed: the caller then releases the lease.
func (c *Client) track(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.leases[l] = struct{}{}
	context.AfterFunc(l.ctx, func() {
		c.mu.Lock()
		delete(c.leases, l)
		c.mu.Unlock()
	})
	return true
}

// ensureInstalled checks once that schema fence is installed at the version
// this package needs, so that a missing kit gives ErrNotInstalled with the
// command that fixes it instead of a bare "function does not exist".
func (c *Client) ensureInstalled(ctx context.Context) error {
	if c.installed.Load() {
		return nil
	}
	// Concurrent first calls may each ask; each waits only as long as its
	// own ctx allows.
	if err := c.checkPoolerStatementCache(ctx); err != nil { // pooler.go
		return err
	}
	v, err := sqlfuncs.Version(ctx, c.pool)
	if err != nil {
		return err
	}
	if v < migrations.Latest {
		return fmt.Errorf("%w (the database has version %d, this package needs %d)", ErrNotInstalled, v, migrations.Latest)
	}
	c.installed.Store(true)
	return nil
}
