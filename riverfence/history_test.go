package riverfence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/riverfence"
)

// randomArgs is the job of the history test.
type randomArgs struct{}

func (randomArgs) Kind() string { return "random" }

// randomWorker pauses each attempt for a random time, ignoring its context:
// mostly briefly, but often (half of the first attempts, 20 % of second ones)
// past RescueStuckJobsAfter, so that River rescues the job and a newer
// attempt runs while the paused one still lives. Then it writes a step and
// completes the job with its result, and records in history what it got.
type randomWorker struct {
	river.WorkerDefaults[randomArgs]
	b    *bundle
	seed uint64
}

func (w *randomWorker) Timeout(*river.Job[randomArgs]) time.Duration { return workerTimeout }

func (w *randomWorker) Work(ctx context.Context, job *river.Job[randomArgs]) error {
	token := riverfence.Lease(ctx).Token()
	w.b.record(ctx, job.JobRow, token, "start", nil)
	rng := rand.New(rand.NewPCG(w.seed, uint64(job.ID)<<8|uint64(job.Attempt)))
	pause := time.Duration(rng.IntN(100)) * time.Millisecond
	if p := [...]int{0, 50, 20}; job.Attempt < len(p) && rng.IntN(100) < p[job.Attempt] {
		pause = rescueAfter + time.Duration(800+rng.IntN(1200))*time.Millisecond
	}
	time.Sleep(pause) // ignores ctx, as a paused process does
	ctx = context.WithoutCancel(ctx)
	_, err := w.b.step(ctx, job.JobRow)
	w.b.record(ctx, job.JobRow, token, "step", err)
	err2 := complete(ctx, w.b, job, token)
	w.b.record(ctx, job.JobRow, token, "complete", err2)
	return errors.Join(err, err2)
}

// TestManyJobsWithRandomPausesKeepAHistoryThatChecks: 24 jobs at once,
// attempts paused at random past their timeout while River rescues them
// again and again (a leading client started every half second); the history of
// every attempt is then checked (checkHistory): every job completed once,
// by the attempt with its latest token, with its result; no write of an
// older attempt committed after a newer attempt's; every refusal is FN001
// or a job no longer running.
func TestManyJobsWithRandomPausesKeepAHistoryThatChecks(t *testing.T) {
	t.Parallel()
	pgtest.Long(t, "24 jobs with pauses past their timeout, rescued by River (about 15 s)")
	b := setup(t, true)
	b.start(t, gofence.Config{})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	runHistory(t, b, seed, 24)
}

// runHistory inserts n random jobs, rescues until all are completed, and
// checks the history.
func runHistory(t *testing.T, b *bundle, seed uint64, n int) {
	t.Helper()
	workers := river.NewWorkers()
	riverfence.AddWorker(b.mw, workers, &randomWorker{b: b, seed: seed})
	client := b.work(t, workers, n)
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: randomArgs{}, InsertOpts: &river.InsertOpts{MaxAttempts: 25}}
	}
	_, err := client.InsertMany(b.ctx, params)
	require.NoError(t, err)
	done := func() bool {
		var open int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM river_job WHERE state <> 'completed'`).Scan(&open))
		return open == 0
	}
	deadline := time.Now().Add(90 * time.Second)
	for !b.maintainFor(t, workers, done, 500*time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "jobs still not completed after 90s (%s)", b.db.URL)
	}
	// The paused attempts still running finish, and River finalizes them.
	require.Eventually(t, func() bool {
		var running int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT job_id, attempt, token FROM history GROUP BY 1, 2, 3
			HAVING count(*) FILTER (WHERE op = 'complete') = 0) s`).Scan(&running))
		return running == 0
	}, 10*time.Second, 50*time.Millisecond)
	require.True(t, done(), "a late attempt changed a completed job (%s)", b.db.URL)
	refused := checkHistory(t, b)
	t.Logf("%d jobs: %d attempts, %d writes refused", n, count(t, b, `SELECT count(*) FROM history WHERE op = 'start'`), refused)
	require.Positive(t, refused, "no attempt was refused: the pauses did not make River rescue a running job")
}

func count(t *testing.T, b *bundle, sql string) (n int) {
	t.Helper()
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, sql).Scan(&n))
	return n
}

// checkHistory checks what the attempts recorded against what the tables
// hold, and returns how many writes were refused.
func checkHistory(t *testing.T, b *bundle) (refused int) {
	t.Helper()
	type rec struct {
		JobID   int64
		Attempt int
		Token   int64
		Op      string
		OK      bool
		Err     string
	}
	rows, err := b.db.Pool.Query(b.ctx, `SELECT job_id, attempt, token, op, ok, err FROM history ORDER BY id`)
	require.NoError(t, err)
	hist, err := pgx.CollectRows(rows, pgx.RowToStructByPos[rec])
	require.NoError(t, err)
	type job struct {
		starts      []int64 // tokens of the attempts, in the order they started
		completedBy []int64 // tokens of the completions that landed
	}
	jobs := map[int64]*job{}
	var errs []error
	for _, h := range hist {
		j := jobs[h.JobID]
		if j == nil {
			j = &job{}
			jobs[h.JobID] = j
		}
		switch {
		case h.Op == "start":
			if len(j.starts) > 0 && h.Token <= j.starts[len(j.starts)-1] {
				errs = append(errs, fmt.Errorf("job %d: attempt %d started with token %d, not above the previous attempt's %d", h.JobID, h.Attempt, h.Token, j.starts[len(j.starts)-1]))
			}
			j.starts = append(j.starts, h.Token)
		case h.OK && h.Op == "complete":
			j.completedBy = append(j.completedBy, h.Token)
		case !h.OK:
			refused++
			if h.Err != "FN001" && h.Err != "not running" {
				errs = append(errs, fmt.Errorf("job %d attempt %d (token %d): %s refused for another reason: %s", h.JobID, h.Attempt, h.Token, h.Op, h.Err))
			}
		}
	}
	var results map[int64]int64
	rows, err = b.db.Pool.Query(b.ctx, `SELECT job_id, token FROM results`)
	require.NoError(t, err)
	results = map[int64]int64{}
	for rows.Next() {
		var id, token int64
		require.NoError(t, rows.Scan(&id, &token))
		results[id] = token
	}
	require.NoError(t, rows.Err())
	rows, err = b.db.Pool.Query(b.ctx, `SELECT job_id, token FROM steps ORDER BY seq`)
	require.NoError(t, err)
	lastStep := map[int64]int64{}
	for rows.Next() {
		var id, token int64
		require.NoError(t, rows.Scan(&id, &token))
		if token < lastStep[id] {
			errs = append(errs, fmt.Errorf("job %d: a step under token %d committed after one under the newer %d", id, token, lastStep[id]))
		}
		lastStep[id] = token
	}
	require.NoError(t, rows.Err())
	for id, j := range jobs {
		switch {
		case len(j.completedBy) != 1:
			errs = append(errs, fmt.Errorf("job %d: %d completions landed (tokens %v), want exactly one", id, len(j.completedBy), j.completedBy))
		case results[id] != j.completedBy[0]:
			errs = append(errs, fmt.Errorf("job %d: results holds token %d's result, but token %d completed the job", id, results[id], j.completedBy[0]))
		case lastStep[id] != j.completedBy[0]:
			errs = append(errs, fmt.Errorf("job %d: the last step that landed is token %d's, but token %d completed the job", id, lastStep[id], j.completedBy[0]))
		}
	}
	if len(results) != len(jobs) {
		errs = append(errs, fmt.Errorf("%d results for %d jobs", len(results), len(jobs)))
	}
	require.NoError(t, errors.Join(errs...), "history of %s", b.db.URL)
	return refused
}
