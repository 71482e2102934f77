package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The bench is not a test of speed: these smoke runs only check that every
// scenario runs without errors, that the output has its shape, and that the
// bench leaves no database behind. No figure is asserted.

// smokeArgs keep each scenario to a second or two.
var smokeArgs = []string{"--duration", "60ms", "--rounds", "1", "--clients", "1,2", "--big-resources", "2000", "--waiters", "2", "--poll-interval", "20ms"}

func TestBenchSmokeTable(t *testing.T) {
	pgtest.Long(t, "the bench's scenarios")
	admin := pgtest.AdminURL(t)
	charts := t.TempDir()
	code, out, errOut := run(t, append([]string{"bench", "--database-url", admin, "--chart-dir", charts}, smokeArgs...)...)
	require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	for _, s := range []string{"== grant", "== guarded", "== rows", "== handoff", "== scale", "== scaling", "== targets (docs/benchmarks.md) =="} {
		require.Contains(t, out, s)
	}
	require.Contains(t, out, "ratio A/B median [min-max]")
	require.Contains(t, out, "round trips per gofence acquire")
	require.Contains(t, out, "HOT share of renewals")
	require.Contains(t, out, "per-row guarded UPDATE vs plain UPDATE, synchronous_commit=on")
	require.Contains(t, out, "10000-row UPDATE per-row guarded/plain")
	require.Contains(t, out, "scenario errors: 0")
	require.NotContains(t, out, "ERROR:")
	require.NotContains(t, out, "issue", "the output speaks to users, not about the project's issues")
	for _, f := range []string{"bench-client-scaling.svg", "bench-handoff.svg"} {
		svg, err := os.ReadFile(filepath.Join(charts, f))
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(svg), "<svg "), f)
		require.Contains(t, string(svg), "</svg>")
	}
	pgtest.RequireNoDatabases(t, "pgfence_bench_") // the bench dropped its databases
}

func TestBenchSmokeJSON(t *testing.T) {
	pgtest.Long(t, "a bench scenario")
	admin := pgtest.AdminURL(t)
	code, out, errOut := run(t, append([]string{"bench", "--json", "--database-url", admin, "--scenario", "grant"}, smokeArgs...)...)
	require.Equal(t, cli.ExitOK, code, "stderr: %s\nstdout: %s", errOut, out)
	var r struct {
		Machine struct {
			CPUs       int    `json:"cpus"`
			PostgreSQL string `json:"postgresql"`
		} `json:"machine"`
		Scenarios []struct {
			Name        string `json:"name"`
			Error       string `json:"error"`
			Comparisons []struct {
				Name    string `json:"name"`
				Clients int    `json:"clients"`
				AOps    struct {
					Median float64 `json:"median"`
				} `json:"a_ops_per_sec"`
				Ratio struct {
					Median float64   `json:"median"`
					Min    float64   `json:"min"`
					Max    float64   `json:"max"`
					Rounds []float64 `json:"rounds"`
				} `json:"ratio"`
				Errors int `json:"errors"`
			} `json:"comparisons"`
			Facts []struct {
				Name  string  `json:"name"`
				Value float64 `json:"value"`
			} `json:"facts"`
		} `json:"scenarios"`
		Targets []struct {
			Name   string  `json:"name"`
			Value  float64 `json:"value"`
			Target string  `json:"target"`
			Met    bool    `json:"met"`
		} `json:"targets"`
		Errors int `json:"errors"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	require.Positive(t, r.Machine.CPUs)
	require.Contains(t, r.Machine.PostgreSQL, "PostgreSQL")
	require.Zero(t, r.Errors)
	require.Len(t, r.Scenarios, 1)
	s := r.Scenarios[0]
	require.Equal(t, "grant", s.Name)
	require.Empty(t, s.Error)
	require.Len(t, s.Comparisons, 4, "gofence and advisory against hand-written, at 1 and 2 clients")
	for _, c := range s.Comparisons {
		require.Zero(t, c.Errors, c.Name)
		require.Positive(t, c.AOps.Median, c.Name)
		require.Len(t, c.Ratio.Rounds, 1, c.Name)
		require.LessOrEqual(t, c.Ratio.Min, c.Ratio.Median, c.Name)
		require.LessOrEqual(t, c.Ratio.Median, c.Ratio.Max, c.Name)
	}
	// Round trips are counted, not timed: they are exact.
	rt := map[string]float64{}
	for _, f := range s.Facts {
		rt[f.Name] = f.Value
	}
	for _, op := range []string{"acquire", "renew", "release"} {
		require.Contains(t, rt, "round trips per gofence "+op)
	}
	require.NotEmpty(t, r.Targets)
	pgtest.RequireNoDatabases(t, "pgfence_bench_") // the bench dropped its databases
}

func TestBenchRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--scenario", "nope"},
		{"bench", "--clients", "0"},
		{"bench", "--rounds", "0"},
		{"bench", "--duration", "1ms"},
	} {
		code, _, errOut := run(t, args...)
		require.Equal(t, cli.ExitUsage, code, "%v: %s", args, errOut)
	}
}
