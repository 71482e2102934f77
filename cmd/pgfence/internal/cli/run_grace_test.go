//go:build linux

package cli_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// A renewal that succeeds inside the --grace window, after run sent
// SIGTERM because none had come, is honoured: run sends no SIGKILL, the
// command (which handles SIGTERM) runs on under the renewed lease, its own
// exit code is run's, and the lease is released at the end. (run sent
// SIGKILL anyway, exited 76 "lost", and left the renewed lease live.)
func TestRunHonoursARenewalInTheGraceWindow(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	proxy := pgtest.NewProxy(t, db.URL)
	dir := t.TempDir()
	started, termed, finish := filepath.Join(dir, "started"), filepath.Join(dir, "termed"), filepath.Join(dir, "finish")
	type result struct {
		code int
		err  string
	}
	done := make(chan result, 1)
	go func() {
		script := `trap 'touch ` + termed + `' TERM; touch ` + started + `; while [ ! -e ` + finish + ` ]; do sleep 0.05; done`
		// TTL 10s: renewals every 3.3s, trust deadline 9s after each is sent,
		// SIGTERM with 2s left, SIGKILL 1.5s after it.
		code, _, errOut := run(t, "run", "job", "--ttl", "10s", "--grace", "2s", "--database-url", proxy.URL(db.URL), "--", "sh", "-c", script)
		done <- result{code, errOut}
	}()
	exists := func(path string) func() bool {
		return func() bool { _, err := os.Stat(path); return err == nil }
	}
	require.Eventually(t, exists(started), 20*time.Second, 10*time.Millisecond)
	proxy.Delay(pgtest.ToClient, time.Minute) // no renewal's reply comes
	require.Eventually(t, exists(termed), 20*time.Second, 10*time.Millisecond, "SIGTERM, with less than --grace left")
	proxy.Delay(pgtest.ToClient, 0) // the replies come again: a renewal succeeds in the grace window
	time.Sleep(3 * time.Second)     // past the moment of the SIGKILL
	require.NoError(t, os.WriteFile(finish, nil, 0o600))
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("pgfence run did not end")
	}
	require.Equal(t, cli.ExitOK, r.code, "the command's own exit code; stderr: %s", r.err)
	require.Contains(t, r.err, "sending SIGTERM")
	require.Contains(t, r.err, "succeeded after all")
	require.NotContains(t, r.err, "; sending SIGKILL")
	require.NotContains(t, r.err, ": sending SIGKILL")
	var live bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT live FROM fence.leases WHERE resource = 'job'`).Scan(&live))
	require.False(t, live, "released at the end")
}
