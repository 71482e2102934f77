//go:build linux

package cli_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// buildPgfence builds the real binary: signals are only handled by main.
func buildPgfence(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pgfence")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/pgfence/pgfence/cmd/pgfence").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// startPgfence starts the binary; when the test ends it is killed if still
// running (a hang fails the test through the safety timeout of the context,
// never leaves a process behind).
func startPgfence(t *testing.T, bin string, args ...string) (*exec.Cmd, *syncBuf) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr syncBuf
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	return cmd, &stderr
}

// exitCode waits for cmd and returns its exit code (128+N when killed by
// signal N).
func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// waitPid waits for the pid that a command wrote to path, and makes sure its
// process group is gone when the test ends.
func waitPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 30*time.Second, 10*time.Millisecond)
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	return pid
}

// A command that ignores INT and TERM is not left running after a second
// Ctrl-C: pgfence sends SIGKILL to its group and exits at once. (The second
// signal used to be swallowed, and pgfence waited for the command forever.)
func TestRunSecondSignalKillsACommandThatIgnoresThem(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `trap '' INT TERM; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
	cmd, stderr := startPgfence(t, bin, "run", "job", "--database-url", db.URL, "--", "sh", "-c", script)
	pid := waitPid(t, pidFile)

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM)) // a second, distinct signal: never merged with the first
	// run's own loop and main's second-signal exit race to end pgfence:
	// either way it is 128+N, N being one of the two signals.
	require.Contains(t, []int{128 + int(syscall.SIGINT), 128 + int(syscall.SIGTERM)}, exitCode(t, cmd), "stderr: %s", stderr.String())
	require.Eventually(t, func() bool { return !processRunning(pid) }, 10*time.Second, 10*time.Millisecond,
		"the command outlived pgfence")
}

// If pgfence run is SIGKILLed (nothing in it can react), the kernel kills
// its command (Linux parent-death signal), so it cannot go on writing after
// the lease passes to a new holder.
func TestRunCommandDiesWithPgfence(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := `trap '' INT TERM HUP; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
	cmd, _ := startPgfence(t, bin, "run", "job", "--database-url", db.URL, "--", "sh", "-c", script)
	pid := waitPid(t, pidFile)

	require.NoError(t, cmd.Process.Kill())
	require.Equal(t, 128+int(syscall.SIGKILL), exitCode(t, cmd))
	require.Eventually(t, func() bool { return !processRunning(pid) }, 10*time.Second, 10*time.Millisecond,
		"the command outlived a SIGKILLed pgfence run")
}

// A limited role's command that waits (acquire --wait on a held resource)
// ends on the first SIGTERM, with exit 130, and hands its connections back.
func TestWaitingCommandEndsOnSignal(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	app := pgtest.NewRole(t, "app")
	require.NoError(t, sqlfuncs.GrantUsage(t.Context(), db.Pool, app, false))
	tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "held", "other", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	defer sqlfuncs.Release(t.Context(), db.Pool, "held", tok)

	cmd, stderr := startPgfence(t, bin, "acquire", "held", "--wait", "--database-url", db.URLAs(app))
	// Signal once the waiter is registered (fence.acquire(..., waiting => true)).
	require.Eventually(t, func() bool {
		var waiting bool
		return db.Pool.QueryRow(t.Context(), `SELECT waiters FROM fence.lease WHERE resource = 'held'`).Scan(&waiting) == nil && waiting
	}, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 130, exitCode(t, cmd), "stderr: %s", stderr.String())
	require.Equal(t, "pgfence: interrupted\n", stderr.String())
	require.Eventually(t, func() bool {
		var n int
		return db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, app).Scan(&n) == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "connections of the interrupted command stayed open")
}
