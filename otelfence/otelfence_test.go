package otelfence_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/otelfence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

// bundle is one test's database, with table work protected for resource
// job, and an Observer over in-memory providers.
type bundle struct {
	ctx    context.Context
	db     *pgtest.DB
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	obs    *otelfence.Observer
}

func setup(t *testing.T, opts ...otelfence.Option) *bundle {
	t.Helper()
	b := &bundle{ctx: t.Context(), db: pgtest.Setup(t), reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE work (id serial PRIMARY KEY, who text NOT NULL, token bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "work", "job", "token"))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	b.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = b.tp.Shutdown(context.Background())
	})
	b.obs, err = otelfence.New(append([]otelfence.Option{otelfence.WithMeterProvider(mp), otelfence.WithTracerProvider(b.tp)}, opts...)...)
	require.NoError(t, err)
	return b
}

func (b *bundle) client(t *testing.T, cfg gofence.Config) *gofence.Client {
	t.Helper()
	cfg.Logger = quiet
	cfg.Observer = b.obs
	c, err := gofence.New(b.db.Pool, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

// metrics collects every instrument of the reader, by name.
func (b *bundle) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, b.reader.Collect(b.ctx, &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelfence.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// point finds the data point of a sum or gauge with exactly attrs; ok is
// false when there is none (or the instrument recorded nothing yet).
func point(t *testing.T, m metricdata.Metrics, attrs ...attribute.KeyValue) (int64, bool) {
	t.Helper()
	want := attribute.NewSet(attrs...)
	var dps []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		dps = d.DataPoints
	case metricdata.Gauge[int64]:
		dps = d.DataPoints
	case nil: // nothing recorded yet
	default:
		t.Fatalf("%s is a %T, not an int64 sum or gauge", m.Name, m.Data)
	}
	for _, dp := range dps {
		if dp.Attributes.Equals(&want) {
			return dp.Value, true
		}
	}
	return 0, false
}

// histogram finds the data point of a float64 histogram with exactly attrs.
func histogram(t *testing.T, m metricdata.Metrics, attrs ...attribute.KeyValue) (metricdata.HistogramDataPoint[float64], bool) {
	t.Helper()
	want := attribute.NewSet(attrs...)
	d, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a %T, not a float64 histogram", m.Name, m.Data)
	for _, dp := range d.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp, true
		}
	}
	return metricdata.HistogramDataPoint[float64]{}, false
}

// attrSets lists the attribute sets of every data point of m, to show in a
// failure.
func attrSets(m metricdata.Metrics) []string {
	var out []string
	add := func(s attribute.Set) { out = append(out, s.Encoded(attribute.DefaultEncoder())) }
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			add(dp.Attributes)
		}
	}
	return out
}

// eventually polls cond every 10ms, failing the test after 30s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// insert writes a row of work in a fenced transaction under l, with token
// in the token column.
func insert(ctx context.Context, b *bundle, l *gofence.Lease, token any) error {
	return l.Tx(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO work (who, token) VALUES ('w', $1)`, token)
		return err
	})
}

var (
	try     = otelfence.AttrAcquireMode.String("try")
	wait    = otelfence.AttrAcquireMode.String("wait")
	granted = otelfence.AttrAcquireOutcome.String("granted")
	held    = otelfence.AttrAcquireOutcome.String("held")
	ttl     = otelfence.AttrLeaseKind.String("ttl")
)

// A real lease goes through grant, renewal, loss (the server revokes it)
// and a refused write; every instrument of the table is read from
// the SDK's in-memory reader with its attributes, and the spans from a
// span recorder.
func TestObserverRecordsALeasesLife(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A TTL long enough for a loaded machine: the loss must be the revoke's.
	c := b.client(t, gofence.Config{Holder: "A", TTL: 2 * time.Second, PollInterval: 20 * time.Millisecond})
	other := b.client(t, gofence.Config{Holder: "B"})

	// Grant, under a span of the caller's: the acquire span is its child.
	ctx, parent := b.tp.Tracer("test").Start(b.ctx, "caller")
	l, err := c.Acquire(ctx, "job", nil)
	require.NoError(t, err)
	parent.End()
	m := b.metrics(t)
	n, ok := point(t, m["pgfence.lease.active"], ttl)
	require.True(t, ok, "pgfence.lease.active has a ttl point: %v", attrSets(m["pgfence.lease.active"]))
	require.EqualValues(t, 1, n, "one lease held")

	// Held: another client tries once.
	_, err = other.Acquire(b.ctx, "job", nil)
	require.ErrorIs(t, err, gofence.ErrHeld)
	// An error: a wait that ends with its context (200 ms; the duration
	// recorded starts inside Acquire, after the context's clock did, so the
	// check below asks for half of it: 48 ms of a 50 ms wait were recorded
	// once beside a second copy of the suite).
	wctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	_, err = other.Acquire(wctx, "job", &gofence.LeaseOptions{Wait: true})
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Renewal: the keepalive renews every TTL/3.
	eventually(t, "a successful renewal", func() bool {
		n, _ := point(t, b.metrics(t)["pgfence.lease.renewals"], otelfence.AttrRenewResult.String("ok"))
		return n >= 1
	})
	require.NoError(t, insert(b.ctx, b, l, l.Token()), "an accepted write")

	// Loss: the operator revokes the lease; the next renewal hears it.
	_, err = c.Revoke(b.ctx, "job")
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked lease was never reported lost")
	}
	require.ErrorIs(t, l.Err(), gofence.ErrLost)
	// Done closes first; the keepalive reports the renewal and the loss
	// right after.
	eventually(t, "the lost renewal and the loss recorded", func() bool {
		m := b.metrics(t)
		r, _ := point(t, m["pgfence.lease.renewals"], otelfence.AttrRenewResult.String("lost"))
		n, _ := point(t, m["pgfence.lease.losses"], otelfence.AttrLossReason.String("superseded"))
		return r == 1 && n == 1
	})

	// Refused writes: the stale token (FN001), and a write without the
	// token of its table's resource (FN002).
	err = insert(b.ctx, b, l, l.Token())
	require.ErrorIs(t, err, gofence.ErrStaleToken)
	unrelated, err := c.Acquire(b.ctx, "unrelated", nil)
	require.NoError(t, err)
	err = insert(b.ctx, b, unrelated, nil)
	require.ErrorIs(t, err, gofence.ErrNoToken)
	require.NoError(t, unrelated.Release(b.ctx))
	require.NoError(t, l.Release(b.ctx), "Release after a loss")

	// Leadership: gained, then stepped down when fn returns.
	err = c.Elect(b.ctx, "leader", nil, func(ctx context.Context, lease *gofence.Lease) error {
		n, ok := point(t, b.metrics(t)["pgfence.election.leader"], otelfence.AttrElectionName.String("leader"))
		if !ok || n != 1 {
			return errLeaderGauge
		}
		return nil
	})
	require.NoError(t, err, "pgfence.election.leader is 1 while leading")

	m = b.metrics(t)
	for _, name := range []string{
		"pgfence.lease.acquire.duration", "pgfence.lease.renewals", "pgfence.lease.renew.duration",
		"pgfence.lease.renew.headroom", "pgfence.lease.losses", "pgfence.lease.active",
		"pgfence.election.leader", "pgfence.write.refusals",
	} {
		require.Contains(t, m, name)
	}
	units := map[string]string{
		"pgfence.lease.acquire.duration": "s", "pgfence.lease.renewals": "{renewal}", "pgfence.lease.renew.duration": "s",
		"pgfence.lease.renew.headroom": "s", "pgfence.lease.losses": "{loss}", "pgfence.lease.active": "{lease}",
		"pgfence.election.leader": "1", "pgfence.write.refusals": "{refusal}",
	}
	for name, unit := range units {
		require.Equal(t, unit, m[name].Unit, name)
	}

	acq := m["pgfence.lease.acquire.duration"]
	dp, ok := histogram(t, acq, try, granted)
	require.True(t, ok, "acquire try/granted: %v", attrSets(acq))
	require.EqualValues(t, 2, dp.Count, "job and unrelated")
	dp, ok = histogram(t, acq, try, held)
	require.True(t, ok, "acquire try/held: %v", attrSets(acq))
	require.EqualValues(t, 1, dp.Count)
	dp, ok = histogram(t, acq, wait, granted)
	require.True(t, ok, "acquire wait/granted (Elect): %v", attrSets(acq))
	require.EqualValues(t, 1, dp.Count)
	dp, ok = histogram(t, acq, wait, otelfence.AttrAcquireOutcome.String("error"), attribute.String("error.type", "timeout"))
	require.True(t, ok, "acquire wait/error/timeout: %v", attrSets(acq))
	require.EqualValues(t, 1, dp.Count)
	require.GreaterOrEqual(t, dp.Sum, 0.1, "the wait is in the duration")

	ren := m["pgfence.lease.renewals"]
	n, _ = point(t, ren, otelfence.AttrRenewResult.String("ok"))
	require.GreaterOrEqual(t, n, int64(1))
	n, ok = point(t, ren, otelfence.AttrRenewResult.String("lost"))
	require.True(t, ok, "a lost renewal: %v", attrSets(ren))
	require.EqualValues(t, 1, n)
	dur, ok := histogram(t, m["pgfence.lease.renew.duration"])
	require.True(t, ok, "renew.duration has no attributes: %v", attrSets(m["pgfence.lease.renew.duration"]))
	require.GreaterOrEqual(t, dur.Count, uint64(2), "the ok renewals and the lost one")
	head, ok := histogram(t, m["pgfence.lease.renew.headroom"])
	require.True(t, ok, "renew.headroom has no attributes")
	require.GreaterOrEqual(t, head.Count, uint64(1))
	minHead, _ := head.Min.Value()
	require.Greater(t, minHead, 0.0, "a renewal at TTL/3 leaves headroom")
	require.Less(t, minHead, (2 * time.Second).Seconds())

	loss := m["pgfence.lease.losses"]
	n, ok = point(t, loss, otelfence.AttrLossReason.String("superseded"))
	require.True(t, ok, "a superseded loss: %v", attrSets(loss))
	require.EqualValues(t, 1, n)
	n, _ = point(t, loss, otelfence.AttrLossReason.String("released"))
	require.EqualValues(t, 2, n, "unrelated and the leader's lease were released")

	n, ok = point(t, m["pgfence.lease.active"], ttl)
	require.True(t, ok)
	require.EqualValues(t, 0, n, "every lease ended")

	n, ok = point(t, m["pgfence.election.leader"], otelfence.AttrElectionName.String("leader"))
	require.True(t, ok)
	require.EqualValues(t, 0, n, "stepped down")

	ref := m["pgfence.write.refusals"]
	for _, code := range []string{"FN001", "FN002"} {
		n, ok = point(t, ref, attribute.String("db.response.status_code", code))
		require.True(t, ok, "a refusal %s: %v", code, attrSets(ref))
		require.EqualValues(t, 1, n, code)
	}

	// No resource names in the metrics by default.
	for name, mm := range m {
		for _, s := range attrSets(mm) {
			require.NotContains(t, s, "pgfence.resource", name)
		}
	}

	// Spans: INTERNAL, the acquire a child of the caller's span.
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range b.spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	require.Len(t, byName["pgfence.acquire"], 5, "job, job (held), job (timed out), unrelated, leader")
	first := byName["pgfence.acquire"][0]
	require.Equal(t, trace.SpanKindInternal, first.SpanKind())
	require.Equal(t, parent.SpanContext().SpanID(), first.Parent().SpanID(), "the acquire span is a child of the caller's")
	require.Contains(t, first.Attributes(), otelfence.AttrResource.String("job"))
	require.Contains(t, first.Attributes(), otelfence.AttrToken.Int64(l.Token()))
	require.Contains(t, first.Attributes(), granted)
	require.False(t, first.EndTime().Before(first.StartTime()))
	require.Equal(t, codes.Error, byName["pgfence.acquire"][2].Status().Code, "the timed-out acquire")
	require.Equal(t, codes.Unset, byName["pgfence.acquire"][1].Status().Code, "held is an answer, not an error")
	require.Len(t, byName["pgfence.release"], 3, "unrelated, job (lost), leader")
	for _, s := range byName["pgfence.release"] {
		require.Equal(t, trace.SpanKindInternal, s.SpanKind())
	}
	require.Contains(t, byName["pgfence.release"][1].Attributes(), attribute.Bool("pgfence.lease.lost", true))
	require.Len(t, byName["pgfence.elect"], 1)
	require.Contains(t, byName["pgfence.elect"][0].Attributes(), otelfence.AttrElectionName.String("leader"))
	require.Equal(t, trace.SpanKindInternal, byName["pgfence.elect"][0].SpanKind())
}

var errLeaderGauge = errorString("pgfence.election.leader was not 1 inside fn")

type errorString string

func (e errorString) Error() string { return string(e) }

// WithResourceNames puts the resource's name on the lease and refusal
// metrics.
func TestWithResourceNames(t *testing.T) {
	t.Parallel()
	b := setup(t, otelfence.WithResourceNames())
	c := b.client(t, gofence.Config{})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	_, err = c.Revoke(b.ctx, "job")
	require.NoError(t, err)
	require.ErrorIs(t, insert(b.ctx, b, l, l.Token()), gofence.ErrStaleToken)
	require.NoError(t, l.Release(b.ctx))

	m := b.metrics(t)
	res := otelfence.AttrResource.String("job")
	_, ok := histogram(t, m["pgfence.lease.acquire.duration"], try, granted, res)
	require.True(t, ok, "%v", attrSets(m["pgfence.lease.acquire.duration"]))
	n, ok := point(t, m["pgfence.lease.active"], ttl, res)
	require.True(t, ok, "%v", attrSets(m["pgfence.lease.active"]))
	require.EqualValues(t, 0, n)
	n, ok = point(t, m["pgfence.write.refusals"], attribute.String("db.response.status_code", "FN001"), otelfence.AttrResource.StringSlice([]string{"job"}))
	require.True(t, ok, "%v", attrSets(m["pgfence.write.refusals"]))
	require.EqualValues(t, 1, n)
}

// ErrorType names the errors of gofence by their class.
func TestErrorType(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]string{
		nil:                                  "",
		gofence.ErrClosed:                    "client_closed",
		fmt.Errorf("x: %w", gofence.ErrLost): "lost",
		gofence.ErrNotInstalled:              "not_installed",
		gofence.ErrPooledSession:             "pooled_session",
		gofence.ErrPoolerStatementCache:      "pooler_statement_cache",
		context.DeadlineExceeded:             "timeout",
		context.Canceled:                     "canceled",
		fmt.Errorf("q: %w", &pgconn.PgError{Code: "57P01"}): "57P01",
		errors.New("dial tcp: connection refused"):          "_OTHER",
	} {
		require.Equal(t, want, otelfence.ErrorType(err), "%v", err)
	}
}
