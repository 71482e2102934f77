package gofence_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// exampleDB is a migrated database with a protected table orders(id, note,
// fence_token) guarded by the resource "orders".
func exampleDB() (*pgxpool.Pool, func()) {
	url, drop := pgtest.MustMigratedDB()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE TABLE orders (id int PRIMARY KEY, note text, fence_token bigint)`,
		`SELECT fence.protect('orders', 'orders', 'fence_token')`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			log.Fatal(err)
		}
	}
	return pool, func() { pool.Close(); drop() }
}

func ExampleMigrate() {
	url, drop := pgtest.MustMigratedDB()
	defer drop()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Applies every migration the database lacks (here: none, the example
	// database is migrated already), in table fence_schema_migrations.
	if err := gofence.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	version, dirty, err := gofence.MigrationVersion(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("version", version, "dirty", dirty)
	// Output: version 10 dirty false
}

func ExampleClient_Acquire() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	client, err := gofence.New(pool, &gofence.Config{Holder: "worker-1", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	lease, err := client.Acquire(ctx, "orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	fmt.Println("holding", lease.Resource())

	// A second try finds it held, and says by whom.
	_, err = client.Acquire(ctx, "orders", nil)
	var held *gofence.HeldError
	if errors.As(err, &held) {
		fmt.Println("held by", held.Holder, "with token", held.Token == lease.Token())
	}
	// Output:
	// holding orders
	// held by worker-1 with token true
}

func ExampleClient_Acquire_wait() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	// Poll once an hour: here only the NOTIFY of the release can wake the
	// waiter before its context ends.
	client, err := gofence.New(pool, &gofence.Config{PollInterval: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	first, err := client.Acquire(ctx, "orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		if waitedFor(ctx, pool, "orders") == nil {
			_ = first.Release(ctx) // wakes the waiter through NOTIFY
		}
	}()
	// With Wait, Acquire waits until the lease is free (or ctx is done).
	second, err := client.Acquire(ctx, "orders", &gofence.LeaseOptions{Wait: true})
	if err != nil {
		log.Fatal(err)
	}
	defer second.Release(ctx)
	fmt.Println("granted after the first holder released; newer token:", second.Token() > first.Token())
	// Output: granted after the first holder released; newer token: true
}

// waitedFor returns once a waiter has asked to be told of the release of
// resource (fence.lease's waiters flag) and a Client listens for the
// release's NOTIFY, so that a release from then on wakes that waiter
// through the notification, not by polling or when the listener starts.
func waitedFor(ctx context.Context, pool *pgxpool.Pool, resource string) error {
	for {
		var ready bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM fence.lease WHERE resource = $1 AND waiters)
			AND EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' AND query = 'LISTEN fence_release')`, resource).Scan(&ready)
		if err != nil || ready {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func ExampleClient_Do() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	client, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	// Take the lease (waiting for it), keep it alive while the function runs,
	// and release it afterwards. Write through lease.Tx: the database refuses
	// the writes if this process lost the lease to a newer holder.
	err = client.Do(ctx, "orders", &gofence.LeaseOptions{Wait: true}, func(ctx context.Context, lease *gofence.Lease) error {
		return lease.Tx(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (id, note, fence_token) VALUES (1, 'paid', $1)`, lease.Token())
			return err
		})
	})
	if errors.Is(err, gofence.ErrStaleToken) {
		log.Print("lost the lease: another worker took over")
	} else if err != nil {
		log.Fatal(err)
	}

	var note string
	if err := pool.QueryRow(ctx, `SELECT note FROM orders WHERE id = 1`).Scan(&note); err != nil {
		log.Fatal(err)
	}
	fmt.Println(note)
	// Output: paid
}

func ExampleLease_Tx() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	client, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	old, err := client.Acquire(ctx, "orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	// An operator revokes the lease (or it expired and someone else got it).
	if _, err := pool.Exec(ctx, `SELECT fence.revoke('orders')`); err != nil {
		log.Fatal(err)
	}
	err = old.Tx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM orders`)
		return err
	})
	fmt.Println("stale:", errors.Is(err, gofence.ErrStaleToken))
	_ = old.Release(ctx)
	// Output: stale: true
}

func ExampleClient_ProtectRows() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	client, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	// Every row of invoices is a resource of its own: row 4 needs the token
	// of "invoice:4" (no token column here: the tokens come from Lease.Tx).
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (id int PRIMARY KEY, status text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	if err := client.ProtectRows(ctx, "invoices", "id", "invoice:", ""); err != nil {
		log.Fatal(err)
	}

	// Three workers, each holding the leases of two invoices.
	leases := make([][]*gofence.Lease, 3)
	for w := range leases {
		for _, id := range []int{2*w + 1, 2*w + 2} {
			l, err := client.Acquire(ctx, fmt.Sprintf("invoice:%d", id), &gofence.LeaseOptions{Holder: fmt.Sprintf("worker-%d", w)})
			if err != nil {
				log.Fatal(err)
			}
			defer l.Release(ctx)
			leases[w] = append(leases[w], l)
		}
	}
	// Each worker writes both its rows in one transaction under both leases,
	// all workers at once.
	round := func(status string) {
		errs := make([]error, len(leases))
		var wg sync.WaitGroup
		for w, ls := range leases {
			wg.Go(func() {
				errs[w] = gofence.Tx(ctx, pool, &gofence.TxOptions{Leases: ls}, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1, $3), ($2, $3)
						ON CONFLICT (id) DO UPDATE SET status = excluded.status`, 2*w+1, 2*w+2, status)
					return err
				})
			})
		}
		wg.Wait()
		for w, err := range errs {
			switch {
			case errors.Is(err, gofence.ErrStaleToken):
				fmt.Printf("worker %d refused: stale token\n", w)
			case err != nil:
				log.Fatal(err)
			default:
				fmt.Printf("worker %d wrote %s\n", w, status)
			}
		}
	}

	round("paid")
	// An operator takes invoice 4 away from worker 1 (or its lease expired
	// and another worker got it).
	if _, err := client.Revoke(ctx, "invoice:4"); err != nil {
		log.Fatal(err)
	}
	round("shipped")

	var rows string
	if err := pool.QueryRow(ctx, `SELECT string_agg(id || ' ' || status, ', ' ORDER BY id) FROM invoices`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println(rows)
	// Output:
	// worker 0 wrote paid
	// worker 1 wrote paid
	// worker 2 wrote paid
	// worker 0 wrote shipped
	// worker 1 refused: stale token
	// worker 2 wrote shipped
	// 1 shipped, 2 shipped, 3 paid, 4 paid, 5 shipped, 6 shipped
}

func ExampleLease_UseToken() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	client, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	lease, err := client.Acquire(ctx, "orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	// A transaction that something else began, a job queue for example.
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, note, fence_token) VALUES (1, 'paid', $1)`, lease.Token()); err != nil {
		log.Fatal(err)
	}
	// Register the token: every later write of tx to a protected table is
	// fenced, also those that do not assign the token column.
	if err := lease.UseToken(ctx, tx); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE orders SET note = 'shipped' WHERE id = 1`); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	var note string
	if err := pool.QueryRow(ctx, `SELECT note FROM orders WHERE id = 1`).Scan(&note); err != nil {
		log.Fatal(err)
	}
	fmt.Println(note)
	// Output: shipped
}

// A job queue with a lease per job: worker A takes job 1 and writes in the
// queue's own transaction, fenced with UseToken; A stalls past its TTL (its
// renewals reach no server, as in a long GC pause or a stalled network),
// worker B takes the job over, and A's late write is refused by the
// database, whatever A believes.
func ExampleLease_UseToken_jobQueue() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	// Every row of jobs is its own resource: row 1 needs the token of "job:1".
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL, worker text);
		INSERT INTO jobs (id, state) VALUES (1, 'queued')`); err != nil {
		log.Fatal(err)
	}
	admin, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	if err := admin.ProtectRows(ctx, "jobs", "id", "job:", ""); err != nil {
		log.Fatal(err)
	}

	// step is one step of a worker on job 1, in a transaction of the queue
	// (any pgx.Tx), fenced by the job's lease.
	step := func(db *pgxpool.Pool, lease *gofence.Lease, state string) error {
		tx, err := db.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if err := lease.UseToken(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE jobs SET state = $1, worker = $2 WHERE id = 1`, state, lease.Holder()); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	// Worker A, with a pool that can be cut off from the server while A is
	// paused.
	var paused atomic.Bool
	cfg, err := pgxpool.ParseConfig(pool.Config().ConnString())
	if err != nil {
		log.Fatal(err)
	}
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if paused.Load() {
			return true, errors.New("worker A is paused")
		}
		return true, nil
	}
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer poolA.Close()
	workerA, err := gofence.New(poolA, &gofence.Config{Holder: "worker-a", TTL: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer workerA.Close(ctx)

	a, err := workerA.Acquire(ctx, "job:1", nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := step(poolA, a, "running"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker-a runs job 1")

	paused.Store(true)
	<-a.Done() // the trust deadline passed without a renewal: before the server lets anyone else in
	fmt.Println("worker-a's lease is lost:", errors.Is(a.Err(), gofence.ErrLost))

	workerB, err := gofence.New(pool, &gofence.Config{Holder: "worker-b"})
	if err != nil {
		log.Fatal(err)
	}
	defer workerB.Close(ctx)
	b, err := workerB.Acquire(ctx, "job:1", &gofence.LeaseOptions{Wait: true}) // granted once A's lease expired by the server's clock
	if err != nil {
		log.Fatal(err)
	}
	defer b.Release(ctx)
	if err := step(pool, b, "done"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("worker-b took job 1 over with a newer token:", b.Token() > a.Token())

	// A wakes up and, without looking at its lease, finishes the job.
	paused.Store(false)
	err = step(poolA, a, "done")
	fmt.Println("worker-a's late write is refused:", errors.Is(err, gofence.ErrStaleToken))

	var state, worker string
	if err := pool.QueryRow(ctx, `SELECT state, worker FROM jobs WHERE id = 1`).Scan(&state, &worker); err != nil {
		log.Fatal(err)
	}
	fmt.Println("job 1:", state, "by", worker)
	// Output:
	// worker-a runs job 1
	// worker-a's lease is lost: true
	// worker-b took job 1 over with a newer token: true
	// worker-a's late write is refused: true
	// job 1: done by worker-b
}

func ExampleClient_Elect() {
	pool, done := exampleDB()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	terms := make(chan string, 2)
	for _, name := range []string{"node-a", "node-b"} {
		client, err := gofence.New(pool, &gofence.Config{Holder: name, TTL: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		defer client.Close(ctx)
		wg.Go(func() {
			// Runs the function while this node leads; campaigns again after
			// a loss; steps down (releasing at once) when ctx is cancelled.
			_ = client.Elect(ctx, "scheduler", nil, func(ctx context.Context, lease *gofence.Lease) error {
				terms <- "leader elected"
				<-ctx.Done()
				return ctx.Err()
			})
		})
	}
	fmt.Println(<-terms)
	// Who leads now, for an observer that does not campaign.
	observer, err := gofence.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer observer.Close(ctx)
	info, ok, err := observer.LeaseOf(ctx, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("someone leads:", ok && info.Live)
	cancel()
	wg.Wait()
	// Output:
	// leader elected
	// someone leads: true
}

func ExampleObserverFunc() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()

	// What a dashboard counts: leases that ended other than by Release, and
	// writes the database refused. (Code that must stop on a loss watches
	// lease.Done() instead.)
	var lost, refused atomic.Int64
	observer := gofence.ObserverFunc(func(ctx context.Context, e gofence.Event) {
		switch e := e.(type) {
		case *gofence.LossEvent:
			if e.Reason != gofence.LossReleased {
				lost.Add(1) // deadline passed, superseded, session ended, ...
			}
		case *gofence.RefusalEvent:
			refused.Add(1) // e.SQLState is FN001, FN002 or FN003
		}
	})
	client, err := gofence.New(pool, &gofence.Config{Observer: observer})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	lease, err := client.Acquire(ctx, "orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	// An operator revokes the lease; the holder's next write is refused.
	if _, err := client.Revoke(ctx, "orders"); err != nil {
		log.Fatal(err)
	}
	err = lease.Tx(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, note, fence_token) VALUES (1, 'late', $1)`, lease.Token())
		return err
	})
	fmt.Println("stale:", errors.Is(err, gofence.ErrStaleToken), "refusals seen:", refused.Load())
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: stale: true refusals seen: 1
}

// TestREADMEGoSnippetsAreCompiled keeps the README's Go code honest: every
// ```go block of the README must appear, line for line, in this file, which
// the compiler checks and whose examples run.
func TestREADMEGoSnippetsAreCompiled(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	self, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	normalize := func(s string) string {
		var out []string
		for _, line := range strings.Split(s, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				out = append(out, line)
			}
		}
		return strings.Join(out, "\n")
	}
	body := normalize(string(self))
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, blocks, "the README has Go code")
	for _, b := range blocks {
		require.True(t, strings.Contains(body, normalize(b[1])), "this README Go block is not in gofence/example_test.go:\n%s", b[1])
	}
}
