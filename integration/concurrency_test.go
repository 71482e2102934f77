package integration

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// grantEvent is one grant that returned a token to a client, with the
// client's view of when the call started and returned.
type grantEvent struct {
	worker     int
	res        string
	tok        int64
	start, end time.Time
}

// clientError is an error a client saw.
type clientError struct {
	worker int
	op     string
	at     time.Time
	err    error
}

// requireRealTimeOrder checks guarantee 1 across concurrent sessions: a
// grant that started after another grant of the same resource had returned
// got a larger token, and no two grants of a resource share a token.
func requireRealTimeOrder(t *testing.T, events []grantEvent) {
	t.Helper()
	byRes := map[string][]grantEvent{}
	for _, e := range events {
		byRes[e.res] = append(byRes[e.res], e)
	}
	for res, evs := range byRes {
		seen := map[int64]grantEvent{}
		for _, e := range evs {
			if d, dup := seen[e.tok]; dup {
				require.Failf(t, "token granted twice", "%s: token %d returned to worker %d and worker %d", res, e.tok, d.worker, e.worker)
			}
			seen[e.tok] = e
		}
		sort.Slice(evs, func(i, j int) bool { return evs[i].end.Before(evs[j].end) })
		// With evs sorted by return time, the largest token returned before
		// a grant started must be below that grant's token.
		for _, g := range evs {
			for _, p := range evs {
				if !p.end.Before(g.start) {
					break
				}
				require.Less(t, p.tok, g.tok,
					"%s: worker %d's grant (token %d) returned before worker %d's grant started, which got token %d",
					res, p.worker, p.tok, g.worker, g.tok)
			}
		}
	}
}

// TestCrashDuringConcurrentGrants: several sessions grant on three resources
// (acquire + release, or revoke) when the server crashes. After restart,
// every new grant of a resource exceeds every token a client had been
// returned before the crash.
func TestCrashDuringConcurrentGrants(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})

	const workers = 4
	const crashAfter = 150 // grants before the crash
	resources := []string{"conc/r0", "conc/r1", "conc/r2"}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	conns := make([]*pgx.Conn, workers)
	for w := range workers {
		conns[w] = connect(t, ctx, c.URL(), w%2 == 1) // odd workers: synchronous_commit = off
	}

	var (
		mu      sync.Mutex
		events  []grantEvent
		errs    []clientError
		busy    atomic.Int64
		granted atomic.Int64
		reached = make(chan struct{}) // closed at the crashAfter-th grant
	)
	record := func(e grantEvent) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
		if granted.Add(1) == crashAfter {
			close(reached)
		}
	}
	fail := func(w int, op string, err error) {
		mu.Lock()
		errs = append(errs, clientError{worker: w, op: op, at: time.Now(), err: err})
		mu.Unlock()
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			db := conns[w]
			for ctx.Err() == nil {
				res := resources[rng.IntN(len(resources))]
				start := time.Now()
				if rng.IntN(2) == 0 {
					tok, ok, err := sqlfuncs.Acquire(ctx, db, res, fmt.Sprintf("w%d", w), leaseTTL)
					if err != nil {
						fail(w, "acquire", err)
						return
					}
					if !ok {
						busy.Add(1) // another worker holds the lease: no grant
						continue
					}
					record(grantEvent{worker: w, res: res, tok: tok, start: start, end: time.Now()})
					if _, err := sqlfuncs.Release(ctx, db, res, tok); err != nil {
						fail(w, "release", err)
						return
					}
				} else {
					tok, err := sqlfuncs.Revoke(ctx, db, res)
					if err != nil {
						fail(w, "revoke", err)
						return
					}
					record(grantEvent{worker: w, res: res, tok: tok, start: start, end: time.Now()})
				}
			}
		})
	}

	// Crash once enough grants have returned (or fail if they never do).
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		require.FailNow(t, "too few grants", "only %d grants in 30s; client errors: %v", granted.Load(), errs)
	}
	crashAt := time.Now()
	c.Stop(t, "immediate")

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		require.FailNow(t, "workers did not notice the crash within 30s")
	}

	before := newLedger()
	for _, e := range events {
		before.add(e.res, e.tok)
	}
	kinds := map[string]int{}
	for _, e := range errs {
		require.False(t, e.at.Before(crashAt), "worker %d: %s failed before the crash: %v", e.worker, e.op, e.err)
		require.True(t, isConnError(e.err), "worker %d: %s failed with a non-connection error at the crash: %v", e.worker, e.op, e.err)
		kinds[fmt.Sprintf("%s: %v", e.op, e.err)]++
	}
	require.Len(t, errs, workers, "every worker ends on the error of the crash")
	t.Logf("%d grants returned before the crash (%d acquire attempts found a live lease); client errors at the crash:", len(events), busy.Load())
	for k, n := range kinds {
		t.Logf("  %dx %s", n, k)
	}

	t.Run("concurrent grants are ordered and unique", func(t *testing.T) {
		requireRealTimeOrder(t, events)
	})

	c.Start(t)
	conn := connect(t, ctx, c.URL(), false)

	t.Run("returned grants are durable", func(t *testing.T) {
		got := leaseTokens(t, ctx, conn)
		for _, res := range resources {
			n := int64(len(before.all(res)))
			require.GreaterOrEqual(t, got[res], before.max(res), "fence.lease of %s after crash recovery", res)
			require.GreaterOrEqual(t, counterOf(got[res]), n, "%s: the counter counts every grant", res)
			t.Logf("%s: %d grants returned, latest returned %d, latest durable %d (%d committed without a reply)",
				res, n, before.max(res), got[res], got[res]-before.max(res))
		}
	})

	t.Run("new grants exceed every token returned before the crash", func(t *testing.T) {
		for _, res := range resources {
			grantAfterFault(t, ctx, conn, before, res, "after crash")
		}
	})

	t.Run("tokens from before the crash are stale", func(t *testing.T) {
		for _, res := range resources {
			requireStale(t, ctx, conn, before, res)
		}
	})
}
