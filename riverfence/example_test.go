package riverfence_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/riverfence"
)

// TotalArgs asks for an order's total to be computed and stored.
type TotalArgs struct {
	Order int64 `json:"order"`
}

func (TotalArgs) Kind() string { return "total" }

// TotalWorker stores the total in order_totals, a table protected per row by
// job id, and completes the job in the same fenced transaction.
type TotalWorker struct {
	river.WorkerDefaults[TotalArgs]
	pool *pgxpool.Pool
}

func (w *TotalWorker) Timeout(*river.Job[TotalArgs]) time.Duration { return 30 * time.Second }

func (w *TotalWorker) Work(ctx context.Context, job *river.Job[TotalArgs]) error {
	total := job.Args.Order * 6 // the work
	_, err := riverfence.CompleteTx(ctx, w.pool, job, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO order_totals (job_id, order_id, total) VALUES ($1, $2, $3)`,
			job.ID, job.Args.Order, total)
		return err
	})
	return err // gofence.ErrStaleToken when a newer attempt of the job exists
}

// A River client whose every job attempt runs under a lease of its own: the
// worker's results and the job's completion commit together, and only
// while no newer attempt of the job exists.
func ExampleNew() {
	url, drop := pgtest.MustMigratedDB() // a database with pgfence's migrations
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		log.Fatal(err)
	}

	fence, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer fence.Close(ctx)
	if _, err := pool.Exec(ctx, `CREATE TABLE order_totals (job_id bigint PRIMARY KEY, order_id bigint NOT NULL, total bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	// The row of job 7 is written only under the latest token of river_job:7.
	if err := fence.ProtectRows(ctx, "order_totals", "job_id", riverfence.DefaultResourcePrefix, ""); err != nil {
		log.Fatal(err)
	}

	mw, err := riverfence.New(fence, nil) // River's default JobTimeout
	if err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	riverfence.AddWorker(mw, workers, &TotalWorker{pool: pool}) // tells mw the worker's Timeout
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:    workers,
		Middleware: []rivertype.Middleware{mw},
	})
	if err != nil {
		log.Fatal(err)
	}
	events, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer client.Stop(ctx)

	if _, err := client.Insert(ctx, TotalArgs{Order: 7}, nil); err != nil {
		log.Fatal(err)
	}
	select {
	case ev := <-events:
		fmt.Println("job", ev.Kind)
	case <-time.After(30 * time.Second):
		log.Fatal("the job did not finish")
	}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT total FROM order_totals WHERE order_id = 7`).Scan(&total); err != nil {
		log.Fatal(err)
	}
	fmt.Println("total", total)
	// Output:
	// job job_completed
	// total 42
}
