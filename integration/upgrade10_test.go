package integration

import (
	"regexp"
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

// TestUpgradeFrom009LeanPaths (issue 29): migration 10 on a database in use
// at version 9 whose kit belongs to an ordinary role, with a per-row table
// of that role (token column), a per-row table of another role
// (fence.use_token), a table-wide table, an application role writing under
// tokens granted at 9, and a released lease. The upgrade warns of nothing
// and changes no trigger and no generated guard (only kit functions that
// the guards call); the tokens granted at 9 stay valid, stale and missing
// tokens are refused as before, the fast grant path grants the released
// lease, releases answer as before, and fence.allow_producers still
// recognises the guard. The down gives back exactly version 9's catalog,
// generated guards included.
func TestUpgradeFrom009LeanPaths(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	owner := pgtest.NewRole(t, "kitowner")
	other := pgtest.NewRole(t, "other")
	app := pgtest.NewRole(t, "app")
	id := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	_, err := db.Pool.Exec(ctx, `GRANT CREATE ON DATABASE `+id(db.Name)+` TO `+id(owner)+`; GRANT CREATE ON SCHEMA public TO `+id(owner)+`, `+id(other))
	require.NoError(t, err)

	var mu sync.Mutex
	var warnings []string
	cfg, err := pgxpool.ParseConfig(db.URLAs(owner))
	require.NoError(t, err)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if n.Severity == "WARNING" {
			warnings = append(warnings, n.Message)
		}
	}
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(own.Close)
	ownExec := func(sql string, args ...any) {
		t.Helper()
		_, err := own.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}

	require.NoError(t, gofence.MigrateTo(ctx, own, 9))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, app, false))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, own, other, false))
	ownExec(`CREATE TABLE r_own (id int PRIMARY KEY, job int NOT NULL, tok bigint, val text)`)
	ownExec(`CREATE TABLE tw (id int PRIMARY KEY, tok bigint, val text)`)
	ownExec(`GRANT SELECT, INSERT, UPDATE, DELETE ON r_own, tw TO ` + id(app))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, own, "r_own", "job", "own:", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, own, "tw", "tw", "tok"))
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
	o1, x1, w1 := mustAcquire(t, ctx, conn, "own:1", "app"), mustAcquire(t, ctx, conn, "oth:1", "app"), mustAcquire(t, ctx, conn, "tw", "app")
	_, err = conn.Exec(ctx, `INSERT INTO r_own VALUES (1, 1, $1, 'v9'), (2, 1, $1, 'v9')`, o1)
	require.NoError(t, err)
	require.NoError(t, writeWithToken(ctx, conn, "oth:1", x1, `INSERT INTO r_other VALUES (1, 1, 'v9'), (2, 1, 'v9')`))
	_, err = conn.Exec(ctx, `INSERT INTO tw VALUES (1, $1, 'v9')`, w1)
	require.NoError(t, err)
	freed := mustAcquire(t, ctx, conn, "free", "app")
	ok, err := sqlfuncs.Release(ctx, conn, "free", freed)
	require.NoError(t, err)
	require.True(t, ok)

	before := protectedRows(t, ctx, own)
	guards := map[string][]string{"r_own": triggersOf(t, ctx, own, "r_own"), "r_other": triggersOf(t, ctx, own, "r_other"), "tw": triggersOf(t, ctx, own, "tw")}
	v9 := kitCatalog(t, ctx, own)
	// generated is what the catalog says of the guards fence.protect and
	// fence.protect_rows generated for the tables.
	generated := func(catalog string) []string {
		var g []string
		for _, l := range strings.Split(catalog, "\n") {
			if generatedName.MatchString(l) {
				g = append(g, l)
			}
		}
		return g
	}
	guards9 := generated(v9)
	require.Len(t, guards9, 4, "r_own's row and mark functions, r_other's row function, tw's guard: %v", guards9)

	require.NoError(t, gofence.MigrateTo(ctx, own, 10))
	t.Run("no trigger and no generated guard changed", func(t *testing.T) {
		mu.Lock()
		require.Empty(t, warnings)
		mu.Unlock()
		require.Equal(t, guards9, generated(kitCatalog(t, ctx, own)))
		for tbl, g := range guards {
			require.Equal(t, g, triggersOf(t, ctx, own, tbl), tbl)
		}
		require.Equal(t, before, protectedRows(t, ctx, own))
	})
	t.Run("tokens of version 9 stay valid, stale and missing ones are refused", func(t *testing.T) {
		_, err := conn.Exec(ctx, `UPDATE r_own SET val = 'v10', tok = $1 WHERE id = 1`, o1)
		require.NoError(t, err, "the token held since 009")
		require.NoError(t, writeWithToken(ctx, conn, "oth:1", x1, `UPDATE r_other SET val = 'v10' WHERE id = 1`))
		require.NoError(t, writeWithToken(ctx, conn, "oth:1", x1, `DELETE FROM r_other WHERE id = 2`))
		require.NoError(t, writeWithToken(ctx, conn, "own:1", o1, `DELETE FROM r_own WHERE id = 2`))
		_, err = conn.Exec(ctx, `UPDATE tw SET val = 'v10', tok = $1 WHERE id = 1`, w1)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `UPDATE r_own SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "per-row, no token")
		_, err = conn.Exec(ctx, `UPDATE r_other SET val = 'none' WHERE id = 1`)
		requireSQLState(t, err, "FN002", "per-row use_token table, no token")
		o2, x2 := mustRevoke(t, ctx, own, "own:1"), mustRevoke(t, ctx, own, "oth:1")
		_, err = conn.Exec(ctx, `UPDATE r_own SET val = 'stale', tok = $1 WHERE id = 1`, o1)
		requireSQLState(t, err, "FN001", "per-row, stale")
		_, err = conn.Exec(ctx, `INSERT INTO r_own VALUES (3, 1, $1, 'stale')`, o1)
		requireSQLState(t, err, "FN001", "per-row INSERT, stale")
		err = writeWithToken(ctx, conn, "oth:1", x1, `UPDATE r_other SET val = 'stale' WHERE id = 1`)
		requireSQLState(t, err, "FN001", "per-row use_token table, stale")
		_, err = conn.Exec(ctx, `UPDATE r_own SET val = 'v10', tok = $1 WHERE id = 1`, o2)
		require.NoError(t, err)
		require.NoError(t, writeWithToken(ctx, conn, "oth:1", x2, `UPDATE r_other SET val = 'v10' WHERE id = 1`))
	})
	t.Run("grants", func(t *testing.T) {
		again := mustAcquire(t, ctx, conn, "free", "app")
		require.Greater(t, again, freed, "the released lease, by the fast path")
		_, ok, err := sqlfuncs.Acquire(ctx, conn, "free", "other", time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "busy")
		ok, err = sqlfuncs.Release(ctx, conn, "free", again)
		require.NoError(t, err)
		require.True(t, ok)
		ok, err = sqlfuncs.Release(ctx, conn, "free", again)
		require.NoError(t, err)
		require.False(t, ok, "released once")
	})
	t.Run("fence.allow_producers recognises the guard", func(t *testing.T) {
		require.NoError(t, sqlfuncs.AllowProducers(ctx, own, "r_own", true))
		_, err := conn.Exec(ctx, `INSERT INTO r_own VALUES (10, 10, NULL, 'produced')`)
		require.NoError(t, err, "a row of a resource never granted")
		require.NoError(t, sqlfuncs.AllowProducers(ctx, own, "r_own", false))
		require.NoError(t, sqlfuncs.AllowProducers(ctx, oth, "r_other", true))
		require.NoError(t, sqlfuncs.AllowProducers(ctx, oth, "r_other", false))
	})

	require.NoError(t, gofence.MigrateTo(ctx, own, 9))
	require.Equal(t, v9, kitCatalog(t, ctx, own), "the down restores version 9's catalog, generated guards included")
	for tbl, g := range guards {
		require.Equal(t, g, triggersOf(t, ctx, own, tbl), tbl)
	}
	_, err = conn.Exec(ctx, `UPDATE r_own SET val = 'stale at 9', tok = $1 WHERE id = 1`, o1)
	requireSQLState(t, err, "FN001", "009's guard again")
	var produced int
	require.NoError(t, own.QueryRow(ctx, `SELECT count(*) FROM r_own WHERE id = 10`).Scan(&produced))
	require.Equal(t, 1, produced, "the produced row stays")
}

// generatedName matches the catalog line of a generated guard function.
var generatedName = regexp.MustCompile(`^function fence\._(guard|rows)_[0-9a-f]{32}\(\) `)
