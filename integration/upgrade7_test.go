package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestUpgradeFrom006ToNoWayAround: migration 7 on a database in use at
// version 6: tables protected in both forms (one per-row table under a
// row-security policy, one owned by the application role), an application
// role with usage, a TTL and a session lease. The leases stay valid; the
// guard functions 006 generated get the new bodies in place, so a role
// without usage is refused through a cascade on tables nobody protected
// again; the per-row tables the migrating role may change get their
// resource column pinned; the first grant after the upgrade moves the
// counter once (as after a crash), and the epoch stays. The down gives back
// exactly version 6's catalog, and a second upgrade the same version 7.
func TestUpgradeFrom006ToNoWayAround(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	app, nobody := pgtest.NewRole(t, "app"), pgtest.NewRole(t, "nobody")
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	super := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 6))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	super(`GRANT CREATE ON SCHEMA public TO ` + id(app))
	appConn := connect(t, ctx, db.URLAs(app), false)
	_, err := appConn.Exec(ctx, `SET app.tenant = 'a'`) // the application is tenant a
	require.NoError(t, err)
	acquire := func(res string) int64 {
		t.Helper()
		tok, ok, err := sqlfuncs.Acquire(ctx, appConn, res, "app", time.Hour)
		require.NoError(t, err)
		require.True(t, ok, res)
		return tok
	}
	for _, s := range []string{
		`CREATE TABLE parent (id int PRIMARY KEY)`,
		`INSERT INTO parent VALUES (1), (2)`,
		`CREATE TABLE wide (id int PRIMARY KEY, pid int REFERENCES parent ON DELETE CASCADE, tok bigint)`,
		`CREATE TABLE plain (id int PRIMARY KEY, pid int REFERENCES parent ON DELETE CASCADE)`,
		`CREATE TABLE job (id int PRIMARY KEY, tenant text NOT NULL, tok bigint)`,
		`ALTER TABLE job ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY by_tenant ON job USING (tenant = current_setting('app.tenant', true))`,
		`GRANT ALL ON parent TO ` + id(nobody),
		`GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON job TO ` + id(app),
	} {
		super(s)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "wide", "wide", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "plain", "wide", ""))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "job", "tenant", "job:", "tok"))
	_, err = appConn.Exec(ctx, `CREATE TABLE mine (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, appConn, "mine", "id", "mine:", "tok"))
	w := acquire("wide")
	su := connect(t, ctx, db.URL, false)
	require.NoError(t, writeWithToken(ctx, su, "wide", w, `INSERT INTO wide VALUES (1, 1, $1), (2, 2, $1)`, w))
	require.NoError(t, writeWithToken(ctx, su, "wide", w, `INSERT INTO plain VALUES (1, 1), (2, 2)`))
	a1 := acquire("job:a")
	_, err = appConn.Exec(ctx, `INSERT INTO job VALUES (1, 'a', $1)`, a1)
	require.NoError(t, err)
	sess, ok, err := sqlfuncs.AcquireSession(ctx, appConn, "singleton", "app")
	require.NoError(t, err)
	require.True(t, ok)
	v6 := kitCatalog(t, ctx, db.Pool)

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 7))
	v, err := sqlfuncs.Version(ctx, appConn)
	require.NoError(t, err)
	require.Equal(t, 7, v)
	v7 := kitCatalog(t, ctx, db.Pool)

	// The leases granted at version 6 are still the latest.
	_, err = appConn.Exec(ctx, `UPDATE job SET tok = $1 WHERE id = 1`, a1)
	require.NoError(t, err)
	_, ok, err = sqlfuncs.Renew(ctx, appConn, "wide", w, time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	// The generated guards of 006's tables have the new bodies: the cascade
	// of a role without usage is refused, with the latest token forged.
	nb := connect(t, ctx, db.URLAs(nobody), false)
	err = pgx.BeginFunc(ctx, nb, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('fence.tokens', $1, true)`, fmt.Sprintf(`{"wide": %d}`, w)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM parent WHERE id = 1`)
		return err
	})
	requireSQLState(t, err, "42501", "a cascade of a role without usage")
	// The per-row table's resource column is pinned.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE job ALTER COLUMN tenant TYPE varchar(10)`)
	requireSQLState(t, err, "0A000", "retype the resource column")
	// The first grant after the upgrade moves the counter once; the epoch
	// stays (no restore, no copy).
	a2 := acquire("job:b")
	require.Equal(t, epochOf(a1), epochOf(a2))
	require.GreaterOrEqual(t, counterOf(a2)-counterOf(a1), int64(1)<<32)
	a3 := acquire("job:c")
	require.Equal(t, counterOf(a2)+1, counterOf(a3), "and only once")
	released, err := sqlfuncs.Release(ctx, appConn, "singleton", sess)
	require.NoError(t, err)
	require.True(t, released, "the session lease taken at version 6 is released at version 7")

	// Down: exactly version 6 again; grants go on above.
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 6))
	require.Equal(t, v6, kitCatalog(t, ctx, db.Pool), "the down restores version 6's functions, tables, privileges and generated guards")
	a4 := acquire("job:d")
	require.Greater(t, a4, a3)
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 7))
	require.Equal(t, v7, kitCatalog(t, ctx, db.Pool), "a second upgrade gives the same schema")
	require.Greater(t, acquire("job:e"), a4)
}
