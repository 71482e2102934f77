package integration

import (
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestUpgradeFrom008PerRowTables (issue 29): migration 9's per-row guard on
// a database at version 8 whose kit belongs to an ordinary role, with a
// per-row table of that role (token column) and one of another role
// (fence.use_token), an application role writing both under tokens granted
// at 8. Migrating to 9 as the kit's owner re-protects the owner's table with
// the new guard and names the other table in a WARNING; the other table
// keeps 008's guard, which still refuses and accepts as before. Both are in
// fence.protected as per-row tables. The down refuses (42501, nothing
// changed) while a table it cannot re-protect has the new guard, and
// otherwise gives back exactly version 8's catalog and guards.
func TestUpgradeFrom008PerRowTables(t *testing.T) {
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

	require.NoError(t, gofence.MigrateTo(ctx, own, 8))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, app, false))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, other, false))
	ownExec(`CREATE TABLE r_own (id int PRIMARY KEY, job int NOT NULL, tok bigint, val text)`)
	ownExec(`GRANT SELECT, INSERT, UPDATE, DELETE ON r_own TO ` + id(app))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, own, "r_own", "job", "own:", "tok"))
	oth := connect(t, ctx, db.URLAs(other), false)
	for _, sql := range []string{
		`CREATE TABLE r_other (id int PRIMARY KEY, job int NOT NULL, val text)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON r_other TO ` + id(app),
	} {
		_, err := oth.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, oth, "r_other", "job", "oth:", ""))

	conn := connect(t, ctx, db.URLAs(app), false)
	o1, x1 := mustAcquire(t, ctx, conn, "own:1", "app"), mustAcquire(t, ctx, conn, "oth:1", "app")
	_, err = conn.Exec(ctx, `INSERT INTO r_own VALUES (1, 1, $1, 'v8')`, o1)
	require.NoError(t, err)
	require.NoError(t, writeWithToken(ctx, conn, "oth:1", x1, `INSERT INTO r_other VALUES (1, 1, 'v8')`))
	before := protectedRows(t, ctx, own)
	ownGuard8 := triggersOf(t, ctx, own, "r_own")
	otherGuard8 := triggersOf(t, ctx, own, "r_other")
	require.Contains(t, strings.Join(otherGuard8, ","), "~fence_rows_2_upd")
	v8 := kitCatalog(t, ctx, own)

	require.NoError(t, gofence.MigrateTo(ctx, own, 9))
	t.Run("the migration names the table it could not re-protect", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		var warned []string
		for _, n := range notices {
			if n.Severity == "WARNING" && strings.Contains(n.Message, "per-row") {
				warned = append(warned, n.Message)
			}
		}
		require.Len(t, warned, 1, "notices: %v", warned)
		require.Contains(t, warned[0], "r_other")
		require.NotContains(t, warned[0], "r_own")
	})
	t.Run("guards after the upgrade", func(t *testing.T) {
		require.Equal(t, before, protectedRows(t, ctx, own), "fence.protected: same tables, resources, token columns")
		var forms []string
		rows, err := own.Query(ctx, `SELECT tbl::text || ' ' || form || ' ' || resource_column FROM fence.protected ORDER BY 1`)
		require.NoError(t, err)
		forms, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"r_other rows job", "r_own rows job"}, forms)
		g := triggersOf(t, ctx, own, "r_own")
		require.Len(t, g, 5, "%v", g)
		require.Contains(t, strings.Join(g, ","), "~fence_rows_2_kids fence._rows_kids")
		require.NotContains(t, strings.Join(g, ","), "~fence_rows_2_upd")
		require.Equal(t, otherGuard8, triggersOf(t, ctx, own, "r_other"), "another owner's table keeps 008's guard")
	})
	t.Run("both tables guard as before", func(t *testing.T) {
		_, err := conn.Exec(ctx, `UPDATE r_own SET val = 'v9', tok = $1 WHERE id = 1`, o1)
		require.NoError(t, err, "the token held since 008")
		require.NoError(t, writeWithToken(ctx, conn, "oth:1", x1, `UPDATE r_other SET val = 'v9' WHERE id = 1`))
		_, err = conn.Exec(ctx, `UPDATE r_own SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "no token, new guard")
		_, err = conn.Exec(ctx, `UPDATE r_other SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "no token, 008's guard")
		o2 := mustRevoke(t, ctx, own, "own:1")
		x2 := mustRevoke(t, ctx, own, "oth:1")
		require.Greater(t, o2, o1)
		require.Greater(t, x2, x1)
		_, err = conn.Exec(ctx, `UPDATE r_own SET val = 'stale', tok = $1 WHERE id = 1`, o1)
		requireSQLState(t, err, "FN001", "stale, new guard")
		err = writeWithToken(ctx, conn, "oth:1", x1, `UPDATE r_other SET val = 'stale' WHERE id = 1`)
		requireSQLState(t, err, "FN001", "stale, 008's guard")
	})

	// Down with the other table on 008's guard: exact.
	require.NoError(t, gofence.MigrateTo(ctx, own, 8))
	require.Equal(t, v8, kitCatalog(t, ctx, own), "the down restores version 8's catalog")
	require.Equal(t, ownGuard8, triggersOf(t, ctx, own, "r_own"), "008's guard is back")
	require.Equal(t, before, protectedRows(t, ctx, own))

	// Up again; the other owner re-protects its table; the down now refuses.
	require.NoError(t, gofence.MigrateTo(ctx, own, 9))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, oth, "r_other", "job", "oth:", ""))
	require.NotEqual(t, otherGuard8, triggersOf(t, ctx, own, "r_other"))
	v9 := kitCatalog(t, ctx, own)
	err = gofence.MigrateTo(ctx, own, 8)
	requireSQLState(t, err, "42501", "down while another owner's table has the new guard")
	require.ErrorContains(t, err, "r_other")
	require.NoError(t, gofence.ForceMigrationVersion(ctx, own, 9))
	require.Equal(t, v9, kitCatalog(t, ctx, own), "the refused down changed nothing")
	superExec(`GRANT ` + id(other) + ` TO ` + id(owner))
	require.NoError(t, gofence.MigrateTo(ctx, own, 8))
	require.Equal(t, otherGuard8, triggersOf(t, ctx, own, "r_other"), "008's guard is back on the other table too")
}
