package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The Patroni tests run the kit, gofence and the CLI through the failovers
// Patroni performs, on a cluster of three nodes over etcd
// (pgtest.NewPatroni), with every client on the cluster's multi-host URL
// (target_session_attrs=read-write), so that it follows the leader.

// foResources are the resources the workers of TestPatroniFailovers take
// turns on: one guards the table-wide form (fo_whole), two the per-row form
// (fo_rows, rows of rid 1 and 2).
var foResources = []string{"fo/whole", "fo/row/1", "fo/row/2"}

// foGrant is a grant a worker saw return: when it asked (start) and when
// the token came back (end), by the test's clock.
type foGrant struct {
	res        string
	tok        int64
	worker     int
	start, end time.Time
}

// foWrite is a guarded insert a worker saw commit (ok) or fail.
type foWrite struct {
	res string
	tok int64
	id  int64
	ok  bool
	end time.Time
}

// foHistory is what the workers saw.
type foHistory struct {
	mu     sync.Mutex
	grants []foGrant
	writes []foWrite
	errs   map[string]int // what failed, by kind and first words, for the log
}

func (h *foHistory) grant(g foGrant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.grants = append(h.grants, g)
}

func (h *foHistory) write(w foWrite) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.writes = append(h.writes, w)
}

func (h *foHistory) fail(kind string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs[kind+": "+errorClass(err)]++
}

// errorClass names what kind of failure err is, for the log's counts.
func errorClass(err error) string {
	switch {
	case errors.Is(err, sqlfuncs.ErrStaleToken):
		return "stale token refused"
	case errors.Is(err, sqlfuncs.ErrUnknownToken):
		return "unknown token refused"
	case errors.Is(err, gofence.ErrLost):
		return "lease lost"
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case isConnError(err):
		return "connection lost"
	}
	return err.Error()
}

// grantsSnapshot returns the grants so far, by the time their token came
// back.
func (h *foHistory) grantsSnapshot() []foGrant {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := slices.Clone(h.grants)
	slices.SortFunc(g, func(a, b foGrant) int { return a.end.Compare(b.end) })
	return g
}

// foWorkers runs n gofence clients, each with a pool of its own on the
// cluster's multi-host URL, that take leases on foResources in turn
// (waiting), write under each token one to three rows and release, until
// stop is called; stop waits for them and closes everything.
func foWorkers(t *testing.T, ctx context.Context, url string, n int, h *foHistory) (stop func()) {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var nextID atomic.Int64
	for w := range n {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		client, err := gofence.New(pool, &gofence.Config{
			Holder:       fmt.Sprintf("worker-%d", w),
			TTL:          2 * time.Second,
			PollInterval: 100 * time.Millisecond,
		})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pool.Close()
			defer func() {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer ccancel()
				_ = client.Close(cctx)
			}()
			for wctx.Err() == nil {
				res := foResources[rand.IntN(len(foResources))]
				lctx, lcancel := context.WithTimeout(wctx, 15*time.Second)
				start := time.Now()
				l, err := client.Acquire(lctx, res, &gofence.LeaseOptions{Wait: true})
				lcancel()
				if err != nil {
					if wctx.Err() == nil {
						h.fail("acquire", err)
						time.Sleep(20 * time.Millisecond)
					}
					continue
				}
				h.grant(foGrant{res: res, tok: l.Token(), worker: w, start: start, end: time.Now()})
				for range 1 + rand.IntN(3) {
					id := nextID.Add(1)
					xctx, xcancel := context.WithTimeout(wctx, 5*time.Second)
					err := l.Tx(xctx, pool, func(tx pgx.Tx) error {
						var err error
						if res == "fo/whole" {
							_, err = tx.Exec(xctx, "INSERT INTO fo_whole (id, tok, worker) VALUES ($1, $2, $3)", id, l.Token(), w)
						} else {
							_, err = tx.Exec(xctx, "INSERT INTO fo_rows (id, rid, tok, worker) VALUES ($1, $2, $3, $4)", id, strings.TrimPrefix(res, "fo/row/"), l.Token(), w)
						}
						return err
					})
					xcancel()
					h.write(foWrite{res: res, tok: l.Token(), id: id, ok: err == nil, end: time.Now()})
					if err != nil {
						if wctx.Err() == nil {
							h.fail("write", err)
						}
						break
					}
					time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
				if err := l.Release(rctx); err != nil && wctx.Err() == nil && !errors.Is(err, gofence.ErrLost) {
					h.fail("release", err)
				}
				rcancel()
			}
		}()
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// foFailover is one failover of TestPatroniFailovers and what it cost.
type foFailover struct {
	kind, mode      string
	from, to        string
	injected, ready time.Time // the fault, and a writable leader again
	unavailable     time.Duration
	epochBefore     int64
	epochAfter      int64
	counterMoves    int
	rewound         string
}

// TestPatroniFailovers runs four gofence workers, on the multi-host URL,
// through Patroni's failovers, first with asynchronous replication, then
// with synchronous_mode: a planned switchover (patronictl), the primary's
// postmaster killed (Patroni restarts or replaces it), the primary's
// Patroni stopped as a service (SIGTERM: it stops PostgreSQL and hands the
// leader key over), and the whole primary node killed (Patroni and PostgreSQL, SIGKILL: the leader key
// expires, a replica is promoted), the old primary then started again and
// rewound (use_pg_rewind) to rejoin as a replica. Across each failover a
// holder is paused: it took a lease before the fault, and writes under its
// token after another holder got the resource on the new primary. After
// every failover and at the end it checks guarantee 1 (a grant that began
// after another returned has the larger token), that no token was granted
// twice, and guarantee 3 from the final tables (rows of a resource in the
// order of the sequence value their transaction took under the guard
// carry nondecreasing tokens, each one granted for that resource), that
// each failover spent one epoch and no counter move (since 009; on 008
// each moved the counter 2^32 too, and this fails there by design), and
// that fence.token_budget still has every counter move at the end; it
// measures how long no lease could be granted.
func TestPatroniFailovers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	c := pgtest.NewPatroni(t, pgtest.PatroniOptions{Nodes: 3})
	url := c.URL(pgtest.ClusterDB)
	admin := func() *pgx.Conn {
		t.Helper()
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err, url)
		return conn
	}
	setup := admin()
	for _, q := range []string{
		"CREATE SEQUENCE fo_seq",
		"CREATE TABLE fo_whole (id bigint PRIMARY KEY, tok bigint NOT NULL, worker int NOT NULL, seq bigint NOT NULL DEFAULT nextval('fo_seq'))",
		"CREATE TABLE fo_rows (id bigint PRIMARY KEY, rid int NOT NULL, tok bigint NOT NULL, worker int NOT NULL, seq bigint NOT NULL DEFAULT nextval('fo_seq'))",
		"CREATE TABLE fo_paused (id bigserial PRIMARY KEY, tok bigint NOT NULL)",
	} {
		_, err := setup.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, setup, "fo_whole", "fo/whole", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, setup, "fo_rows", "rid", "fo/row/", "tok"))
	require.NoError(t, setup.Close(ctx))

	h := &foHistory{errs: map[string]int{}}
	stop := foWorkers(t, ctx, url, 4, h)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	var failovers []foFailover
	var syncSince time.Time
	var paused []pausedHolder
	for _, mode := range []string{"asynchronous", "synchronous_mode"} {
		if mode == "synchronous_mode" {
			c.SetSynchronousMode(t, true)
			syncSince = time.Now()
		}
		for _, kind := range []string{"switchover", "postmaster killed", "patroni stopped", "node killed"} {
			waitGrants(t, ctx, h, 5)
			leader := c.WaitLeader(t, "")
			ph := pauseHolder(t, ctx, url, len(failovers))
			f := foFailover{kind: kind, mode: mode, from: leader.Name}
			before := h.grantsSnapshot()
			f.epochBefore = epochOf(before[len(before)-1].tok)
			f.injected = time.Now()
			var next *pgtest.PatroniNode
			switch kind {
			case "switchover":
				c.Switchover(t, leader, c.Replica(t))
				next = c.WaitLeader(t, "")
			case "postmaster killed":
				leader.KillPostmaster(t)
				next = c.WaitLeader(t, "")
			case "patroni stopped":
				leader.Stop(t)
				next = c.WaitLeader(t, leader.Name)
			case "node killed":
				leader.Kill(t)
				next = c.WaitLeader(t, leader.Name)
			}
			f.ready, f.to = time.Now(), next.Name
			waitGrants(t, ctx, h, len(before)+5)
			logBefore := len(leader.PatroniLog())
			if kind == "node killed" || kind == "patroni stopped" {
				leader.Start(t)
			}
			c.WaitStreaming(t, len(c.Nodes)-1)
			if kind == "node killed" || kind == "patroni stopped" {
				f.rewound = rewindOutcome(leader.PatroniLog()[logBefore:])
			}
			after := h.grantsSnapshot()
			f.unavailable = longestGap(after, f.injected, f.ready)
			f.epochAfter, f.counterMoves = epochAndMoves(before, after, f.ready)
			ph.check(t, ctx, url)
			paused = append(paused, ph)
			failovers = append(failovers, f)
			t.Logf("%s, %s: %s -> %s, no grant for %s, leader writable after %s, epoch %d -> %d, %d counter moves%s",
				mode, kind, f.from, f.to, f.unavailable.Round(10*time.Millisecond), f.ready.Sub(f.injected).Round(10*time.Millisecond),
				f.epochBefore, f.epochAfter, f.counterMoves, map[bool]string{true: ", old primary " + f.rewound, false: ""}[f.rewound != ""])
			checkGrants(t, h.grantsSnapshot())
			// Since 009 a promotion spends an epoch and no counter move
			// (on 008 each one moved the counter 2^32 too).
			require.Equal(t, f.epochBefore+1, f.epochAfter, "%s, %s: one epoch", mode, kind)
			require.Zero(t, f.counterMoves, "%s, %s: no counter move", mode, kind)
		}
	}
	stop()
	stopped = true

	// Final tables, on the last leader.
	final := admin()
	defer final.Close(context.Background())
	grants := h.grantsSnapshot()
	checkGrants(t, grants)
	granted := map[string]map[int64]bool{}
	for _, g := range grants {
		if granted[g.res] == nil {
			granted[g.res] = map[int64]bool{}
		}
		granted[g.res][g.tok] = true
	}
	type row struct {
		res          string
		id, tok, seq int64
	}
	var rows []row
	rs, err := final.Query(ctx, `SELECT 'fo/whole', id, tok, seq FROM fo_whole
		UNION ALL SELECT 'fo/row/' || rid, id, tok, seq FROM fo_rows ORDER BY 4`)
	require.NoError(t, err)
	for rs.Next() {
		var r row
		require.NoError(t, rs.Scan(&r.res, &r.id, &r.tok, &r.seq))
		rows = append(rows, r)
	}
	require.NoError(t, rs.Err())
	present := map[int64]bool{}
	last := map[string]row{}
	violations := 0
	for _, r := range rows {
		present[r.id] = true
		if !granted[r.res][r.tok] {
			violations++
			t.Errorf("row %d of %s carries token %d, never granted for it", r.id, r.res, r.tok)
		}
		if p, ok := last[r.res]; ok && r.tok < p.tok {
			violations++
			t.Errorf("guarantee 3: row %d of %s (seq %d) was written under token %d after row %d (seq %d) under the newer %d", r.id, r.res, r.seq, r.tok, p.id, p.seq, p.tok)
		}
		last[r.res] = r
	}
	okWrites, lostWrites, lostSync, failedPresent := 0, 0, 0, 0
	for _, w := range h.writes {
		switch {
		case w.ok && present[w.id]:
			okWrites++
		case w.ok:
			lostWrites++ // committed, then lost with an asynchronous primary
			if w.end.After(syncSince) {
				lostSync++
			}
		case present[w.id]:
			failedPresent++ // the reply was lost; the commit was not
		}
	}
	budget, err := sqlfuncs.TokenBudget(ctx, final)
	require.NoError(t, err)
	require.Equal(t, int64(2047), budget.CounterMovesLeft, "the failovers spent no counter move")
	require.Equal(t, failovers[len(failovers)-1].epochAfter, budget.Epoch, "the budget's epoch is the last grants'")
	pausedRefused := 0
	for _, p := range paused {
		if p.refused {
			pausedRefused++
		}
	}
	require.Equal(t, len(paused), pausedRefused, "every paused holder's write was refused")
	t.Logf("%d grants, %d rows in the final tables (%d writes seen committed, %d committed and lost, %d seen failed but committed), %d paused holders refused, %d violations; client errors: %v",
		len(grants), len(rows), okWrites, lostWrites, failedPresent, pausedRefused, violations, h.errs)
	var byKind []string
	for _, f := range failovers {
		byKind = append(byKind, fmt.Sprintf("%s/%s %.1fs (epoch +%d, %d counter moves)", f.mode, f.kind, f.unavailable.Seconds(), f.epochAfter-f.epochBefore, f.counterMoves))
	}
	t.Logf("NOTE: Patroni failovers (%s): %d failovers, %d grants, %d guarded rows, %d violations, %d committed writes lost, token budget after: epoch %d, %d counter moves left; no grant for: %s",
		c.Version, len(failovers), len(grants), len(rows), violations, lostWrites, budget.Epoch, budget.CounterMovesLeft, strings.Join(byKind, "; "))
	require.Zero(t, lostSync, "under synchronous_mode no commit a client saw is lost")
}

// waitGrants waits until the workers have seen n grants in all.
func waitGrants(t *testing.T, ctx context.Context, h *foHistory, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		h.mu.Lock()
		got := len(h.grants)
		h.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the workers saw %d grants, want %d; errors: %v", got, n, h.errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkGrants checks guarantee 1 and uniqueness on the grants the workers
// saw: a grant that began after another of the same resource returned has
// a larger token, and no token came back twice.
func checkGrants(t *testing.T, grants []foGrant) {
	t.Helper()
	seen := map[int64]foGrant{}
	for _, g := range grants {
		if p, dup := seen[g.tok]; dup {
			t.Errorf("token %d granted twice: %s to worker %d and %s to worker %d", g.tok, p.res, p.worker, g.res, g.worker)
		}
		seen[g.tok] = g
	}
	for i, a := range grants {
		for _, b := range grants[i+1:] {
			if a.res == b.res && b.start.After(a.end) && b.tok <= a.tok {
				t.Errorf("guarantee 1: %s: token %d (asked %s) is not above %d (returned %s)", a.res, b.tok, b.start.Format(time.StampMilli), a.tok, a.end.Format(time.StampMilli))
			}
		}
	}
}

// longestGap is the longest time, from the fault on, without a grant
// returning: the gaps between the fault and the first grant after it and
// between consecutive grants, up to the first grant after ready.
func longestGap(grants []foGrant, injected, ready time.Time) time.Duration {
	var longest time.Duration
	prev := injected
	for _, g := range grants {
		if !g.end.After(injected) {
			continue
		}
		longest = max(longest, g.end.Sub(prev))
		prev = g.end
		if g.end.After(ready) {
			break
		}
	}
	return longest
}

// epochAndMoves returns the epoch of the first grant after ready, and how
// many times the counter moved 2^32 ahead between the last grant before
// the fault and it.
func epochAndMoves(before, after []foGrant, ready time.Time) (int64, int) {
	last := before[len(before)-1].tok
	for _, g := range after {
		if g.end.After(ready) {
			return epochOf(g.tok), int((counterOf(g.tok) - counterOf(last)) >> 32)
		}
	}
	return 0, 0
}

// rewindOutcome reads, in a rejoined node's Patroni log, how it rejoined.
func rewindOutcome(log string) string {
	switch {
	case strings.Contains(log, "pg_rewind exit code=0") || strings.Contains(log, "running pg_rewind"):
		return "rewound with pg_rewind"
	case strings.Contains(log, "bootstrap from leader"):
		return "cloned again"
	}
	return "rejoined without a rewind"
}

// pausedHolder took a lease (by its token alone, no keepalive) before a
// failover and stays silent across it.
type pausedHolder struct {
	res     string
	tok     int64
	refused bool
}

func pauseHolder(t *testing.T, ctx context.Context, url string, i int) pausedHolder {
	t.Helper()
	conn := connect(t, ctx, url, false)
	defer conn.Close(ctx)
	res := fmt.Sprintf("fo/paused/%d", i)
	tok, ok, err := sqlfuncs.Acquire(ctx, conn, res, "paused", time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	return pausedHolder{res: res, tok: tok}
}

// check wakes the paused holder after the failover: another holder takes
// the resource on the new primary (once the paused lease expired), and the
// paused holder's write under its old token is then refused there.
func (p *pausedHolder) check(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	conn := connect(t, ctx, url, false)
	defer conn.Close(ctx)
	var tok int64
	require.Eventually(t, func() bool {
		var ok bool
		var err error
		tok, ok, err = sqlfuncs.Acquire(ctx, conn, p.res, "after", time.Minute)
		return err == nil && ok
	}, 30*time.Second, 50*time.Millisecond)
	require.Greater(t, tok, p.tok, "%s: the grant after the failover exceeds the paused holder's", p.res)
	require.NoError(t, sqlfuncs.UseToken(ctx, conn, p.res, tok), "the new holder's token is current")
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	err = sqlfuncs.UseToken(ctx, tx, p.res, p.tok)
	_ = tx.Rollback(ctx)
	require.Error(t, err)
	require.True(t, errors.Is(err, sqlfuncs.ErrStaleToken) || errors.Is(err, sqlfuncs.ErrUnknownToken), "paused holder's token %d: %v", p.tok, err)
	p.refused = true
}
