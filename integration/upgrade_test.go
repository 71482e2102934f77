package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// triggersOf lists the non-internal triggers of tbl as "name function".
func triggersOf(t *testing.T, ctx context.Context, db sqlfuncs.Querier, tbl string) []string {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT tgname || ' ' || tgfoid::regproc::text FROM pg_trigger
	                             WHERE tgrelid = $1::regclass AND NOT tgisinternal ORDER BY tgname`, tbl)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// protectedRows reads fence.protected as "table resource token_column".
func protectedRows(t *testing.T, ctx context.Context, db sqlfuncs.Querier) []string {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT tbl::text || ' ' || resource || ' ' || coalesce(token_column::text, '-')
	                              FROM fence.protected ORDER BY 1`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return got
}

// kitCatalog is pgtest.KitCatalog as one string: a down migration must give
// back exactly what the version below had.
func kitCatalog(t *testing.T, ctx context.Context, db sqlfuncs.Querier) string {
	t.Helper()
	return strings.Join(pgtest.KitCatalog(t, ctx, db), "\n")
}

// writeWithToken runs stmt in a transaction that first registers tok for res
// with fence.use_token; the transaction is rolled back on any failure.
func writeWithToken(ctx context.Context, conn *pgx.Conn, res string, tok int64, stmt string, args ...any) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := sqlfuncs.UseToken(ctx, tx, res, tok); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, stmt, args...)
		return err
	})
}

// TestUpgradeFrom002WithProtectedTables (issue 10, "upgrade from 002 with
// protected tables in place"): a kit at version 2 owned by an ordinary role,
// which also owns a token-column table and a use_token table, and an
// application role with fence.grant_usage holding a live lease and writing
// under tokens; a third protected table belongs to a role the migrating role
// is not a member of. Migrating to 3 as the kit's owner:
//
//   - re-creates the guards of the owner's tables in the generated form
//     (fence.protected unchanged), and extends the application role's grants
//     (the new guards read fence.lease as the writer), so it keeps writing
//     under the token it held before the upgrade; stale writes are FN001,
//     writes that present no token FN002;
//   - keeps the other role's table on its 002 trigger, whose function is now
//     the fail-closed generic guard, and says so in a WARNING: a write that
//     presents no token fails, an UPDATE that assigns a new token works.
//
// Migrating back down to 2 (fence.allow_downgrade = on, since leases exist)
// refuses while it cannot re-create the other role's guards, and otherwise
// puts 002's guards back, which still work.
func TestUpgradeFrom002WithProtectedTables(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	owner := pgtest.NewRole(t, "kitowner")
	other := pgtest.NewRole(t, "other")
	app := pgtest.NewRole(t, "app")
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	superExec := func(sql string) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	superExec(`GRANT CREATE ON DATABASE ` + id(db.Name) + ` TO ` + id(owner))
	superExec(`GRANT CREATE ON SCHEMA public TO ` + id(owner) + `, ` + id(other))

	var mu sync.Mutex
	var notices []*pgconn.Notice
	cfg, err := pgxpool.ParseConfig(db.URLAs(owner))
	require.NoError(t, err)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		notices = append(notices, n)
	}
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(own.Close)
	ownExec := func(sql string) {
		t.Helper()
		_, err := own.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}

	// Version 2, as users run it today.
	require.NoError(t, gofence.MigrateTo(ctx, own, 2))
	v, err := sqlfuncs.Version(ctx, own)
	require.NoError(t, err)
	require.Equal(t, 2, v)
	ownExec(`CREATE TABLE up_col (id int PRIMARY KEY, val text, tok bigint)`)
	ownExec(`CREATE TABLE up_tx (id int PRIMARY KEY, val text)`)
	ownExec(`GRANT SELECT, INSERT, UPDATE, DELETE ON up_col, up_tx TO ` + id(app))
	require.NoError(t, sqlfuncs.Protect(ctx, own, "up_col", "up/col", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, own, "up_tx", "up/tx", ""))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, app, false))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, other, false))

	oth := connect(t, ctx, db.URLAs(other), false)
	for _, sql := range []string{
		`CREATE TABLE up_other (id int PRIMARY KEY, val text, tok bigint)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON up_other TO ` + id(app),
	} {
		_, err := oth.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, oth, "up_other", "up/other", "tok"))
	before := protectedRows(t, ctx, own)
	require.Equal(t, []string{"up_col up/col tok", "up_other up/other tok", "up_tx up/tx -"}, before)

	// The application writes under tokens of version 2: a first lease, then
	// the lease it still holds during the upgrade.
	conn := connect(t, ctx, db.URLAs(app), false)
	oldCol := mustAcquire(t, ctx, conn, "up/col", "app")
	_, err = conn.Exec(ctx, `INSERT INTO up_col VALUES (1, 'v1', $1)`, oldCol)
	require.NoError(t, err)
	mustRelease(t, ctx, conn, "up/col", oldCol)
	col := mustAcquire(t, ctx, conn, "up/col", "app")
	_, err = conn.Exec(ctx, `INSERT INTO up_col VALUES (2, 'v1', $1)`, col)
	require.NoError(t, err)
	txTok := mustAcquire(t, ctx, conn, "up/tx", "app")
	require.NoError(t, writeWithToken(ctx, conn, "up/tx", txTok, `INSERT INTO up_tx VALUES (1, 'v1')`))
	oldOther := mustAcquire(t, ctx, conn, "up/other", "app")
	_, err = conn.Exec(ctx, `INSERT INTO up_other VALUES (1, 'v1', $1)`, oldOther)
	require.NoError(t, err)

	// The upgrade, run by the kit's owner.
	require.NoError(t, gofence.MigrateTo(ctx, own, 3))
	v, err = sqlfuncs.Version(ctx, own)
	require.NoError(t, err)
	require.Equal(t, 3, v)

	t.Run("the migration warns about the table it could not regenerate", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		var warned []string
		for _, n := range notices {
			if n.Severity == "WARNING" && strings.Contains(n.Message, "pgfence") {
				warned = append(warned, n.Message)
			}
		}
		require.Len(t, warned, 1, "notices: %v", warned)
		require.Contains(t, warned[0], "up_other")
		require.NotContains(t, warned[0], "up_col")
		require.NotContains(t, warned[0], "up_tx")
	})

	t.Run("guards after the upgrade", func(t *testing.T) {
		require.Equal(t, before, protectedRows(t, ctx, own), "fence.protected: same tables, resources, token columns")
		colGuard := queryString(t, ctx, own, `SELECT fence._guard_function('tok')::regproc::text`)
		require.Equal(t, []string{
			"zz_fence_guard_stmt fence._guard_stmt",
			"~fence_guard_0_mark " + colGuard,
			"~fence_guard_1_row " + colGuard,
		}, triggersOf(t, ctx, own, "up_col"))
		require.Equal(t, []string{
			"zz_fence_guard_stmt fence._guard_stmt",
			"~fence_guard_1_row fence._guard_use_token",
		}, triggersOf(t, ctx, own, "up_tx"))
		require.Equal(t, []string{
			"zz_fence_guard_row fence._guard_row",
			"zz_fence_guard_stmt fence._guard_stmt",
		}, triggersOf(t, ctx, own, "up_other"), "a table of another owner keeps its trigger")
		require.Equal(t, int64(1), queryInt(t, ctx, own,
			`SELECT count(*) FROM pg_catalog.has_table_privilege($1, 'fence.lease', 'SELECT') h WHERE h`, app),
			"the application role may read fence.lease, as the new guards need")
	})

	t.Run("the application keeps writing under the token it held", func(t *testing.T) {
		_, err := conn.Exec(ctx, `UPDATE up_col SET val = 'v2', tok = $1 WHERE id = 2`, col)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO up_col VALUES (3, 'v2', $1)`, col)
		require.NoError(t, err)
		require.NoError(t, writeWithToken(ctx, conn, "up/tx", txTok, `UPDATE up_tx SET val = 'v2' WHERE id = 1`))
		require.NoError(t, writeWithToken(ctx, conn, "up/col", col, `DELETE FROM up_col WHERE id = 3`))
	})

	t.Run("stale and token-less writes fail", func(t *testing.T) {
		_, err := conn.Exec(ctx, `INSERT INTO up_col VALUES (4, 'stale', $1)`, oldCol)
		requireSQLState(t, err, "FN001", "insert under a token of an earlier lease")
		_, err = conn.Exec(ctx, `UPDATE up_col SET val = 'stale', tok = $1 WHERE id = 1`, oldCol)
		requireSQLState(t, err, "FN001", "update that assigns the earlier token the row carries")
		_, err = conn.Exec(ctx, `UPDATE up_col SET val = 'none' WHERE id = 2`)
		requireSQLState(t, err, "FN002", "update that does not assign the token column")
		_, err = conn.Exec(ctx, `UPDATE up_tx SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "use_token table without fence.use_token")
		_, err = conn.Exec(ctx, `DELETE FROM up_col WHERE id = 2`)
		requireSQLState(t, err, "FN002", "delete without fence.use_token")
	})

	t.Run("grants after the upgrade exceed the tokens of version 2", func(t *testing.T) {
		revoked := mustRevoke(t, ctx, own, "up/col")
		require.Greater(t, revoked, col)
		_, err := conn.Exec(ctx, `UPDATE up_col SET val = 'stale', tok = $1 WHERE id = 2`, col)
		requireSQLState(t, err, "FN001", "the token held across the upgrade, once revoked")
		col = mustAcquire(t, ctx, conn, "up/col", "app")
		require.Greater(t, col, revoked)
		_, err = conn.Exec(ctx, `UPDATE up_col SET val = 'v3', tok = $1`, col)
		require.NoError(t, err)
	})

	t.Run("the other owner's table fails closed with the generic guard", func(t *testing.T) {
		_, err := conn.Exec(ctx, `UPDATE up_other SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "update that does not assign the token column")
		_, err = conn.Exec(ctx, `UPDATE up_other SET val = 'same', tok = $1 WHERE id = 1`, oldOther)
		requireSQLState(t, err, "FN002", "re-assigning the token the row carries presents nothing to the generic guard")
		_, err = conn.Exec(ctx, `INSERT INTO up_other VALUES (2, 'none', NULL)`)
		requireSQLState(t, err, "FN002", "insert without a token")
		mustRelease(t, ctx, conn, "up/other", oldOther)
		newOther := mustAcquire(t, ctx, conn, "up/other", "app")
		_, err = conn.Exec(ctx, `UPDATE up_other SET val = 'v2', tok = $1 WHERE id = 1`, newOther)
		require.NoError(t, err, "an update that assigns a new token")
		_, err = conn.Exec(ctx, `INSERT INTO up_other VALUES (3, 'stale', $1)`, oldOther)
		requireSQLState(t, err, "FN001", "insert under the earlier token")
		require.NoError(t, writeWithToken(ctx, conn, "up/other", newOther, `UPDATE up_other SET val = 'v3' WHERE id = 1`))
	})

	t.Run("the other owner's protect again installs the generated guard", func(t *testing.T) {
		require.NoError(t, sqlfuncs.Protect(ctx, oth, "up_other", "up/other", "tok"), "as the WARNING's hint says")
		colGuard := queryString(t, ctx, own, `SELECT fence._guard_function('tok')::regproc::text`)
		require.Equal(t, []string{
			"zz_fence_guard_stmt fence._guard_stmt",
			"~fence_guard_0_mark " + colGuard,
			"~fence_guard_1_row " + colGuard,
		}, triggersOf(t, ctx, own, "up_other"))
		require.Equal(t, before, protectedRows(t, ctx, own))
		latest := queryInt(t, ctx, conn, `SELECT token FROM fence.leases WHERE resource = 'up/other'`)
		_, err := conn.Exec(ctx, `UPDATE up_other SET val = 'v4', tok = $1 WHERE id = 1`, latest)
		require.NoError(t, err, "re-assigning the latest token presents it to the generated guard")
		_, err = conn.Exec(ctx, `UPDATE up_other SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "update that does not assign the token column")
	})

	// Back down to 2. Leases exist, so the session must allow it; and the
	// other role's guards cannot be put back by the kit's owner.
	down := poolWith(t, db.URLAs(owner), "-c fence.allow_downgrade=on")
	err = gofence.MigrateTo(ctx, down, 2)
	requireSQLState(t, err, "42501", "migrate down while another owner's table is protected")
	require.ErrorContains(t, err, "up_other")
	require.NoError(t, gofence.ForceMigrationVersion(ctx, own, 3))
	require.Equal(t, before, protectedRows(t, ctx, own), "the refused down changed nothing")
	// The documented way out: run it as a member of the tables' owners.
	superExec(`GRANT ` + id(other) + ` TO ` + id(owner))
	require.NoError(t, gofence.MigrateTo(ctx, down, 2))
	v, err = sqlfuncs.Version(ctx, own)
	require.NoError(t, err)
	require.Equal(t, 2, v)

	t.Run("after the down, 002's guards are back and work", func(t *testing.T) {
		require.Equal(t, before, protectedRows(t, ctx, own))
		for _, tbl := range []string{"up_col", "up_tx", "up_other"} {
			require.Equal(t, []string{
				"zz_fence_guard_row fence._guard_row",
				"zz_fence_guard_stmt fence._guard_stmt",
			}, triggersOf(t, ctx, own, tbl), tbl)
		}
		require.Zero(t, queryInt(t, ctx, own,
			`SELECT count(*) FROM pg_proc WHERE pronamespace = 'fence'::regnamespace AND proname ~ '^_guard_[0-9a-f]{32}$'`),
			"no generated guard is left")

		_, err := conn.Exec(ctx, `INSERT INTO up_col VALUES (5, 'v4', $1)`, col)
		require.NoError(t, err, "the latest token still writes")
		_, err = conn.Exec(ctx, `INSERT INTO up_col VALUES (6, 'stale', $1)`, oldCol)
		requireSQLState(t, err, "FN001", "a stale token")
		_, err = conn.Exec(ctx, `INSERT INTO up_col VALUES (7, 'none', NULL)`)
		requireSQLState(t, err, "FN002", "no token")
		_, err = conn.Exec(ctx, `UPDATE up_tx SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "use_token table without fence.use_token")
		require.NoError(t, writeWithToken(ctx, conn, "up/tx", txTok, `UPDATE up_tx SET val = 'v4' WHERE id = 1`))
		revoked := mustRevoke(t, ctx, own, "up/tx")
		require.Greater(t, revoked, txTok)
		err = writeWithToken(ctx, conn, "up/tx", txTok, `UPDATE up_tx SET val = 'stale' WHERE id = 1`)
		requireSQLState(t, err, "FN001", "use_token with a revoked token")
		next := mustAcquire(t, ctx, conn, "up/tx", "app")
		require.Greater(t, next, revoked, "002's grants go on above the tokens of version 3")
	})
}

func queryString(t *testing.T, ctx context.Context, db sqlfuncs.DB, sql string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(ctx, sql, args...).Scan(&s), "%s", sql)
	return s
}

// TestUpgradeKeepsUsageThroughMembershipOnly: a role that has the kit's usage
// only as a member of a group with usage must not get grants of its own from
// migration 3's re-grant (nor from its down): once it leaves the group it has
// no usage left.
func TestUpgradeKeepsUsageThroughMembershipOnly(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	grp, member := pgtest.NewRole(t, "grp"), pgtest.NewRole(t, "member")
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 2))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, grp, true))
	_, err := db.Pool.Exec(ctx, `GRANT `+pgx.Identifier{grp}.Sanitize()+` TO `+pgx.Identifier{member}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 3))

	conn := connect(t, ctx, db.URLAs(member), false)
	_, _, err = sqlfuncs.Acquire(ctx, conn, "m", "member", time.Minute)
	require.NoError(t, err, "usage through the group")
	_, err = db.Pool.Exec(ctx, `REVOKE `+pgx.Identifier{grp}.Sanitize()+` FROM `+pgx.Identifier{member}.Sanitize())
	require.NoError(t, err)
	_, _, err = sqlfuncs.Acquire(ctx, conn, "m2", "member", time.Minute)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "42501", pgErr.Code, "no usage of its own after leaving the group")
	_, err = sqlfuncs.Revoke(ctx, conn, "m")
	require.Error(t, err, "and no operator rights either")
}
