package riverfence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/riverfence"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

// The timings of the tests: an attempt's deadline (the workers' Timeout) is
// short, River's client-wide JobTimeout longer (so the middleware must take
// the worker's, registered with riverfence.AddWorker), and River rescues a
// job 3s after its attempt began (RescueStuckJobsAfter).
const (
	workerTimeout = 2400 * time.Millisecond
	jobTimeout    = 3 * time.Second
	rescueAfter   = 3 * time.Second
)

// bundle is one test's database with River's schema, the tables that the
// workers write (steps, results: protected per row by job id when fenced)
// and the pool that River and gofence use (direct, or through PgBouncer).
type bundle struct {
	ctx    context.Context
	db     *pgtest.DB
	pool   *pgxpool.Pool
	fence  *gofence.Client
	mw     *riverfence.Middleware
	fenced bool
	// pollOnly runs River without LISTEN (behind PgBouncer in transaction
	// mode).
	pollOnly bool
	// mwCfg configures the middleware (JobTimeout: jobTimeout when zero).
	mwCfg riverfence.Config
}

// setup makes a bundle. With fenced, steps and results are protected per
// row (resource river_job:<job_id>) and the middleware exists; without,
// the tables are plain and the workers write as an unfenced River worker
// does (the control).
func setup(t testing.TB, fenced bool) *bundle {
	t.Helper()
	b := &bundle{ctx: t.Context(), db: pgtest.Setup(t), fenced: fenced}
	b.pool = b.db.Pool
	migrator, err := rivermigrate.New(riverpgxv5.New(b.db.Pool), &rivermigrate.Config{Logger: quiet})
	require.NoError(t, err)
	_, err = migrator.Migrate(b.ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err, "River's migrations into %s", b.db.URL)
	_, err = b.db.Pool.Exec(b.ctx, `
		CREATE TABLE steps (seq bigserial PRIMARY KEY, job_id bigint NOT NULL, attempt int NOT NULL, token bigint NOT NULL);
		CREATE TABLE results (job_id bigint PRIMARY KEY, attempt int NOT NULL, token bigint NOT NULL);
		-- what every attempt saw, written outside the fenced transactions
		CREATE TABLE history (id bigserial PRIMARY KEY, job_id bigint NOT NULL, attempt int NOT NULL,
			token bigint NOT NULL, op text NOT NULL, ok boolean NOT NULL, err text NOT NULL DEFAULT '')`)
	require.NoError(t, err)
	return b
}

// usePool switches River and gofence to pool (after setup, before start).
func (b *bundle) usePool(pool *pgxpool.Pool) { b.pool = pool }

// start creates the gofence client and the middleware (fenced) on b.pool,
// and protects the tables.
func (b *bundle) start(t testing.TB, gcfg gofence.Config) {
	t.Helper()
	if !b.fenced {
		return
	}
	gcfg.Logger = quiet
	gcfg.PollInterval = 100 * time.Millisecond
	var err error
	b.fence, err = gofence.New(b.pool, &gcfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.fence.Close(ctx)
	})
	for _, tbl := range []string{"steps", "results"} {
		require.NoError(t, b.fence.ProtectRows(b.ctx, tbl, "job_id", riverfence.DefaultResourcePrefix, ""))
	}
	mwCfg := b.mwCfg
	if mwCfg.JobTimeout == 0 {
		mwCfg.JobTimeout = jobTimeout
	}
	b.mw, err = riverfence.New(b.fence, &mwCfg)
	require.NoError(t, err)
}

// immediately retries at once: the tests wait for rescues, not for backoff.
type immediately struct{}

func (immediately) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// riverConfig is the configuration of the client that works the jobs: it
// never leads, so no rescue happens until maintain starts a client that
// does.
func (b *bundle) riverConfig(workers *river.Workers, maxWorkers int) *river.Config {
	cfg := &river.Config{
		Queues:                 map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:                workers,
		JobTimeout:             jobTimeout,
		RescueStuckJobsAfter:   rescueAfter,
		LeaderElectionDisabled: true,
		FetchCooldown:          20 * time.Millisecond,
		FetchPollInterval:      50 * time.Millisecond,
		RetryPolicy:            immediately{},
		PollOnly:               b.pollOnly,
		Logger:                 quiet,
	}
	if b.fenced {
		cfg.Middleware = []rivertype.Middleware{b.mw}
	}
	return cfg
}

// work starts the client that works the jobs; it is stopped (and its
// attempts cancelled) when the test ends.
func (b *bundle) work(t testing.TB, workers *river.Workers, maxWorkers int) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(b.pool), b.riverConfig(workers, maxWorkers))
	require.NoError(t, err)
	require.NoError(t, client.Start(b.ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.StopAndCancel(ctx)
	})
	return client
}

// maintain runs River's maintenance: a client of the same workers, on a
// queue that holds no jobs, that leads; starting it runs the rescuer and the
// scheduler at once (River's rescuer runs every 30s otherwise; TestOnly
// leaves out the up to 1s that maintenance services wait before they start). It stops the
// client once until says so, and fails the test when that takes over 15s.
func (b *bundle) maintain(t *testing.T, workers *river.Workers, until func() bool) {
	t.Helper()
	if !b.maintainFor(t, workers, until, 15*time.Second) {
		t.Fatalf("River did not rescue and rerun the job within 15s (%s)", b.db.URL)
	}
}

// maintainFor is maintain for at most d; it reports whether until said so.
func (b *bundle) maintainFor(t *testing.T, workers *river.Workers, until func() bool, d time.Duration) bool {
	t.Helper()
	cfg := b.riverConfig(workers, 1)
	cfg.Queues = map[string]river.QueueConfig{"maintenance": {MaxWorkers: 1}}
	cfg.LeaderElectionDisabled = false
	cfg.Middleware = nil
	cfg.TestOnly = true // the rescuer runs as soon as the client leads, not up to 1s later
	client, err := river.NewClient(riverpgxv5.New(b.pool), cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(b.ctx))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(ctx))
	}()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if until() {
			return true
		}
	}
	return false
}

// jobState reads a job's state and attempt from river_job.
func (b *bundle) jobState(t *testing.T, id int64) (state string, attempt int) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT state::text, attempt FROM river_job WHERE id = $1`, id).Scan(&state, &attempt))
	return state, attempt
}

// jobErrors returns the errors River recorded on a job, for failure
// messages.
func (b *bundle) jobErrors(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT coalesce(errors::text, '') FROM river_job WHERE id = $1`, id).Scan(&s))
	return s
}

// record writes what an attempt saw into history, outside any fenced
// transaction (and under a context River's timeout does not end).
func (b *bundle) record(ctx context.Context, job *rivertype.JobRow, token int64, op string, err error) {
	msg := "" // what refused the write: FN001, not running, or the error
	switch {
	case err == nil:
	case errors.Is(err, gofence.ErrStaleToken):
		msg = "FN001"
	case errors.Is(err, riverfence.ErrJobNotRunning):
		msg = "not running"
	default:
		msg = err.Error()
	}
	_, _ = b.db.Pool.Exec(context.WithoutCancel(ctx),
		`INSERT INTO history (job_id, attempt, token, op, ok, err) VALUES ($1, $2, $3, $4, $5, $6)`,
		job.ID, job.Attempt, token, op, err == nil, msg)
}

// step is an attempt's intermediate write: fenced through riverfence.Tx,
// or (the control) in a plain transaction.
func (b *bundle) step(ctx context.Context, job *rivertype.JobRow) (token int64, err error) {
	insert := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO steps (job_id, attempt, token) VALUES ($1, $2, $3)`, job.ID, job.Attempt, token)
		return err
	}
	if !b.fenced {
		return 0, pgx.BeginFunc(ctx, b.pool, insert)
	}
	token = riverfence.Lease(ctx).Token()
	return token, riverfence.Tx(ctx, b.pool, insert)
}

// complete writes an attempt's result and completes the job in one
// transaction: riverfence.CompleteTx, or (the control) a plain transaction
// with river.JobCompleteTx.
func complete[T river.JobArgs](ctx context.Context, b *bundle, job *river.Job[T], token int64) error {
	upsert := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO results (job_id, attempt, token) VALUES ($1, $2, $3)
			ON CONFLICT (job_id) DO UPDATE SET attempt = excluded.attempt, token = excluded.token`, job.ID, job.Attempt, token)
		return err
	}
	if !b.fenced {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if err := upsert(tx); err != nil {
				return err
			}
			_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
			return err
		})
	}
	_, err := riverfence.CompleteTx(ctx, b.pool, job, upsert)
	return err
}

// pauseArgs is the job of the pause-and-rescue test.
type pauseArgs struct{}

func (pauseArgs) Kind() string { return "pause" }

// outcome is what one attempt of pauseWorker got from its writes.
type outcome struct {
	attempt        int
	token          int64
	step, complete error
}

// pauseWorker's first attempt (the first that reaches Work) stops until
// wake is closed, ignoring its context as River's docs warn that a worker
// may ("A worker that ignores cancellation may continue running even after
// the client has timed out the job or the job rescuer has moved it out of
// running"): a GC pause, a stalled dependency. Then it writes a step and its result and completes
// the job, under a context River's timeout no longer ends, as code that
// ignores cancellation does.
type pauseWorker struct {
	river.WorkerDefaults[pauseArgs]
	b        *bundle
	started  chan int
	wake     chan struct{}
	outcomes chan outcome
	paused   atomic.Bool
}

func (w *pauseWorker) Timeout(*river.Job[pauseArgs]) time.Duration { return workerTimeout }

func (w *pauseWorker) Work(ctx context.Context, job *river.Job[pauseArgs]) error {
	w.started <- job.Attempt
	if w.paused.CompareAndSwap(false, true) { // the first attempt that gets here
		select {
		case <-w.wake:
		case <-time.After(30 * time.Second): // never forever
		}
	}
	ctx = context.WithoutCancel(ctx)
	o := outcome{attempt: job.Attempt}
	o.token, o.step = w.b.step(ctx, job.JobRow)
	o.complete = complete(ctx, w.b, job, o.token)
	w.outcomes <- o
	return errors.Join(o.step, o.complete)
}

// pauseReport is what the pause-and-rescue scenario left behind.
type pauseReport struct {
	old, rescued outcome
	// resultAttempt is the attempt whose result is in results; steps, the
	// attempts of the rows of steps in the order they were written.
	resultAttempt int
	steps         []int
	state         string
	attempt       int
}

// pauseAndRescue runs one job whose first attempt is paused past its
// timeout while River rescues it and a second attempt runs and completes;
// then the first attempt wakes and writes.
func pauseAndRescue(t *testing.T, b *bundle) pauseReport {
	t.Helper()
	w := &pauseWorker{b: b, started: make(chan int, 4), wake: make(chan struct{}), outcomes: make(chan outcome, 4)}
	defer func() {
		select {
		case <-w.wake:
		default:
			close(w.wake)
		}
	}()
	workers := river.NewWorkers()
	if b.fenced {
		riverfence.AddWorker(b.mw, workers, w)
	} else {
		river.AddWorker(workers, w)
	}
	client := b.work(t, workers, 2)
	res, err := client.Insert(b.ctx, pauseArgs{}, &river.InsertOpts{MaxAttempts: 5})
	require.NoError(t, err)
	id := res.Job.ID

	var first int
	select {
	case first = <-w.started:
		if first != 1 { // an attempt failed before Work (a grant that came back too late, on a loaded machine)
			t.Logf("the first attempt to reach the worker is attempt %d; the job's errors: %s", first, b.jobErrors(t, id))
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the job's first attempt did not start (%s)", b.db.URL)
	}
	// Past RescueStuckJobsAfter (and the worker's timeout): River may rescue
	// the job now, and does as soon as a leader's rescuer runs.
	time.Sleep(rescueAfter + 100*time.Millisecond)
	b.maintain(t, workers, func() bool {
		select {
		case a := <-w.started:
			require.Greater(t, a, first)
			return true
		default:
			return false
		}
	})
	var rep pauseReport
	select {
	case rep.rescued = <-w.outcomes:
	case <-time.After(15 * time.Second):
		t.Fatalf("the rescued attempt did not finish (%s)", b.db.URL)
	}
	require.Greater(t, rep.rescued.attempt, first)
	close(w.wake)
	select {
	case rep.old = <-w.outcomes:
	case <-time.After(15 * time.Second):
		t.Fatalf("the paused attempt did not finish (%s)", b.db.URL)
	}
	require.Equal(t, first, rep.old.attempt)

	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT attempt FROM results WHERE job_id = $1`, id).Scan(&rep.resultAttempt))
	rows, err := b.db.Pool.Query(b.ctx, `SELECT attempt FROM steps WHERE job_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	rep.steps, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	// River finalizes the old attempt after its Work returned: wait until
	// the row is no longer being changed by it.
	require.Eventually(t, func() bool {
		rep.state, rep.attempt = b.jobState(t, id)
		return rep.state == "completed"
	}, 10*time.Second, 20*time.Millisecond, "job %d is %s (%s)", id, rep.state, b.db.URL)
	return rep
}

// safe says whether a pause-and-rescue run kept the rescued attempt's work:
// its step and result landed, the old attempt's step and result did not.
func (r pauseReport) safe() error {
	var errs []error
	if r.rescued.step != nil || r.rescued.complete != nil {
		errs = append(errs, fmt.Errorf("the rescued attempt's writes failed: %v, %v", r.rescued.step, r.rescued.complete))
	}
	if r.old.step == nil {
		errs = append(errs, errors.New("the old attempt's step landed after the rescued attempt's"))
	}
	if r.old.complete == nil {
		errs = append(errs, errors.New("the old attempt's result and completion landed after the rescued attempt's"))
	}
	if r.resultAttempt != r.rescued.attempt {
		errs = append(errs, fmt.Errorf("results holds attempt %d's result, not the rescued attempt's", r.resultAttempt))
	}
	if fmt.Sprint(r.steps) != fmt.Sprint([]int{r.rescued.attempt}) {
		errs = append(errs, fmt.Errorf("steps written by attempts %v, want [%d]", r.steps, r.rescued.attempt))
	}
	return errors.Join(errs...)
}

// TestPausedAttemptPastItsTimeoutIsFenced: a job's first attempt is paused
// past its timeout while River rescues the job and a second attempt runs
// and completes it; when the first attempt wakes, its step (riverfence.Tx)
// and its result with the completion (riverfence.CompleteTx) are refused
// with FN001, the second attempt's land, and the job is completed: nothing
// lost. The control, the same scenario without the middleware (plain
// transactions and river.JobCompleteTx), shows that the scenario does let
// the old attempt overwrite the new one's work: the fenced run's check
// fails there.
func TestPausedAttemptPastItsTimeoutIsFenced(t *testing.T) {
	t.Parallel()
	t.Run("with the middleware", func(t *testing.T) {
		t.Parallel()
		b := setup(t, true)
		var mu sync.Mutex
		var refusals []*gofence.RefusalEvent
		var holders []string
		b.start(t, gofence.Config{Observer: gofence.ObserverFunc(func(_ context.Context, e gofence.Event) {
			mu.Lock()
			defer mu.Unlock()
			switch e := e.(type) {
			case *gofence.RefusalEvent:
				refusals = append(refusals, e)
			case *gofence.AcquireEvent:
				if e.Outcome == gofence.OutcomeGranted {
					holders = append(holders, e.Holder)
				}
			}
		})})
		rep := pauseAndRescue(t, b)
		require.NoError(t, rep.safe(), b.db.URL)
		require.ErrorIs(t, rep.old.step, gofence.ErrStaleToken)
		require.ErrorIs(t, rep.old.complete, gofence.ErrStaleToken)
		require.Greater(t, rep.rescued.token, rep.old.token, "the rescued attempt's token")
		require.Equal(t, "completed", rep.state)
		require.Equal(t, rep.rescued.attempt, rep.attempt)
		// What the client's observer saw: the grants of both attempts,
		// named by attempt, and the old attempt's two refusals.
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{
			fmt.Sprintf("%s/river-attempt-%d", b.fence.Holder(), rep.old.attempt),
			fmt.Sprintf("%s/river-attempt-%d", b.fence.Holder(), rep.rescued.attempt),
		}, holders)
		require.Len(t, refusals, 2)
		for _, r := range refusals {
			require.Equal(t, "FN001", r.SQLState)
			require.Equal(t, []string{"river_job:1"}, r.Resources)
			require.Equal(t, []int64{rep.old.token}, r.Tokens)
		}
	})
	t.Run("control: without the middleware the old attempt overwrites", func(t *testing.T) {
		t.Parallel()
		b := setup(t, false)
		rep := pauseAndRescue(t, b)
		err := rep.safe()
		require.Error(t, err, "without the middleware the scenario should show the zombie write")
		require.NoError(t, rep.old.step)
		require.NoError(t, rep.old.complete)
		require.Equal(t, rep.old.attempt, rep.resultAttempt, "the old attempt's result replaced the rescued attempt's")
		require.Equal(t, []int{rep.rescued.attempt, rep.old.attempt}, rep.steps)
		t.Logf("control, as expected: %v", err)
	})
}
