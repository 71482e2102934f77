package integration

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// requireSQLState fails unless err is a PostgreSQL error with SQLSTATE code.
func requireSQLState(t *testing.T, err error, code, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.Equal(t, code, sqlState(err), "%s: %v", what, err)
}

// poolWith opens a pool on url whose sessions start with the given
// -c options (for example fence.allow_downgrade=on), closed when the test
// ends.
func poolWith(t *testing.T, url, options string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	if options != "" {
		cfg.ConnConfig.RuntimeParams["options"] = options
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestReinstallKeepsTokensAboveTheRows (issue 10 item 7, re-install): the
// kit is removed (unprotect, then migrate down to 0 with
// fence.allow_downgrade = on, since leases exist) and installed again, while
// a table keeps rows written under tokens of the old install. The new
// install's counter starts from scratch; fence.protect, run by the kit's
// owner, must make the next grant exceed every token in the token column, so
// the legitimate holder can update those rows (before migration 3 the next
// holder got a token below them and every UPDATE failed with FN001 for
// good), while a token of the old install stays refused.
func TestReinstallKeepsTokensAboveTheRows(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	owner := pgtest.NewRole(t, "kitowner")
	app := pgtest.NewRole(t, "app")
	for _, sql := range []string{
		`GRANT CREATE ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + pgx.Identifier{owner}.Sanitize(),
		`GRANT CREATE ON SCHEMA public TO ` + pgx.Identifier{owner}.Sanitize(),
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	// The kit's owner installs the kit and owns the application's table.
	own := poolWith(t, db.URLAs(owner), "")
	require.NoError(t, gofence.Migrate(ctx, own))
	const res = "reinstall/jobs"
	for _, sql := range []string{
		`CREATE TABLE jobs (id int PRIMARY KEY, state text, tok bigint)`,
		`GRANT SELECT, INSERT, UPDATE ON jobs TO ` + pgx.Identifier{app}.Sanitize(),
	} {
		_, err := own.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, own, "jobs", res, "tok"))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, app, false))

	appConn := connect(t, ctx, db.URLAs(app), false)
	old := newLedger()
	for i := range 3 {
		tok := mustAcquire(t, ctx, appConn, res, "old-install")
		old.add(res, tok)
		_, err := appConn.Exec(ctx, `INSERT INTO jobs VALUES ($1, 'v1', $2)`, i, tok)
		require.NoError(t, err)
		mustRelease(t, ctx, appConn, res, tok)
	}
	rowMax := queryInt(t, ctx, appConn, `SELECT max(tok) FROM jobs`)
	require.Equal(t, old.max(res), rowMax)

	// Remove the kit. Migration 3's down refuses while leases exist unless
	// the session allows it.
	require.NoError(t, sqlfuncs.Unprotect(ctx, own, "jobs"))
	down := poolWith(t, db.URLAs(owner), "-c fence.allow_downgrade=on")
	require.NoError(t, gofence.MigrateTo(ctx, down, 0))
	require.Zero(t, queryInt(t, ctx, own, `SELECT count(*) FROM pg_namespace WHERE nspname = 'fence'`), "the kit is gone")
	require.Equal(t, rowMax, queryInt(t, ctx, own, `SELECT max(tok) FROM jobs`), "the rows keep the old tokens")

	// Install again; the kit's owner protects the table again.
	require.NoError(t, gofence.Migrate(ctx, own))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, app, false))
	require.NoError(t, sqlfuncs.Protect(ctx, own, "jobs", res, "tok"))

	tok := mustAcquire(t, ctx, appConn, res, "new-install")
	t.Logf("tokens of the old install %v (rows up to %d), first grant of the new install %d", old.all(res), rowMax, tok)
	require.Greater(t, tok, rowMax, "the next grant exceeds every token the rows carry")
	requireAbove(t, old, res, tok, "after a re-install")

	tag, err := appConn.Exec(ctx, `UPDATE jobs SET state = 'v2', tok = $1`, tok)
	require.NoError(t, err, "the legitimate holder updates rows written under the old install")
	require.Equal(t, int64(3), tag.RowsAffected())
	_, err = appConn.Exec(ctx, `INSERT INTO jobs VALUES (10, 'stale', $1)`, old.max(res))
	requireSQLState(t, err, "FN001", "a token of the old install")
}

// TestDataOnlyRestoreNeverRegrantsTokens (issue 10 item 7, data-only
// restore): a data-only dump of the source database (the kit's tables and
// sequence included, the migrations table excluded: the target has its
// own) is restored into a freshly migrated database of the same cluster,
// after the source granted more tokens. The restored copy must move to a new
// epoch: no token the source granted, before or after the dump, is granted
// again for the same resource.
//
// The application table is created in the target unprotected, loaded, and
// protected afterwards by the kit's owner. Loading rows into a protected
// table would fire its guards, and the restored rows carry tokens that are
// not the latest grant, so the load would fail (pg_restore
// --disable-triggers would skip them, but needs a superuser and then
// leaves no check of the floor); protect after the load also makes the next
// grant exceed every token the rows carry, however the epochs stand.
func TestDataOnlyRestoreNeverRegrantsTokens(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	src := connect(t, ctx, c.URL(), false)

	const jobsDDL = `CREATE TABLE jobs (id int PRIMARY KEY, state text, tok bigint)`
	_, err := src.Exec(ctx, jobsDDL)
	require.NoError(t, err)
	const res, other = "dataonly/jobs", "dataonly/other"
	require.NoError(t, sqlfuncs.Protect(ctx, src, "jobs", res, "tok"))
	granted := newLedger()
	for i := range 2 {
		tok := mustAcquire(t, ctx, src, res, "source")
		granted.add(res, tok)
		_, err := src.Exec(ctx, `INSERT INTO jobs VALUES ($1, 'before dump', $2)`, i, tok)
		require.NoError(t, err)
		mustRelease(t, ctx, src, res, tok)
		granted.add(other, mustRevoke(t, ctx, src, other))
	}

	dump := dataOnlyDump(t, ctx, src, c.URL())

	// Grants after the dump: the restored copy does not know them.
	for i := range 2 {
		tok := mustAcquire(t, ctx, src, res, "source-after-dump")
		granted.add(res, tok)
		_, err := src.Exec(ctx, `INSERT INTO jobs VALUES ($1, 'after dump', $2)`, 10+i, tok)
		require.NoError(t, err)
		mustRelease(t, ctx, src, res, tok)
		granted.add(other, mustRevoke(t, ctx, src, other))
	}
	const lostOnly = "dataonly/new" // first granted after the dump
	granted.add(lostOnly, mustAcquire(t, ctx, src, lostOnly, "source-after-dump"))

	_, err = src.Exec(ctx, `CREATE DATABASE fence_dataonly`)
	require.NoError(t, err)
	url := pgtest.URLFor(c.URL(), "fence_dataonly")
	require.NoError(t, gofence.Migrate(ctx, poolWith(t, url, "")))
	dst := connect(t, ctx, url, false)
	_, err = dst.Exec(ctx, jobsDDL)
	require.NoError(t, err)
	dump.restore(t, ctx, dst, url)
	dst = connect(t, ctx, url, false) // a fresh session, as after any restore
	require.Equal(t, int64(2), queryInt(t, ctx, dst, `SELECT count(*) FROM jobs`), "the rows of the dump")
	require.NoError(t, sqlfuncs.Protect(ctx, dst, "jobs", res, "tok"))

	after := newLedger()
	for _, r := range []string{res, other, lostOnly} {
		rv, acq := grantAfterFault(t, ctx, dst, granted, r, "after a data-only restore")
		after.add(r, rv)
		after.add(r, acq)
		require.Greater(t, epochOf(rv), granted.maxEpoch(), "%s: the restored copy moves to a new epoch", r)
		t.Logf("%s: source granted %v; restored copy grants %d, %d", r, granted.all(r), rv, acq)
	}
	requireStale(t, ctx, dst, granted, res)

	tok := after.max(res)
	tag, err := dst.Exec(ctx, `UPDATE jobs SET state = 'restored', tok = $1`, tok)
	require.NoError(t, err, "the new holder updates the restored rows")
	require.Equal(t, int64(2), tag.RowsAffected())
	_, err = dst.Exec(ctx, `INSERT INTO jobs VALUES (20, 'stale', $1)`, granted.max(res))
	requireSQLState(t, err, "FN001", "a token the source granted after the dump")
}

// dataOnly is a data-only dump of a database: a pg_dump -Fc --data-only
// archive (the migrations table's data excluded), or, where this machine has
// no pg_dump of at least the server's major version (the version matrix runs
// server-only binaries), the same data taken through the server: the COPY
// text of schema fence's tables and of public.jobs, and the token counter's
// state (what pg_dump writes as setval).
type dataOnly struct {
	file, toolDir string
	tables        map[string][]byte // qualified table -> COPY text
	counter       int64
	called        bool
}

func dataOnlyDump(t *testing.T, ctx context.Context, conn *pgx.Conn, url string) dataOnly {
	t.Helper()
	if dir, ok := clientToolDir(t, ctx, conn); ok {
		file := filepath.Join(t.TempDir(), "data.dump")
		runTool(t, ctx, dir, "pg_dump", "-Fc", "--data-only", "--exclude-table-data=public.fence_schema_migrations", "-f", file, "-d", url)
		return dataOnly{file: file, toolDir: dir}
	}
	t.Logf("NOTE: no pg_dump >= PostgreSQL %d on this machine: data-only dump through the server instead (COPY of schema fence's tables and of jobs, the token counter's setval)", serverMajor(t, ctx, conn))
	d := dataOnly{tables: map[string][]byte{}}
	names := []string{"public.jobs"}
	for _, tbl := range fenceTables(t, ctx, conn) {
		names = append(names, "fence."+pgx.Identifier{tbl}.Sanitize())
	}
	for _, name := range names {
		var buf bytes.Buffer
		_, err := conn.PgConn().CopyTo(ctx, &buf, "COPY "+name+" TO STDOUT")
		require.NoError(t, err, name)
		d.tables[name] = buf.Bytes()
	}
	require.NoError(t, conn.QueryRow(ctx, `SELECT last_value, is_called FROM fence.token_counter`).Scan(&d.counter, &d.called))
	return d
}

// restore loads d into the database at url, whose schema exists (the kit's
// migrations, and public.jobs): pg_restore --exit-on-error, or the COPY text
// and setval with triggers off (as pg_restore --disable-triggers).
func (d dataOnly) restore(t *testing.T, ctx context.Context, conn *pgx.Conn, url string) {
	t.Helper()
	if d.file != "" {
		if out := runTool(t, ctx, d.toolDir, "pg_restore", "--exit-on-error", "-d", url, d.file); out != "" {
			t.Logf("pg_restore output:\n%s", out)
		}
		return
	}
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			return err
		}
		for name, data := range d.tables {
			if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), "COPY "+name+" FROM STDIN"); err != nil {
				return fmt.Errorf("COPY %s FROM STDIN: %w", name, err)
			}
		}
		_, err := tx.Exec(ctx, `SELECT setval('fence.token_counter', $1, $2)`, d.counter, d.called)
		return err
	}))
}
