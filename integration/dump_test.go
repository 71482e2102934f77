package integration

import (
	"bytes"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// fenceDump is a dump of a fence database, taken either with pg_dump -Fc
// (file) or, where no pg_dump of at least the server's major version exists
// on this machine, through the server itself (tables: the COPY text of every
// table of schema fence).
type fenceDump struct {
	file    string            // pg_dump -Fc archive; empty for a dump through the server
	toolDir string            // where pg_dump and pg_restore were taken from
	tables  map[string][]byte // fence table name -> COPY text, for a dump through the server
}

// dumpFence dumps the database at url. With a pg_dump whose major version
// is at least the server's (pg_dump refuses newer servers), it is a real
// pg_dump -Fc of the whole database; without one (the version matrix has
// server-only binaries, and this machine has only Debian's client tools), it
// says so in the test log and copies the data of every table of schema
// fence out through COPY, which is what a data-only pg_dump holds.
func dumpFence(t *testing.T, ctx context.Context, conn *pgx.Conn, url string) fenceDump {
	t.Helper()
	if dir, ok := clientToolDir(t, ctx, conn); ok {
		file := filepath.Join(t.TempDir(), "fence.dump")
		runTool(t, ctx, dir, "pg_dump", "-Fc", "-f", file, "-d", url)
		return fenceDump{file: file, toolDir: dir}
	}
	t.Logf("NOTE: no pg_dump >= PostgreSQL %d on this machine: dumping through the server instead (COPY of every table of schema fence; restored onto the kit's migrations, like a data-only restore)", serverMajor(t, ctx, conn))
	d := fenceDump{tables: map[string][]byte{}}
	for _, tbl := range fenceTables(t, ctx, conn) {
		var buf bytes.Buffer
		_, err := conn.PgConn().CopyTo(ctx, &buf, "COPY fence."+pgx.Identifier{tbl}.Sanitize()+" TO STDOUT")
		require.NoError(t, err, "COPY fence.%s TO STDOUT", tbl)
		d.tables[tbl] = buf.Bytes()
	}
	return d
}

// restoreFence restores d into the empty database at url: pg_restore
// --exit-on-error for a pg_dump archive; for a dump through the server, the
// kit's migrations and then the tables' data with triggers disabled
// (session_replication_role = replica, as pg_restore --disable-triggers
// does). It returns what pg_restore printed.
func restoreFence(t *testing.T, ctx context.Context, d fenceDump, url string) string {
	t.Helper()
	if d.file != "" {
		return runTool(t, ctx, d.toolDir, "pg_restore", "--exit-on-error", "-d", url, d.file)
	}
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, gofence.Migrate(ctx, pool), "migrate the restore target")
	conn := connect(t, ctx, url, false)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	_, err = tx.Exec(ctx, "SET LOCAL session_replication_role = replica")
	require.NoError(t, err)
	tables := fenceTables(t, ctx, conn)
	require.ElementsMatch(t, tables, slices.Collect(maps.Keys(d.tables)), "the same tables in schema fence")
	for _, tbl := range tables {
		name := "fence." + pgx.Identifier{tbl}.Sanitize()
		_, err := tx.Exec(ctx, "TRUNCATE "+name)
		require.NoError(t, err)
		_, err = tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(d.tables[tbl]), "COPY "+name+" FROM STDIN")
		require.NoError(t, err, "COPY %s FROM STDIN", name)
	}
	require.NoError(t, tx.Commit(ctx))
	return ""
}

func fenceTables(t *testing.T, ctx context.Context, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(ctx, "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'fence' AND c.relkind = 'r' ORDER BY 1")
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	return tables
}

func serverMajor(t *testing.T, ctx context.Context, conn *pgx.Conn) int {
	t.Helper()
	var num int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num))
	return num / 10000
}

var toolVersionRe = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// clientToolDir finds a directory with pg_dump and pg_restore of at least the
// server's major version: the server's own bin directory, then Debian's
// /usr/lib/postgresql/*/bin, newest first.
func clientToolDir(t *testing.T, ctx context.Context, conn *pgx.Conn) (string, bool) {
	t.Helper()
	major := serverMajor(t, ctx, conn)
	var bindir string
	require.NoError(t, conn.QueryRow(ctx, "SELECT setting FROM pg_config WHERE name = 'BINDIR'").Scan(&bindir))
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return dirMajor(b) - dirMajor(a) })
	for _, dir := range append([]string{bindir}, dirs...) {
		if _, err := os.Stat(filepath.Join(dir, "pg_restore")); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, filepath.Join(dir, "pg_dump"), "--version").Output()
		if err != nil {
			continue
		}
		m := toolVersionRe.FindSubmatch(out)
		if m == nil {
			continue
		}
		if v, _ := strconv.Atoi(string(m[1])); v >= major {
			t.Logf("pg_dump and pg_restore %d from %s for PostgreSQL %d", v, dir, major)
			return dir, true
		}
	}
	return "", false
}

func dirMajor(dir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return v
}

// runTool runs a client tool from dir without the caller's PG* variables.
func runTool(t *testing.T, ctx context.Context, dir, tool string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, tool), args...)
	cmd.Env = []string{"LC_ALL=C", "PATH=/usr/bin:/bin"}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", tool, strings.Join(args, " "), out)
	return string(out)
}

// TestDataOnlyLoadIsARestoreInEitherOrder (issue 19, docs defect): a
// data-only dump of schema fence (and of a protected table) is loaded into
// a freshly migrated database of another cluster, before or after that
// table is protected there. The source granted more after the dump. On 006,
// fence.protect of a token column created the target's fence.epoch_state
// row, so a load after it collided on that row's key, the target kept its
// own state, and it granted again tokens the source had granted after the
// dump. Now fence.protect writes no state, and the load brings the source's
// fence.origin row beside the target's: the target is not at home, and its
// first grant moves past every restored token, in either order. The load is
// what pg_restore --data-only does: COPY per table, a table whose rows
// collide left out, triggers on.
func TestDataOnlyLoadIsARestoreInEitherOrder(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	a := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	ac := connect(t, ctx, a.URL(), false)
	_, err := ac.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, ac, "orders", "orders", "tok"))
	granted := newLedger()
	for i := range 3 {
		tok := mustRevoke(t, ctx, ac, "orders")
		granted.add("orders", tok)
		_, err := ac.Exec(ctx, `INSERT INTO orders VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET tok = excluded.tok`, i, tok)
		require.NoError(t, err)
	}
	dump := map[string][]byte{}
	tables := append(fenceTables(t, ctx, ac), "")
	for _, tbl := range tables {
		name := "public.orders"
		if tbl != "" {
			name = "fence." + pgx.Identifier{tbl}.Sanitize()
		}
		var buf bytes.Buffer
		_, err := ac.PgConn().CopyTo(ctx, &buf, "COPY "+name+" TO STDOUT")
		require.NoError(t, err)
		dump[name] = buf.Bytes()
	}
	// pg_dump --data-only also sets the sequences.
	var counter int64
	var called bool
	require.NoError(t, ac.QueryRow(ctx, `SELECT last_value, is_called FROM fence.token_counter`).Scan(&counter, &called))
	for range 3 { // granted after the dump: lost on the copy
		granted.add("orders", mustRevoke(t, ctx, ac, "orders"))
		granted.add("fresh", mustRevoke(t, ctx, ac, "fresh")) // a resource the dump has no row of
	}

	b := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	bAdmin := connect(t, ctx, b.AdminURL(), false)
	// The kit's tables first, triggers on; the application's table as
	// pg_restore --disable-triggers loads it (its rows carry tokens older
	// than the latest grant, which its guard would refuse).
	load := func(t *testing.T, conn *pgx.Conn) {
		t.Helper()
		for _, name := range slices.Sorted(maps.Keys(dump)) {
			if name == "public.orders" {
				continue
			}
			if _, err := conn.PgConn().CopyFrom(ctx, bytes.NewReader(dump[name]), "COPY "+name+" FROM STDIN"); err != nil {
				t.Logf("load: %s left out: %v", name, err) // as pg_restore goes on after an error
			}
		}
		_, err := conn.Exec(ctx, `SELECT setval('fence.token_counter', $1, $2)`, counter, called)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
		require.NoError(t, err)
		_, err = tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(dump["public.orders"]), "COPY public.orders FROM STDIN")
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	for _, order := range []string{"protect, then load", "load, then protect"} {
		t.Run(order, func(t *testing.T) {
			dbname := map[string]string{"protect, then load": "target_pl", "load, then protect": "target_lp"}[order]
			_, err := bAdmin.Exec(ctx, `CREATE DATABASE `+dbname)
			require.NoError(t, err)
			url := pgtest.URLFor(b.URL(), dbname)
			pool, err := pgxpool.New(ctx, url)
			require.NoError(t, err)
			defer pool.Close()
			require.NoError(t, gofence.Migrate(ctx, pool))
			conn := connect(t, ctx, url, false)
			_, err = conn.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, tok bigint)`)
			require.NoError(t, err)
			if order == "protect, then load" {
				require.NoError(t, sqlfuncs.Protect(ctx, conn, "orders", "orders", "tok"))
				load(t, conn)
			} else {
				load(t, conn)
				require.NoError(t, sqlfuncs.Protect(ctx, conn, "orders", "orders", "tok"))
			}
			requireAbove(t, granted, "fresh", mustRevoke(t, ctx, conn, "fresh"), order)
			tok := mustRevoke(t, ctx, conn, "orders")
			requireAbove(t, granted, "orders", tok, order)
			_, err = conn.Exec(ctx, `UPDATE orders SET tok = $1`, tok)
			require.NoError(t, err, "the restored rows take the new token")
		})
	}
}
