package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// statusStory gives a database leases in every state and a refused write,
// and returns a role that was granted usage and nothing else, with the
// tokens: "live" (a live TTL lease), "released", "revoked", "session" (a
// live session lease, held until the test ends), "gone" (a session lease
// whose session ended) and weird, a live lease on a resource whose name
// needs every escape of the exposition format.
type statusStory struct {
	db     *pgtest.DB
	reader string
	tokens map[string]int64
}

const weirdResource = "we\"ird\\name\nline two"

func newStatusStory(t *testing.T) *statusStory {
	t.Helper()
	ctx := t.Context()
	db := pgtest.Setup(t)
	s := &statusStory{db: db, reader: pgtest.NewRole(t, "reader"), tokens: map[string]int64{}}
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, s.reader, false))
	acquire := func(resource string, ttl time.Duration) int64 {
		t.Helper()
		tok, ok, err := sqlfuncs.Acquire(ctx, db.Pool, resource, "holder-of-"+resource[:4], ttl)
		require.NoError(t, err)
		require.True(t, ok, resource)
		s.tokens[resource] = tok
		return tok
	}
	acquire("live", time.Hour)
	acquire(weirdResource, time.Hour)
	_, err := sqlfuncs.Release(ctx, db.Pool, "released", acquire("released", time.Hour))
	require.NoError(t, err)
	stale := acquire("revoked", time.Hour)
	s.tokens["revoked"], err = sqlfuncs.Revoke(ctx, db.Pool, "revoked")
	require.NoError(t, err)
	conn := db.Conn(t) // the session lease lives as long as this session
	tok, ok, err := sqlfuncs.AcquireSession(ctx, conn, "session", "holder-of-sess")
	require.NoError(t, err)
	require.True(t, ok)
	s.tokens["session"] = tok
	gone := db.Conn(t) // a session lease whose session ends: free
	tok, ok, err = sqlfuncs.AcquireSession(ctx, gone, "gone", "holder-of-gone")
	require.NoError(t, err)
	require.True(t, ok)
	s.tokens["gone"] = tok
	require.NoError(t, gone.Close(ctx))
	require.Eventually(t, func() bool {
		l, ok, err := sqlfuncs.GetLease(ctx, db.Pool, "gone")
		return err == nil && ok && !l.Live
	}, 10*time.Second, 10*time.Millisecond)

	_, err = db.Pool.Exec(ctx, `CREATE TABLE report (body text, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "report", "revoked", "tok"))
	_, err = db.Pool.Exec(ctx, `INSERT INTO report VALUES ('stale', $1)`, stale)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
	return s
}

// parseExposition parses text as Prometheus' text parser does (the one
// node_exporter's textfile collector uses), with the classic name rules.
func parseExposition(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err, "the exposition does not parse:\n%s", text)
	return fams
}

// series is a family's samples by their labels ("resource=live").
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	t.Helper()
	f, ok := fams[name]
	require.True(t, ok, "no family %s", name)
	out := map[string]float64{}
	for _, m := range f.Metric {
		var labels []string
		for _, l := range m.Label {
			labels = append(labels, l.GetName()+"="+l.GetValue())
		}
		sort.Strings(labels)
		var v float64
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			v = m.GetCounter().GetValue()
		case dto.MetricType_GAUGE:
			v = m.GetGauge().GetValue()
		default:
			t.Fatalf("%s: type %s", name, f.GetType())
		}
		out[strings.Join(labels, ",")] = v
	}
	return out
}

// TestStatusPrometheus (issue 22, item 4): status --format prometheus, as a
// role with usage only, prints an exposition that Prometheus' own parser
// reads, every family with HELP and TYPE: the lease table (per resource,
// the holder in an info series; totals by state; the least time left and
// the longest hold) and the refusal counters; --no-resource-labels keeps
// the totals only; --output replaces a file whole.
func TestStatusPrometheus(t *testing.T) {
	t.Parallel()
	s := newStatusStory(t)
	url := "--database-url=" + s.db.URLAs(s.reader)

	code, out, errOut := run(t, "status", "--format", "prometheus", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	fams := parseExposition(t, out)
	for name, f := range fams {
		require.NotEmpty(t, f.GetHelp(), "%s has no HELP", name)
		require.True(t, strings.HasPrefix(name, "pgfence_"), name)
		for _, m := range f.Metric {
			require.Zero(t, m.GetTimestampMs(), "the textfile collector refuses timestamps")
		}
	}
	require.Equal(t, map[string]float64{"": 1}, series(t, fams, "pgfence_up"))
	require.Equal(t, map[string]float64{"state=live": 3, "state=released": 1, "state=revoked": 1, "state=expired": 0, "state=free": 1},
		series(t, fams, "pgfence_leases"))
	require.Equal(t, dto.MetricType_COUNTER, fams["pgfence_write_refusals_total"].GetType())
	require.Equal(t, map[string]float64{"reason=stale token,sqlstate=FN001": 1, "reason=no token,sqlstate=FN002": 0, "reason=token never granted,sqlstate=FN003": 0},
		series(t, fams, "pgfence_write_refusals_total"))

	weird := "resource=" + weirdResource
	require.Equal(t, map[string]float64{
		"holder=holder-of-live,kind=ttl,resource=live,state=live":         1,
		"holder=holder-of-rele,kind=ttl,resource=released,state=released": 1,
		"holder=,kind=revoked,resource=revoked,state=revoked":             1,
		"holder=holder-of-sess,kind=session,resource=session,state=live":  1,
		"holder=holder-of-gone,kind=session,resource=gone,state=free":     1,
		"holder=holder-of-we\"i,kind=ttl," + weird + ",state=live":        1,
	}, series(t, fams, "pgfence_lease_info"))
	require.Equal(t, map[string]float64{"resource=live": 1, "resource=released": 0, "resource=revoked": 0, "resource=session": 1, "resource=gone": 0, weird: 1},
		series(t, fams, "pgfence_lease_live"))
	tokens := series(t, fams, "pgfence_lease_token")
	for r, tok := range s.tokens {
		require.Equal(t, float64(tok), tokens["resource="+r], r)
	}
	left := series(t, fams, "pgfence_lease_expires_in_seconds")
	require.Len(t, left, 2, "live TTL leases only: %v", left)
	for _, r := range []string{"resource=live", weird} {
		require.InDelta(t, time.Hour.Seconds(), left[r], 60, r)
	}
	heldFor := series(t, fams, "pgfence_lease_held_seconds")
	require.Len(t, heldFor, 3, "live leases only: %v", heldFor)
	for r, v := range heldFor {
		require.True(t, v >= 0 && v < 60, "%s held for %v", r, v)
	}
	require.InDelta(t, time.Hour.Seconds(), series(t, fams, "pgfence_lease_min_expires_in_seconds")[""], 60)
	require.Less(t, series(t, fams, "pgfence_lease_max_held_seconds")[""], 60.0)

	t.Run("no resource labels", func(t *testing.T) {
		code, out, errOut := run(t, "status", "--format", "prometheus", "--no-resource-labels", url)
		require.Equal(t, cli.ExitOK, code, errOut)
		fams := parseExposition(t, out)
		var names []string
		for name, f := range fams {
			names = append(names, name)
			for _, m := range f.Metric {
				for _, l := range m.Label {
					require.NotEqual(t, "resource", l.GetName(), name)
					require.NotEqual(t, "holder", l.GetName(), name)
				}
			}
		}
		sort.Strings(names)
		require.Equal(t, []string{"pgfence_lease_max_held_seconds", "pgfence_lease_min_expires_in_seconds", "pgfence_leases",
			"pgfence_token_counter_moves_left", "pgfence_token_epoch", "pgfence_token_epochs_left", "pgfence_token_grants_left",
			"pgfence_up", "pgfence_write_refusals_total"}, names)
	})

	t.Run("output replaces a file whole", func(t *testing.T) {
		dir := t.TempDir()
		file := filepath.Join(dir, "pgfence.prom")
		require.NoError(t, os.WriteFile(file, []byte("old\n"), 0o600))
		code, out, errOut := run(t, "status", "--format", "prometheus", "--output", file, url)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.Empty(t, out)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Equal(t, map[string]float64{"": 1}, series(t, parseExposition(t, string(b)), "pgfence_up"))
		fi, err := os.Stat(file)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o644), fi.Mode().Perm(), "readable by node_exporter")
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Len(t, entries, 1, "no temporary file left behind")

		// A read that fails (here: a role without usage) leaves pgfence_up 0
		// alone in the file, not the series of the last good read.
		stranger := pgtest.NewRole(t, "stranger")
		code, _, errOut = run(t, "status", "--format", "prometheus", "--output", file, "--database-url", s.db.URLAs(stranger))
		require.Equal(t, cli.ExitError, code)
		require.Contains(t, errOut, "fence.grant_usage")
		b, err = os.ReadFile(file)
		require.NoError(t, err)
		fams := parseExposition(t, string(b))
		require.Len(t, fams, 1, string(b))
		require.Equal(t, map[string]float64{"": 0}, series(t, fams, "pgfence_up"))
	})
}

// TestStatusFlagsThatMeanNothing: combinations of status's flags that could
// only surprise are refused with exit 2 before anything is read; "--watch
// 5s" (which pflag reads as a bare --watch and a resource named 5s) says
// how to write it.
func TestStatusFlagsThatMeanNothing(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch", "5s"}, "--watch=5s"},
		{[]string{"job", "--watch", "5s"}, "accepts at most 1 arg"},
		{[]string{"--watch=10ms"}, "at least 100ms"},
		{[]string{"--watch=0"}, "at least 100ms"},
		{[]string{"--format", "yaml"}, "use table or prometheus"},
		{[]string{"--format", "prometheus", "--json"}, "exclude each other"},
		{[]string{"--no-resource-labels"}, "goes with --format prometheus"},
		{[]string{"--output", "f.prom"}, "goes with --format prometheus"},
		{[]string{"--watch", "--format", "prometheus"}, "needs --output FILE"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, _, errOut := run(t, append([]string{"status", "--database-url", "postgres://127.0.0.1:1/none"}, c.args...)...)
			require.Equal(t, cli.ExitUsage, code, errOut)
			require.Contains(t, errOut, c.want)
		})
	}
}

// snapshotKit is everything of the kit that a reader could change: the
// objects of schema fence, every lease row and every sequence (the token
// counter, the epoch floor, the refusal counts).
func snapshotKit(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rows, err := db.Pool.Query(ctx, `SELECT format('%s', l) FROM fence.lease l
		UNION ALL SELECT format('%s %s', sequencename, last_value) FROM pg_sequences WHERE schemaname = 'fence'
		ORDER BY 1`)
	require.NoError(t, err)
	state, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(append(pgtest.KitCatalog(t, ctx, db.Pool), state...), "\n")
}
