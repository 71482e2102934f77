// Package bench is pgfence bench: it measures pgfence's own path (gofence
// and the SQL kit) side by side with the SQL a careful engineer would write
// by hand without fencing, on the server it is pointed at, and holds the
// figures against the targets of docs/benchmarks.md.
//
// Every figure is a ratio of two workloads run interleaved (A B A B ...) in
// one process on the same database, with the median and the spread over the
// rounds. The bench works in databases of its own (pgfence_bench_XXXX,
// migrated with the embedded migrations and dropped at the end). Its SQL is
// its own workload (the hand-written baselines, its tables and fixtures);
// every call of a kit function goes through gofence or sqlfuncs.
//
// The CLI's bench command parses its flags into an [Options] and calls
// [Run]; the charts (SVG) are drawn here too.
package bench

import (
	"context"
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
	"golang.org/x/sync/errgroup"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Scenarios are the scenario names, in the order they run.
var Scenarios = []string{"grant", "guarded", "rows", "handoff", "scale", "scaling"}

// Options say what a run measures and how long. The CLI checks the ranges
// of its flags before it calls [Run]; Run takes the values as they are.
type Options struct {
	// Duration is the length of one workload slice.
	Duration time.Duration
	// Rounds is the number of rounds of interleaved slices (A B A B ...);
	// figures are the median over rounds.
	Rounds int
	// Clients overrides the client counts of grant and scaling; guarded,
	// rows and scale use the largest up to 4. Nil for the defaults.
	Clients []int
	// Scenario is "all" or one of [Scenarios].
	Scenario string
	// ChartDir is where to write the SVG charts; "" for none.
	ChartDir string
	// BigResources is the number of rows in the lease table for the big side
	// of the scale scenario.
	BigResources int
	// Waiters is the number of clients waiting for the lease in the handoff
	// scenario.
	Waiters int
	// PollInterval is the gofence PollInterval of the polling-only handoff.
	PollInterval time.Duration
	// Out receives the report as text while the run goes on (a header, each
	// scenario as it ends, then the targets); nil for none.
	Out io.Writer
	// Log receives the warnings of the gofence clients of the bench and its
	// own (a connection never handed back); nil for none.
	Log io.Writer
}

// ErrScenarios is returned, with the report, when a scenario reported an
// error (the report says which).
type ErrScenarios struct {
	// N is the number of scenarios that reported an error.
	N int
}

// Error says how many scenarios reported errors.
func (e ErrScenarios) Error() string {
	return fmt.Sprintf("%d scenario(s) reported errors (see above)", e.N)
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

	// Released leases in the hand-written table as fixtures, so that grants
	// find existing rows (the steady state of a long-running system). The
	// kit's table is filled through the kit's own functions (prefill).
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
	o      Options
	admin  *pgxpool.Pool
	base   *pgxpool.Config // the admin pool's config, to derive others from
	prefix string          // database name prefix of this run
	dbs    []benchDB       // databases created, dropped at the end
	log    *slog.Logger
	report *Report
}

// benchDB is a database of the run and the function that drops it.
type benchDB struct {
	name string
	drop func(context.Context) error
}

// Run runs the scenarios o asks for on the server of admin, a pool whose
// role has CREATEDB (the bench derives the pools of its own databases from
// admin's configuration; the caller keeps admin and closes it). It returns
// the report once every scenario has run, and with it an [ErrScenarios] if
// any reported an error; on a setup error or a cancelled ctx it returns no
// report. The databases it created are dropped in every case, even when ctx
// was cancelled.
func Run(ctx context.Context, admin *pgxpool.Pool, o Options) (_ *Report, err error) {
	start := time.Now()
	logOut := o.Log
	if logOut == nil {
		logOut = io.Discard
	}
	b := &bench{
		o: o, admin: admin, base: admin.Config(),
		prefix: pgcluster.ScratchName("pgfence_bench_", 4),
		log:    slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelWarn})),
		report: &Report{},
	}
	defer func() {
		// Dropped even when ctx was cancelled (Ctrl-C): the bench leaves nothing behind.
		for _, db := range b.dbs {
			if derr := db.drop(ctx); derr != nil && err == nil {
				err = fmt.Errorf("dropping the bench database %s: %w", db.name, derr)
			}
		}
	}()

	if err := b.machine(ctx); err != nil {
		return nil, err
	}
	r := b.report
	r.Settings = Settings{
		Duration: o.Duration.String(), Rounds: o.Rounds, Clients: o.Clients, Scenario: o.Scenario,
		BigResources: o.BigResources, SmallResources: scaleSmall, Waiters: o.Waiters,
		PollInterval: o.PollInterval.String(), Database: b.prefix,
	}
	if w := o.Out; w != nil {
		fmt.Fprintf(w, "pgfence bench: pgfence against hand-written SQL, interleaved A B A B, median [min-max] over %d rounds of %s slices\n",
			o.Rounds, o.Duration)
		fmt.Fprintf(w, "machine: %d CPUs, %s memory, %s %s/%s; %s\n", r.Machine.CPUs, humanBytes(r.Machine.MemoryBytes),
			r.Machine.GoVersion, r.Machine.GOOS, r.Machine.GOARCH, r.Machine.PostgreSQL)
		fmt.Fprintf(w, "server settings: %s\n", r.Machine.Settings)
		fmt.Fprintf(w, "database %s on %s:%d (created for this run, dropped at the end)\n",
			b.prefix, b.base.ConnConfig.Host, b.base.ConnConfig.Port)
	}

	env, err := b.setup(ctx)
	if err != nil {
		return nil, err
	}
	defer env.close()

	for _, name := range Scenarios {
		if o.Scenario != "all" && o.Scenario != name {
			continue
		}
		s := &ScenarioResult{Name: name}
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
		if o.Out != nil {
			printScenario(o.Out, s)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}

	for _, s := range r.Scenarios {
		if s.Error != "" {
			r.Errors++
		}
		r.Targets = append(r.Targets, s.Targets...)
	}
	if o.ChartDir != "" {
		files, err := writeCharts(o.ChartDir, r)
		if err != nil {
			return nil, err
		}
		r.Charts = files
	}
	r.ElapsedSeconds = time.Since(start).Seconds()
	if o.Scenario == "all" {
		r.Targets = append(r.Targets, Target{Name: "whole run, seconds (before dropping the databases)",
			Value: r.ElapsedSeconds, Target: "<= 120", Met: r.ElapsedSeconds <= 120})
	}
	r.Targets = append(r.Targets, Target{Name: "scenarios with errors", Value: float64(r.Errors), Target: "= 0", Met: r.Errors == 0})
	if o.Out != nil {
		printTargets(o.Out, r)
	}
	if r.Errors > 0 {
		return r, ErrScenarios{N: r.Errors}
	}
	return r, nil
}

// oneLine is err's message on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
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
	drop, err := pgcluster.CreateDB(ctx, b.admin, name, "")
	if err != nil {
		return nil, nil, fmt.Errorf("creating the bench database (the role needs CREATEDB): %w", err)
	}
	b.dbs = append(b.dbs, benchDB{name: name, drop: drop})
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

// closeClient closes a bench client, waiting at most poolCloseWait for
// the acquires it may still have in flight (the bench hands every lease
// back itself).
func closeClient(c *gofence.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), poolCloseWait)
	defer cancel()
	_ = c.Close(ctx)
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
	for _, c := range b.o.Clients {
		maxC = max(maxC, c)
	}
	if b.o.Scenario == "all" || b.o.Scenario == "scaling" {
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
	env := &benchEnv{pool: pool, rt: rt, client: client, close: func() { closeClient(client); b.closePool(pool) }}
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

// prefill makes n released leases named prefix1..prefixN in fence.lease
// (and, with hand, the same rows in bench_lease), then vacuums and analyzes.
// fence.lease is written only by the kit's own functions (migration 002
// dropped its CHECK constraints on that ground), so each lease is granted
// with fence.acquire and ended with fence.release: grantBatch of them to a
// transaction, prefillWorkers transactions at a time on disjoint ranges.
func prefill(ctx context.Context, pool *pgxpool.Pool, prefix string, n int, hand bool) error {
	batch := func(ctx context.Context, first, last int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for id := first; id <= last; id++ {
				res := prefix + strconv.Itoa(id)
				tok, ok, err := sqlfuncs.Acquire(ctx, tx, res, "bench-prefill", benchTTL)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("resource %s is held: the bench database should be new", res)
				}
				if ok, err := sqlfuncs.Release(ctx, tx, res, tok); err != nil || !ok {
					return cmpErr(err, fmt.Errorf("releasing %s did not end its lease", res))
				}
			}
			return nil
		})
	}
	// The first batch alone: the first grant in a new database validates the
	// epoch state and holds it until its transaction commits, and a grant that
	// finds it held waits at most fence.grant_wait (then it is busy).
	if err := batch(ctx, 1, min(grantBatch, n)); err != nil {
		return fmt.Errorf("filling fence.lease: %w", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(prefillWorkers)
	for first := grantBatch + 1; first <= n; first += grantBatch {
		last := min(first+grantBatch-1, n)
		g.Go(func() error { return batch(gctx, first, last) })
	}
	if err := g.Wait(); err != nil {
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

// prefillWorkers is how many transactions of prefill run at a time (the
// pools of the bench have at least four connections to spare).
const prefillWorkers = 4

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

// Report is what a run measured: the JSON document of pgfence bench --json,
// and what its tables show.
type Report struct {
	Machine        Machine           `json:"machine"`          // what the figures were measured on
	Settings       Settings          `json:"settings"`         // the options of the run
	Scenarios      []*ScenarioResult `json:"scenarios"`        // in the order they ran
	Targets        []Target          `json:"targets"`          // every scenario's targets, then the run's own
	Charts         []string          `json:"charts,omitempty"` // the SVG files written (Options.ChartDir)
	ElapsedSeconds float64           `json:"elapsed_seconds"`  // the whole run, before dropping its databases
	Errors         int               `json:"errors"`           // scenarios that reported an error
}

// Machine is what the figures were measured on.
type Machine struct {
	CPUs        int    `json:"cpus"`            // runtime.NumCPU of the bench's process
	MemoryBytes int64  `json:"memory_bytes"`    // MemTotal of /proc/meminfo; 0 where there is none
	GOOS        string `json:"goos"`            // runtime.GOOS
	GOARCH      string `json:"goarch"`          // runtime.GOARCH
	GoVersion   string `json:"go_version"`      // runtime.Version
	PostgreSQL  string `json:"postgresql"`      // the server's version()
	Settings    string `json:"server_settings"` // a few server settings that move the figures, name=value
}

// Settings are the options of the run, as the report states them.
type Settings struct {
	Duration       string `json:"duration"`          // Options.Duration
	Rounds         int    `json:"rounds"`            // Options.Rounds
	Clients        []int  `json:"clients,omitempty"` // Options.Clients
	Scenario       string `json:"scenario"`          // Options.Scenario
	SmallResources int    `json:"small_resources"`   // the small side of scale
	BigResources   int    `json:"big_resources"`     // Options.BigResources
	Waiters        int    `json:"waiters"`           // Options.Waiters
	PollInterval   string `json:"poll_interval"`     // Options.PollInterval
	Database       string `json:"database"`          // the name (prefix) of the run's databases
}

// ScenarioResult is what one scenario measured.
type ScenarioResult struct {
	Name        string        `json:"name"`                  // one of Scenarios
	Comparisons []*Comparison `json:"comparisons,omitempty"` // workload pairs, A against B
	Latencies   []Latency     `json:"latencies,omitempty"`   // latency distributions
	Facts       []Fact        `json:"facts,omitempty"`       // single measured numbers
	Targets     []Target      `json:"targets,omitempty"`     // figures held against docs/benchmarks.md
	Notes       []string      `json:"notes,omitempty"`       // how it was measured
	Error       string        `json:"error,omitempty"`       // what went wrong, on one line; "" if nothing
	Seconds     float64       `json:"seconds"`               // how long the scenario ran
}

// Comparison is workload A (ours) against workload B (the baseline):
// throughput of each and the ratio A/B, per round, summarised.
type Comparison struct {
	key        cmpKey  // what the bench's code looks it up by; not in the JSON
	Name       string  `json:"name"`                  // what is compared
	A          string  `json:"a"`                     // workload A (pgfence's path)
	B          string  `json:"b"`                     // workload B (the baseline)
	Clients    int     `json:"clients"`               // concurrent clients of each side
	AOps       Summary `json:"a_ops_per_sec"`         // A's operations per second
	BOps       Summary `json:"b_ops_per_sec"`         // B's operations per second
	Ratio      Summary `json:"ratio"`                 // A/B, round by round
	Errors     int64   `json:"errors"`                // failed operations, both sides
	Held       int64   `json:"held"`                  // random picks that found the resource held (not errors)
	FirstError string  `json:"first_error,omitempty"` // the first failure, on one line
}

// Summary is the median and spread of one figure over the rounds.
type Summary struct {
	Median float64   `json:"median"` // median over the rounds
	Min    float64   `json:"min"`    // lowest round
	Max    float64   `json:"max"`    // highest round
	Rounds []float64 `json:"rounds"` // each round, in order, to three decimals
}

// Latency is a latency distribution (milliseconds).
type Latency struct {
	Name    string    `json:"name"`   // what was timed
	N       int       `json:"n"`      // samples
	P50Ms   float64   `json:"p50_ms"` // median
	P90Ms   float64   `json:"p90_ms"` // 90th percentile (nearest rank)
	P99Ms   float64   `json:"p99_ms"` // 99th percentile (nearest rank)
	MaxMs   float64   `json:"max_ms"` // slowest sample
	Samples []float64 `json:"-"`      // every sample, sorted, for the chart
}

// Fact is a single measured number.
type Fact struct {
	Name  string  `json:"name"`  // what was measured
	Value float64 `json:"value"` // the figure
	Unit  string  `json:"unit"`  // its unit, with any context
}

// Target is a figure held against its target (docs/benchmarks.md).
type Target struct {
	Name   string  `json:"name"`   // the figure
	Value  float64 `json:"value"`  // as measured
	Target string  `json:"target"` // what it needs, e.g. ">= 0.85"
	Met    bool    `json:"met"`    // whether Value meets Target
}

func (s *ScenarioResult) fact(name string, v float64, unit string) {
	s.Facts = append(s.Facts, Fact{Name: name, Value: v, Unit: unit})
}

// atLeast and atMost record a target.
func (s *ScenarioResult) atLeast(name string, v, target float64) {
	s.Targets = append(s.Targets, Target{Name: name, Value: v, Target: ">= " + trimFloat(target), Met: v >= target})
}

// relative records the target v >= ref + delta, where ref is a figure
// measured in the same run (the target moves with it).
func (s *ScenarioResult) relative(name string, v, ref, delta float64) {
	target := ref + delta
	s.Targets = append(s.Targets, Target{Name: name, Value: v,
		Target: fmt.Sprintf(">= %.3f (%.3f %+g)", target, ref, delta), Met: v >= target})
}

func (s *ScenarioResult) atMost(name string, v, target float64) {
	s.Targets = append(s.Targets, Target{Name: name, Value: v, Target: "<= " + trimFloat(target), Met: v <= target})
}

func (s *ScenarioResult) exactly(name string, v, target float64) {
	s.Targets = append(s.Targets, Target{Name: name, Value: v, Target: "= " + trimFloat(target), Met: v == target})
}

func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func printScenario(w io.Writer, s *ScenarioResult) {
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

func printTargets(w io.Writer, r *Report) {
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
