package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/gofence"
)

// benchTTL is the TTL of every lease the bench takes: long enough that no
// lease expires during a run, so every grant follows a release.
const benchTTL = 30 * time.Second

// scaleSmall is the small side of the scale scenario.
const scaleSmall = 1000

// guardResource is the resource the guarded tables are protected under.
const guardResource = "bench-guarded"

func (b *bench) clientList(def []int) []int {
	if len(b.o.Clients) > 0 {
		return b.o.Clients
	}
	return def
}

// midClients is the client count of the scenarios that run at one count.
func (b *bench) midClients() int {
	if len(b.o.Clients) == 0 {
		return 4
	}
	m := 0
	for _, c := range b.o.Clients {
		m = max(m, c)
	}
	return min(m, 4)
}

// newRand gives each client its own generator.
func newRand(id int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(id)))
}

// gofenceGrant is acquire+release of random resources prefix1..prefixN
// through gofence.
func gofenceGrant(name string, clients int, client *gofence.Client, prefix string, n int) workload {
	return workload{name: name, clients: clients, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
		rng := newRand(id)
		return func(ctx context.Context) error {
			l, err := client.Acquire(ctx, prefix+strconv.Itoa(rng.IntN(n)+1), nil)
			if errors.Is(err, gofence.ErrHeld) || errors.Is(err, gofence.ErrBusy) {
				return errHeld // not granted: another client has it, or just had it
			}
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}, nil, nil
	}}
}

// handGrant is the same work in hand-written SQL: one upsert, one update.
func handGrant(clients int, pool *pgxpool.Pool, prefix string, n int) workload {
	return workload{name: "hand-written upsert+update", clients: clients, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
		rng := newRand(id)
		holder := "hand-" + strconv.Itoa(id)
		return func(ctx context.Context) error {
			res := prefix + strconv.Itoa(rng.IntN(n)+1)
			var tok int64
			err := pool.QueryRow(ctx, benchHandAcquire, res, holder, benchTTL).Scan(&tok)
			if errors.Is(err, pgx.ErrNoRows) {
				return errHeld
			}
			if err != nil {
				return err
			}
			_, err = pool.Exec(ctx, benchHandRelease, res, tok)
			return err
		}, nil, nil
	}}
}

// advisoryPair is pg_try_advisory_lock + pg_advisory_unlock on one session:
// the non-durable reference.
func advisoryPair(clients int, pool *pgxpool.Pool, n int) workload {
	return workload{name: "pg_try_advisory_lock+unlock", clients: clients, worker: func(ctx context.Context, id int) (func(context.Context) error, func(), error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		rng := newRand(id)
		return func(ctx context.Context) error {
			key := int64(rng.IntN(n) + 1)
			var ok bool
			if err := conn.QueryRow(ctx, advisoryLock, key).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return errHeld
			}
			return conn.QueryRow(ctx, advisoryUnlock, key).Scan(&ok)
		}, conn.Release, nil
	}}
}

// ---------------------------------------------------------------------------
// 1. grant
// ---------------------------------------------------------------------------

func (b *bench) grantScenario(ctx context.Context, env *benchEnv, s *ScenarioResult) error {
	var pairs []pair
	for _, c := range b.clientList([]int{1, 4, 16}) {
		hand := handGrant(c, env.pool, "grant-", grantResources)
		pairs = append(pairs,
			pair{key: cmpKey{what: cmpGrant, clients: c}, name: fmt.Sprintf("grant: gofence vs hand-written, %d clients", c),
				a: gofenceGrant("gofence Acquire+Release", c, env.client, "grant-", grantResources), b: hand},
			pair{key: cmpKey{what: cmpAdvisory, clients: c}, name: fmt.Sprintf("reference: advisory lock vs hand-written, %d clients", c),
				a: advisoryPair(c, env.pool, grantResources), b: hand})
	}
	cmps, err := b.interleave(ctx, pairs)
	s.Comparisons = cmps
	if err != nil {
		return err
	}
	for _, c := range cmps {
		if c.key.what == cmpGrant {
			s.atLeast(fmt.Sprintf("grant path gofence/hand-written at %d clients", c.Clients), c.Ratio.Median, 0.85)
		}
	}
	s.Notes = append(s.Notes, fmt.Sprintf("random resources among %d released leases, TTL %s; picks that found the resource held are not counted", grantResources, benchTTL))
	return b.roundTrips(ctx, env, s)
}

// roundTrips counts, on one client at a time, the network round trips and
// the statements of each lease operation, after a warm-up that prepares the
// statements on the connection.
func (b *bench) roundTrips(ctx context.Context, env *benchEnv, s *ScenarioResult) error {
	const warm, n = 5, 50
	names := []string{"acquire", "renew", "release"}
	var trips, stmts [3]int64
	var lat [3][]time.Duration
	for i := range warm + n {
		res := "rt-probe-" + strconv.Itoa(i%3)
		var l *gofence.Lease
		steps := [3]func() error{
			func() (err error) { l, err = env.client.Acquire(ctx, res, nil); return err },
			func() error { return l.Renew(ctx) },
			func() error { return l.Release(ctx) },
		}
		for k, f := range steps {
			t0, s0 := env.rt.snapshot()
			start := time.Now()
			err := f()
			d := time.Since(start)
			t1, s1 := env.rt.snapshot()
			if err != nil {
				return fmt.Errorf("counting round trips of %s: %w", names[k], err)
			}
			if i >= warm {
				trips[k] += t1 - t0
				stmts[k] += s1 - s0
				lat[k] = append(lat[k], d)
			}
		}
	}
	for k, name := range names {
		t := float64(trips[k]) / n
		s.fact("round trips per gofence "+name, t, "round trips")
		s.fact("statements per gofence "+name, float64(stmts[k])/n, "statements")
		s.fact("latency p50 of one gofence "+name, latencies(name, lat[k]).P50Ms, "ms")
		s.exactly("round trips per "+name, t, 1)
	}
	s.Notes = append(s.Notes, "round trips counted on the socket (a write after a read) and statements with a pgx QueryTracer, one operation at a time, after a warm-up")
	return nil
}

// ---------------------------------------------------------------------------
// 2. guarded
// ---------------------------------------------------------------------------

// guardedWrites gives, over pool, the four guarded-write workloads: single
// UPDATE on the protected table (token column) and on the unprotected one,
// and Lease.Tx (use_token) + UPDATE against a plain transaction + UPDATE.
func guardedWrites(clients int, pool *pgxpool.Pool, l *gofence.Lease, label string) (upd, plainUpd, tx, plainTx workload) {
	single := func(name, table string) workload {
		sql := fmt.Sprintf(benchWriteUpdate, table)
		return workload{name: name, clients: clients, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
			return func(ctx context.Context) error {
				_, err := pool.Exec(ctx, sql, id+1, l.Token())
				return err
			}, nil, nil
		}}
	}
	guardedTx := fmt.Sprintf(benchTxUpdate, "bench_guarded_tx")
	plainTxSQL := fmt.Sprintf(benchTxUpdate, "bench_unguarded_tx")
	upd = single("UPDATE protected (token column)"+label, "bench_guarded")
	plainUpd = single("UPDATE unprotected"+label, "bench_unguarded")
	tx = workload{name: "Lease.Tx (use_token) + UPDATE" + label, clients: clients, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
		return func(ctx context.Context) error {
			return l.Tx(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, guardedTx, id+1)
				return err
			})
		}, nil, nil
	}}
	plainTx = workload{name: "BEGIN + UPDATE + COMMIT" + label, clients: clients, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
		return func(ctx context.Context) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, plainTxSQL, id+1)
				return err
			})
		}, nil, nil
	}}
	return upd, plainUpd, tx, plainTx
}

func (b *bench) guardedScenario(ctx context.Context, env *benchEnv, s *ScenarioResult) error {
	c := b.midClients()
	off, _, err := b.openPool(ctx, b.prefix, int32(c+4), map[string]string{"synchronous_commit": "off"})
	if err != nil {
		return err
	}
	defer b.closePool(off)
	l, err := env.client.Acquire(ctx, guardResource, nil)
	if err != nil {
		return err
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()

	var pairs []pair
	for _, m := range []struct {
		label string
		pool  *pgxpool.Pool
	}{{"on", env.pool}, {"off", off}} {
		upd, plainUpd, tx, plainTx := guardedWrites(c, m.pool, l, ", synchronous_commit="+m.label)
		pairs = append(pairs,
			pair{key: cmpKey{what: cmpGuardedUpdate, clients: c, commit: m.label},
				name: "guarded UPDATE vs plain UPDATE, synchronous_commit=" + m.label, a: upd, b: plainUpd},
			pair{key: cmpKey{what: cmpUseTokenTx, clients: c, commit: m.label},
				name: "use_token tx vs plain tx, synchronous_commit=" + m.label, a: tx, b: plainTx})
	}
	cmps, err := b.interleave(ctx, pairs)
	s.Comparisons = cmps
	if err != nil {
		return err
	}
	ratio := func(what, commit string) float64 {
		return s.comparison(cmpKey{what: what, clients: c, commit: commit}).Ratio.Median
	}
	s.atLeast("guarded UPDATE (token column)/plain, synchronous_commit=on", ratio(cmpGuardedUpdate, "on"), 0.95)
	s.atLeast("use_token tx/plain tx, synchronous_commit=on", ratio(cmpUseTokenTx, "on"), 0.95)
	s.atLeast("guarded UPDATE (token column)/plain, synchronous_commit=off", ratio(cmpGuardedUpdate, "off"), 0.85)
	s.atLeast("use_token tx/plain tx, synchronous_commit=off", ratio(cmpUseTokenTx, "off"), 0.8)
	s.Notes = append(s.Notes, fmt.Sprintf("%d clients, each updating its own row; one lease on %q held throughout", c, guardResource))
	return nil
}

// ---------------------------------------------------------------------------
// 3. handoff
// ---------------------------------------------------------------------------

// handoffSlice runs len(clients) clients in a chain on resource for d: each
// one in turn gets the lease from a waiting Acquire, holds it a moment (so
// that the others are all waiting), notes the time and releases it, and
// waits for the next grant before it asks again (so a releaser never
// re-takes its own lease).
// A sample is the time from the start of Release to the return of the next
// holder's waiting Acquire.
func handoffSlice(ctx context.Context, clients []*gofence.Client, resource string, d time.Duration) ([]time.Duration, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		samples  []time.Duration
		firstErr error
		released time.Time     // when the current holder started its release; zero if none pending
		next     chan struct{} = make(chan struct{})
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	for _, c := range clients {
		wg.Go(func() {
			for {
				l, err := c.Acquire(sctx, resource, &gofence.LeaseOptions{Wait: true})
				now := time.Now()
				if err != nil {
					if sctx.Err() == nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
						cancel()
					}
					return
				}
				mu.Lock()
				if !released.IsZero() {
					samples = append(samples, now.Sub(released))
					released = time.Time{}
				}
				close(next)
				next = make(chan struct{})
				mine := next
				mu.Unlock()
				if now.After(deadline) {
					cancel()
					_ = l.Release(context.WithoutCancel(ctx))
					return
				}
				time.Sleep(time.Millisecond)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := l.Release(sctx); err != nil {
					if sctx.Err() == nil {
						mu.Lock()
						firstErr = cmpErr(firstErr, err)
						mu.Unlock()
						cancel()
					}
					return
				}
				select {
				case <-mine:
				case <-sctx.Done():
					return
				}
			}
		})
	}
	wg.Wait()
	return samples, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// roundTripSlice measures SELECT 1 one after another for d.
func roundTripSlice(ctx context.Context, pool *pgxpool.Pool, d time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		t := time.Now()
		var one int
		if err := pool.QueryRow(ctx, selectOne).Scan(&one); err != nil {
			return out, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// commitSlice times one synchronous commit (syncCommit) at a time for d.
func commitSlice(ctx context.Context, pool *pgxpool.Pool, d time.Duration) ([]time.Duration, error) {
	var out []time.Duration
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		t := time.Now()
		if _, err := pool.Exec(ctx, syncCommit); err != nil {
			return out, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

func (b *bench) handoffScenario(ctx context.Context, env *benchEnv, s *ScenarioResult) error {
	var notify, poll []*gofence.Client
	defer func() {
		for _, c := range append(notify, poll...) {
			closeClient(c)
		}
	}()
	for i := range b.o.Waiters {
		cn, err := gofence.New(env.pool, &gofence.Config{Holder: fmt.Sprintf("bench-notify-%d", i), TTL: benchTTL, Logger: b.log})
		if err != nil {
			return err
		}
		notify = append(notify, cn)
		cp, err := gofence.New(env.pool, &gofence.Config{Holder: fmt.Sprintf("bench-poll-%d", i), TTL: benchTTL,
			PollInterval: b.o.PollInterval, DisableNotify: true, Logger: b.log})
		if err != nil {
			return err
		}
		poll = append(poll, cp)
	}
	var nSamples, pSamples, rtSamples, cSamples []time.Duration
	n := 0
	slice := func(d time.Duration, record bool) error {
		// A fresh resource per slice: a waiting Acquire cancelled at the end of a slice
		// may have been granted on the server after all (its reply was
		// lost to the cancellation), and that lease stays until its TTL.
		n++
		ns, err := handoffSlice(ctx, notify, "handoff-notify-"+strconv.Itoa(n), d)
		if err != nil {
			return fmt.Errorf("handoff with NOTIFY: %w", err)
		}
		rs, err := roundTripSlice(ctx, env.pool, d)
		if err != nil {
			return err
		}
		cs, err := commitSlice(ctx, env.pool, d)
		if err != nil {
			return err
		}
		// Polling needs a few intervals per slice to give a sample at all.
		ps, err := handoffSlice(ctx, poll, "handoff-poll-"+strconv.Itoa(n), max(d, 4*b.o.PollInterval))
		if err != nil {
			return fmt.Errorf("handoff with polling: %w", err)
		}
		if record {
			nSamples, rtSamples, pSamples = append(nSamples, ns...), append(rtSamples, rs...), append(pSamples, ps...)
			cSamples = append(cSamples, cs...)
		}
		return nil
	}
	if err := slice(max(b.o.Duration/4, 20*time.Millisecond), false); err != nil {
		return err
	}
	for range b.o.Rounds {
		if err := slice(b.o.Duration, true); err != nil {
			return err
		}
	}
	ln := latencies("handoff with NOTIFY", nSamples)
	lp := latencies(fmt.Sprintf("handoff polling only (PollInterval %s)", b.o.PollInterval), pSamples)
	lr := latencies("round trip (SELECT 1)", rtSamples)
	lc := latencies("one synchronous commit (1-row UPDATE)", cSamples)
	s.Latencies = []Latency{ln, lp, lr, lc}
	if ln.N == 0 || lp.N == 0 || lr.N == 0 || lc.N == 0 {
		return errors.New("a handoff slice gave no samples; raise --duration")
	}
	s.fact("NOTIFY handoff p50 in round trips", ln.P50Ms/lr.P50Ms, "round trips")
	s.fact("NOTIFY handoff p99 in round trips", ln.P99Ms/lr.P50Ms, "round trips")
	s.fact("polling handoff p99 / PollInterval", lp.P99Ms/msOf(b.o.PollInterval), "")
	s.fact("NOTIFY handoff p50 in synchronous commits", ln.P50Ms/lc.P50Ms, "commits (a handoff holds a release and a grant)")
	s.atMost("handoff p50 with NOTIFY, in round trips (SELECT 1 p50)", ln.P50Ms/lr.P50Ms, 5)
	s.atMost("handoff p99 polling only, in PollInterval (jitter allows 1.25)", lp.P99Ms/msOf(b.o.PollInterval), 1.25)
	s.Notes = append(s.Notes, fmt.Sprintf("%d waiters, each its own gofence.Client (own LISTEN connection) on one pool; a sample runs from the start of Release to the return of the next holder's waiting Acquire", b.o.Waiters))
	return nil
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// ---------------------------------------------------------------------------
// 4. scale
// ---------------------------------------------------------------------------

type leaseStats struct {
	upd, hot, dead, live, size, autovacuums int64
}

// statsReportWait is how long the bench waits for backends to report their
// statistics on their own, where it cannot make them flush: a backend
// reports at the end of a transaction at most every 500ms before
// PostgreSQL 15 (PGSTAT_STAT_INTERVAL), and after at most 1s idle from 15.
const statsReportWait = 1100 * time.Millisecond

// readLeaseStats reads the statistics of fence.lease once every idle
// connection of pool has reported what it did. From PostgreSQL 15,
// pg_stat_force_next_flush() makes each report at once. On PostgreSQL 13 and
// 14 (a stats collector, no such function), and for a role without EXECUTE
// on it (superusers only by default), the bench waits for the server's own
// reporting instead, and note says so: the figures are then as fresh as the
// server's reporting interval allows.
func readLeaseStats(ctx context.Context, pool *pgxpool.Pool) (st leaseStats, note string, err error) {
	flushed, err := flushStats(ctx, pool)
	if err != nil {
		return st, "", fmt.Errorf("flushing statistics: %w", err)
	}
	if !flushed {
		note = fmt.Sprintf("statistics read without pg_stat_force_next_flush() (PostgreSQL before 15, or no EXECUTE on it): "+
			"the bench waited %s for the server to report them, so the counts may lag a little", 2*statsReportWait)
	}
	if _, err := pool.Exec(ctx, benchClearStats); err != nil {
		return st, note, err
	}
	err = pool.QueryRow(ctx, benchLeaseStats).Scan(&st.upd, &st.hot, &st.dead, &st.live, &st.size, &st.autovacuums)
	return st, note, err
}

// flushStats makes every idle connection of pool report its pending
// statistics. It holds those connections until it returns, whatever happens,
// and hands every one of them back. flushed is false when the server could
// not be asked to flush; it then waited for the server's own reporting.
func flushStats(ctx context.Context, pool *pgxpool.Pool) (flushed bool, err error) {
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		_, err := c.Exec(ctx, benchFlushStats)
		if err == nil {
			continue
		}
		// undefined_function (before 15) or insufficient_privilege (not a
		// superuser): the server cannot be asked; anything else is an error.
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "42883" && pgErr.Code != "42501") {
			return false, err
		}
		return false, awaitStatsReport(ctx, conns)
	}
	return true, nil
}

// awaitStatsReport lets the server's reporting interval pass, ends a
// transaction on every connection (which is when a backend of PostgreSQL 13
// and 14 reports), then lets the interval pass again so that a reader's
// snapshot (at most that old) includes the reports.
func awaitStatsReport(ctx context.Context, conns []*pgxpool.Conn) error {
	if err := sleepCtx(ctx, statsReportWait); err != nil {
		return err
	}
	for _, c := range conns {
		if _, err := c.Exec(ctx, selectOne); err != nil {
			return err
		}
	}
	return sleepCtx(ctx, statsReportWait)
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *bench) scaleScenario(ctx context.Context, s *ScenarioResult) error {
	c := b.midClients()
	small, _, err := b.createDB(ctx, "_s1k", int32(c+4), nil)
	if err != nil {
		return err
	}
	defer b.closePool(small)
	big, _, err := b.createDB(ctx, "_sbig", int32(c+4), nil)
	if err != nil {
		return err
	}
	defer b.closePool(big)
	start := time.Now()
	if err := prefill(ctx, small, "s-", scaleSmall, false); err != nil {
		return err
	}
	if err := prefill(ctx, big, "s-", b.o.BigResources, false); err != nil {
		return err
	}
	s.fact("time to fill the lease tables", time.Since(start).Seconds(), "s")
	cs, err := gofence.New(small, &gofence.Config{Holder: "bench-scale", Logger: b.log})
	if err != nil {
		return err
	}
	defer closeClient(cs)
	cb, err := gofence.New(big, &gofence.Config{Holder: "bench-scale", Logger: b.log})
	if err != nil {
		return err
	}
	defer closeClient(cb)
	cmps, err := b.interleave(ctx, []pair{{
		key:  cmpKey{what: cmpScale, clients: c},
		name: fmt.Sprintf("grant at %d vs %d resources, %d clients", b.o.BigResources, scaleSmall, c),
		a:    gofenceGrant(fmt.Sprintf("gofence grant, %d resources", b.o.BigResources), c, cb, "s-", b.o.BigResources),
		b:    gofenceGrant(fmt.Sprintf("gofence grant, %d resources", scaleSmall), c, cs, "s-", scaleSmall),
	}})
	s.Comparisons = cmps
	if err != nil {
		return err
	}
	s.atLeast(fmt.Sprintf("grant throughput at %d / at %d resources", b.o.BigResources, scaleSmall),
		s.comparison(cmpKey{what: cmpScale, clients: c}).Ratio.Median, 0.8)
	if b.o.BigResources < 1_000_000 {
		s.Notes = append(s.Notes, fmt.Sprintf("the big side has %d resources, not the 1,000,000 of the documented target: run with --big-resources 1000000 for that", b.o.BigResources))
	}
	return b.renewLoop(ctx, small, cs, c, s)
}

// renewLoop renews leases as fast as c clients can for a while and reports
// what that did to fence.lease: the share of HOT updates, dead tuples, size.
func (b *bench) renewLoop(ctx context.Context, pool *pgxpool.Pool, client *gofence.Client, c int, s *ScenarioResult) error {
	const perClient = 16
	leases := make([]*gofence.Lease, 0, c*perClient)
	defer func() {
		for _, l := range leases {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	for i := range c * perClient {
		l, err := client.Acquire(ctx, "s-"+strconv.Itoa(i+1), nil)
		if err != nil {
			return err
		}
		leases = append(leases, l)
	}
	before, note, err := readLeaseStats(ctx, pool)
	if err != nil {
		return err
	}
	if note != "" {
		s.Notes = append(s.Notes, note)
	}
	loop := time.Duration(5*b.o.Rounds) * b.o.Duration
	r, err := workload{name: "renew", clients: c, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
		i := 0
		return func(ctx context.Context) error {
			i++
			return leases[id*perClient+i%perClient].Renew(ctx)
		}, nil, nil
	}}.run(ctx, loop)
	if err != nil {
		return err
	}
	if r.errs > 0 {
		return fmt.Errorf("%d renewals failed, first: %w", r.errs, r.firstErr)
	}
	after, _, err := readLeaseStats(ctx, pool)
	if err != nil {
		return err
	}
	upd, hot := after.upd-before.upd, after.hot-before.hot
	share := 0.0
	if upd > 0 {
		share = float64(hot) / float64(upd)
	}
	s.fact("renew loop length", loop.Seconds(), "s")
	s.fact("renewals", float64(r.ops), fmt.Sprintf("(%.0f/s, %d clients, %d leases)", r.perSec(), c, len(leases)))
	s.fact("fence.lease updates seen by pg_stat_user_tables", float64(upd), "")
	s.fact("of which HOT", float64(hot), "")
	s.fact("HOT share of renewals", share, "")
	s.fact("fence.lease size before", float64(before.size), "bytes")
	s.fact("fence.lease size after", float64(after.size), "bytes")
	s.fact("fence.lease dead tuples after", float64(after.dead), "")
	s.fact("fence.lease live tuples after", float64(after.live), "")
	s.fact("autovacuum runs on fence.lease during the loop", float64(after.autovacuums-before.autovacuums), "")
	s.atLeast("HOT share of renewals", share, 0.9)
	return nil
}

// ---------------------------------------------------------------------------
// 5. scaling
// ---------------------------------------------------------------------------

func (b *bench) scalingScenario(ctx context.Context, env *benchEnv, s *ScenarioResult) error {
	l, err := env.client.Acquire(ctx, guardResource, nil)
	if err != nil {
		return err
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()
	var pairs []pair
	for _, c := range b.clientList([]int{1, 2, 4, 8, 16, 32}) {
		upd, plainUpd, _, _ := guardedWrites(c, env.pool, l, "")
		pairs = append(pairs,
			pair{key: cmpKey{what: cmpGrant, clients: c}, name: fmt.Sprintf("grant, %d clients", c),
				a: gofenceGrant("gofence Acquire+Release", c, env.client, "grant-", grantResources),
				b: handGrant(c, env.pool, "grant-", grantResources)},
			pair{key: cmpKey{what: cmpGuardedUpdate, clients: c}, name: fmt.Sprintf("guarded UPDATE, %d clients", c), a: upd, b: plainUpd})
	}
	cmps, err := b.interleave(ctx, pairs)
	s.Comparisons = cmps
	if err != nil {
		return err
	}
	for _, c := range cmps {
		switch c.key.what {
		case cmpGrant:
			s.atLeast(fmt.Sprintf("scaling: grant gofence/hand-written at %d clients", c.Clients), c.Ratio.Median, 0.85)
		case cmpGuardedUpdate:
			s.atLeast(fmt.Sprintf("scaling: guarded/plain UPDATE at %d clients (synchronous_commit as the server)", c.Clients), c.Ratio.Median, 0.95)
		}
	}
	return nil
}
