package bench_test

import (
	"encoding/json"
	"strconv"
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

// runJSON runs scenario with smokeOptions on the server of url and returns
// its report as JSON (what pgfence bench --json prints), after checking that
// the bench dropped its databases.
func runJSON(t *testing.T, url, scenario string) []byte {
	t.Helper()
	r, err := bench.Run(t.Context(), connect(t, url), smokeOptions(scenario))
	require.NoError(t, err)
	out, err := json.Marshal(r)
	require.NoError(t, err)
	requireNoBenchDatabases(t)
	return out
}

func requireNoBenchDatabases(t *testing.T) {
	t.Helper()
	db := pgtest.Empty(t)
	var left int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_database WHERE datname LIKE 'pgfence\_bench\_%'`).Scan(&left))
	require.Zero(t, left, "the bench dropped its databases")
}

// TestBenchRowsScenario runs the per-row scenario alone and checks that
// its figures are sane: every comparison did work on both sides without an
// error, the relative targets name the table-wide ratio they follow, and
// EXPLAIN ANALYZE saw each guard trigger fire once per row (the mark and
// row triggers) or once per statement (the check), each taking part of the
// guarded statement's execution time. No timing is compared with another.
func TestBenchRowsScenario(t *testing.T) {
	out := runJSON(t, pgtest.AdminURL(t), "rows")
	var r struct {
		Scenarios []struct {
			Name        string `json:"name"`
			Error       string `json:"error"`
			Comparisons []struct {
				Name    string `json:"name"`
				Clients int    `json:"clients"`
				AOps    struct {
					Median float64 `json:"median"`
				} `json:"a_ops_per_sec"`
				BOps struct {
					Median float64 `json:"median"`
				} `json:"b_ops_per_sec"`
				Ratio struct {
					Median float64 `json:"median"`
					Min    float64 `json:"min"`
					Max    float64 `json:"max"`
				} `json:"ratio"`
				Errors int `json:"errors"`
			} `json:"comparisons"`
			Facts []struct {
				Name  string  `json:"name"`
				Value float64 `json:"value"`
				Unit  string  `json:"unit"`
			} `json:"facts"`
			Targets []struct {
				Name   string  `json:"name"`
				Value  float64 `json:"value"`
				Target string  `json:"target"`
			} `json:"targets"`
		} `json:"scenarios"`
		Errors int `json:"errors"`
	}
	require.NoError(t, json.Unmarshal(out, &r), string(out))
	require.Zero(t, r.Errors)
	require.Len(t, r.Scenarios, 1)
	s := r.Scenarios[0]
	require.Equal(t, "rows", s.Name)
	require.Empty(t, s.Error)
	names := []string{
		"table-wide guarded UPDATE vs plain UPDATE, synchronous_commit=on",
		"per-row guarded UPDATE vs plain UPDATE, synchronous_commit=on",
		"table-wide guarded UPDATE vs plain UPDATE, synchronous_commit=off",
		"per-row guarded UPDATE vs plain UPDATE, synchronous_commit=off",
		"10000-row UPDATE per-row guarded vs plain",
	}
	require.Len(t, s.Comparisons, len(names))
	for i, c := range s.Comparisons {
		require.Equal(t, names[i], c.Name)
		require.Zero(t, c.Errors, c.Name)
		require.Positive(t, c.AOps.Median, c.Name)
		require.Positive(t, c.BOps.Median, c.Name)
		require.Positive(t, c.Ratio.Median, c.Name)
		require.LessOrEqual(t, c.Ratio.Min, c.Ratio.Median, c.Name)
		require.LessOrEqual(t, c.Ratio.Median, c.Ratio.Max, c.Name)
	}
	require.Equal(t, 2, s.Comparisons[0].Clients, "the largest of --clients 1,2")
	require.Equal(t, 1, s.Comparisons[4].Clients)

	require.Len(t, s.Targets, 3)
	for i, m := range []string{"on", "off"} {
		wide := s.Comparisons[2*i].Ratio.Median
		require.Contains(t, s.Targets[i].Name, "synchronous_commit="+m)
		require.Equal(t, s.Comparisons[2*i+1].Ratio.Median, s.Targets[i].Value)
		require.Contains(t, s.Targets[i].Target, strconv.FormatFloat(wide-0.05, 'f', 3, 64), "the target follows the table-wide ratio of the run")
	}
	require.Equal(t, ">= 0.5", s.Targets[2].Target)
	require.Equal(t, s.Comparisons[4].Ratio.Median, s.Targets[2].Value)

	facts := map[string]float64{}
	units := map[string]string{}
	for _, f := range s.Facts {
		facts[f.Name], units[f.Name] = f.Value, f.Unit
	}
	require.Positive(t, facts["time to grant the 10000 per-row leases"])
	plain := facts["EXPLAIN ANALYZE 10000-row UPDATE, plain: execution time"]
	guarded := facts["EXPLAIN ANALYZE 10000-row UPDATE, guarded: execution time"]
	require.Positive(t, plain)
	require.Positive(t, guarded)
	for trigger, calls := range map[string]string{"~fence_guard_0_mark": "10000 calls", "~fence_guard_1_row": "10000 calls", "~fence_rows_2_upd": "1 calls"} {
		name := "  of which trigger " + trigger
		require.Contains(t, facts, name, "EXPLAIN ANALYZE reports the trigger")
		require.Contains(t, units[name], "("+calls+")", trigger)
		require.Positive(t, facts[name], trigger)
		require.LessOrEqual(t, facts[name], guarded, "%s is part of the statement", trigger)
	}
}

// TestBenchScaleReturnsOnEveryVersion: the scale scenario asks every
// connection to flush its statistics with pg_stat_force_next_flush(), which
// PostgreSQL 13 and 14 lack. There, on the first failure, the bench returned
// without handing back the connections it held, and the deferred pool Close
// waited forever. It runs here as an ordinary role with CREATEDB, as a user
// would; on 13 and 14 the scenario says that it waited for the statistics.
func TestBenchScaleReturnsOnEveryVersion(t *testing.T) {
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
	go func() {
		var out strings.Builder
		admin := connect(t, url)
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
