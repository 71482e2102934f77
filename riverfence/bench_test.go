package riverfence_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/riverfence"
)

// benchArgs is the job of BenchmarkJobs.
type benchArgs struct{}

func (benchArgs) Kind() string { return "bench" }

// benchWorker writes one row of results and completes the job in the same
// transaction: riverfence.CompleteTx, or (plain) a transaction with
// river.JobCompleteTx.
type benchWorker struct {
	river.WorkerDefaults[benchArgs]
	b *bundle
}

func (w *benchWorker) Work(ctx context.Context, job *river.Job[benchArgs]) error {
	var token int64
	if w.b.fenced {
		token = riverfence.Lease(ctx).Token()
	}
	return complete(ctx, w.b, job, token)
}

// BenchmarkJobs: jobs per second through River (10 workers, one client),
// each writing one result row and completing in one transaction, with the
// middleware (a lease per attempt, its grant and release, and the fenced
// completion) and without (a plain transaction with river.JobCompleteTx).
//
//	go test -run '^$' -bench BenchmarkJobs -benchtime 2000x ./riverfence
func BenchmarkJobs(b *testing.B) {
	for _, fenced := range []bool{false, true} {
		name := "plain"
		if fenced {
			name = "riverfence"
		}
		b.Run(name, func(tb *testing.B) {
			bd := setup(tb, fenced)
			bd.start(tb, gofence.Config{})
			workers := river.NewWorkers()
			if fenced {
				riverfence.AddWorker(bd.mw, workers, &benchWorker{b: bd})
			} else {
				river.AddWorker(workers, &benchWorker{b: bd})
			}
			params := make([]river.InsertManyParams, tb.N)
			for i := range params {
				params[i] = river.InsertManyParams{Args: benchArgs{}}
			}
			client := bd.work(tb, workers, 10)
			events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
			defer cancel()
			tb.ResetTimer()
			start := time.Now()
			_, err := client.InsertMany(bd.ctx, params)
			require.NoError(tb, err)
			for done := 0; done < tb.N; done++ {
				select {
				case ev := <-events:
					require.Equal(tb, river.EventKindJobCompleted, ev.Kind, "job %d: %v", ev.Job.ID, ev.Job.Errors)
				case <-time.After(time.Minute):
					tb.Fatalf("%d of %d jobs done after a minute", done, tb.N)
				}
			}
			tb.ReportMetric(float64(tb.N)/time.Since(start).Seconds(), "jobs/s")
		})
	}
}
