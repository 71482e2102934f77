//go:build linux

package cli_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// exitOf runs the built binary and returns its exit code and output.
func exitOf(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	code, out, err := runBinary(t.Context(), bin, args...)
	require.NoError(t, err, "%s", out)
	return code, out
}

// runBinary is exitOf for a goroutine, which must not end the test: err is
// an error other than the binary's exit code.
func runBinary(ctx context.Context, bin string, args ...string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	var xerr *exec.ExitError
	if errors.As(err, &xerr) {
		return xerr.ExitCode(), string(out), nil
	}
	return 0, string(out), err
}

// TestRunExitCodesCanBeChosen, through the real binary: a command may exit
// 75 or 76 itself, so that run's own outcomes cannot be told from the
// command's by the defaults; -E/--conflict-exit-code and --lost-exit-code
// (flock(1)'s -E) pick codes the command never uses.
func TestRunExitCodesCanBeChosen(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	bin := buildPgfence(t)
	url := "--database-url=" + db.URL
	tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "busy", "other", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	defer sqlfuncs.Release(context.Background(), db.Pool, "busy", tok)
	marker := filepath.Join(t.TempDir(), "ran")

	for _, c := range []struct {
		name string
		args []string
		code int
	}{
		{"the command's own 75 passes through", []string{"run", "free", url, "--", "sh", "-c", "exit 75"}, 75},
		{"held, default", []string{"run", "busy", url, "--", "touch", marker}, cli.ExitRunNotAcquired},
		{"held, -E 200", []string{"run", "busy", "-E", "200", url, "--", "touch", marker}, 200},
		{"held, --conflict-exit-code=0", []string{"run", "busy", "--conflict-exit-code=0", url, "--", "touch", marker}, 0},
		{"held with --wait --timeout, -E 200", []string{"run", "busy", "--wait", "--timeout", "100ms", "-E", "200", url, "--", "touch", marker}, 200},
		{"the command's own 75 with -E 200", []string{"run", "free", "-E", "200", url, "--", "sh", "-c", "exit 75"}, 75},
		{"-E out of range", []string{"run", "free", "-E", "256", url, "--", "true"}, cli.ExitUsage},
		{"--lost-exit-code out of range", []string{"run", "free", "--lost-exit-code", "-1", url, "--", "true"}, cli.ExitUsage},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := exitOf(t, bin, c.args...)
			require.Equal(t, c.code, code, "%s", out)
			require.NoFileExists(t, marker, "the command never starts when the lease is held")
		})
	}

	for _, c := range []struct {
		name string
		flag []string
		code int
	}{
		{"lost, default", nil, cli.ExitRunLost},
		{"lost, --lost-exit-code 201", []string{"--lost-exit-code", "201"}, 201},
	} {
		t.Run(c.name, func(t *testing.T) {
			started := filepath.Join(t.TempDir(), "started")
			resource := "lost-" + filepath.Base(filepath.Dir(started))
			done := make(chan struct{})
			var code int
			var out string
			var runErr error
			go func() {
				defer close(done)
				args := append([]string{"run", resource, "--ttl", "2s", url}, c.flag...)
				code, out, runErr = runBinary(t.Context(), bin, append(args, "--", "sh", "-c", "touch "+started+"; exec sleep 60")...)
			}()
			require.Eventually(t, func() bool { _, err := os.Stat(started); return err == nil }, 30*time.Second, 10*time.Millisecond)
			_, err := sqlfuncs.Revoke(t.Context(), db.Pool, resource)
			require.NoError(t, err)
			<-done
			require.NoError(t, runErr, "%s", out)
			require.Equal(t, c.code, code, "%s", out)
			require.Contains(t, out, "lost the lease on "+resource)
		})
	}
}
