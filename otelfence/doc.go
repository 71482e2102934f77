// Package otelfence records what gofence does as OpenTelemetry metrics and
// spans: an Observer (gofence.Config.Observer) that turns the client's
// events into the instruments below. It is a module of its own
// (github.com/pgfence/pgfence/otelfence), as otelpgx is beside pgx and
// otelriver beside river, so that a program that uses gofence without
// OpenTelemetry carries none of it.
//
//	obs, err := otelfence.New() // the global meter and tracer providers
//	if err != nil { ... }
//	client, err := gofence.New(pool, &gofence.Config{Observer: obs})
//
// No OpenTelemetry semantic convention covers locks or leases, so the names
// are pgfence's own, written by its naming rules: units in UCUM, counters
// in the plural without _total, one metric with an attribute (error.type,
// a result, a reason) rather than a pair of success and failure metrics.
//
// # Metrics
//
//   - pgfence.lease.acquire.duration (histogram, s): every acquire (Acquire,
//     and those of Do and Elect), its wait included; attributes
//     pgfence.acquire.mode (try, wait), pgfence.acquire.outcome (granted,
//     held, busy, error) and, for the outcome error, error.type (see
//     ErrorType).
//   - pgfence.lease.renewals (counter, {renewal}): renewal attempts of TTL
//     leases; pgfence.renew.result (ok, retry, lost).
//   - pgfence.lease.renew.duration (histogram, s): each renewal attempt
//     that was sent.
//   - pgfence.lease.renew.headroom (histogram, s): for each successful
//     renewal, the trust deadline in force when it was sent minus its
//     completion: it falls when renewals slow down or need retries.
//   - pgfence.lease.losses (counter, {loss}): leases that ended;
//     pgfence.lease.loss_reason (released, client_closed, deadline_passed,
//     superseded, session_ended, renew_failed, refused). released is the
//     holder's own Release, the normal end: alert on the other reasons.
//   - pgfence.lease.active (up-down counter, {lease}): leases held now;
//     pgfence.lease.kind (ttl, session).
//   - pgfence.election.leader (gauge, 1): 1 while this process leads an
//     election (Elect), 0 after it stepped down or lost;
//     pgfence.election.name.
//   - pgfence.write.refusals (counter, {refusal}): writes the database
//     refused inside gofence's Tx, UseToken or Do; db.response.status_code
//     (FN001 stale token, FN002 no token, FN003 unknown token).
//
// Resource names stay out of the metrics by default: a resource per row
// (an order, a tenant) would make a time series per row. WithResourceNames
// adds them as pgfence.resource.
//
// # Spans
//
// pgfence.acquire, pgfence.release and pgfence.elect (a campaign, from its
// start until leadership was gained), of kind INTERNAL, children of the
// span in the call's context, with the resource (pgfence.resource), the
// holder (pgfence.lease.holder) and the token (pgfence.lease.token, or
// pgfence.election.term) as attributes. gofence reports a call once it has
// returned, so the spans are made afterwards with the call's start and end
// times, and the database spans of the call (otelpgx's, which are that
// library's business) are their siblings, not their children. Renewals and
// losses make no spans: they happen in the background, outside any trace.
package otelfence
