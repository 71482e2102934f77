//go:build linux

package cli_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

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

// syncBuf is a bytes.Buffer safe for a writer and a reader at once.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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

// The lease is being lost (the watchdog has sent SIGTERM, the command
// ignores it); then pgfence itself is told to stop (SIGTERM/SIGINT cancel
// the context in main.go). The command must still be SIGKILLed before the
// server's expiry of its lease. (The ctx branch used to reset termAt and set
// stopping, which disabled the "SIGKILL when grace/4 is left" rule: SIGKILL
// came grace after the signal, past the trust deadline and past the server's
// expiry, while the command still ran.)
func TestRunSignalDuringLossStillKillsBeforeExpiry(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	proxy := pgtest.NewProxy(t, db.URL)
	pidFile := filepath.Join(t.TempDir(), "pid")

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr syncBuf
	done := make(chan int, 1)
	go func() {
		script := `trap '' TERM; echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
		done <- cli.Run(ctx, []string{"run", "job", "--ttl", "2s", "--grace", "900ms", "--database-url", proxy.URL(db.URL), "--", "sh", "-c", script}, &bytes.Buffer{}, &stderr)
	}()
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}, 20*time.Second, 10*time.Millisecond)
	defer syscall.Kill(-pid, syscall.SIGKILL)

	proxy.Freeze()
	defer proxy.Thaw()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "sending SIGTERM") }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(550 * time.Millisecond) // still more than grace/4 before the trust deadline
	cancel()                           // what SIGTERM to pgfence does (signal.NotifyContext in main.go)

	// Wait until the server no longer counts the lease live: from then on it
	// could be granted to someone else.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var live bool
		if assert.NoError(c, db.Pool.QueryRow(t.Context(), `SELECT live FROM fence.leases WHERE resource = 'job'`).Scan(&live)) {
			assert.False(c, live)
		}
	}, 10*time.Second, 5*time.Millisecond)
	require.False(t, processRunning(pid), "the command is still running after the server's expiry of its lease")
	<-done
}

// Once ctx is done (SIGINT/SIGTERM to pgfence), the watchdog waits for the
// command without burning a CPU. (`case <-ctx.Done()`, ready on every
// iteration of its loop, used to make it spin until the command exited.)
func TestRunDoesNotSpinAfterASignal(t *testing.T) {
	db := pgtest.Setup(t)
	started := filepath.Join(t.TempDir(), "started")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		script := `trap 'sleep 1.5; exit 0' TERM; touch ` + started + `; while :; do sleep 0.05; done`
		done <- cli.Run(ctx, []string{"run", "job", "--database-url", db.URL, "--", "sh", "-c", script}, &bytes.Buffer{}, &bytes.Buffer{})
	}()
	require.Eventually(t, func() bool { _, err := os.Stat(started); return err == nil }, 20*time.Second, 10*time.Millisecond)

	var before, after syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &before))
	start := time.Now()
	cancel()
	<-done
	wall := time.Since(start)
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &after))
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
	t.Logf("wall %s, cpu %s", wall, cpu)
	require.Less(t, cpu, wall/3, "pgfence run burned a CPU while waiting for the command to stop")
}

// A single Ctrl-C (SIGINT to pgfence) reaches the command as SIGINT only:
// docs/cli.md says signals sent to pgfence "go to the whole group", and a
// command that handles INT by cancelling its current work (psql, for
// instance) must not be killed for it. (It used to arrive also as SIGTERM,
// from the ctx branch, and the command was SIGKILLed after --grace.) The
// command here logs each signal; after the SIGINT, a SIGHUP (passed on as
// well) makes it exit: the log must hold exactly those two, and the exit
// code must be the command's own.
func TestRunPassesCtrlCOnlyAsSIGINT(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	pidFile := filepath.Join(dir, "pid")
	script := `trap 'echo INT >> ` + log + `' INT; trap 'echo TERM >> ` + log + `' TERM; trap 'echo HUP >> ` + log + `; exit 3' HUP; ` +
		`echo $$ > ` + pidFile + `; while :; do sleep 0.05; done`
	cmd, stderr := startPgfence(t, bin, "run", "job", "--ttl", "10s", "--grace", "1s", "--database-url", db.URL, "--", "sh", "-c", script)
	waitPid(t, pidFile) // and kill its group at the end, whatever happens

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.Eventually(t, func() bool { b, _ := os.ReadFile(log); return len(b) > 0 }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Equal(t, 3, exitCode(t, cmd), "stderr: %s", stderr.String())
	require.Equal(t, "INT\nHUP\n", readFile(t, log), "the command got more than the signals sent to pgfence; stderr: %s", stderr.String())
}

// TestDemoCleansUpWhenItsReaderGoesAway: `pgfence demo | head -1` closes the
// pipe while the demo still writes; the demo must still drop its database
// (before SIGPIPE was handled, the first write after the reader left killed
// it and left pgfence_demo_XXXX behind). On a cluster of its own, so that no
// other test's demo database is counted.
func TestDemoCleansUpWhenItsReaderGoesAway(t *testing.T) {
	t.Parallel()
	bin := buildPgfence(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "demo", "--database-url", c.URL())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuf
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	first := make([]byte, 1)
	_, err = out.Read(first) // the demo is writing
	require.NoError(t, err)
	require.NoError(t, out.Close()) // the reader goes away
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		ws := exit.Sys().(syscall.WaitStatus)
		require.False(t, ws.Signaled(), "killed by %v before its cleanup; stderr: %s", ws.Signal(), stderr.String())
	}
	db, err := pgx.Connect(ctx, c.AdminURL())
	require.NoError(t, err)
	defer db.Close(context.Background())
	var left int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 'pgfence_demo_%'`).Scan(&left))
	require.Zero(t, left, "the demo's database was left behind; stderr: %s", stderr.String())
}
