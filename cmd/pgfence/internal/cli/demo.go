package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/sqlfuncs"
)

func newDemoCmd(g *globals) *cobra.Command {
	var (
		ttl       time.Duration
		throwaway bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show a paused worker being fenced off, against a real database",
		Long: `demo runs the story pgfence exists for, twice, against a real database:
worker A acquires a lease and starts writing; A pauses (a simulated GC pause)
past its TTL; worker B is granted a larger token and writes its result; A wakes
and writes with its old token. On a table protected by fence.protect the
database refuses A's write (SQLSTATE FN001) and B's result survives. On an
unprotected table A's write silently overwrites B's: the lost update fencing
prevents.

Then the same story on the rows of one table protected by fence.protect_rows,
where each row is a resource of its own (row 1 is "job:1"): A holds job:1 and
B holds job:2; A pauses past its TTL, worker C is granted job:1 and writes row
1, and the database refuses A's write to row 1 while B, whose lease nobody
took, keeps writing row 2 with its token before and after.

The demo works in a database of its own (pgfence_demo_XXXX, created and dropped
by the demo), so it leaves nothing behind in yours. The role needs CREATEDB.

When no connection was configured and nothing answers at the default
address, or with --throwaway, the demo starts a throwaway cluster from the
PostgreSQL server binaries installed on this machine (initdb, pg_ctl), says
so, and removes it at the end.`,
		Example: `  pgfence demo
  pgfence demo --database-url postgres://postgres@localhost:5432/postgres --ttl 2s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl < 10*time.Millisecond || ttl > time.Minute {
				return usageError{fmt.Errorf("--ttl must be between 10ms and 1m")}
			}
			return runDemo(cmd.Context(), g, ttl, throwaway)
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Second, "TTL of the workers' leases (A pauses past it)")
	cmd.Flags().BoolVar(&throwaway, "throwaway", false, "run against a throwaway cluster started from local PostgreSQL binaries")
	return cmd
}

// startThrowaway starts a cluster from this machine's PostgreSQL binaries and
// returns its superuser URL and the function that removes it.
func startThrowaway(ctx context.Context, log io.Writer) (string, func(), error) {
	bins, err := pgcluster.LocalBins("")
	if err != nil {
		return "", nil, fmt.Errorf("no local PostgreSQL binaries to start a throwaway cluster: %w", err)
	}
	inst, err := pgcluster.StartThrowaway(ctx, bins, nil)
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintf(log, "pgfence demo: started a throwaway PostgreSQL cluster from %s on 127.0.0.1:%d (in %s; removed at the end)\n",
		bins.Dir, inst.Port, inst.Base)
	return inst.URL("postgres"), inst.Destroy, nil
}

// The demo's own SQL: its tables. Everything that calls the kit goes through
// sqlfuncs: the demo plays two workers by hand, and worker A must not renew
// while it is "paused", which a gofence.Lease (it renews itself in the
// background) would do. Applications use gofence.
const (
	demoTableSQL = `CREATE TABLE %s (job text PRIMARY KEY, worker text NOT NULL, result text NOT NULL, token bigint NOT NULL)`
	demoInsert   = `INSERT INTO %s (job, worker, result, token) VALUES ($1, $2, $3, $4)`
	demoUpdate   = `UPDATE %s SET worker = $2, result = $3, token = $4 WHERE job = $1`
	demoRows     = `SELECT job, worker, result, token FROM %s ORDER BY job`

	// The per-row story's table: the resource of a row is 'job:' || id, and
	// each write presents the token of its row's resource in column tok.
	demoJobTable  = `CREATE TABLE job (id integer PRIMARY KEY, worker text NOT NULL, result text NOT NULL, tok bigint NOT NULL)`
	demoJobInsert = `INSERT INTO job (id, worker, result, tok) VALUES ($1, $2, $3, $4)`
	demoJobUpdate = `UPDATE job SET worker = $2, result = $3, tok = $4 WHERE id = $1`
	demoJobRows   = `SELECT id::text, worker, result, tok FROM job ORDER BY id`
)

func runDemo(ctx context.Context, g *globals, ttl time.Duration, throwaway bool) (err error) {
	var admin *pgxpool.Pool
	if !throwaway {
		admin, err = g.connect(ctx)
		var cerr *connectError
		if errors.As(err, &cerr) && cerr.unreachable && g.connString() == DefaultDatabaseURL {
			fmt.Fprintf(g.stderr, "pgfence demo: no PostgreSQL answered at %s; trying a throwaway cluster\n", DefaultDatabaseURL)
			throwaway = true
		} else if err != nil {
			return err
		}
	}
	if throwaway {
		url, stop, terr := startThrowaway(ctx, g.stderr)
		if terr != nil {
			if err != nil {
				return fmt.Errorf("%w; and no throwaway cluster either: %w", err, terr)
			}
			return terr
		}
		defer stop()
		if admin, err = connectTo(ctx, url); err != nil {
			return err
		}
	}
	defer closePool(admin)

	dbName, drop, err := pgcluster.CreateScratchDB(ctx, admin, "pgfence_demo_")
	if err != nil {
		return fmt.Errorf("creating the demo database (the role needs CREATEDB): %w", err)
	}
	defer func() {
		// Dropped even when ctx was cancelled (Ctrl-C): the demo leaves nothing behind.
		if derr := drop(ctx); derr != nil && err == nil {
			err = fmt.Errorf("dropping the demo database %s: %w", dbName, derr)
		}
	}()

	cfg := admin.Config().Copy()
	cfg.ConnConfig.Database = dbName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer closePool(pool)

	// With --json the timeline is collected and printed as one document at
	// the end; otherwise it is printed as it happens.
	out := g.stdout
	if g.json {
		out = io.Discard
	}
	report := demoJSON{Database: dbName}
	fmt.Fprintf(out, "pgfence demo: a paused worker against a fenced table\n")
	fmt.Fprintf(out, "database %s on %s:%d (created for this demo, dropped at the end)\n",
		dbName, cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	if err := gofence.Migrate(ctx, pool); err != nil {
		return err
	}
	for _, tbl := range []string{"report", "report_unprotected"} {
		if _, err := pool.Exec(ctx, fmt.Sprintf(demoTableSQL, tbl)); err != nil {
			return err
		}
	}
	if err := sqlfuncs.Protect(ctx, pool, "report", "nightly-report", "token"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, demoJobTable); err != nil {
		return err
	}
	if err := sqlfuncs.ProtectRows(ctx, pool, "job", "id", "job:", "tok"); err != nil {
		return err
	}

	fmt.Fprintf(out, "\n== 1. Protected table \"report\" (fence.protect('report', 'nightly-report', 'token')) ==\n")
	protected := storyJSON{Table: "report", Protected: true, Form: "table"}
	refused, err := demoStory(ctx, out, pool, "report", "nightly-report", ttl, &protected)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== 2. The same story on an unprotected table \"report_unprotected\" ==\n")
	plain := storyJSON{Table: "report_unprotected"}
	refusedPlain, err := demoStory(ctx, out, pool, "report_unprotected", "nightly-report-2", ttl, &plain)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\n== 3. A lease per row: table \"job\" (fence.protect_rows('job', 'id', 'job:', 'tok')) ==\n")
	perRow := storyJSON{Table: "job", Protected: true, Form: "rows"}
	refusedRow, err := demoRowsStory(ctx, out, pool, ttl, &perRow)
	if err != nil {
		return err
	}
	report.Stories = []storyJSON{protected, plain, perRow}
	report.Fenced = refused && !refusedPlain && refusedRow
	if g.json {
		if err := g.emit(report, nil); err != nil {
			return err
		}
	}

	fmt.Fprintln(out)
	switch {
	case report.Fenced:
		fmt.Fprintln(out, "Result: with fencing, the database refused A's stale write and B's result survived;")
		fmt.Fprintln(out, "without it, A silently overwrote B's newer result (a lost update). With a lease per")
		fmt.Fprintln(out, "row, A's stale write to row 1 was refused while B kept writing row 2.")
		return nil
	default:
		return errors.New("the demo did not behave as expected: the protected tables should refuse A's stale write and the unprotected one should not")
	}
}

// demoJSON is the --json shape of pgfence demo.
type demoJSON struct {
	Database string      `json:"database"`
	Stories  []storyJSON `json:"stories"`
	// Fenced: the protected tables (fence.protect and fence.protect_rows)
	// refused A's stale write and the unprotected one did not.
	Fenced bool `json:"fenced"`
}

type storyJSON struct {
	Table     string `json:"table"`
	Protected bool   `json:"protected"`
	// Form is how the table is protected, as in fence.protected: "table"
	// (one resource, fence.protect) or "rows" (a resource per row,
	// fence.protect_rows); empty when it is not.
	Form    string       `json:"form,omitempty"`
	Steps   []stepJSON   `json:"steps"`
	Refused *refusalJSON `json:"refused,omitempty"`
	Rows    []demoRow    `json:"rows"`
}

type stepJSON struct {
	AtSeconds float64 `json:"at_seconds"`
	Worker    string  `json:"worker"`
	Action    string  `json:"action"`
	Outcome   string  `json:"outcome"`
}

type refusalJSON struct {
	SQLState string `json:"sqlstate"`
	Message  string `json:"message"`
}

// demoRow is a row of a story's table. In the per-row story Job is the row's
// id and Token its column tok.
type demoRow struct {
	Job    string `json:"job"`
	Worker string `json:"worker"`
	Result string `json:"result"`
	Token  int64  `json:"token"`
}

// timeline prints a story's steps as they happen and records them.
type timeline struct {
	out   io.Writer
	rep   *storyJSON
	start time.Time
}

func newTimeline(out io.Writer, rep *storyJSON) *timeline {
	return &timeline{out: out, rep: rep, start: time.Now()}
}

func (tl *timeline) step(who, what, outcome string) {
	at := time.Since(tl.start).Seconds()
	tl.rep.Steps = append(tl.rep.Steps, stepJSON{AtSeconds: at, Worker: who, Action: what, Outcome: outcome})
	line := fmt.Sprintf("  %8s  %s  %-50s %s", fmt.Sprintf("+%.3fs", at), who, what, outcome)
	fmt.Fprintln(tl.out, strings.TrimRight(line, " "))
}

// refusal records and prints the database's refusal of a write.
func (tl *timeline) refusal(who, what string, pgErr *pgconn.PgError) {
	tl.step(who, what, "REFUSED by the database")
	tl.rep.Refused = &refusalJSON{SQLState: pgErr.Code, Message: pgErr.Message}
	fmt.Fprintf(tl.out, "             SQLSTATE %s: %s\n", pgErr.Code, pgErr.Message)
}

// acquireAfterExpiry asks for resource until the server's clock says the
// previous holder's lease has expired.
func (tl *timeline) acquireAfterExpiry(ctx context.Context, pool *pgxpool.Pool, who, resource, holder, heldBy string, ttl time.Duration) (int64, error) {
	for tries := 0; ; tries++ {
		tok, ok, err := sqlfuncs.Acquire(ctx, pool, resource, holder, ttl*10)
		if err != nil {
			return 0, err
		}
		if ok {
			tl.step(who, fmt.Sprintf("acquire %q", resource), fmt.Sprintf("granted token %d (%s's lease expired by the server clock)", tok, heldBy))
			return tok, nil
		}
		if tries == 0 {
			tl.step(who, fmt.Sprintf("acquire %q", resource), fmt.Sprintf("held by %s: %s waits", heldBy, who))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(ttl / 20):
		}
	}
}

// printRows reads a story's rows with query, records and prints them under
// header (the table's column names).
func printRows(ctx context.Context, out io.Writer, pool *pgxpool.Pool, table, query, header string, rep *storyJSON) error {
	rows, err := pool.Query(ctx, query)
	if err != nil {
		return err
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[demoRow])
	if err != nil {
		return err
	}
	rep.Rows = all
	fmt.Fprintf(out, "  rows of %s at the end:\n", table)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "    "+header)
	for _, r := range all {
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%d\n", r.Job, r.Worker, r.Result, r.Token)
	}
	return tw.Flush()
}

// demoStory plays the story on one table and reports whether the database
// refused A's stale write.
func demoStory(ctx context.Context, out io.Writer, pool *pgxpool.Pool, table, resource string, ttl time.Duration, rep *storyJSON) (refused bool, err error) {
	tl := newTimeline(out, rep)
	step := tl.step

	tokA, ok, err := sqlfuncs.Acquire(ctx, pool, resource, "worker-A", ttl)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, fmt.Errorf("worker A was not granted %s", resource)
	}
	step("A", fmt.Sprintf("acquire %q ttl=%s", resource, ttl), fmt.Sprintf("granted token %d", tokA))
	if _, err := pool.Exec(ctx, fmt.Sprintf(demoInsert, table), "nightly", "worker-A", "draft by A", tokA); err != nil {
		return false, err
	}
	step("A", fmt.Sprintf("INSERT draft with token %d", tokA), "accepted")
	step("A", "pauses (a simulated GC pause longer than its TTL)", "")

	tokB, err := tl.acquireAfterExpiry(ctx, pool, "B", resource, "worker-B", "A", ttl)
	if err != nil {
		return false, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(demoUpdate, table), "nightly", "worker-B", "final by B", tokB); err != nil {
		return false, err
	}
	step("B", fmt.Sprintf("UPDATE result with token %d", tokB), "accepted")

	_, err = pool.Exec(ctx, fmt.Sprintf(demoUpdate, table), "nightly", "worker-A", "final by A (stale)", tokA)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		step("A", fmt.Sprintf("wakes, UPDATE result with token %d", tokA), "accepted  <- lost update: B's result is gone")
	case errors.As(err, &pgErr):
		refused = true
		tl.refusal("A", fmt.Sprintf("wakes, UPDATE result with token %d", tokA), pgErr)
	default:
		return false, err
	}
	if _, err := sqlfuncs.Release(ctx, pool, resource, tokB); err != nil {
		return false, err
	}
	return refused, printRows(ctx, out, pool, table, fmt.Sprintf(demoRows, table), "job\tworker\tresult\ttoken", rep)
}

// demoRowsStory plays the story on two rows of the table job, each row a
// resource of its own: A holds job:1 and pauses past its TTL, C is granted
// job:1 and writes row 1, A wakes and writes row 1 with its old token; B
// holds job:2 throughout and writes row 2 before and after. It reports
// whether the database refused A's stale write; a refusal of B's writes or
// C's is an error.
func demoRowsStory(ctx context.Context, out io.Writer, pool *pgxpool.Pool, ttl time.Duration, rep *storyJSON) (refused bool, err error) {
	tl := newTimeline(out, rep)
	write := func(who, what, sql string, id int, result string, tok int64) error {
		if _, err := pool.Exec(ctx, sql, id, "worker-"+who, result, tok); err != nil {
			return fmt.Errorf("worker %s: %s: %w", who, what, err)
		}
		tl.step(who, what, "accepted")
		return nil
	}

	tokA, ok, err := sqlfuncs.Acquire(ctx, pool, "job:1", "worker-A", ttl)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, errors.New("worker A was not granted job:1")
	}
	tl.step("A", fmt.Sprintf("acquire %q ttl=%s", "job:1", ttl), fmt.Sprintf("granted token %d", tokA))
	// B's lease outlives the whole story: nobody takes job:2 from B.
	tokB, ok, err := sqlfuncs.Acquire(ctx, pool, "job:2", "worker-B", ttl*10)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, errors.New("worker B was not granted job:2")
	}
	tl.step("B", fmt.Sprintf("acquire %q ttl=%s", "job:2", ttl*10), fmt.Sprintf("granted token %d", tokB))
	if err := write("A", fmt.Sprintf("INSERT row 1 with token %d", tokA), demoJobInsert, 1, "draft by A", tokA); err != nil {
		return false, err
	}
	if err := write("B", fmt.Sprintf("INSERT row 2 with token %d", tokB), demoJobInsert, 2, "draft by B", tokB); err != nil {
		return false, err
	}
	tl.step("A", "pauses (a simulated GC pause longer than its TTL)", "")
	if err := write("B", fmt.Sprintf("UPDATE row 2 with token %d", tokB), demoJobUpdate, 2, "progress by B", tokB); err != nil {
		return false, err
	}

	tokC, err := tl.acquireAfterExpiry(ctx, pool, "C", "job:1", "worker-C", "A", ttl)
	if err != nil {
		return false, err
	}
	if err := write("C", fmt.Sprintf("UPDATE row 1 with token %d", tokC), demoJobUpdate, 1, "final by C", tokC); err != nil {
		return false, err
	}

	what := fmt.Sprintf("wakes, UPDATE row 1 with token %d", tokA)
	_, err = pool.Exec(ctx, demoJobUpdate, 1, "worker-A", "final by A (stale)", tokA)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		tl.step("A", what, "accepted  <- lost update: C's result is gone")
	case errors.As(err, &pgErr):
		refused = true
		tl.refusal("A", what, pgErr)
	default:
		return false, err
	}
	if err := write("B", fmt.Sprintf("UPDATE row 2 with token %d", tokB), demoJobUpdate, 2, "final by B", tokB); err != nil {
		return false, err
	}
	if _, err := sqlfuncs.Release(ctx, pool, "job:1", tokC); err != nil {
		return false, err
	}
	if _, err := sqlfuncs.Release(ctx, pool, "job:2", tokB); err != nil {
		return false, err
	}
	return refused, printRows(ctx, out, pool, "job", demoJobRows, "id\tworker\tresult\ttok", rep)
}
