//go:build linux

package cli_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestRunReportsALossInOrder, through the real binary: when pgfence run
// loses its lease, stderr says what happened in the order it happened, in
// one format (no structured log line among the plain ones), and never
// "did not stop" of a command that had no time to. (A pause past the trust
// deadline used to print gofence's slog line, then "did not stop; sending
// SIGKILL", then "was stopped (exit 143)": it had died of the SIGTERM sent
// in the same instant.)
func TestRunReportsALossInOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	url := "--database-url=" + db.URL

	// lines checks that every line is one of the CLI's own and returns them.
	lines := func(t *testing.T, stderr string) []string {
		t.Helper()
		ls := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		for _, l := range ls {
			require.True(t, strings.HasPrefix(l, "pgfence: "), "a line not in the CLI's format: %q", l)
			require.NotContains(t, l, "level=", stderr)
		}
		return ls
	}

	t.Run("revoked: SIGTERM, and the command ends on it", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		cmd, stderr := startPgfence(t, bin, "run", "revoked", "--ttl", "2s", url, "--", "sh", "-c", "echo $$ > "+pidFile+"; exec sleep 60")
		waitPid(t, pidFile)
		_, err := sqlfuncs.Revoke(t.Context(), db.Pool, "revoked")
		require.NoError(t, err)
		require.Equal(t, cli.ExitRunLost, exitCode(t, cmd), stderr.String())
		ls := lines(t, stderr.String())
		require.Len(t, ls, 2, stderr.String())
		require.Regexp(t, `^pgfence: lost the lease on revoked \(the server no longer has this lease live .*\); sending SIGTERM to sh$`, ls[0])
		require.Equal(t, "pgfence: sh ended on SIGTERM (exit status 143) after the lease on revoked was lost", ls[1])
	})

	t.Run("a command that ignores SIGTERM: SIGKILL, said when it still runs", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		script := `trap '' TERM; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
		cmd, stderr := startPgfence(t, bin, "run", "stubborn", "--ttl", "2s", url, "--", "sh", "-c", script)
		waitPid(t, pidFile)
		_, err := sqlfuncs.Revoke(t.Context(), db.Pool, "stubborn")
		require.NoError(t, err)
		require.Equal(t, cli.ExitRunLost, exitCode(t, cmd), stderr.String())
		ls := lines(t, stderr.String())
		require.Len(t, ls, 3, stderr.String())
		require.Regexp(t, `^pgfence: lost the lease on stubborn \(.*\); sending SIGTERM to sh$`, ls[0])
		require.Regexp(t, `^pgfence: sh still runs \d+ms after SIGTERM \(.*\); sending SIGKILL$`, ls[1])
		require.Equal(t, "pgfence: sh ended on SIGKILL (exit status 137) after the lease on stubborn was lost", ls[2])
	})

	t.Run("pgfence paused past its trust deadline: SIGKILL at once, and said so", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		cmd, stderr := startPgfence(t, bin, "run", "paused", "--ttl", "1s", url, "--", "sh", "-c", "echo $$ > "+pidFile+"; exec sleep 60")
		waitPid(t, pidFile)
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		// Paused until the server's clock has ended the lease: the local
		// trust deadline, earlier, has passed too.
		require.Eventually(t, func() bool {
			row, ok, err := sqlfuncs.GetLease(t.Context(), db.Pool, "paused")
			return err == nil && ok && !row.Live
		}, 20*time.Second, 10*time.Millisecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
		require.Equal(t, cli.ExitRunLost, exitCode(t, cmd), stderr.String())
		ls := lines(t, stderr.String())
		require.Len(t, ls, 2, stderr.String())
		require.Regexp(t, `^pgfence: (lost the lease on paused \(.*\)|the lease on paused is about to be lost \(.*\)); too late for SIGTERM.*: sending SIGKILL to sh$`, ls[0])
		require.Equal(t, "pgfence: sh ended on SIGKILL (exit status 137) after the lease on paused was lost", ls[1])
		require.NotContains(t, stderr.String(), "still runs")
	})
}
