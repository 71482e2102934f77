package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/bench"
)

// newBenchCmd is pgfence bench: it parses the flags into a bench.Options and
// runs the bench package, which does the measuring.
func newBenchCmd(g *globals) *cobra.Command {
	var o bench.Options
	var clients string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure pgfence against hand-written SQL on your server",
		Long: `bench measures pgfence's own path (gofence and the SQL kit) side by side with
the SQL a careful engineer would write by hand without fencing, on the server
you point it at. Every figure is a ratio of two workloads run interleaved
(A B A B ...) in one process on the same database, with the median and the
spread (min-max) over --rounds rounds, so a noisy machine moves both sides.

Scenarios (--scenario):
  grant    acquire+release through gofence vs a hand-written upsert/update
           pair, at 1, 4 and 16 clients; pg_try_advisory_lock/unlock pairs as
           a non-durable reference; round trips per acquire, renew, release
  guarded  UPDATE of a protected table (token column) vs the same UPDATE of
           an unprotected one; Lease.Tx (use_token) + UPDATE vs a plain
           transaction; each with synchronous_commit on and off
  rows     per-row resources (fence.protect_rows): a single-row UPDATE
           under the row's own lease vs the same UPDATE unprotected, beside
           the table-wide guarded UPDATE pair of guarded, synchronous_commit
           on and off; one UPDATE of 10,000 rows of 10,000 leased resources
           (a token per row) vs the same UPDATE unprotected, and where the
           guarded one spends its time (EXPLAIN ANALYZE, per trigger)
  handoff  --waiters waiters in gofence Acquire (LeaseOptions.Wait) on one
           resource: time from a release to the next grant (p50, p99), with
           NOTIFY and with polling only, against one round trip (SELECT 1)
  scale    grant throughput with 1,000 vs --big-resources rows in the lease
           table; a renew loop: HOT share, dead tuples, table size
  scaling  grant and guarded-write throughput at 1, 2, 4, 8, 16, 32 clients

The bench works in databases of its own (pgfence_bench_XXXX, migrated with the
embedded migrations and dropped at the end), so it leaves nothing behind. The
role needs CREATEDB. The default run takes about a minute and a half.`,
		Example: `  pgfence bench
  pgfence bench --scenario grant --clients 1,8 --duration 1s --rounds 5
  pgfence bench --big-resources 1000000 --chart-dir docs --json > bench.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Duration < 10*time.Millisecond || o.Duration > 10*time.Minute {
				return usageError{fmt.Errorf("--duration must be between 10ms and 10m")}
			}
			if o.Rounds < 1 || o.Rounds > 1000 {
				return usageError{fmt.Errorf("--rounds must be between 1 and 1000")}
			}
			if o.Waiters < 2 || o.Waiters > 64 {
				return usageError{fmt.Errorf("--waiters must be between 2 and 64")}
			}
			if o.BigResources < 1000 || o.BigResources > 100_000_000 {
				return usageError{fmt.Errorf("--big-resources must be between 1000 and 100000000")}
			}
			if o.PollInterval < time.Millisecond || o.PollInterval > time.Minute {
				return usageError{fmt.Errorf("--poll-interval must be between 1ms and 1m")}
			}
			if clients != "" {
				for _, f := range strings.Split(clients, ",") {
					n, err := strconv.Atoi(strings.TrimSpace(f))
					if err != nil || n < 1 || n > 256 {
						return usageError{fmt.Errorf("--clients: %q is not a client count between 1 and 256", f)}
					}
					o.Clients = append(o.Clients, n)
				}
			}
			if o.Scenario != "all" && !slices.Contains(bench.Scenarios, o.Scenario) {
				return usageError{fmt.Errorf("--scenario must be all or one of %s", strings.Join(bench.Scenarios, ", "))}
			}
			return runBench(cmd.Context(), g, o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", 300*time.Millisecond, "length of one workload slice")
	f.IntVar(&o.Rounds, "rounds", 3, "rounds of interleaved slices; figures are the median over rounds")
	f.StringVar(&clients, "clients", "", "comma-separated client counts for grant and scaling (default 1,4,16 and 1,2,4,8,16,32); guarded, rows and scale use the largest up to 4")
	f.StringVar(&o.Scenario, "scenario", "all", "all, or one of "+strings.Join(bench.Scenarios, ", "))
	f.StringVar(&o.ChartDir, "chart-dir", "", "write SVG charts (bench-client-scaling.svg, bench-handoff.svg) into this directory")
	f.IntVar(&o.BigResources, "big-resources", 100_000, "rows in the lease table for the big side of scale (the target in docs/benchmarks.md is stated at 1000000)")
	f.IntVar(&o.Waiters, "waiters", 4, "clients waiting for the lease (gofence LeaseOptions.Wait) in the handoff scenario")
	f.DurationVar(&o.PollInterval, "poll-interval", 100*time.Millisecond, "gofence PollInterval of the polling-only handoff")
	return cmd
}

// runBench connects, runs the bench and prints its report: as text while it
// runs, or as one JSON document at the end with --json.
func runBench(ctx context.Context, g *globals, o bench.Options) error {
	admin, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer closePool(admin)
	o.Log = g.stderr
	if !g.json {
		o.Out = g.stdout
	}
	r, err := bench.Run(ctx, admin, o)
	if r != nil && g.json {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(r); jerr != nil {
			return jerr
		}
	}
	return err
}
