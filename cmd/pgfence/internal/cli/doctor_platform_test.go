package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestDoctorPlatform(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)

	t.Run("direct connection", func(t *testing.T) {
		code, out, errOut := run(t, "doctor", "--database-url", db.URL)
		require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
		require.Regexp(t, `ok\s+pooler\s+direct connection`, out)
		require.Regexp(t, `ok\s+token epoch\s+system identifier and WAL timeline readable`, out)
	})

	t.Run("through PgBouncer in transaction mode", func(t *testing.T) {
		pb := pgtest.NewPgBouncer(t, db.URL)
		code, out, errOut := run(t, "doctor", "--database-url", pb.URL(db.URL))
		require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
		require.Regexp(t, `WARN\s+pooler\s+connected through a pooler in transaction mode`, out)
		require.Contains(t, out, "LeaseOptions.Session refuses")
	})

	t.Run("a service that refuses the WAL functions", func(t *testing.T) {
		// What a managed service does to pg_current_wal_lsn() (Aurora
		// without logical replication, a revoked grant): doctor says that
		// grants need it. The revoke is local to this test's database.
		_, err := db.Pool.Exec(t.Context(), `REVOKE EXECUTE ON FUNCTION pg_current_wal_lsn() FROM PUBLIC`)
		require.NoError(t, err)
		role := pgtest.NewRole(t, "doctor")
		_, err = db.Pool.Exec(t.Context(), `SELECT fence.grant_usage($1)`, role)
		require.NoError(t, err)
		// Without this, doctor hangs as such a role today: a connection of
		// the failed version read is never given back and pool.Close waits
		// (reported for issue 11).
		_, err = db.Pool.Exec(t.Context(), `GRANT SELECT ON fence_schema_migrations TO `+role)
		require.NoError(t, err)
		code, out, _ := run(t, "doctor", "--database-url", db.URLAs(role))
		require.Equal(t, cli.ExitError, code, out)
		require.Regexp(t, `FAIL\s+token epoch\s+the server refuses what the token epoch is read from: pg_current_wal_lsn\(\): .*permission denied`, out)
	})
}
