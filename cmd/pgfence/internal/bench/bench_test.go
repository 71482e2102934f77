package bench_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The bench is not a test of speed: these runs only check that the
// scenarios run without errors, that the report has its shape, and that the
// bench leaves no database behind. No figure is asserted. The CLI's
// bench_test.go runs every scenario through the command.

func TestMain(m *testing.M) { pgtest.Main(m) }

// smokeOptions keep a scenario to a second or two (the options of the CLI's
// smoke runs).
func smokeOptions(scenario string) bench.Options {
	return bench.Options{Duration: 60 * time.Millisecond, Rounds: 1, Clients: []int{1, 2}, Scenario: scenario,
		BigResources: 2000, Waiters: 2, PollInterval: 20 * time.Millisecond}
}

// connect opens a pool on url, closed at the end of the test.
func connect(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// runScenario runs scenario with smokeOptions on the server of url and
// returns its report, after checking that the bench dropped its databases.
// (The CLI's bench_test.go checks the JSON that pgfence bench --json prints.)
func runScenario(t *testing.T, url, scenario string) *bench.Report {
	t.Helper()
	r, err := bench.Run(t.Context(), connect(t, url), smokeOptions(scenario))
	require.NoError(t, err)
	pgtest.RequireNoDatabases(t, "pgfence_bench_") // the bench dropped its databases
	return r
}

// TestBenchScaleReturnsOnEveryVersion: the scale scenario asks every
// connection to flush its statistics with pg_stat_force_next_flush(), which
// PostgreSQL 13 and 14 lack. There, on the first failure, the bench returned
// without handing back the connections it held, and the deferred pool Close
// waited forever. It runs here as an ordinary role with CREATEDB, as a user
// would; on 13 and 14 the scenario says that it waited for the statistics.
func TestBenchScaleReturnsOnEveryVersion(t *testing.T) {
	pgtest.Long(t, "the scale scenario")
	t.Parallel()
	role := pgtest.NewRole(t, "bencher")
	db := pgtest.Empty(t)
	_, err := db.Pool.Exec(t.Context(), `ALTER ROLE `+pgx.Identifier{role}.Sanitize()+` CREATEDB`)
	require.NoError(t, err)
	var version int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT current_setting('server_version_num')::int`).Scan(&version))
	url := pgtest.URLFor(db.URLAs(role), "postgres")

	type result struct {
		err error
		out string
	}
	done := make(chan result, 1)
	admin := connect(t, url)
	go func() {
		var out strings.Builder
		o := smokeOptions("scale")
		o.Out = &out
		_, err := bench.Run(t.Context(), admin, o)
		done <- result{err, out.String()}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute): // the scenario takes a few seconds (half a minute on a slow machine)
		t.Fatal("the scale scenario did not return within 3 minutes (a connection never handed back keeps the pool's Close waiting)")
	}
	require.NoError(t, r.err, r.out)
	require.Contains(t, r.out, "HOT share of renewals")
	require.Contains(t, r.out, "scenario errors: 0")
	if version < 150000 {
		require.Contains(t, r.out, "without pg_stat_force_next_flush()")
	}
}
