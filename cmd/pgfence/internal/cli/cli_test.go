package cli_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m, removeBuiltPgfence) }

// built is the real binary, built once per test binary by buildPgfence
// into a directory of its own that TestMain removes at the end.
var built struct {
	once     sync.Once
	dir, bin string
	out      []byte
	err      error
}

// buildPgfence builds the real binary (signals, exit codes and the
// terminal are only handled by main), once for every test that asks: each
// build links a binary of its own, seconds of CPU on a busy machine.
func buildPgfence(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "pgfence-cli-test-")
		if built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "pgfence")
		built.out, built.err = exec.Command("go", "build", "-o", built.bin, "github.com/pgfence/pgfence/cmd/pgfence").CombinedOutput()
	})
	require.NoError(t, built.err, "%s", built.out)
	return built.bin
}

func removeBuiltPgfence() {
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
}

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

	// The per-row story: A's stale write to row 1 (resource job:1) is
	// refused; B, holding job:2, writes row 2 before and after with its one
	// token; the rows end with C's result and B's, each under its writer's token.
	story := out[strings.Index(out, "== 3. "):]
	tokB := regexp.MustCompile(`B  acquire "job:2" ttl=\S+\s+granted token (\d+)\n`).FindStringSubmatch(story)
	require.Len(t, tokB, 2, story)
	tokC := regexp.MustCompile(`C  acquire "job:1"\s+granted token (\d+) `).FindStringSubmatch(story)
	require.Len(t, tokC, 2, story)
	require.Regexp(t, `A  wakes, UPDATE row 1 with token \d+\s+REFUSED by the database\n\s+SQLSTATE FN001: .*resource job:1:`, story)
	bWrites := regexp.MustCompile(`B  (INSERT|UPDATE) row 2 with token (\d+)\s+(\S+)`).FindAllStringSubmatch(story, -1)
	require.Len(t, bWrites, 3, story)
	for _, w := range bWrites {
		require.Equal(t, tokB[1], w[2], "B writes with its own token")
		require.Equal(t, "accepted", w[3])
	}
	require.Regexp(t, `(?s)REFUSED by the database.*B  UPDATE row 2 with token \d+\s+accepted`, story, "B writes after A's refusal")
	require.Regexp(t, `(?s)rows of job at the end:\n\s+id\s+worker\s+result\s+tok\n\s+1\s+worker-C\s+final by C\s+`+tokC[1]+`\n\s+2\s+worker-B\s+final by B\s+`+tokB[1]+`\n`, story)

	// The README shows this story as the demo prints it, but for the times,
	// the tokens and the TTLs.
	readme, err := os.ReadFile("../../../../README.md")
	require.NoError(t, err)
	shown := regexp.MustCompile("(?s)```\n(== 3\\. .*?)```").FindSubmatch(readme)
	require.Len(t, shown, 2, "README shows story 3")
	printed := story[:strings.Index(story, "\n\n")+1]
	require.Equal(t, demoShape(string(shown[1])), demoShape(printed))

	// Its own database, named in the output, is gone (other tests may run
	// demos of their own at the same time).
	name := regexp.MustCompile(`database (pgfence_demo_[0-9a-f]+) on`).FindStringSubmatch(out)
	require.Len(t, name, 2, out)
	db := pgtest.Empty(t)
	var left int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_database WHERE datname = $1`, name[1]).Scan(&left))
	require.Zero(t, left, "the demo dropped its database")
}

// demoShape is the demo's output without what changes from run to run:
// times, tokens, TTLs and the padding that depends on their width, and the
// "held by A: C waits" step, absent when a slow machine took longer than the
// TTL before C first asked.
func demoShape(s string) []string {
	s = regexp.MustCompile(`\+\d+\.\d{3}s`).ReplaceAllString(s, "+T")
	s = regexp.MustCompile(`\d{7,}`).ReplaceAllString(s, "TOKEN")
	s = regexp.MustCompile(`ttl=\S+`).ReplaceAllString(s, "ttl=TTL")
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if !strings.Contains(l, " held by ") {
			lines = append(lines, strings.Join(strings.Fields(l), " "))
		}
	}
	return lines
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
	if testing.Short() {
		t.Skip("-short: skipping a test that starts a cluster of its own")
	}
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
