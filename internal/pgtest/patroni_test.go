package pgtest_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestPatroniHarness: NewPatroni brings up etcd and two Patroni nodes, the
// first leads with the fence database migrated, the second streams from it
// and holds the kit too; the multi-host URL reaches the leader; and when
// the test that started it ends, no process it started still runs and its
// directory is gone.
func TestPatroniHarness(t *testing.T) {
	t.Parallel()
	var pids []int
	var dirs []string
	t.Run("cluster", func(t *testing.T) {
		c := pgtest.NewPatroni(t, pgtest.PatroniOptions{Nodes: 2})
		leader := c.WaitLeader(t, "")
		require.Equal(t, "node1", leader.Name, "the first node bootstraps and leads")

		members, err := c.Members(t.Context())
		require.NoError(t, err)
		require.Len(t, members, 2)

		conn, err := pgx.Connect(t.Context(), c.URL(pgtest.ClusterDB))
		require.NoError(t, err, c.URL(pgtest.ClusterDB))
		defer conn.Close(t.Context())
		var inRecovery bool
		var port int
		require.NoError(t, conn.QueryRow(t.Context(), "SELECT pg_is_in_recovery(), current_setting('port')::int").Scan(&inRecovery, &port))
		require.False(t, inRecovery, "target_session_attrs=read-write reaches the primary")
		require.Equal(t, leader.Port, port)

		replica := c.Nodes[1]
		rc, err := pgx.Connect(t.Context(), replica.URL(pgtest.ClusterDB))
		require.NoError(t, err)
		defer rc.Close(t.Context())
		var kit bool
		require.NoError(t, rc.QueryRow(t.Context(), "SELECT pg_is_in_recovery(), EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'fence')").Scan(&inRecovery, &kit))
		require.True(t, inRecovery, "the second node is a replica")
		require.True(t, kit, "the replica cloned the migrated fence database")

		pids = append(pids, c.Etcd.PID())
		for _, n := range c.Nodes {
			p, pm := n.PIDs()
			require.NotZero(t, p, "%s: patroni runs", n.Name)
			require.NotZero(t, pm, "%s: postmaster runs", n.Name)
			pids = append(pids, p, pm)
			dirs = append(dirs, n.Dir)
		}
		t.Logf("%s; %s; processes %v", c.Version, c.Etcd.Version, pids)
	})
	if t.Failed() || len(pids) == 0 {
		return // skipped, or already failed
	}
	for _, pid := range pids {
		require.False(t, processRuns(pid), "process %d outlived the test that started it", pid)
	}
	for _, d := range dirs {
		_, err := os.Stat(d)
		require.ErrorIs(t, err, os.ErrNotExist, "%s outlived the test", d)
	}
}

// processRuns reports whether process pid exists and is not a zombie.
func processRuns(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
