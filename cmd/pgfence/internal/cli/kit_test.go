package cli_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

type finding struct{ Check, Status, Detail, Fix string }

// doctorFindings runs doctor --json and returns its findings by check.
func doctorFindings(t *testing.T, url string) (int, map[string]finding, string) {
	t.Helper()
	code, out, errOut := run(t, "doctor", "--json", "--database-url", url)
	var fs []finding
	require.NoError(t, json.Unmarshal([]byte(out), &fs), "stdout %q stderr %q", out, errOut)
	m := map[string]finding{}
	for _, f := range fs {
		m[f.Check] = f
	}
	return code, m, out
}

// nothingInstalled asserts that the database has neither schema fence nor
// golang-migrate's version table.
func nothingInstalled(t *testing.T, db *pgtest.DB) {
	t.Helper()
	var table, schema bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT to_regclass('public.fence_schema_migrations') IS NOT NULL,
		EXISTS (SELECT FROM pg_namespace WHERE nspname = 'fence')`).Scan(&table, &schema))
	require.False(t, table, "fence_schema_migrations was created")
	require.False(t, schema, "schema fence was created")
}

// TestReadingWritesNothing: migrate version and doctor only read; in a
// database that never had the kit they leave it as they found it.
func TestReadingWritesNothing(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	code, out, errOut := run(t, "migrate", "version", "--database-url", db.URL)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "version 0, clean\n", out)
	code, fs, out := doctorFindings(t, db.URL)
	require.Equal(t, cli.ExitError, code, out)
	require.Equal(t, "fail", fs["migrations"].Status)
	require.Equal(t, "pgfence migrate up, as the role that will own the kit", fs["migrations"].Fix)
	nothingInstalled(t, db)
}

// TestLimitedRoles runs migrate and doctor as an ordinary owner and as an
// application role, as the README tells users to set them up. As the owner
// without CREATE on schema public, and as an application role, golang-migrate
// used to fail to create its table and keep its connection: the commands
// printed their output and never exited. Every finding must name the fix for
// the role that ran it.
func TestLimitedRoles(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	owner := pgtest.NewRole(t, "owner")
	_, err := db.Pool.Exec(t.Context(), "GRANT CREATE ON DATABASE "+pgx.Identifier{db.Name}.Sanitize()+" TO "+owner+"; REVOKE CREATE ON SCHEMA public FROM PUBLIC")
	require.NoError(t, err)
	ownerURL := db.URLAs(owner)

	t.Run("owner without CREATE on schema public", func(t *testing.T) {
		code, fs, out := doctorFindings(t, ownerURL)
		require.Equal(t, cli.ExitError, code, out)
		require.Equal(t, "fail", fs["migrations"].Status, out)
		require.Equal(t, "warn", fs["privileges"].Status, out)
		require.Contains(t, fs["privileges"].Fix, "GRANT CREATE ON SCHEMA public TO "+owner)
		require.NotContains(t, out, "ON DATABASE", "the owner has CREATE on the database")

		code, _, errOut := run(t, "migrate", "up", "--database-url", ownerURL)
		require.Equal(t, cli.ExitError, code, errOut)
		require.Contains(t, errOut, "GRANT CREATE ON SCHEMA public TO "+owner)
		require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)

		code, out, errOut = run(t, "migrate", "version", "--database-url", ownerURL)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.Equal(t, "version 0, clean\n", out)
		nothingInstalled(t, db)
	})

	_, err = db.Pool.Exec(t.Context(), "GRANT CREATE ON SCHEMA public TO "+owner)
	require.NoError(t, err)
	code, out, errOut := run(t, "migrate", "up", "--database-url", ownerURL)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out)
	code, fs, out := doctorFindings(t, ownerURL)
	require.Equal(t, "ok", fs["migrations"].Status, out)
	require.Equal(t, "ok", fs["privileges"].Status, out)
	require.Contains(t, fs["privileges"].Detail, "the kit's owner")
	require.Equal(t, cli.ExitOK, code, out)

	app := pgtest.NewRole(t, "app")
	appURL := db.URLAs(app)
	t.Run("application role without usage", func(t *testing.T) {
		code, fs, out := doctorFindings(t, appURL)
		require.Equal(t, cli.ExitError, code, out)
		grant := "as role " + owner + " (the kit's owner): SELECT fence.grant_usage('" + app + "')"
		require.Equal(t, "fail", fs["migrations"].Status, out)
		require.Equal(t, grant, fs["migrations"].Fix)
		require.Equal(t, "fail", fs["privileges"].Status, out)
		require.Equal(t, grant, fs["privileges"].Fix)
		require.NotContains(t, out, "GRANT CREATE")

		code, _, errOut := run(t, "migrate", "version", "--database-url", appURL)
		require.Equal(t, cli.ExitError, code)
		require.Contains(t, errOut, "fence.grant_usage('"+app+"')")
	})

	ownerConn, err := pgx.Connect(t.Context(), ownerURL)
	require.NoError(t, err)
	defer ownerConn.Close(t.Context())
	require.NoError(t, sqlfuncs.GrantUsage(t.Context(), ownerConn, app, false))

	t.Run("application role with usage", func(t *testing.T) {
		code, out, errOut := run(t, "migrate", "version", "--database-url", appURL)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.True(t, strings.HasPrefix(out, fmt.Sprintf("version %d, from fence.version()", migrations.Latest)), out)
		code, out, errOut = run(t, "migrate", "version", "--json", "--database-url", appURL)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.JSONEq(t, fmt.Sprintf(`{"version": %d, "dirty": null}`, migrations.Latest), out)

		code, fs, out := doctorFindings(t, appURL)
		require.Equal(t, cli.ExitOK, code, out)
		require.Equal(t, "ok", fs["migrations"].Status, out)
		require.Equal(t, "ok", fs["privileges"].Status, out)
		require.NotContains(t, out, "GRANT CREATE", "an application role is never told to get CREATE")

		code, out, errOut = run(t, "migrate", "up", "--database-url", appURL)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.True(t, strings.HasPrefix(out, fmt.Sprintf("version %d", migrations.Latest)), out)
		code, _, errOut = run(t, "migrate", "down", "--yes", "--database-url", appURL)
		require.Equal(t, cli.ExitError, code)
		require.Contains(t, errOut, "run pgfence migrate as "+owner)
		v, err := sqlfuncs.Version(t.Context(), db.Pool)
		require.NoError(t, err)
		require.Equal(t, migrations.Latest, v)
	})
}

// TestMigrateDownChecksFirst: migrate down used to drop everything without
// asking and, with a protected table, leave the database dirty with 002
// already reverted, the hint lost. Now it asks, checks before changing
// anything, and a refusal leaves the kit as it was.
func TestMigrateDownChecksFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	_, err := db.Pool.Exec(t.Context(), `CREATE TABLE orders (id int, fence_token bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(t.Context(), db.Pool, "orders", "orders", "fence_token"))
	unchanged := func(t *testing.T) {
		t.Helper()
		code, out, errOut := run(t, "migrate", "version", url)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out)
		v, err := sqlfuncs.Version(t.Context(), db.Pool)
		require.NoError(t, err)
		require.Equal(t, migrations.Latest, v, "the latest migration is still applied")
	}

	code, _, errOut := run(t, "migrate", "down", "--yes", url)
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "tables are protected (orders)")
	require.Contains(t, errOut, "pgfence unprotect TABLE")
	unchanged(t)

	code, _, errOut = run(t, "migrate", "down", strconv.Itoa(migrations.Latest+1), "--yes", url)
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, fmt.Sprintf("only %d applied", migrations.Latest))
	unchanged(t)

	code, _, errOut = run(t, "unprotect", "orders", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	// The test's stdin is not a terminal (or gives no answer): without
	// --yes, no change.
	for _, args := range [][]string{{"down"}, {"down", "1"}, {"goto", "1"}} {
		code, _, errOut = run(t, append(append([]string{"migrate"}, args...), url)...)
		require.Equal(t, cli.ExitError, code, errOut)
		require.Contains(t, errOut, "--yes")
		require.Contains(t, errOut, "nothing was changed")
		unchanged(t)
	}
	code, out, errOut := run(t, "migrate", "down", "--yes", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "version 0, clean\n", out)
	code, out, errOut = run(t, "migrate", "up", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out)
}

// TestMigrateBelow4RefusesWhileTablesAreProtectedPerRow: versions before 4
// have no per-row guard, and 004's down file raises while a table is
// protected per row, after golang-migrate has marked the version dirty. So
// migrate refuses any target below 4 first, naming those tables and the fix,
// and changes nothing; unprotecting them, or protecting them table-wide,
// lets it go on.
func TestMigrateBelow4RefusesWhileTablesAreProtectedPerRow(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	ctx := t.Context()
	for _, sql := range []string{
		`CREATE TABLE inv (id int PRIMARY KEY, fence_token bigint)`,
		`CREATE TABLE lines (id int PRIMARY KEY)`,
		`CREATE TABLE orders (id int PRIMARY KEY, fence_token bigint)`,
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "inv", "id", "inv:", "fence_token"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "lines", "id", "inv:", ""))
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "orders", "orders", "fence_token"))
	protected := func() string {
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT string_agg(tbl || ':' || form, ',' ORDER BY tbl::text) FROM fence.protected`).Scan(&s))
		return s
	}
	unchanged := func(t *testing.T) {
		t.Helper()
		code, out, errOut := run(t, "migrate", "version", url)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out, "not dirty, not migrated")
		require.Equal(t, "inv:rows,lines:rows,orders:table", protected())
	}

	toVersion3 := fmt.Sprint(migrations.Latest - 3)
	for _, args := range [][]string{{"down", toVersion3}, {"down", fmt.Sprint(migrations.Latest - 2)}, {"goto", "3"}, {"goto", "1"}} {
		code, _, errOut := run(t, append(append([]string{"migrate"}, args...), "--yes", url)...)
		require.Equal(t, cli.ExitError, code, errOut)
		require.Contains(t, errOut, "cannot migrate below version 4 while tables are protected per row (inv, lines)", args)
		require.Contains(t, errOut, "pgfence unprotect TABLE")
		require.Contains(t, errOut, "pgfence protect TABLE --resource RESOURCE")
		require.Contains(t, errOut, "nothing was changed")
		unchanged(t)
	}
	// To 0 every protected table is in the way, and the message says so.
	code, _, errOut := run(t, "migrate", "down", "--yes", url)
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "tables are protected (inv, lines, orders)")
	unchanged(t)

	// The two ways out: protect table-wide, or unprotect.
	code, _, errOut = run(t, "protect", "inv", "--resource", "inv", "--token-column", "fence_token", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	code, _, errOut = run(t, "migrate", "goto", "3", "--yes", url)
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "protected per row (lines)")
	code, _, errOut = run(t, "unprotect", "lines", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	code, out, errOut := run(t, "migrate", "down", toVersion3, "--yes", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "version 3, clean\n", out)
	_, err := db.Pool.Exec(ctx, `INSERT INTO inv VALUES (1, NULL)`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "inv is still guarded, table-wide, at version 3")
	code, out, errOut = run(t, "migrate", "up", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out)
}

// TestMigrateBelow3RefusesWhileLeasesExist: the kit's lease rows keep every
// resource's latest token; going below version 3 (and on to 0) would forget
// them, so migrate down refuses before changing anything unless
// --allow-downgrade, which passes fence.allow_downgrade to the migration.
func TestMigrateBelow3RefusesWhileLeasesExist(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	_, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "r", "h", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	code, _, errOut := run(t, "migrate", "down", "-y", url)
	require.Equal(t, cli.ExitError, code)
	require.Contains(t, errOut, "--allow-downgrade")
	require.Contains(t, errOut, "nothing was changed")
	code, out, errOut := run(t, "migrate", "version", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out, "not dirty")

	code, out, errOut = run(t, "migrate", "down", "-y", "--allow-downgrade", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "version 0, clean\n", out)
}
