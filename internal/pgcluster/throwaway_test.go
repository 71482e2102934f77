package pgcluster_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// A cluster started with StartCopy from a Snapshot has the snapshot's data
// and a life of its own: another directory (in RAMDir when there is one),
// another port, and writes that the original does not see. pgtest's shared
// cluster starts this way from the second test binary on.
func TestStartCopyStartsFromTheSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts clusters of its own")
	}
	bins, err := pgcluster.LocalBins(os.Getenv(pgtest.EnvBinDir))
	if err != nil {
		if os.Getenv(pgtest.EnvRequireDB) == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx := t.Context()
	ram := pgcluster.RAMDir()
	a, err := pgcluster.StartThrowawayIn(ctx, bins, ram, []string{"fsync = off"})
	require.NoError(t, err)
	defer a.Destroy()
	query := func(in *pgcluster.Instance, sql string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, in.URL("postgres"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		var out string
		if strings.HasPrefix(sql, "SELECT") {
			require.NoError(t, conn.QueryRow(ctx, sql).Scan(&out))
		} else {
			_, err = conn.Exec(ctx, sql)
			require.NoError(t, err)
		}
		return out
	}
	query(a, `CREATE TABLE marker AS SELECT 'before the snapshot'::text AS note`)

	require.NoError(t, a.Stop(ctx, "fast"))
	snap := filepath.Join(t.TempDir(), "data")
	require.NoError(t, a.Snapshot(ctx, snap))
	require.NoError(t, a.Start(ctx))

	b, err := pgcluster.StartCopy(ctx, bins, ram, snap, nil)
	require.NoError(t, err)
	defer b.Destroy()
	require.NotEqual(t, a.Port, b.Port)
	require.NotEqual(t, a.Base, b.Base)
	if ram != "" {
		require.True(t, strings.HasPrefix(b.Base, ram+"/"), "%s is not in %s", b.Base, ram)
	}
	require.Equal(t, "before the snapshot", query(b, `SELECT note FROM marker`))
	query(b, `INSERT INTO marker VALUES ('in the copy')`)
	require.Equal(t, "1", query(a, `SELECT count(*)::text FROM marker`), "the copy wrote into the original")
	require.Equal(t, "2", query(b, `SELECT count(*)::text FROM marker`))
}
