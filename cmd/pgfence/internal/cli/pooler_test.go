package cli_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestEveryCommandThroughPgBouncer runs every command that talks to a
// fence database through PgBouncer in transaction mode, with a plain URL, several
// times in a row: each command is a new client that PgBouncer hands the
// server connections other clients used before, so a command that leaves a
// named prepared statement behind breaks the next one (SQLSTATE 42P05).
func TestEveryCommandThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	pb := pgtest.NewPgBouncer(t, db.URL)
	url := "--database-url=" + pb.URL(db.URL)
	ok := func(args ...string) string {
		t.Helper()
		code, out, errOut := run(t, append([]string{args[0], url}, args[1:]...)...)
		require.Equal(t, cli.ExitOK, code, "pgfence %s\nstderr: %s\nstdout: %s\npgbouncer log:\n%s", strings.Join(args, " "), errOut, out, pb.LogTail(20))
		return out
	}

	for range 3 {
		ok("migrate", "up")
		require.Contains(t, ok("migrate", "version"), "clean")
	}
	_, err := db.Pool.Exec(t.Context(), `CREATE TABLE orders (id int, fence_token bigint)`)
	require.NoError(t, err)

	for i := range 5 {
		res := "pooled-" + strconv.Itoa(i%2)
		tok := strings.TrimSpace(ok("acquire", res, "--ttl", "1m", "--holder", "cli"))
		_, err := strconv.ParseInt(tok, 10, 64)
		require.NoError(t, err, "acquire prints the token: %q", tok)
		code, _, errOut := run(t, "acquire", res, url)
		require.Equal(t, cli.ExitHeld, code, errOut)
		ok("renew", res, "--token", tok, "--ttl", "2m")
		require.Contains(t, ok("status"), res)
		var rows []map[string]any
		require.NoError(t, json.Unmarshal([]byte(ok("status", res, "--json")), &rows))
		require.Len(t, rows, 1)
		require.Equal(t, "released\n", ok("release", res, "--token", tok))
		ok("revoke", res)
		ok("protect", "orders", "--resource", res, "--token-column", "fence_token")
		ok("unprotect", "orders")
		require.Regexp(t, `token=\d+`, ok("run", res+"-run", "--", "sh", "-c", `echo "token=$PGFENCE_TOKEN"`))
		ok("acquire", res+"-wait", "--wait", "--timeout", "10s", "--ttl", "1s")
		ok("doctor")
	}
}

// TestStatementCacheThroughPgBouncerIsRefused: the CLI sends no named
// statements unless the URL asks for pgx's statement cache; through a
// transaction pooler that shares them, gofence refuses such a URL, and the
// CLI says which URL parameter fixes it (not gofence's Go API).
func TestStatementCacheThroughPgBouncerIsRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	pb := pgtest.NewPgBouncer(t, db.URL)
	code, _, errOut := run(t, "status", "--database-url", pb.URL(db.URL)+"&default_query_exec_mode=cache_statement")
	require.Equal(t, cli.ExitError, code, errOut)
	require.Contains(t, errOut, "add default_query_exec_mode=exec to the connection string")
	require.NotContains(t, errOut, "Config.")
	require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
}

// TestDemoThroughPgBouncer: demo creates, uses and drops its own database
// through the pooler.
func TestDemoThroughPgBouncer(t *testing.T) {
	t.Parallel()
	admin := pgtest.AdminURL(t)
	pb := pgtest.NewPgBouncer(t, admin)
	code, out, errOut := run(t, "demo", "--database-url", pb.URL(admin), "--ttl", "300ms")
	require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	require.Contains(t, out, "REFUSED by the database")
}

// TestBenchSmokeThroughPgBouncer: the bench runs its pools through the
// pooler with the CLI's connection settings (named like the other bench
// smoke tests, which CI leaves out where the bench hangs).
func TestBenchSmokeThroughPgBouncer(t *testing.T) {
	pgtest.Long(t, "a bench scenario through PgBouncer")
	admin := pgtest.AdminURL(t)
	pb := pgtest.NewPgBouncer(t, admin)
	code, out, errOut := run(t, append([]string{"bench", "--database-url", pb.URL(admin), "--scenario", "grant"}, smokeArgs...)...)
	require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	require.Contains(t, out, "scenario errors: 0")
	pgtest.RequireNoDatabases(t, "pgfence_bench_") // the bench dropped its databases
}
