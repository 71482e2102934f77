package gofence_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// waitRound has n waiters queue on "job" behind a holder; each waiter holds
// the lease briefly, writes under it and releases. It checks that no two
// hold at once and that tokens strictly increase, and returns the handoff
// latencies (release returned -> next holder granted).
func waitRound(t *testing.T, b *bundle, n int, cfg gofence.Config) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second) // a waiter that is never woken fails the test here
	defer cancel()
	first := b.client(t, nil, cfg)
	l, err := first.Acquire(ctx, "job", nil)
	require.NoError(t, err)

	var (
		holding    atomic.Int32
		mu         sync.Mutex
		tokens     []int64
		handoffs   []time.Duration
		releasedAt = time.Now()
	)
	var ready, wg sync.WaitGroup
	ready.Add(n)
	for i := range n {
		c := b.client(t, nil, cfg)
		wg.Go(func() {
			// No require here: FailNow must run on the test's goroutine.
			ready.Done()
			l, err := c.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			granted := time.Now()
			if n := holding.Add(1); n != 1 {
				t.Errorf("waiter %d: %d holders at once", i, n)
			}
			mu.Lock()
			handoffs = append(handoffs, granted.Sub(releasedAt))
			tokens = append(tokens, l.Token())
			mu.Unlock()
			if err := write(ctx, l, b.db.Pool, fmt.Sprint("waiter-", i)); err != nil {
				t.Errorf("waiter %d: fenced write: %v", i, err)
			}
			holding.Add(-1)
			mu.Lock()
			if err := l.Release(ctx); err != nil {
				t.Errorf("waiter %d: release: %v", i, err)
			}
			releasedAt = time.Now()
			mu.Unlock()
		})
	}
	ready.Wait()
	mu.Lock()
	require.NoError(t, l.Release(ctx))
	releasedAt = time.Now()
	mu.Unlock()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	require.Len(t, tokens, n)
	require.True(t, slices.IsSorted(tokens), "tokens in grant order: %v", tokens)
	require.Len(t, slices.Compact(slices.Clone(tokens)), n, "no token twice")
	return handoffs
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func TestWaitersAreWokenByNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Polling every minute: only notifications can hand the lease over
	// within the round's 30 s.
	h := waitRound(t, b, 4, gofence.Config{TTL: 10 * time.Second, PollInterval: time.Minute})
	t.Logf("handoff with NOTIFY: median %s, max %s", median(h), slices.Max(h))
}

func TestWaitersGetTheirTurnByPollingAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := waitRound(t, b, 4, gofence.Config{TTL: 10 * time.Second, PollInterval: 50 * time.Millisecond, DisableNotify: true})
	t.Logf("handoff by polling every 50ms: median %s, max %s", median(h), slices.Max(h))
}

func TestWaiterAsksAgainAtTheExpiryOfACrashedHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A holder that crashed: its lease was granted and is never renewed nor
	// released, so no notification comes. The waiter asks again when the
	// lease expires by the server's clock, not after a (here) one-minute poll.
	_, ok, err := sqlfuncs.Acquire(b.ctx, b.db.Pool, "job", "crashed", 300*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	waiter := b.client(t, nil, gofence.Config{TTL: 10 * time.Second, PollInterval: time.Minute})
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	l, err := waiter.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
	require.NoError(t, err)
	require.NoError(t, l.Release(b.ctx))
}

func TestWaiterStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	defer l.Release(b.ctx)
	ctx, cancel := context.WithCancel(b.ctx)
	go func() {
		// Cancelled once the waiter waits (it asked to be notified); no
		// require in this goroutine: an error cancels at once.
		defer cancel()
		for waiting := false; !waiting; time.Sleep(5 * time.Millisecond) {
			if err := b.db.Pool.QueryRow(ctx, `SELECT waiters FROM fence.lease WHERE resource = 'job'`).Scan(&waiting); err != nil {
				return
			}
		}
	}()
	_, err = c.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
	require.ErrorIs(t, err, context.Canceled)
}

// TestHandoffUnderChurn: four clients take turns on one resource as fast
// as they can (hold 1 ms, release, a waiting Acquire again), with polling set to a minute
// and a 30 s lease: every handoff must come from a notification. The first
// version of the waiter flag took a row lock before the gate in one path and
// deadlocked with a grant now and then (a 1 s stall per deadlock_timeout,
// then a retry); with a minute of polling, a missed wake-up fails this test.
func TestHandoffUnderChurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	cfg := gofence.Config{TTL: 30 * time.Second, PollInterval: time.Minute}
	pool, err := pgxpool.New(ctx, b.db.URL) // closed before reading the statistics, so its backends flush them
	require.NoError(t, err)
	var clients []*gofence.Client
	for range 4 {
		clients = append(clients, b.client(t, pool, cfg))
	}
	var handoffs atomic.Int64
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				l, err := c.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
				if err != nil {
					t.Errorf("Acquire: %v (a waiter was not woken)", err)
					return
				}
				handoffs.Add(1)
				time.Sleep(time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, c := range clients {
		require.NoError(t, c.Close(ctx))
	}
	pool.Close()
	// A deadlock between a waiter and a grant costs deadlock_timeout and a
	// retry, and would hide behind the other waiters' notifications: ask the
	// server. Backends flush their statistics when they exit.
	var deadlocks int64
	poll(t, "the clients' backends gone", func() bool { // poll: its condition runs on this goroutine
		var n int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n))
		return n <= 1 // only the test pool's own connection is left
	})
	_, err = b.db.Pool.Exec(b.ctx, `SELECT pg_stat_clear_snapshot()`)
	require.NoError(t, err)
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks))
	t.Logf("%d handoffs in 2s, %d deadlocks", handoffs.Load(), deadlocks)
	require.Greater(t, handoffs.Load(), int64(20))
	require.Zero(t, deadlocks, "waiters and grants deadlocked")
}
