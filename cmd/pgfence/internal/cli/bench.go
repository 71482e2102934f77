package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// benchScenarios are the scenario names, in the order they run.
var benchScenarios = []string{"grant", "guarded", "rows", "handoff", "scale", "scaling"}

// benchOptions are the flags of pgfence bench.
type benchOptions struct {
	duration     time.Duration // length of one workload slice
	rounds       int           // rounds of interleaved slices (A B A B ...)
	clients      []int         // overrides the client counts of grant and scaling
	scenario     string        // "all" or one of benchScenarios
	chartDir     string        // where to write the SVG charts; "" for none
	bigResources int           // rows in the lease table for the big side of "scale"
	waiters      int           // waiters in Lock for "handoff"
	pollInterval time.Duration // gofence PollInterval of the polling-only handoff
}

func newBenchCmd(g *globals) *cobra.Command {
	var o benchOptions
	var clients string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure pgfence against hand-written SQL on your server",
		Long: `bench measures pgfence's own path (gofence and the SQL kit) side by side with
the SQL a careful engineer would write by hand without fencing, on the server
you point it at. Every figure is a ratio of two workloads run interleaved
(A B A B ...) in one process on the same database, with the median and the
spread (min-max) over --rounds rounds, so a noisy machine moves both sides.

Scenarios (--scenario):
  grant    acquire+release through gofence vs a hand-written upsert/update
           pair, at 1, 4 and 16 clients; pg_try_advisory_lock/unlock pairs as
           a non-durable reference; round trips per acquire, renew, release
  guarded  UPDATE of a protected table (token column) vs the same UPDATE of
           an unprotected one; Lease.Tx (use_token) + UPDATE vs a plain
           transaction; each with synchronous_commit on and off
  rows     per-row resources (fence.protect_rows): a single-row UPDATE
           under the row's own lease vs the same UPDATE unprotected, beside
           the table-wide guarded UPDATE pair of guarded, synchronous_commit
           on and off; one UPDATE of 10,000 rows of 10,000 leased resources
           (a token per row) vs the same UPDATE unprotected, and where the
           guarded one spends its time (EXPLAIN ANALYZE, per trigger)
  handoff  --waiters waiters in gofence Lock on one resource: time from a
           release to the next grant (p50, p99), with NOTIFY and with polling
           only, against one round trip (SELECT 1)
  scale    grant throughput with 1,000 vs --big-resources rows in the lease
           table; a renew loop: HOT share, dead tuples, table size
  scaling  grant and guarded-write throughput at 1, 2, 4, 8, 16, 32 clients

The bench works in databases of its own (pgfence_bench_XXXX, migrated with the
embedded migrations and dropped at the end), so it leaves nothing behind. The
role needs CREATEDB. The default run takes about a minute and a half.`,
		Example: `  pgfence bench
  pgfence bench --scenario grant --clients 1,8 --duration 1s --rounds 5
  pgfence bench --big-resources 1000000 --chart-dir docs --json > bench.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.duration < 10*time.Millisecond || o.duration > 10*time.Minute {
				return usageError{fmt.Errorf("--duration must be between 10ms and 10m")}
			}
			if o.rounds < 1 || o.rounds > 1000 {
				return usageError{fmt.Errorf("--rounds must be between 1 and 1000")}
			}
			if o.waiters < 2 || o.waiters > 64 {
				return usageError{fmt.Errorf("--waiters must be between 2 and 64")}
			}
			if o.bigResources < 1000 || o.bigResources > 100_000_000 {
				return usageError{fmt.Errorf("--big-resources must be between 1000 and 100000000")}
			}
			if o.pollInterval < time.Millisecond || o.pollInterval > time.Minute {
				return usageError{fmt.Errorf("--poll-interval must be between 1ms and 1m")}
			}
			if clients != "" {
				for _, f := range strings.Split(clients, ",") {
					n, err := strconv.Atoi(strings.TrimSpace(f))
					if err != nil || n < 1 || n > 256 {
						return usageError{fmt.Errorf("--clients: %q is not a client count between 1 and 256", f)}
					}
					o.clients = append(o.clients, n)
				}
			}
			if o.scenario != "all" && !contains(benchScenarios, o.scenario) {
				return usageError{fmt.Errorf("--scenario must be all or one of %s", strings.Join(benchScenarios, ", "))}
			}
			return runBench(cmd.Context(), g, o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", 300*time.Millisecond, "length of one workload slice")
	f.IntVar(&o.rounds, "rounds", 3, "rounds of interleaved slices; figures are the median over rounds")
	f.StringVar(&clients, "clients", "", "comma-separated client counts for grant and scaling (default 1,4,16 and 1,2,4,8,16,32); guarded, rows and scale use the largest up to 4")
	f.StringVar(&o.scenario, "scenario", "all", "all, or one of "+strings.Join(benchScenarios, ", "))
	f.StringVar(&o.chartDir, "chart-dir", "", "write SVG charts (bench-client-scaling.svg, bench-handoff.svg) into this directory")
	f.IntVar(&o.bigResources, "big-resources", 100_000, "rows in the lease table for the big side of scale (the target in docs/benchmarks.md is stated at 1000000)")
	f.IntVar(&o.waiters, "waiters", 4, "clients waiting in Lock for the handoff scenario")
	f.DurationVar(&o.pollInterval, "poll-interval", 100*time.Millisecond, "gofence PollInterval of the polling-only handoff")
	return cmd
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// The bench's own SQL: its tables, its hand-written baselines and its
// fixtures. Every call of a kit function goes through gofence or sqlfuncs.
const (
	// The hand-written lease table: what a careful engineer would build
	// without fencing. Same columns as fence.lease, primary key only.
	benchLeaseTable = `CREATE TABLE bench_lease (
    resource    text COLLATE "C" PRIMARY KEY,
    token       bigint NOT NULL,
    holder      text,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    ended_at    timestamptz
) WITH (fillfactor = 80)`
	// One round trip: grant when the row is missing, released or expired.
	benchHandAcquire = `INSERT INTO bench_lease AS l (resource, token, holder, acquired_at, expires_at)
VALUES ($1, 1, $2, clock_timestamp(), clock_timestamp() + $3::interval)
ON CONFLICT (resource) DO UPDATE
   SET token = l.token + 1, holder = excluded.holder, acquired_at = excluded.acquired_at,
       expires_at = excluded.expires_at, ended_at = NULL
 WHERE l.ended_at IS NOT NULL OR l.expires_at <= clock_timestamp()
RETURNING l.token`
	benchHandRelease = `UPDATE bench_lease SET ended_at = clock_timestamp()
 WHERE resource = $1 AND token = $2 AND ended_at IS NULL AND expires_at > clock_timestamp()`
	benchHandRenew = `UPDATE bench_lease SET expires_at = clock_timestamp() + $3::interval
 WHERE resource = $1 AND token = $2 AND ended_at IS NULL AND expires_at > clock_timestamp()`

	// Released leases as fixtures, so that grants find existing rows (the
	// steady state of a long-running system). Token 1 is below every token
	// the kit grants, so the next grant computes its token as usual.
	benchPrefillKit = `INSERT INTO fence.lease (resource, token, holder, kind, acquired_at, expires_at, ended_at)
SELECT $1 || i, 1, 'bench-prefill', 'ttl', now(), now(), now() FROM generate_series(1, $2::int) AS i`
	benchPrefillHand = `INSERT INTO bench_lease (resource, token, holder, acquired_at, expires_at, ended_at)
SELECT $1 || i, 1, 'bench-prefill', now(), now(), now() FROM generate_series(1, $2::int) AS i`

	advisoryLock   = `SELECT pg_try_advisory_lock($1)`
	advisoryUnlock = `SELECT pg_advisory_unlock($1)`
	selectOne      = `SELECT 1`
	// One synchronous commit of a one-row update: a grant commits like this
	// (it forces synchronous_commit on), so a handoff holds two of them.
	syncCommit = `BEGIN; SET LOCAL synchronous_commit = on; UPDATE bench_unguarded_tx SET val = val + 1 WHERE id = 1; COMMIT`

	// Tables of the guarded-write scenario: a protected one and an identical
	// unprotected one for single UPDATEs (token column), and the same pair
	// without a token column for transactions that register the token with
	// fence.use_token.
	benchWriteTable  = `CREATE TABLE %s (id int PRIMARY KEY, val bigint NOT NULL, token bigint NOT NULL)`
	benchTxTable     = `CREATE TABLE %s (id int PRIMARY KEY, val bigint NOT NULL)`
	benchWriteRows   = `INSERT INTO %s (id, val, token) SELECT i, 0, 0 FROM generate_series(1, 256) AS i`
	benchTxRows      = `INSERT INTO %s (id, val) SELECT i, 0 FROM generate_series(1, 256) AS i`
	benchWriteUpdate = `UPDATE %s SET val = val + 1, token = $2 WHERE id = $1`
	benchTxUpdate    = `UPDATE %s SET val = val + 1 WHERE id = $1`

	// Tables of the rows scenario (created with benchWriteTable): rows 1..$1,
	// the resource of row id is rowsPrefix || id. The multi-row UPDATE
	// presents one token per row through the token column.
	// The tables of the multi-row UPDATE leave half of each page free, so
	// that rewriting every row stays a HOT update pruned on the next pass
	// even with autovacuum off: without it both tables grow by 10,000 dead
	// rows per UPDATE, and the faster side (the plain one) the fastest.
	benchRowsMultiTable = `CREATE TABLE %s (id int PRIMARY KEY, val bigint NOT NULL, token bigint NOT NULL) WITH (fillfactor = 50)`
	benchRowsRows       = `INSERT INTO %s (id, val, token) SELECT i, 0, 0 FROM generate_series(1, $1::int) AS i`
	benchRowsUpdate     = `UPDATE %s AS t SET val = t.val + 1, token = u.tok FROM unnest($1::int[], $2::bigint[]) AS u(id, tok) WHERE t.id = u.id`
	// EXPLAIN ANALYZE of benchRowsUpdate (rolled back): execution time and
	// per-trigger times.
	benchExplain = `EXPLAIN (ANALYZE, FORMAT JSON) `

	// What the scale scenario reads about fence.lease.
	benchLeaseStats = `SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, pg_relation_size('fence.lease'), autovacuum_count
  FROM pg_stat_user_tables WHERE relid = 'fence.lease'::regclass`
	benchFlushStats = `SELECT pg_stat_force_next_flush()`
	benchClearStats = `SELECT pg_stat_clear_snapshot()`
	benchVacuum     = `VACUUM ANALYZE %s`
)

// bench is one run: its databases, pools and results.
type bench struct {
	g      *globals
	o      benchOptions
	admin  *pgxpool.Pool
	base   *pgxpool.Config // the admin pool's config, to derive others from
	prefix string          // database name prefix of this run
	dbs    []string        // databases created, dropped at the end
	log    *slog.Logger
	report *benchReport
}

func runBench(ctx context.Context, g *globals, o benchOptions) (err error) {
	start := time.Now()
	admin, err := g.connect(ctx)
	if err != nil {
		return err
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	b := &bench{
		g: g, o: o, admin: admin, base: admin.Config(),
		prefix: "pgfence_bench_" + hex.EncodeToString(suffix),
		log:    slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		report: &benchReport{},
	}
	defer b.closePool(admin)
	defer func() {
		// Drop even when ctx was cancelled (Ctrl-C): the bench leaves nothing behind.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, db := range b.dbs {
			if _, derr := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); derr != nil && err == nil {
				err = fmt.Errorf("dropping the bench database %s: %w", db, derr)
			}
		}
	}()

	if err := b.machine(ctx); err != nil {
		return err
	}
	r := b.report
	r.Settings = benchSettings{
		Duration: o.duration.String(), Rounds: o.rounds, Clients: o.clients, Scenario: o.scenario,
		BigResources: o.bigResources, SmallResources: scaleSmall, Waiters: o.waiters,
		PollInterval: o.pollInterval.String(), Database: b.prefix,
	}
	if !g.json {
		fmt.Fprintf(g.stdout, "pgfence bench: pgfence against hand-written SQL, interleaved A B A B, median [min-max] over %d rounds of %s slices\n",
			o.rounds, o.duration)
		fmt.Fprintf(g.stdout, "machine: %d CPUs, %s memory, %s %s/%s; %s\n", r.Machine.CPUs, humanBytes(r.Machine.MemoryBytes),
			r.Machine.GoVersion, r.Machine.GOOS, r.Machine.GOARCH, r.Machine.PostgreSQL)
		fmt.Fprintf(g.stdout, "server settings: %s\n", r.Machine.Settings)
		fmt.Fprintf(g.stdout, "database %s on %s:%d (created for this run, dropped at the end)\n",
			b.prefix, b.base.ConnConfig.Host, b.base.ConnConfig.Port)
	}

	env, err := b.setup(ctx)
	if err != nil {
		return err
	}
	defer env.close()

	for _, name := range benchScenarios {
		if o.scenario != "all" && o.scenario != name {
			continue
		}
		s := &scenarioResult{Name: name}
		sstart := time.Now()
		var serr error
		switch name {
		case "grant":
			serr = b.grantScenario(ctx, env, s)
		case "guarded":
			serr = b.guardedScenario(ctx, env, s)
		case "rows":
			serr = b.rowsScenario(ctx, s)
		case "handoff":
			serr = b.handoffScenario(ctx, env, s)
		case "scale":
			serr = b.scaleScenario(ctx, s)
		case "scaling":
			serr = b.scalingScenario(ctx, env, s)
		}
		if serr != nil {
			s.Error = oneLine(serr)
		}
		for _, c := range s.Comparisons {
			if c.Errors > 0 && s.Error == "" {
				s.Error = fmt.Sprintf("%d operations failed in %s, first: %s", c.Errors, c.Name, c.FirstError)
			}
		}
		s.Seconds = time.Since(sstart).Seconds()
		r.Scenarios = append(r.Scenarios, s)
		if !g.json {
			printScenario(g.stdout, s)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	for _, s := range r.Scenarios {
		if s.Error != "" {
			r.Errors++
		}
		r.Targets = append(r.Targets, s.Targets...)
	}
	if o.chartDir != "" {
		files, err := writeCharts(o.chartDir, r)
		if err != nil {
			return err
		}
		r.Charts = files
	}
	r.ElapsedSeconds = time.Since(start).Seconds()
	if o.scenario == "all" {
		r.Targets = append(r.Targets, benchTarget{Name: "whole run, seconds (before dropping the databases)",
			Value: r.ElapsedSeconds, Target: "<= 120", Met: r.ElapsedSeconds <= 120})
	}
	r.Targets = append(r.Targets, benchTarget{Name: "scenarios with errors", Value: float64(r.Errors), Target: "= 0", Met: r.Errors == 0})
	if g.json {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		printTargets(g.stdout, r)
	}
	if r.Errors > 0 {
		return fmt.Errorf("%d scenario(s) reported errors (see above)", r.Errors)
	}
	return nil
}

// machine records what the figures were measured on.
func (b *bench) machine(ctx context.Context) error {
	m := &b.report.Machine
	m.CPUs = runtime.NumCPU()
	m.GOOS, m.GOARCH, m.GoVersion = runtime.GOOS, runtime.GOARCH, runtime.Version()
	m.MemoryBytes = memTotal()
	if err := b.admin.QueryRow(ctx, `SELECT version()`).Scan(&m.PostgreSQL); err != nil {
		return err
	}
	var parts []string
	for _, name := range []string{"shared_buffers", "fsync", "synchronous_commit", "wal_sync_method", "max_connections", "autovacuum"} {
		var v string
		if err := b.admin.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			return err
		}
		parts = append(parts, name+"="+v)
	}
	m.Settings = strings.Join(parts, " ")
	return nil
}

// memTotal reads MemTotal from /proc/meminfo; 0 where there is none.
func memTotal() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func humanBytes(n int64) string {
	if n <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// createDB creates and migrates a database of this run and returns a pool on
// it with maxConns connections that counts its round trips.
func (b *bench) createDB(ctx context.Context, suffix string, maxConns int32, params map[string]string) (*pgxpool.Pool, *rtCounter, error) {
	name := b.prefix + suffix
	if _, err := b.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, nil, fmt.Errorf("creating the bench database (the role needs CREATEDB): %w", err)
	}
	b.dbs = append(b.dbs, name)
	pool, rt, err := b.openPool(ctx, name, maxConns, params)
	if err != nil {
		return nil, nil, err
	}
	if err := gofence.Migrate(ctx, pool); err != nil {
		b.closePool(pool)
		return nil, nil, err
	}
	return pool, rt, nil
}

// openPool opens a counted pool on database name.
func (b *bench) openPool(ctx context.Context, name string, maxConns int32, params map[string]string) (*pgxpool.Pool, *rtCounter, error) {
	cfg := b.base.Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns = maxConns
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	rt := &rtCounter{}
	rt.instrument(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return pool, rt, nil
}

// poolCloseWait bounds how long closing a pool of the bench waits for
// connections still checked out.
const poolCloseWait = 10 * time.Second

// closePool closes pool. Every connection the bench takes is handed back by
// a deferred release, so Close returns at once; if one ever was not, the
// bench reports it and goes on instead of waiting forever (pgxpool's Close
// waits for every checked-out connection).
func (b *bench) closePool(pool *pgxpool.Pool) {
	done := make(chan struct{})
	go func() { pool.Close(); close(done) }()
	t := time.NewTimer(poolCloseWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		b.log.Error("pgfence bench: a connection was never handed back; not waiting for it (a bug: please report it)",
			"database", pool.Config().ConnConfig.Database, "checked_out", pool.Stat().AcquiredConns())
	}
}

// benchEnv is the main bench database, shared by every scenario but scale.
type benchEnv struct {
	pool   *pgxpool.Pool // synchronous_commit as the server says
	rt     *rtCounter
	client *gofence.Client
	close  func()
}

// grantResources is how many released leases the grant scenarios pick from.
const grantResources = 1000

func (b *bench) setup(ctx context.Context) (*benchEnv, error) {
	maxC := 16
	for _, c := range b.o.clients {
		maxC = max(maxC, c)
	}
	if b.o.scenario == "all" || b.o.scenario == "scaling" {
		maxC = max(maxC, 32)
	}
	pool, rt, err := b.createDB(ctx, "", int32(maxC+8), nil)
	if err != nil {
		return nil, err
	}
	client, err := gofence.New(pool, &gofence.Config{Holder: "pgfence-bench", Logger: b.log})
	if err != nil {
		b.closePool(pool)
		return nil, err
	}
	env := &benchEnv{pool: pool, rt: rt, client: client, close: func() { client.Close(); b.closePool(pool) }}
	stmts := []string{benchLeaseTable}
	for _, t := range []string{"bench_guarded", "bench_unguarded"} {
		stmts = append(stmts, fmt.Sprintf(benchWriteTable, t), fmt.Sprintf(benchWriteRows, t))
	}
	for _, t := range []string{"bench_guarded_tx", "bench_unguarded_tx"} {
		stmts = append(stmts, fmt.Sprintf(benchTxTable, t), fmt.Sprintf(benchTxRows, t))
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			env.close()
			return nil, fmt.Errorf("bench setup: %w", err)
		}
	}
	for _, p := range [][2]string{{"bench_guarded", "token"}, {"bench_guarded_tx", ""}} {
		if err := sqlfuncs.Protect(ctx, pool, p[0], guardResource, p[1]); err != nil {
			env.close()
			return nil, err
		}
	}
	if err := prefill(ctx, pool, "grant-", grantResources, true); err != nil {
		env.close()
		return nil, err
	}
	return env, nil
}

// prefill inserts n released leases named prefix1..prefixN into fence.lease
// (and, with hand, into bench_lease), then vacuums and analyzes.
func prefill(ctx context.Context, pool *pgxpool.Pool, prefix string, n int, hand bool) error {
	if _, err := pool.Exec(ctx, benchPrefillKit, prefix, n); err != nil {
		return fmt.Errorf("filling fence.lease: %w", err)
	}
	tables := "fence.lease"
	if hand {
		if _, err := pool.Exec(ctx, benchPrefillHand, prefix, n); err != nil {
			return fmt.Errorf("filling bench_lease: %w", err)
		}
		tables += ", bench_lease"
	}
	_, err := pool.Exec(ctx, fmt.Sprintf(benchVacuum, tables))
	return err
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

// benchReport is the JSON document of --json, and what the table shows.
type benchReport struct {
	Machine        benchMachine      `json:"machine"`
	Settings       benchSettings     `json:"settings"`
	Scenarios      []*scenarioResult `json:"scenarios"`
	Targets        []benchTarget     `json:"targets"`
	Charts         []string          `json:"charts,omitempty"`
	ElapsedSeconds float64           `json:"elapsed_seconds"`
	Errors         int               `json:"errors"`
}

type benchMachine struct {
	CPUs        int    `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	GoVersion   string `json:"go_version"`
	PostgreSQL  string `json:"postgresql"`
	Settings    string `json:"server_settings"`
}

type benchSettings struct {
	Duration       string `json:"duration"`
	Rounds         int    `json:"rounds"`
	Clients        []int  `json:"clients,omitempty"`
	Scenario       string `json:"scenario"`
	SmallResources int    `json:"small_resources"`
	BigResources   int    `json:"big_resources"`
	Waiters        int    `json:"waiters"`
	PollInterval   string `json:"poll_interval"`
	Database       string `json:"database"`
}

// scenarioResult is what one scenario measured.
type scenarioResult struct {
	Name        string          `json:"name"`
	Comparisons []*comparison   `json:"comparisons,omitempty"`
	Latencies   []latencyResult `json:"latencies,omitempty"`
	Facts       []benchFact     `json:"facts,omitempty"`
	Targets     []benchTarget   `json:"targets,omitempty"`
	Notes       []string        `json:"notes,omitempty"`
	Error       string          `json:"error,omitempty"`
	Seconds     float64         `json:"seconds"`
}

// comparison is workload A (ours) against workload B (the baseline):
// throughput of each and the ratio A/B, per round, summarised.
type comparison struct {
	Name       string  `json:"name"`
	A          string  `json:"a"`
	B          string  `json:"b"`
	Clients    int     `json:"clients"`
	AOps       summary `json:"a_ops_per_sec"`
	BOps       summary `json:"b_ops_per_sec"`
	Ratio      summary `json:"ratio"`
	Errors     int64   `json:"errors"`
	Held       int64   `json:"held"` // random picks that found the resource held (not errors)
	FirstError string  `json:"first_error,omitempty"`
}

// summary is the median and spread of one figure over the rounds.
type summary struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Rounds []float64 `json:"rounds"`
}

// latencyResult is a latency distribution (milliseconds).
type latencyResult struct {
	Name    string    `json:"name"`
	N       int       `json:"n"`
	P50Ms   float64   `json:"p50_ms"`
	P90Ms   float64   `json:"p90_ms"`
	P99Ms   float64   `json:"p99_ms"`
	MaxMs   float64   `json:"max_ms"`
	Samples []float64 `json:"-"` // sorted, for the chart
}

// benchFact is a single measured number.
type benchFact struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

// benchTarget is a figure held against its target (docs/benchmarks.md).
type benchTarget struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Target string  `json:"target"`
	Met    bool    `json:"met"`
}

func (s *scenarioResult) fact(name string, v float64, unit string) {
	s.Facts = append(s.Facts, benchFact{Name: name, Value: v, Unit: unit})
}

// atLeast and atMost record a target.
func (s *scenarioResult) atLeast(name string, v, target float64) {
	s.Targets = append(s.Targets, benchTarget{Name: name, Value: v, Target: ">= " + trimFloat(target), Met: v >= target})
}

// relative records the target v >= ref + delta, where ref is a figure
// measured in the same run (the target moves with it).
func (s *scenarioResult) relative(name string, v, ref, delta float64) {
	target := ref + delta
	s.Targets = append(s.Targets, benchTarget{Name: name, Value: v,
		Target: fmt.Sprintf(">= %.3f (%.3f %+g)", target, ref, delta), Met: v >= target})
}

func (s *scenarioResult) atMost(name string, v, target float64) {
	s.Targets = append(s.Targets, benchTarget{Name: name, Value: v, Target: "<= " + trimFloat(target), Met: v <= target})
}

func (s *scenarioResult) exactly(name string, v, target float64) {
	s.Targets = append(s.Targets, benchTarget{Name: name, Value: v, Target: "= " + trimFloat(target), Met: v == target})
}

func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func printScenario(w io.Writer, s *scenarioResult) {
	fmt.Fprintf(w, "\n== %s (%.1fs) ==\n", s.Name, s.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(s.Comparisons) > 0 {
		fmt.Fprintln(tw, "comparison\tclients\tA ops/s\tB ops/s\tratio A/B median [min-max]\terrors")
		for _, c := range s.Comparisons {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.3f [%.3f-%.3f]\t%d\n", c.Name, c.Clients, c.AOps.Median, c.BOps.Median,
				c.Ratio.Median, c.Ratio.Min, c.Ratio.Max, c.Errors)
		}
		fmt.Fprintln(tw)
	}
	if len(s.Latencies) > 0 {
		fmt.Fprintln(tw, "latency\tn\tp50 ms\tp90 ms\tp99 ms\tmax ms")
		for _, l := range s.Latencies {
			fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\n", l.Name, l.N, l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs)
		}
		fmt.Fprintln(tw)
	}
	if len(s.Facts) > 0 {
		fmt.Fprintln(tw, "measure\tvalue\tunit")
		for _, f := range s.Facts {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Name, strconv.FormatFloat(f.Value, 'f', -1, 64), f.Unit)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	for _, n := range s.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if s.Error != "" {
		fmt.Fprintf(w, "ERROR: %s\n", s.Error)
	}
}

func printTargets(w io.Writer, r *benchReport) {
	fmt.Fprintf(w, "\n== targets (docs/benchmarks.md) ==\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tvalue\tneeds\tmet")
	for _, t := range r.Targets {
		met := "yes"
		if !t.Met {
			met = "NO"
		}
		fmt.Fprintf(tw, "%s\t%.3f\t%s\t%s\n", t.Name, t.Value, t.Target, met)
	}
	_ = tw.Flush()
	for _, c := range r.Charts {
		fmt.Fprintf(w, "chart: %s\n", c)
	}
	fmt.Fprintf(w, "scenario errors: %d; elapsed %.1fs\n", r.Errors, r.ElapsedSeconds)
}
