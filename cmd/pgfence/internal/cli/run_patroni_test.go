//go:build linux

package cli_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestRunAcrossPatroniFailover, through the real binary on a Patroni
// cluster's multi-host URL (target_session_attrs=read-write): when the
// primary node dies, pgfence run cannot renew, stops its command before the
// lease could pass to anyone and exits with the lost code; a second pgfence
// run, waiting for the same resource, finds the new primary and runs its
// command under a larger token, of a later epoch.
func TestRunAcrossPatroniFailover(t *testing.T) {
	t.Parallel()
	c := pgtest.NewPatroni(t, pgtest.PatroniOptions{Nodes: 2})
	bin := buildPgfence(t)
	url := "--database-url=" + c.URL(pgtest.ClusterDB)
	dir := t.TempDir()
	first, second := filepath.Join(dir, "first"), filepath.Join(dir, "second")

	holder, holderErr := startPgfence(t, bin, "run", "cli/failover", "--ttl", "3s", url, "--",
		"sh", "-c", `echo "$$ $PGFENCE_TOKEN" > `+first+`.tmp && mv `+first+`.tmp `+first+`; exec sleep 120`)
	var pid int
	var tok1 int64
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(first)
		if err != nil {
			return false
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		tok1, _ = strconv.ParseInt(f[1], 10, 64)
		return pid > 0 && tok1 > 0
	}, 60*time.Second, 20*time.Millisecond, "the first command starts; stderr: %s", holderErr)
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })

	waiter, waiterErr := startPgfence(t, bin, "run", "cli/failover", "--wait", "--timeout", "50s", "--ttl", "3s", url, "--",
		"sh", "-c", `echo "$PGFENCE_TOKEN" > `+second)
	time.Sleep(time.Second) // both on the old primary: one holds, one waits

	leader := c.WaitLeader(t, "")
	killed := time.Now()
	leader.Kill(t)

	require.Equal(t, cli.ExitRunLost, exitCode(t, holder), "stderr: %s", holderErr)
	lostAfter := time.Since(killed)
	require.Less(t, lostAfter, 10*time.Second, "stopped within its TTL, not after it; stderr: %s", holderErr)
	// Lost, or about to be: the renewals fail, and pgfence stops the
	// command before the trust deadline when it can.
	require.Regexp(t, `^pgfence: (lost the lease on cli/failover|the lease on cli/failover is about to be lost) \(.*\); sending SIG(TERM|KILL) to sh\n`, holderErr.String())
	require.Eventually(t, func() bool { return processGone(pid) }, 5*time.Second, 20*time.Millisecond, "the command is gone")

	require.Equal(t, cli.ExitOK, exitCode(t, waiter), "stderr: %s", waiterErr)
	grantedAfter := time.Since(killed)
	b, err := os.ReadFile(second)
	require.NoError(t, err)
	tok2, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	require.Greater(t, tok2, tok1, "the new primary's token exceeds the old one")
	require.Greater(t, tok2>>43, tok1>>43, "of a later epoch")
	t.Logf("pgfence run: token %d stopped %s after the primary node was killed; the waiting run got token %d on the new primary %s after it",
		tok1, lostAfter.Round(time.Millisecond), tok2, grantedAfter.Round(time.Millisecond))
	leader.Start(t)
}

// processGone reports whether process pid has exited (a zombie that its
// new parent has not reaped yet counts as gone).
func processGone(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
