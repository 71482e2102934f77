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
