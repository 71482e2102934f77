//go:build linux

package cli_test

// Tests from an independent review: each one demonstrated a bug, fixed since;
// the comments describe the bug as it was.

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

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

// The lease is being lost (the watchdog has sent SIGTERM, the command
// ignores it); then pgfence itself is told to stop (SIGTERM/SIGINT cancel
// the context in main.go). The ctx branch resets termAt and sets stopping,
// which disables the "SIGKILL when grace/4 is left" rule: SIGKILL comes
// grace after the signal, past the trust deadline and past the server's
// expiry, while the command still runs.
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
	require.Eventually(t, func() bool {
		var live bool
		require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT live FROM fence.leases WHERE resource = 'job'`).Scan(&live))
		return !live
	}, 10*time.Second, 5*time.Millisecond)
	require.False(t, processRunning(pid), "the command is still running after the server's expiry of its lease")
	<-done
}

// Once ctx is done (SIGINT/SIGTERM to pgfence), `case <-ctx.Done()` is ready
// on every iteration of the watchdog loop: it spins on a CPU until the
// command exits.
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

// A single Ctrl-C (SIGINT to pgfence) used to reach the command as SIGINT and
// also as SIGTERM (the ctx branch), and the command was SIGKILLed after
// --grace. docs/cli.md says signals sent to pgfence "go to the whole group";
// a command that handles INT by cancelling its current work (psql, for
// instance) was killed instead. The command here logs each signal; after the
// SIGINT, a SIGHUP (passed on as well) makes it exit: the log must hold
// exactly those two, and the exit code must be the command's own.
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
	require.Equal(t, "INT\nHUP\n", readFile(t, log), "the command got more than the signals sent to pgfence")
}
