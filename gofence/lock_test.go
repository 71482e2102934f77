package gofence_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// lockRound has n waiters queue on "job" behind a holder; each waiter holds
// the lease briefly, writes under it and releases. It checks that no two
// hold at once and that tokens strictly increase, and returns the handoff
// latencies (release returned -> next holder granted).
func lockRound(t *testing.T, b *bundle, n int, cfg gofence.Config) []time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second) // a waiter that is never woken fails the test here
	defer cancel()
	first := b.client(t, nil, cfg)
	l, err := first.Acquire(ctx, "job")
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
			ready.Done()
			l, err := c.Lock(ctx, "job")
			require.NoError(t, err)
			granted := time.Now()
			require.Equal(t, int32(1), holding.Add(1), "two holders at once")
			mu.Lock()
			handoffs = append(handoffs, granted.Sub(releasedAt))
			tokens = append(tokens, l.Token())
			mu.Unlock()
			require.NoError(t, write(ctx, l, b.db.Pool, fmt.Sprint("waiter-", i)))
			holding.Add(-1)
			mu.Lock()
			require.NoError(t, l.Release(ctx))
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

func TestLockWaitersAreWokenByNotification(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Polling every minute: only notifications can hand the lease over
	// within the round's 30 s.
	h := lockRound(t, b, 4, gofence.Config{TTL: 10 * time.Second, PollInterval: time.Minute})
	t.Logf("handoff with NOTIFY: median %s, max %s", median(h), slices.Max(h))
}

func TestLockWaitersGetTheirTurnByPollingAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := lockRound(t, b, 4, gofence.Config{TTL: 10 * time.Second, PollInterval: 50 * time.Millisecond, DisableNotify: true})
	t.Logf("handoff by polling every 50ms: median %s, max %s", median(h), slices.Max(h))
}

func TestLockWaitsForExpiryOfACrashedHolder(t *testing.T) {
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
	l, err := waiter.Lock(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, l.Release(b.ctx))
}

func TestLockStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{})
	l, err := c.Acquire(b.ctx, "job")
	require.NoError(t, err)
	defer l.Release(b.ctx)
	ctx, cancel := context.WithCancel(b.ctx)
	go func() {
		for !b.serverLive(t, "job") {
		}
		cancel()
	}()
	_, err = c.Lock(ctx, "job")
	require.ErrorIs(t, err, context.Canceled)
}
