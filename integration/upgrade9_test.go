package integration

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestUpgradeFrom008ToEveryOrder: migration 9 on a database in use at
// version 8, with a table-wide table (token column), a use_token table and a
// per-row table, an application role granted usage at version 8, TTL and
// session leases, and two leases left from version 2 whose tokens are equal
// (002 counted per resource). The leases granted at 8 stay valid: their
// holders write and renew. The two version-2 leases cannot be told apart by
// the new unique index on token, so the migration revokes them (new, larger
// tokens) and warns: their old tokens are refused. The down gives back
// exactly version 8's catalog, and a second upgrade the same version 9.
func TestUpgradeFrom008ToEveryOrder(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	app := pgtest.NewRole(t, "app")
	super := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 2))
	su := connect(t, ctx, db.URL, false)
	old := map[string]int64{}
	for _, res := range []string{"old:a", "old:b"} {
		tok, ok, err := sqlfuncs.Acquire(ctx, su, res, "v2", time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
		old[res] = tok
	}
	require.Equal(t, old["old:a"], old["old:b"], "the precondition: version 2 gives two resources the same token")

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	appID := pgx.Identifier{app}.Sanitize()
	for _, s := range []string{
		`CREATE TABLE cols (id int PRIMARY KEY, tok bigint, val text)`,
		`CREATE TABLE plain (id int PRIMARY KEY, val text)`,
		`CREATE TABLE job (id int PRIMARY KEY, job int NOT NULL, tok bigint, val text)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON cols, plain, job TO ` + appID,
	} {
		super(s)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "cols", "cols", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "plain", "plain", ""))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "job", "job", "job:", "tok"))
	appConn := connect(t, ctx, db.URLAs(app), false)
	acquire := func(res string) int64 {
		t.Helper()
		tok, ok, err := sqlfuncs.Acquire(ctx, appConn, res, "app", time.Hour)
		require.NoError(t, err)
		require.True(t, ok, res)
		return tok
	}
	tc, tp, tj := acquire("cols"), acquire("plain"), acquire("job:1")
	_, err := appConn.Exec(ctx, `INSERT INTO cols VALUES (1, $1, 'v8')`, tc)
	require.NoError(t, err)
	_, err = appConn.Exec(ctx, `INSERT INTO job VALUES (1, 1, $1, 'v8')`, tj)
	require.NoError(t, err)
	require.NoError(t, writeWithToken(ctx, appConn, "plain", tp, `INSERT INTO plain VALUES (1, 'v8')`))
	sess, ok, err := sqlfuncs.AcquireSession(ctx, appConn, "singleton", "app")
	require.NoError(t, err)
	require.True(t, ok)
	v8 := kitCatalog(t, ctx, db.Pool)

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 9))
	v, err := sqlfuncs.Version(ctx, appConn)
	require.NoError(t, err)
	require.Equal(t, 9, v)
	v9 := kitCatalog(t, ctx, db.Pool)

	// The leases granted at version 8 are still the latest.
	_, err = appConn.Exec(ctx, `UPDATE cols SET val = 'v9', tok = $1 WHERE id = 1`, tc)
	require.NoError(t, err)
	_, err = appConn.Exec(ctx, `UPDATE job SET val = 'v9', tok = $1 WHERE id = 1`, tj)
	require.NoError(t, err)
	require.NoError(t, writeWithToken(ctx, appConn, "plain", tp, `INSERT INTO plain VALUES (2, 'v9')`))
	_, ok, err = sqlfuncs.Renew(ctx, appConn, "job:1", tj, time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	released, err := sqlfuncs.Release(ctx, appConn, "singleton", sess)
	require.NoError(t, err)
	require.True(t, released, "the session lease taken at version 8 is released at version 9")

	// The two version-2 leases were revoked: their shared token is refused,
	// their new tokens differ and are larger.
	for res, tok := range old {
		l, ok, err := sqlfuncs.GetLease(ctx, su, res)
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, l.Live, res)
		require.Greater(t, l.Token, tok, res)
		requireSQLState(t, sqlfuncs.Check(ctx, su, res, tok), "FN001", res+": the shared token after the upgrade")
	}
	var distinct bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(DISTINCT token) = count(*) FROM fence.lease`).Scan(&distinct))
	require.True(t, distinct)
	a1 := acquire("job:2")
	require.Greater(t, a1, tj)

	// Down: exactly version 8 again; grants go on above.
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
	require.Equal(t, v8, kitCatalog(t, ctx, db.Pool), "the down restores version 8's functions, tables, views, privileges and generated guards")
	a2 := acquire("job:3")
	require.Greater(t, a2, a1)
	_, err = appConn.Exec(ctx, `UPDATE job SET val = 'v8 again', tok = $1 WHERE id = 1`, tj)
	require.NoError(t, err)
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 9))
	require.Equal(t, v9, kitCatalog(t, ctx, db.Pool), "a second upgrade gives the same schema")
	require.Greater(t, acquire("job:4"), a2)
	_, err = appConn.Exec(ctx, `UPDATE cols SET val = 'v9 again', tok = $1 WHERE id = 1`, tc)
	require.NoError(t, err)
}
