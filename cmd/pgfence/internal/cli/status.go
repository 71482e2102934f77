package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// statusJSON is the --json shape of one status row.
type statusJSON struct {
	Resource         string     `json:"resource"`
	Holder           string     `json:"holder"`
	Token            int64      `json:"token"`
	Kind             string     `json:"kind"`
	Live             bool       `json:"live"`
	AcquiredAt       time.Time  `json:"acquired_at"`
	ExpiresAt        *time.Time `json:"expires_at,omitempty"`
	ExpiresInSeconds *float64   `json:"expires_in_seconds,omitempty"`
	EndedAt          *time.Time `json:"ended_at,omitempty"`
}

// refusalCountJSON is the --json shape of one row of fence.refusals.
type refusalCountJSON struct {
	SQLState string `json:"sqlstate"`
	Reason   string `json:"reason"`
	Count    int64  `json:"count"`
}

// watchJSON is the line that status --watch --json prints on every tick:
// the lease rows and the refusal counts.
type watchJSON struct {
	At       time.Time          `json:"at"`
	Leases   []statusJSON       `json:"leases"`
	Refusals []refusalCountJSON `json:"refusals"`
	// Budget is fence.token_budget() (budget.go); absent on a kit older
	// than version 9.
	Budget *budgetJSON `json:"budget,omitempty"`
}

// watchErrorJSON is the line of a tick whose read failed.
type watchErrorJSON struct {
	At    time.Time `json:"at"`
	Error string    `json:"error"`
}

// Bounds of status --watch.
const (
	// defaultWatchInterval is the interval of a bare --watch.
	defaultWatchInterval = 2 * time.Second
	// minWatchInterval keeps a watch from reading in a busy loop.
	minWatchInterval = 100 * time.Millisecond
)

// minTickTimeout bounds each read of a watch, whatever the interval (a read
// that runs longer than that is reported as failed and tried again at the
// next tick). A variable for the test of that bound.
var minTickTimeout = 10 * time.Second

// statusFlags are the flags of pgfence status.
type statusFlags struct {
	watch            time.Duration // 0: once
	format           string        // "table" or "prometheus"
	noResourceLabels bool
	output           string
}

func newStatusCmd(g *globals) *cobra.Command {
	var f statusFlags
	cmd := &cobra.Command{
		Use:   "status [RESOURCE] [--watch[=INTERVAL]] [--format table|prometheus [--no-resource-labels] [--output FILE]]",
		Short: "Show every lease (or one): holder, token, live or not, expiry by the server's clock",
		Long: `status reads fence.leases (and, with --watch or --format prometheus,
fence.refusals: the tokens the database refused since the install, by
SQLSTATE) and prints them. It only reads: it creates and changes nothing,
so a role granted usage is enough.

--watch redraws the table every INTERVAL (2s when none is given; write it
with an equals sign, --watch=5s) until Ctrl-C, which ends it with exit
code 0; with --json it prints one JSON line per tick. Once connected, a
read that fails is reported (on stderr, as a JSON line with "error", or in
the Prometheus file as pgfence_up 0) and tried again at the next tick.

--format prometheus prints the Prometheus text exposition of the lease table
and of the refusal counters, for node_exporter's textfile collector or a
scrape wrapper. --output FILE replaces FILE whole (a temporary file renamed
over it) instead of printing, which the textfile collector needs; with
--watch it is required. Every resource is a label value: with a resource
per row, their number has no bound; --no-resource-labels leaves out the
per-resource series and keeps the totals.`,
		Example: `  pgfence status
  pgfence status nightly-report --json
  pgfence status --watch
  pgfence status --watch=10s --json
  pgfence status --format prometheus
  pgfence status --format prometheus --watch=15s --output /var/lib/prometheus/node-exporter/pgfence.prom`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.check(cmd, args, g.json); err != nil {
				return err
			}
			resource := ""
			if len(args) == 1 {
				resource = args[0]
			}
			ctx := cmd.Context()
			c, pool, err := g.client(ctx, gofence.Config{})
			if err != nil {
				return err
			}
			defer closePool(pool)
			defer closeClient(c)
			st := &statusRun{g: g, f: f, c: c, pool: pool, resource: resource}
			if f.watch > 0 {
				return st.watch(ctx)
			}
			return st.once(ctx)
		},
	}
	cmd.Flags().DurationVar(&f.watch, "watch", 0, "redraw every INTERVAL until Ctrl-C (--watch alone: "+defaultWatchInterval.String()+"; give it as --watch=INTERVAL)")
	cmd.Flags().Lookup("watch").NoOptDefVal = defaultWatchInterval.String()
	cmd.Flags().StringVar(&f.format, "format", "table", "table, or prometheus (the text exposition format)")
	cmd.Flags().BoolVar(&f.noResourceLabels, "no-resource-labels", false, "with --format prometheus: leave out the series labelled by resource (their number grows with the resources), keep the totals")
	cmd.Flags().StringVar(&f.output, "output", "", "with --format prometheus: replace FILE whole on every read instead of printing (required with --watch)")
	return cmd
}

// check refuses flag combinations that mean nothing, before connecting.
func (f *statusFlags) check(cmd *cobra.Command, args []string, json bool) error {
	watching := cmd.Flags().Changed("watch")
	if watching && len(args) == 1 && cmd.ArgsLenAtDash() != 0 {
		// "--watch 5s": pflag took the bare --watch and left 5s as RESOURCE.
		if _, err := time.ParseDuration(args[0]); err == nil {
			return usageError{fmt.Errorf("--watch takes its interval after an equals sign: --watch=%s (for a resource named %s, put it after --: pgfence status --watch -- %s)", args[0], args[0], args[0])}
		}
	}
	switch {
	case watching && f.watch < minWatchInterval:
		return usageError{fmt.Errorf("--watch=%s: the interval must be at least %s", f.watch, minWatchInterval)}
	case f.format != "table" && f.format != "prometheus":
		return usageError{fmt.Errorf("--format %q: use table or prometheus", f.format)}
	case f.format == "prometheus" && json:
		return usageError{errors.New("--json and --format prometheus exclude each other: pick one output")}
	case f.noResourceLabels && f.format != "prometheus":
		return usageError{errors.New("--no-resource-labels goes with --format prometheus")}
	case f.output != "" && f.format != "prometheus":
		return usageError{errors.New("--output goes with --format prometheus")}
	case watching && f.format == "prometheus" && f.output == "":
		return usageError{errors.New("--watch with --format prometheus needs --output FILE: an exposition must be read whole, so each tick replaces the file (or run status --format prometheus once per scrape)")}
	}
	return nil
}

// statusRun is one pgfence status command: what it reads and how it shows it.
type statusRun struct {
	g        *globals
	f        statusFlags
	c        *gofence.Client
	pool     *pgxpool.Pool
	resource string // "" for every resource
}

// statusRead is what one read found.
type statusRead struct {
	leases   []gofence.LeaseInfo
	refusals []sqlfuncs.Refusal // nil when not read
	budget   *budgetJSON        // read with the refusals; nil when not read or the kit predates it
	// notGranted: resource was asked for and has never been granted.
	notGranted bool
}

// read reads the lease rows (of st.resource, or all) and, withRefusals,
// the refusal counts. Two statements on the pool, neither of which writes.
func (st *statusRun) read(ctx context.Context, withRefusals bool) (statusRead, error) {
	var r statusRead
	if st.resource != "" {
		info, ok, err := st.c.LeaseOf(ctx, st.resource)
		if err != nil {
			return r, explainDenied(ctx, st.pool, err)
		}
		if ok {
			r.leases = []gofence.LeaseInfo{info}
		}
		r.notGranted = !ok
	} else {
		var err error
		if r.leases, err = st.c.Leases(ctx); err != nil {
			return r, explainDenied(ctx, st.pool, err)
		}
	}
	if withRefusals {
		var err error
		if r.refusals, err = sqlfuncs.Refusals(ctx, st.pool); err != nil {
			return r, explainDenied(ctx, st.pool, err)
		}
		if r.budget, err = readBudget(ctx, st.pool); err != nil {
			return r, explainDenied(ctx, st.pool, err)
		}
	}
	return r, nil
}

// once is status without --watch: the table, its JSON or the exposition.
func (st *statusRun) once(ctx context.Context) error {
	if st.f.format == "prometheus" {
		r, err := st.read(ctx, true)
		if err != nil {
			if st.f.output != "" {
				// Say so in the file too: the series of the last good read
				// must not stand for the present.
				_ = writeFileWhole(st.f.output, promDown())
			}
			return err
		}
		return st.writeProm(r)
	}
	r, err := st.read(ctx, false)
	if err != nil {
		return err
	}
	if r.notGranted {
		return exitError{ExitError, fmt.Errorf("%s has never been granted", st.resource)}
	}
	rows := statusRows(r.leases)
	return st.g.emit(rows, func(w io.Writer) error { return printStatusTable(w, rows) })
}

// writeProm prints the exposition of r, or replaces --output with it.
func (st *statusRun) writeProm(r statusRead) error {
	text := promStatus(r, !st.f.noResourceLabels)
	if st.f.output != "" {
		return writeFileWhole(st.f.output, text)
	}
	_, err := io.WriteString(st.g.stdout, text)
	return err
}

// watch reads and shows the status every st.f.watch until ctx ends (Ctrl-C,
// SIGTERM), which ends it without an error. Each read is bounded by
// max(interval, minTickTimeout); a failed one is reported and the next tick
// tries again.
func (st *statusRun) watch(ctx context.Context) error {
	interval := st.f.watch
	tick := time.NewTicker(interval)
	defer tick.Stop()
	terminal := isTerminal(st.g.stdout)
	for {
		rctx, cancel := context.WithTimeout(ctx, max(interval, minTickTimeout))
		r, err := st.read(rctx, true)
		cancel()
		if ctx.Err() != nil {
			return nil // the watch's normal end
		}
		if err := st.show(r, err, terminal); err != nil {
			return err // stdout is gone (a closed pipe) or --output cannot be written
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// show is one tick of a watch: the frame, the JSON line or the file of r,
// or readErr reported the same way.
func (st *statusRun) show(r statusRead, readErr error, terminal bool) error {
	now := time.Now()
	if readErr != nil {
		fmt.Fprintf(st.g.stderr, "pgfence: %s: %s (trying again in %s)\n", now.Format(time.TimeOnly), message(readErr), st.f.watch)
	}
	switch {
	case st.f.format == "prometheus":
		if readErr != nil {
			return writeFileWhole(st.f.output, promDown())
		}
		return st.writeProm(r)
	case st.g.json:
		var line any = watchJSON{At: now, Leases: statusRows(r.leases), Refusals: refusalRows(r.refusals), Budget: r.budget}
		if readErr != nil {
			line = watchErrorJSON{At: now, Error: message(readErr)}
		}
		return json.NewEncoder(st.g.stdout).Encode(line)
	}
	var b bytes.Buffer
	if terminal {
		b.WriteString("\x1b[H\x1b[2J") // home, clear: the frame replaces the last one
	}
	what := "every resource"
	if st.resource != "" {
		what = st.resource
	}
	fmt.Fprintf(&b, "pgfence status of %s every %s, %s (Ctrl-C ends)\n\n", what, st.f.watch, now.Format(time.DateTime))
	if readErr != nil {
		fmt.Fprintf(&b, "read failed: %s\n", message(readErr))
	} else {
		if err := printStatusTable(&b, statusRows(r.leases)); err != nil {
			return err
		}
		if r.notGranted {
			fmt.Fprintf(&b, "(%s has never been granted)\n", st.resource)
		}
		parts := make([]string, len(r.refusals))
		for i, f := range r.refusals {
			parts[i] = fmt.Sprintf("%s (%s) %d", f.SQLState, f.Reason, f.Count)
		}
		fmt.Fprintf(&b, "\nrefused since the install: %s\n", strings.Join(parts, ", "))
		if r.budget != nil {
			fmt.Fprintf(&b, "token budget: %s\n", r.budget)
		}
	}
	if !terminal {
		b.WriteString("\n") // frames one after the other in a file or a pipe
	}
	_, err := st.g.stdout.Write(b.Bytes())
	return err
}

// statusRows turns lease rows into their JSON shape (which the table is
// printed from too).
func statusRows(infos []gofence.LeaseInfo) []statusJSON {
	rows := make([]statusJSON, len(infos))
	for i, in := range infos {
		r := statusJSON{Resource: in.Resource, Holder: in.Holder, Token: in.Token, Kind: in.Kind, Live: in.Live, AcquiredAt: in.AcquiredAt}
		switch {
		case !in.EndedAt.IsZero():
			// Released or revoked: it ended then, whatever its TTL would
			// have said.
			ended := in.EndedAt
			r.EndedAt = &ended
		case !in.ExpiresAt.IsZero():
			exp := in.ExpiresAt
			r.ExpiresAt = &exp
			if in.Live {
				left := in.ExpiresAt.Sub(in.ServerNow).Seconds()
				r.ExpiresInSeconds = &left
			}
		}
		rows[i] = r
	}
	return rows
}

// refusalRows turns the rows of fence.refusals into their JSON shape.
func refusalRows(rs []sqlfuncs.Refusal) []refusalCountJSON {
	out := make([]refusalCountJSON, len(rs))
	for i, r := range rs {
		out[i] = refusalCountJSON{SQLState: r.SQLState, Reason: r.Reason, Count: r.Count}
	}
	return out
}

// leaseState is the STATE column of a status row.
func leaseState(r statusJSON) string {
	switch {
	case r.Live:
		return "live"
	case r.Kind == "revoked":
		return "revoked"
	case r.EndedAt != nil:
		return "released"
	case r.ExpiresAt != nil:
		return "expired"
	}
	return "free"
}

// printStatusTable prints rows as status's aligned table.
func printStatusTable(w io.Writer, rows []statusJSON) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tHOLDER\tTOKEN\tKIND\tSTATE\tEXPIRES IN")
	for _, r := range rows {
		expires := "-"
		if r.ExpiresInSeconds != nil {
			expires = (time.Duration(*r.ExpiresInSeconds * float64(time.Second))).Round(time.Millisecond).String()
		} else if r.Kind == "session" && r.Live {
			expires = "with its session"
		}
		holder, kind := r.Holder, r.Kind
		if holder == "" {
			holder = "-"
		}
		if kind == "revoked" {
			// A revoke grants its token to nobody: no lease, of either
			// kind; STATE says revoked.
			kind = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", r.Resource, holder, r.Token, kind, leaseState(r), expires)
	}
	return tw.Flush()
}

// isTerminal reports whether w is the process's terminal (a character
// device), where a watch redraws in place rather than appending frames.
func isTerminal(w io.Writer) bool {
	if lw, ok := w.(*lockedWriter); ok {
		w = lw.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// writeFileWhole replaces path with text: written to a temporary file in the
// same directory, then renamed over path, so that a reader (node_exporter's
// textfile collector) sees the old file or the new one, never half of one.
// The temporary name ends in digits, not .prom, so the collector skips it.
func writeFileWhole(path, text string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: no such file, nothing done
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		return fmt.Errorf("--output: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("--output: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("--output: %w", err)
	}
	return nil
}
