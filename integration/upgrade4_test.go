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

// TestUpgradeFrom003ToPerRow: migration 4 on a database in use at version 3
// (a table protected table-wide, an application role with usage, live
// leases) keeps everything guarded as before, lets the application role
// protect and write a table per row, and its down refuses while a table is
// protected per row, then, once it is not, goes back to exactly version 3's
// functions, with the table-wide guard still in force.
func TestUpgradeFrom003ToPerRow(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	app := pgtest.NewRole(t, "app")
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	super := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	kitFunctions := func() string { return kitCatalog(t, ctx, db.Pool) }
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 3))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	super(`GRANT CREATE ON SCHEMA public TO ` + id(app))
	appConn := connect(t, ctx, db.URLAs(app), false)
	_, err := appConn.Exec(ctx, `CREATE TABLE wide (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, appConn, "wide", "wide", "tok"))
	w1, ok, err := sqlfuncs.Acquire(ctx, appConn, "wide", "app", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = appConn.Exec(ctx, `INSERT INTO wide VALUES (1, $1)`, w1)
	require.NoError(t, err)
	v3 := kitFunctions() // with the guard function protect generated

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 4))
	v, err := sqlfuncs.Version(ctx, appConn)
	require.NoError(t, err)
	require.Equal(t, 4, v)
	_, err = appConn.Exec(ctx, `UPDATE wide SET id = 2`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "the table-wide guard holds across the upgrade")
	_, err = appConn.Exec(ctx, `UPDATE wide SET id = 2, tok = $1`, w1)
	require.NoError(t, err)

	// The application role (usage, not an operator) uses the new form.
	_, err = appConn.Exec(ctx, `CREATE TABLE job (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, appConn, "job", "id", "job:", "tok"))
	j1, ok, err := sqlfuncs.Acquire(ctx, appConn, "job:1", "app", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = appConn.Exec(ctx, `INSERT INTO job VALUES (1, $1)`, j1)
	require.NoError(t, err)
	_, err = appConn.Exec(ctx, `INSERT INTO job VALUES (2, $1)`, j1)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrUnknownToken, "job:2 was never granted")

	// Down: refused while job is protected per row, nothing changed.
	before := kitFunctions()
	err = gofence.MigrateTo(ctx, db.Pool, 3)
	require.Error(t, err)
	require.Contains(t, err.Error(), "protected per row")
	require.NoError(t, gofence.ForceMigrationVersion(ctx, db.Pool, 4))
	require.Equal(t, before, kitFunctions())

	require.NoError(t, sqlfuncs.Unprotect(ctx, appConn, "job"))
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 3))
	require.Equal(t, v3, kitFunctions(),
		"the down restores version 3's functions exactly")
	_, err = appConn.Exec(ctx, `UPDATE wide SET id = 3`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "the table-wide guard holds across the down")
	_, err = appConn.Exec(ctx, `UPDATE wide SET id = 3, tok = $1`, w1)
	require.NoError(t, err, "the application role keeps its usage")
	var n int
	require.NoError(t, appConn.QueryRow(ctx, `SELECT count(*) FROM fence.protected`).Scan(&n))
	require.Equal(t, 1, n, "and reads fence.protected (re-created by the down)")
}
