package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli.Run(t.Context(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDemoFencesOffTheStaleWorkerAndCleansUp(t *testing.T) {
	t.Parallel()
	admin := pgtest.AdminURL(t)
	code, out, errOut := run(t, "demo", "--database-url", admin, "--ttl", "300ms")
	require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	require.Contains(t, out, "REFUSED by the database")
	require.Contains(t, out, "SQLSTATE FN001")
	require.Contains(t, out, "lost update")
	require.Regexp(t, `(?s)rows of report at the end:.*worker-B\s+final by B`, out)
	require.Regexp(t, `(?s)rows of report_unprotected at the end:.*worker-A\s+final by A \(stale\)`, out)

	// Its own database, named in the output, is gone (other tests may run
	// demos of their own at the same time).
	name := regexp.MustCompile(`database (pgfence_demo_[0-9a-f]+) on`).FindStringSubmatch(out)
	require.Len(t, name, 2, out)
	db := pgtest.Empty(t)
	var left int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_database WHERE datname = $1`, name[1]).Scan(&left))
	require.Zero(t, left, "the demo dropped its database")
}

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	code, out, errOut := run(t, "migrate", "version", "--database-url", db.URL)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "version 0, clean\n", out)
	code, out, errOut = run(t, "migrate", "up", "--database-url", db.URL)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest), out)
	code, out, errOut = run(t, "migrate", "down", "1", "--yes", "--database-url", db.URL)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, fmt.Sprintf("version %d, clean\n", migrations.Latest-1), out)
	code, out, errOut = run(t, "migrate", "down", "-y", "--database-url", db.URL)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "version 0, clean\n", out)

	code, _, errOut = run(t, "migrate", "goto", "x", "--database-url", db.URL)
	require.Equal(t, cli.ExitUsage, code)
	require.Contains(t, errOut, "is not a number")
}

func TestUnreachableDatabaseSaysWhatToDo(t *testing.T) {
	t.Parallel()
	code, _, errOut := run(t, "migrate", "version", "--database-url", "postgres://127.0.0.1:1/postgres?connect_timeout=2")
	require.Equal(t, cli.ExitError, code)
	require.Contains(t, errOut, "cannot reach PostgreSQL")
	require.Contains(t, errOut, "start it")
	require.Equal(t, 1, bytes.Count([]byte(errOut), []byte("\n")), "one line: %q", errOut)
}

// TestDemoOnAThrowawayCluster: with --throwaway (and, automatically, when no
// connection is configured and nothing answers at the default address) the
// demo starts a cluster from this machine's PostgreSQL binaries, says so,
// and removes it.
func TestDemoOnAThrowawayCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.FindBins(os.Getenv(pgtest.EnvBinDir)); err != nil {
		if os.Getenv(pgtest.EnvRequireDB) == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	code, out, errOut := run(t, "demo", "--throwaway", "--ttl", "300ms")
	require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	require.Contains(t, errOut, "started a throwaway PostgreSQL cluster")
	require.Contains(t, out, "REFUSED by the database")
	dir := regexp.MustCompile(`\(in (\S+); removed at the end\)`).FindStringSubmatch(errOut)
	require.Len(t, dir, 2, errOut)
	require.NoDirExists(t, dir[1], "the throwaway cluster was removed")
}
