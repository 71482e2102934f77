package cli_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestCommandLinesThatDoNotParseExit2: exit 2 is decided by the type of the
// error, for every way a command line can be wrong, and changes nothing.
func TestCommandLinesThatDoNotParseExit2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"acquire"},
		{"acquire", "a", "b"},
		{"migrate"},
		{"migrate", "sideways"},
		{"migrate", "goto"},
		{"migrate", "version", "3"},
		{"status", "a", "b"},
		{"run", "x"},
		{"run", "x", "true"},
		{"doctor", "extra"},
		{"frobnicate"},
		{"status", "--no-such-flag"},
		{"acquire", "r", "--ttl", "soon"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			// No server is needed: nothing may be tried before parsing.
			code, out, errOut := run(t, append(args, "--database-url", "postgres://127.0.0.1:1/none")...)
			require.Equal(t, cli.ExitUsage, code, "stdout %q stderr %q", out, errOut)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			require.True(t, strings.HasPrefix(errOut, "pgfence: "), errOut)
		})
	}
}

// TestErrorsSpeakCLI: one "pgfence: " prefix; flags named instead of Go API
// calls; a timeout says what timed out; a PostgreSQL HINT reaches the user.
func TestErrorsSpeakCLI(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "held", "other", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	defer sqlfuncs.Release(t.Context(), db.Pool, "held", tok)

	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"held", []string{"acquire", "held", url}, cli.ExitHeld, []string{"held by other", "pass --wait"}},
		{"timeout", []string{"acquire", "held", "--wait", "--timeout", "50ms", url}, cli.ExitHeld, []string{"not granted within 50ms (--timeout"}},
		{"not installed", []string{"status", "--database-url", pgtest.Empty(t).URL}, cli.ExitError, []string{"pgfence migrate up"}},
		{"hint kept", []string{"protect", "a_view", "--resource", "r", url}, cli.ExitError, []string{"protect a plain table"}},
		{"ttl flag", []string{"acquire", "r", "--ttl", "48h", url}, cli.ExitUsage, []string{"--ttl 48h0m0s is out of range"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "hint kept" {
				_, err := db.Pool.Exec(t.Context(), `CREATE VIEW a_view AS SELECT 1 AS x`)
				require.NoError(t, err)
			}
			code, out, errOut := run(t, c.args...)
			require.Equal(t, c.code, code, "stdout %q stderr %q", out, errOut)
			require.Equal(t, 1, strings.Count(errOut, "pgfence: "), "one prefix: %q", errOut)
			for _, w := range c.want {
				require.Contains(t, errOut, w)
			}
			for _, api := range []string{"Lock", "Config.", "gofence", "context deadline exceeded"} {
				require.NotContains(t, errOut, api)
			}
		})
	}
}

// TestJSONErrors: with --json a failing command still prints one JSON
// document on stdout.
func TestJSONErrors(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "held", "other", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	defer sqlfuncs.Release(t.Context(), db.Pool, "held", tok)

	for _, c := range []struct {
		args     []string
		code     int
		sqlstate string
	}{
		{[]string{"acquire", "held", "--json", url}, cli.ExitHeld, ""},
		{[]string{"status", "never", "--json", url}, cli.ExitError, ""},
		{[]string{"status", "a", "b", "--json", url}, cli.ExitUsage, ""},
		{[]string{"acquire", "--json", "r", "--ttl", "soon", url}, cli.ExitUsage, ""},
		{[]string{"protect", "nope", "--resource", "r", "--json", url}, cli.ExitError, "42P01"},
	} {
		t.Run(strings.Join(c.args[:len(c.args)-1], " "), func(t *testing.T) {
			code, out, errOut := run(t, c.args...)
			require.Equal(t, c.code, code, errOut)
			var got struct {
				Error    string `json:"error"`
				ExitCode int    `json:"exit_code"`
				SQLState string `json:"sqlstate"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &got), "stdout %q", out)
			require.Equal(t, c.code, got.ExitCode)
			require.Equal(t, strings.TrimSpace(strings.TrimPrefix(errOut, "pgfence: ")), got.Error)
			require.Equal(t, c.sqlstate, got.SQLState)
		})
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	code, out, errOut := run(t, "--version")
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, fmt.Sprintf(`^pgfence \S.*, migrations %d\n$`, migrations.Latest), out)
}

// TestRunExits75OnlyWhenHeld: 75 tells a cron wrapper "another instance
// runs"; an outage must not look like that.
func TestRunExits75OnlyWhenHeld(t *testing.T) {
	t.Parallel()
	marker := filepath.Join(t.TempDir(), "ran")
	noKit := pgtest.Empty(t)
	db := pgtest.Setup(t)
	stranger := pgtest.NewRole(t, "stranger")
	for _, c := range []struct {
		name, url, want string
	}{
		{"kit not installed", noKit.URL, "pgfence migrate up"},
		{"role without usage", db.URLAs(stranger), "permission denied"},
		{"server down", "postgres://127.0.0.1:1/postgres?connect_timeout=2", "cannot reach PostgreSQL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := run(t, "run", "job", "--database-url", c.url, "--", "touch", marker)
			require.Equal(t, cli.ExitError, code, errOut)
			require.Contains(t, errOut, c.want)
			require.NoFileExists(t, marker)
		})
	}
}

// TestPermissionErrorsNameTheFix: a role without the kit's usage, or
// without its operator privilege for revoke, is told which grant it lacks,
// the exact call, and who runs it, as doctor says it.
func TestPermissionErrorsNameTheFix(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	stranger := pgtest.NewRole(t, "stranger")
	app := pgtest.NewRole(t, "app")
	require.NoError(t, sqlfuncs.GrantUsage(t.Context(), db.Pool, app, false))
	var owner string
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fence'`).Scan(&owner))
	marker := filepath.Join(t.TempDir(), "ran")

	usage := "as role " + owner + " (the kit's owner): SELECT fence.grant_usage('" + stranger + "')"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"acquire without usage", []string{"acquire", "j", "--database-url", db.URLAs(stranger)}, usage},
		{"status without usage", []string{"status", "--database-url", db.URLAs(stranger)}, usage},
		{"run without usage", []string{"run", "j", "--database-url", db.URLAs(stranger), "--", "touch", marker}, usage},
		{"revoke without the operator privilege", []string{"revoke", "orders", "--database-url", db.URLAs(app)},
			"as role " + owner + " (the kit's owner): SELECT fence.grant_usage('" + app + "', operator => true)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := run(t, c.args...)
			require.Equal(t, cli.ExitError, code, errOut)
			require.Contains(t, errOut, "permission denied", "PostgreSQL's own words stay")
			require.Contains(t, errOut, c.want)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			require.NoFileExists(t, marker)
		})
	}
}
