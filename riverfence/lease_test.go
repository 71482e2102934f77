package riverfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/riverfence"
)

// leaseArgs is the job of the lease tests; Timeout is the worker's.
type leaseArgs struct {
	Timeout time.Duration `json:"timeout"`
	Hold    time.Duration `json:"hold"`
}

func (leaseArgs) Kind() string { return "lease" }

// look is what leaseWorker saw of its lease.
type look struct {
	at       time.Duration // since Work began
	token    int64
	err      error
	acquired time.Time // the grant, by the server's clock, from fence.leases
	expires  time.Time // the lease's expiry by the server's clock
	now      time.Time // the server's clock then
	live     bool
}

// leaseWorker looks at its lease at once, then every 100ms for Hold, and
// sends what it saw.
type leaseWorker struct {
	river.WorkerDefaults[leaseArgs]
	b     *bundle
	looks chan []look
}

func (w *leaseWorker) Timeout(job *river.Job[leaseArgs]) time.Duration { return job.Args.Timeout }

func (w *leaseWorker) Work(ctx context.Context, job *river.Job[leaseArgs]) error {
	start := time.Now()
	lease := riverfence.Lease(ctx)
	var looks []look
	for {
		l := look{at: time.Since(start), token: lease.Token(), err: lease.Err()}
		info, ok, err := w.b.fence.LeaseOf(context.WithoutCancel(ctx), lease.Resource())
		if err == nil && ok {
			l.acquired, l.expires, l.now, l.live = info.AcquiredAt, info.ExpiresAt, info.ServerNow, info.Live
		}
		looks = append(looks, l)
		if time.Since(start) >= job.Args.Hold {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.looks <- looks
	return nil
}

func leaseSetup(t *testing.T, cfg riverfence.Config) (*bundle, *leaseWorker, *river.Client[pgx.Tx]) {
	t.Helper()
	b := setup(t, true)
	b.mwCfg = cfg
	b.start(t, gofence.Config{})
	w := &leaseWorker{b: b, looks: make(chan []look, 4)}
	workers := river.NewWorkers()
	riverfence.AddWorker(b.mw, workers, w)
	return b, w, b.work(t, workers, 2)
}

func receiveLooks(t *testing.T, w *leaseWorker) []look {
	t.Helper()
	select {
	case looks := <-w.looks:
		return looks
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not run")
		return nil
	}
}

// TestLeaseEndsBeforeTheAttemptsDeadline: an attempt with a timeout of 3s
// holds a live lease of TTL 1s (timeout/3), renewed while the attempt
// runs, whose expiry by the server's clock never passes the deadline (the
// middleware counts it from before the grant, so from the grant on it is at
// most the timeout), and that the middleware releases: from the deadline on
// it is not live, while the worker, ignoring River's cancellation, goes on
// under its token.
func TestLeaseEndsBeforeTheAttemptsDeadline(t *testing.T) {
	t.Parallel()
	b, w, client := leaseSetup(t, riverfence.Config{})
	const timeout = 3 * time.Second
	// The worker goes on past its deadline (ignoring River's cancellation).
	res, err := client.Insert(b.ctx, leaseArgs{Timeout: timeout, Hold: timeout + time.Second}, nil)
	require.NoError(t, err)
	looks := receiveLooks(t, w)
	first := looks[0]
	require.NoError(t, first.err)
	require.True(t, first.live)
	require.Positive(t, first.token)
	deadline := first.acquired.Add(timeout)
	var renewed, released bool
	for _, l := range looks {
		require.Equal(t, first.token, l.token)
		if l.live {
			require.False(t, released, "at %s the lease is live again", l.at)
			if l.err != nil { // a release under way: the lease ends here first, then on the server
				require.ErrorIs(t, l.err, gofence.ErrReleased, "at %s", l.at)
			}
			require.False(t, l.expires.After(deadline), "at %s the lease expires at %s, past the deadline %s", l.at, l.expires, deadline)
			renewed = renewed || l.expires.After(first.expires)
		} else {
			released = true
		}
		if !l.now.Before(deadline) {
			require.False(t, l.live, "at %s the lease is live past the deadline", l.at)
		}
	}
	require.True(t, renewed, "the lease was never renewed: %+v", looks)
	require.True(t, released, "the lease never ended: %+v", looks)
	require.ErrorIs(t, looks[len(looks)-1].err, gofence.ErrReleased, "the middleware released it")
	require.Eventually(t, func() bool {
		state, _ := b.jobState(t, res.Job.ID)
		return state == "completed"
	}, 10*time.Second, 20*time.Millisecond)
}

// TestJobWithoutTimeoutKeepsItsLease: a job whose worker's Timeout is -1
// (none) holds its lease, renewed, as long as Work runs (here 4.5s, over
// twice the TTL of 2s), and Work's return releases it.
func TestJobWithoutTimeoutKeepsItsLease(t *testing.T) {
	t.Parallel()
	b, w, client := leaseSetup(t, riverfence.Config{TTL: 2 * time.Second})
	res, err := client.Insert(b.ctx, leaseArgs{Timeout: -1, Hold: 4500 * time.Millisecond}, nil)
	require.NoError(t, err)
	looks := receiveLooks(t, w)
	for _, l := range looks {
		require.NoError(t, l.err, "at %s", l.at)
		require.True(t, l.live, "at %s", l.at)
	}
	last := looks[len(looks)-1]
	require.Greater(t, last.at, 4*time.Second)
	require.True(t, last.expires.After(looks[0].expires), "renewed")
	require.Eventually(t, func() bool {
		info, ok, err := b.fence.LeaseOf(b.ctx, b.mw.Resource(res.Job.ID))
		return err == nil && ok && !info.Live
	}, 5*time.Second, 20*time.Millisecond, "the lease is released after Work")
}

// TestAttemptSnoozesWhileTheLeaseIsHeld: while another holder has the job's
// lease, an attempt waits Config.AcquireTimeout for it, does not run the
// worker, and snoozes the job (ErrLeaseUnavailable and a JobSnoozeError,
// so no attempt is used up); once the holder releases, the job runs.
func TestAttemptSnoozesWhileTheLeaseIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.mwCfg = riverfence.Config{AcquireTimeout: 300 * time.Millisecond, Snooze: 200 * time.Millisecond}
	b.start(t, gofence.Config{})
	// The job's id is 1 in a fresh database: hold river_job:1 first.
	held, err := b.fence.Acquire(b.ctx, b.mw.Resource(1), &gofence.LeaseOptions{TTL: 2 * time.Second})
	require.NoError(t, err)
	w := &leaseWorker{b: b, looks: make(chan []look, 4)}
	workers := river.NewWorkers()
	riverfence.AddWorker(b.mw, workers, w)
	client := b.work(t, workers, 2)
	events, cancel := client.Subscribe(river.EventKindJobSnoozed)
	defer cancel()
	res, err := client.Insert(b.ctx, leaseArgs{Timeout: time.Second}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Job.ID)
	select {
	case ev := <-events:
		require.Equal(t, res.Job.ID, ev.Job.ID)
		require.Equal(t, rivertype.JobStateAvailable, ev.Job.State, "a snooze shorter than River's scheduler interval is available at once")
	case <-time.After(10 * time.Second):
		t.Fatal("the job was not snoozed")
	}
	select {
	case <-w.looks:
		t.Fatal("the worker ran while another holder had the job's lease")
	default:
	}
	var snoozes int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT coalesce((metadata->>'snoozes')::int, 0) FROM river_job WHERE id = $1`, res.Job.ID).Scan(&snoozes))
	require.Positive(t, snoozes)
	require.NoError(t, held.Release(b.ctx))
	looks := receiveLooks(t, w)
	require.Greater(t, looks[0].token, held.Token())
	state, attempt := b.jobState(t, res.Job.ID)
	for state != "completed" {
		time.Sleep(20 * time.Millisecond)
		state, attempt = b.jobState(t, res.Job.ID)
	}
	require.Equal(t, 1, attempt, "snoozes used up no attempt")
}

// TestWorkReturnsASnoozeError: the error a snoozed attempt returns matches
// ErrLeaseUnavailable and *river.JobSnoozeError, and names the job; any
// other failure to take the lease is a plain error (River retries it);
// outside an attempt, Tx and Lease find none.
func TestWorkReturnsASnoozeError(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.mwCfg = riverfence.Config{AcquireTimeout: 100 * time.Millisecond}
	b.start(t, gofence.Config{})
	held, err := b.fence.Acquire(b.ctx, b.mw.Resource(99), &gofence.LeaseOptions{TTL: 2 * time.Second})
	require.NoError(t, err)
	defer held.Release(context.Background())
	ran := false
	err = b.mw.Work(b.ctx, &rivertype.JobRow{ID: 99, Kind: "lease", Attempt: 1, EncodedArgs: []byte(`{}`)}, func(context.Context) error {
		ran = true
		return nil
	})
	require.False(t, ran)
	require.ErrorIs(t, err, riverfence.ErrLeaseUnavailable)
	var snooze *river.JobSnoozeError
	require.True(t, errors.As(err, &snooze), "%v", err)
	require.Greater(t, snooze.Duration, time.Second, "until the holder's lease expires")
	require.Contains(t, err.Error(), "job 99 attempt 1")

	require.ErrorIs(t, riverfence.Tx(b.ctx, b.pool, nil), riverfence.ErrNoAttempt)
	require.Nil(t, riverfence.Lease(b.ctx))

	// Any other failure to take the lease is an error that River retries,
	// not a snooze: here the gofence client is closed.
	closed, err := gofence.New(b.pool, &gofence.Config{Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, closed.Close(b.ctx))
	mw, err := riverfence.New(closed, nil)
	require.NoError(t, err)
	err = mw.Work(b.ctx, &rivertype.JobRow{ID: 5, Kind: "lease", Attempt: 2, EncodedArgs: []byte(`{}`)}, func(context.Context) error {
		ran = true
		return nil
	})
	require.False(t, ran)
	require.ErrorIs(t, err, gofence.ErrClosed)
	require.False(t, errors.As(err, &snooze), "%v", err)
	require.Contains(t, err.Error(), "job 5 attempt 2")
}
