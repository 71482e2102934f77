package bench_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestBenchRowsScenario runs the per-row scenario alone and checks that
// its figures are sane: every comparison did work on both sides without an
// error, the relative targets name the table-wide ratio they follow, and
// EXPLAIN ANALYZE saw each guard trigger fire once per row (the mark and
// row triggers) or once per statement (the check), each taking part of the
// guarded statement's execution time. No timing is compared with another.
func TestBenchRowsScenario(t *testing.T) {
	pgtest.Long(t, "the rows scenario")
	r := runScenario(t, pgtest.AdminURL(t), "rows")
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
	for trigger, calls := range map[string]string{"~fence_guard_0_mark": "10000 calls", "~fence_guard_1_row": "10000 calls", "~fence_rows_2_kids": "1 calls"} { // since migration 9 the row triggers check; the statement trigger looks for children
		name := "  of which trigger " + trigger
		require.Contains(t, facts, name, "EXPLAIN ANALYZE reports the trigger")
		require.Contains(t, units[name], "("+calls+")", trigger)
		require.Positive(t, facts[name], trigger)
		require.LessOrEqual(t, facts[name], guarded, "%s is part of the statement", trigger)
	}
}
