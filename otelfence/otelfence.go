package otelfence

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/gofence"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/pgfence/pgfence/otelfence"

// The attributes of the instruments and spans. pgfence.resource is on the
// metrics only with WithResourceNames; the spans always carry it.
const (
	AttrAcquireMode    = attribute.Key("pgfence.acquire.mode")    // try, wait
	AttrAcquireOutcome = attribute.Key("pgfence.acquire.outcome") // granted, held, busy, error
	AttrRenewResult    = attribute.Key("pgfence.renew.result")    // ok, retry, lost
	AttrLossReason     = attribute.Key("pgfence.lease.loss_reason")
	AttrLeaseKind      = attribute.Key("pgfence.lease.kind") // ttl, session
	AttrElectionName   = attribute.Key("pgfence.election.name")
	AttrResource       = attribute.Key("pgfence.resource")
	AttrHolder         = attribute.Key("pgfence.lease.holder")
	AttrToken          = attribute.Key("pgfence.lease.token")
	AttrTerm           = attribute.Key("pgfence.election.term")
)

// Option configures New.
type Option func(*config)

type config struct {
	meters        metric.MeterProvider
	tracers       trace.TracerProvider
	resourceNames bool
}

// WithMeterProvider sets the meter provider. Default: otel.GetMeterProvider()
// when New is called (the global one, which follows a provider set later).
func WithMeterProvider(p metric.MeterProvider) Option {
	return func(c *config) { c.meters = p }
}

// WithTracerProvider sets the tracer provider. Default:
// otel.GetTracerProvider() when New is called.
func WithTracerProvider(p trace.TracerProvider) Option {
	return func(c *config) { c.tracers = p }
}

// WithResourceNames adds the attribute pgfence.resource (the resource's
// name; for a refusal, the names of the transaction's resources) to the
// lease and refusal metrics. Off by default: a resource per row (an order,
// a tenant) makes a time series per row. Spans carry it either way.
func WithResourceNames() Option {
	return func(c *config) { c.resourceNames = true }
}

// Observer is a gofence.Observer that records the events of a Client as
// the OpenTelemetry metrics and spans of the package documentation; set it
// as gofence.Config.Observer (or combine it with others through
// gofence.Observers). It is safe for concurrent use, and it does no more
// than the providers' Record, Add and span calls, which do not block.
type Observer struct {
	resourceNames bool
	tracer        trace.Tracer

	acquireDuration metric.Float64Histogram
	renewals        metric.Int64Counter
	renewDuration   metric.Float64Histogram
	renewHeadroom   metric.Float64Histogram
	losses          metric.Int64Counter
	active          metric.Int64UpDownCounter
	leader          metric.Int64Gauge
	refusals        metric.Int64Counter
}

var _ gofence.Observer = (*Observer)(nil)

// New makes the instruments and the tracer. It fails only when the meter
// provider refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	var c config
	for _, opt := range opts {
		opt(&c)
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	if c.tracers == nil {
		c.tracers = otel.GetTracerProvider()
	}
	meter := c.meters.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	o := &Observer{
		resourceNames: c.resourceNames,
		tracer:        c.tracers.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
	}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	o.acquireDuration, err = meter.Float64Histogram("pgfence.lease.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Time an acquire took, its wait included, by mode and outcome."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	add(err)
	o.renewals, err = meter.Int64Counter("pgfence.lease.renewals", metric.WithUnit("{renewal}"),
		metric.WithDescription("Renewal attempts of TTL leases, by result."))
	add(err)
	o.renewDuration, err = meter.Float64Histogram("pgfence.lease.renew.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a renewal attempt took."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	add(err)
	o.renewHeadroom, err = meter.Float64Histogram("pgfence.lease.renew.headroom", metric.WithUnit("s"),
		metric.WithDescription("Trust deadline minus completion of each successful renewal: how close the lease came to being lost."),
		metric.WithExplicitBucketBoundaries(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 300))
	add(err)
	o.losses, err = meter.Int64Counter("pgfence.lease.losses", metric.WithUnit("{loss}"),
		metric.WithDescription("Leases that ended, by reason (released is the normal end)."))
	add(err)
	o.active, err = meter.Int64UpDownCounter("pgfence.lease.active", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now, by kind."))
	add(err)
	o.leader, err = meter.Int64Gauge("pgfence.election.leader", metric.WithUnit("1"),
		metric.WithDescription("1 while this process leads the election, 0 once it stopped."))
	add(err)
	o.refusals, err = meter.Int64Counter("pgfence.write.refusals", metric.WithUnit("{refusal}"),
		metric.WithDescription("Writes the database refused with a fencing SQLSTATE, as seen by gofence."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Observe records e.
func (o *Observer) Observe(ctx context.Context, e gofence.Event) {
	switch e := e.(type) {
	case *gofence.AcquireEvent:
		o.acquire(ctx, e)
	case *gofence.RenewEvent:
		o.renew(ctx, e)
	case *gofence.ReleaseEvent:
		o.release(ctx, e)
	case *gofence.LossEvent:
		o.loss(ctx, e)
	case *gofence.RefusalEvent:
		o.refusal(ctx, e)
	case *gofence.LeadershipEvent:
		o.leadership(ctx, e)
	}
}

// with adds the resource's name to attrs when WithResourceNames asked for it.
func (o *Observer) with(attrs []attribute.KeyValue, resource string) metric.MeasurementOption {
	if o.resourceNames {
		attrs = append(attrs, AttrResource.String(resource))
	}
	return metric.WithAttributeSet(attribute.NewSet(attrs...))
}

func (o *Observer) acquire(ctx context.Context, e *gofence.AcquireEvent) {
	attrs := []attribute.KeyValue{AttrAcquireMode.String(string(e.Mode)), AttrAcquireOutcome.String(string(e.Outcome))}
	if e.Outcome == gofence.OutcomeError {
		attrs = append(attrs, semconv.ErrorTypeKey.String(ErrorType(e.Err)))
	}
	o.acquireDuration.Record(ctx, e.Wait.Seconds(), o.with(attrs, e.Resource))
	if e.Outcome == gofence.OutcomeGranted {
		o.active.Add(ctx, 1, o.with([]attribute.KeyValue{AttrLeaseKind.String(string(e.Kind))}, e.Resource))
	}

	span := o.span(ctx, "pgfence.acquire", e.Start, append(attrs,
		AttrResource.String(e.Resource), AttrHolder.String(e.Holder), AttrLeaseKind.String(string(e.Kind))))
	if e.Outcome == gofence.OutcomeGranted {
		span.SetAttributes(AttrToken.Int64(e.Token))
	}
	if e.Outcome == gofence.OutcomeError {
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(e.Start.Add(e.Wait)))
}

func (o *Observer) renew(ctx context.Context, e *gofence.RenewEvent) {
	o.renewals.Add(ctx, 1, o.with([]attribute.KeyValue{AttrRenewResult.String(string(e.Result))}, e.Resource))
	if e.Latency > 0 {
		o.renewDuration.Record(ctx, e.Latency.Seconds(), o.with(nil, e.Resource))
	}
	if e.Result == gofence.RenewOK {
		o.renewHeadroom.Record(ctx, max(e.Headroom, 0).Seconds(), o.with(nil, e.Resource))
	}
}

func (o *Observer) release(ctx context.Context, e *gofence.ReleaseEvent) {
	span := o.span(ctx, "pgfence.release", e.Start, []attribute.KeyValue{
		AttrResource.String(e.Resource), AttrHolder.String(e.Holder), AttrToken.Int64(e.Token),
		AttrLeaseKind.String(string(e.Kind)), attribute.Bool("pgfence.lease.lost", e.Lost),
	})
	if e.Err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(ErrorType(e.Err)))
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(e.Start.Add(e.Duration)))
}

func (o *Observer) loss(ctx context.Context, e *gofence.LossEvent) {
	o.losses.Add(ctx, 1, o.with([]attribute.KeyValue{AttrLossReason.String(string(e.Reason))}, e.Resource))
	o.active.Add(ctx, -1, o.with([]attribute.KeyValue{AttrLeaseKind.String(string(e.Kind))}, e.Resource))
}

func (o *Observer) refusal(ctx context.Context, e *gofence.RefusalEvent) {
	attrs := []attribute.KeyValue{semconv.DBResponseStatusCodeKey.String(e.SQLState)}
	if o.resourceNames {
		attrs = append(attrs, AttrResource.StringSlice(e.Resources))
	}
	o.refusals.Add(ctx, 1, metric.WithAttributeSet(attribute.NewSet(attrs...)))
}

func (o *Observer) leadership(ctx context.Context, e *gofence.LeadershipEvent) {
	var v int64
	if e.Leading {
		v = 1
	}
	o.leader.Record(ctx, v, metric.WithAttributeSet(attribute.NewSet(AttrElectionName.String(e.Name))))
	if !e.Leading {
		return
	}
	span := o.span(ctx, "pgfence.elect", e.Since, []attribute.KeyValue{
		AttrElectionName.String(e.Name), AttrHolder.String(e.Holder), AttrTerm.Int64(e.Term),
	})
	span.End(trace.WithTimestamp(e.Since.Add(e.Duration)))
}

// span starts an INTERNAL span at start, a child of ctx's span.
func (o *Observer) span(ctx context.Context, name string, start time.Time, attrs []attribute.KeyValue) trace.Span {
	_, span := o.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	return span
}

// ErrorType is the error.type of an error of gofence: the SQLSTATE of a
// PostgreSQL error; client_closed (gofence.ErrClosed), lost (gofence.ErrLost:
// a grant whose reply came after its trust deadline), not_installed,
// pooled_session, pooler_statement_cache; timeout and canceled for a
// context that ended; _OTHER for anything else (a refused connection, for
// example).
func ErrorType(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, gofence.ErrClosed):
		return "client_closed"
	case errors.Is(err, gofence.ErrLost):
		return "lost"
	case errors.Is(err, gofence.ErrNotInstalled):
		return "not_installed"
	case errors.Is(err, gofence.ErrPooledSession):
		return "pooled_session"
	case errors.Is(err, gofence.ErrPoolerStatementCache):
		return "pooler_statement_cache"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.As(err, &pgErr):
		return pgErr.Code
	}
	return semconv.ErrorTypeOther.Value.AsString()
}
