package gofence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// Observer receives the events of a Client (Config.Observer): every
// acquire, renewal, release and end of a lease, every write the database
// refused inside Tx, UseToken or Do, and every change of leadership in
// Elect. It is for telemetry: code that must act on a loss uses Lease.Done,
// Lease.Err or the context of Do and Elect, which say so no later than the
// trust deadline whatever an observer does.
//
// Observe is called synchronously, on the goroutine that made the event (a
// caller's, or the lease's keepalive), after the fact, so it must not block:
// a slow observer delays renewals and the calls it observes. Nor may it call
// Release, Close or Elect: the call it observes may be one of those. It may be
// called from several goroutines at once. A panic in Observe is recovered
// and logged through Config.Logger (WARN); the client carries on.
//
// ctx is the context of the call the event belongs to (Acquire, Release,
// Tx, ...), so that an observer can find the caller's span or values in it;
// it may be done already (a wait that ended with it, for example), and an
// observer must not wait on it. Events of the background (renewals, a loss
// found by the loss timer) come with context.Background().
//
// Events are one of *AcquireEvent, *RenewEvent, *ReleaseEvent, *LossEvent,
// *RefusalEvent and *LeadershipEvent, each new (an observer may keep it),
// and shared by the observers of Observers (none may change it). Package otelfence
// (a module of its own) is an Observer that turns them into OpenTelemetry
// metrics and spans.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc is a function that is an Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// Observers returns an Observer that passes every event to each of obs in
// turn (nil ones are left out), as slog handlers are chained by a fan-out.
// A panic in one of them does not keep the event from the others: the first
// panic goes on once all have been called, so that the Client logs it.
// With no observer left it returns nil; with one, that one.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case multiObserver:
			list = append(list, o...)
		default:
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) {
	var first any
	panicked := false
	for _, o := range m {
		func() {
			defer func() {
				if r := recover(); r != nil && !panicked {
					first, panicked = r, true
				}
			}()
			o.Observe(ctx, e)
		}()
	}
	if panicked {
		panic(first)
	}
}

// observe passes e to o (when there is one), recovering a panic and logging
// it through log: an observer never breaks the client.
func observe(o Observer, log *slog.Logger, ctx context.Context, e Event) {
	if o == nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			log.Warn("pgfence: Config.Observer panicked; the event is dropped, the client goes on",
				"event", fmt.Sprintf("%T", e), "panic", fmt.Sprint(r))
		}
	}()
	o.Observe(ctx, e)
}

// Event is one of *AcquireEvent, *RenewEvent, *ReleaseEvent, *LossEvent,
// *RefusalEvent and *LeadershipEvent (a closed set: a type switch over them
// is complete).
type Event interface {
	// Type names the event: "acquire", "renew", "release", "loss",
	// "refusal" or "leadership".
	Type() string
	event()
}

// LeaseKind is the kind of a lease: "ttl" (Acquire, Do, Elect) or
// "session" (bound to a dedicated connection), as in fence.leases.
type LeaseKind string

// The kinds of lease.
const (
	KindTTL     LeaseKind = "ttl"
	KindSession LeaseKind = "session"
)

// AcquireMode says whether an acquire tried once or waited.
type AcquireMode string

// The modes of an acquire.
const (
	// ModeTry: one attempt (a held resource is an answer, not a reason to wait).
	ModeTry AcquireMode = "try"
	// ModeWait: waited until granted or until its context ended (Do and
	// Elect by default).
	ModeWait AcquireMode = "wait"
)

// AcquireOutcome is how an acquire ended.
type AcquireOutcome string

// The outcomes of an acquire.
const (
	// OutcomeGranted: the call returned a lease.
	OutcomeGranted AcquireOutcome = "granted"
	// OutcomeHeld: another live lease holds the resource (ErrHeld).
	OutcomeHeld AcquireOutcome = "held"
	// OutcomeBusy: a transaction under the previous token was still open
	// when the grant gave up waiting for it (ErrBusy).
	OutcomeBusy AcquireOutcome = "busy"
	// OutcomeError: any other error: the context ended, the client was
	// closed, a grant came back after its trust deadline (ErrLost), the
	// server could not be reached, ...
	OutcomeError AcquireOutcome = "error"
)

// AcquireEvent reports one acquire call as it returns: Acquire (and the
// acquire of Do and Elect), in either mode, of either kind. A waiting call
// makes one event for its whole wait, not one per attempt.
type AcquireEvent struct {
	Resource string
	Holder   string
	Kind     LeaseKind
	Mode     AcquireMode
	Outcome  AcquireOutcome
	// Start is when the call began; Wait is how long it took, waiting included.
	Start time.Time
	Wait  time.Duration
	// Token is the granted lease's token; 0 unless Outcome is granted.
	Token int64
	// Err is what the call returned; nil when granted.
	Err error
}

// RenewResult is how one renewal attempt ended.
type RenewResult string

// The results of a renewal.
const (
	// RenewOK: the server renewed the lease and the trust deadline moved.
	RenewOK RenewResult = "ok"
	// RenewRetry: the attempt failed with a transient error and the lease
	// is still held: the keepalive tries again after RetryInterval
	// (Lease.Renew returns the error to its caller).
	RenewRetry RenewResult = "retry"
	// RenewLost: the lease was lost during the renewal: the server no
	// longer had it live, the attempt ran into the trust deadline (or the
	// deadline passed between attempts), or the error was final. The
	// lease's LossEvent reports the loss too (it may come first: the loss
	// timer can find the deadline passed before the keepalive does).
	RenewLost RenewResult = "lost"
)

// RenewEvent reports one renewal attempt of a TTL lease, by its keepalive
// or by Lease.Renew. A renewal that the keepalive retries makes one event
// per attempt: zero or more retry, then ok or lost.
type RenewEvent struct {
	Resource string
	Holder   string
	Token    int64
	Result   RenewResult
	// Start is when the attempt was sent; Latency is how long it took. Zero
	// Latency for a lost result means no attempt was in flight: the trust
	// deadline passed while the keepalive waited to retry.
	Start   time.Time
	Latency time.Duration
	// Headroom is the trust deadline in force when the attempt was sent
	// minus the time it completed: how close the lease came to being lost.
	// It shrinks when renewals slow down or need retries; it is zero or
	// less for a renewal lost at the deadline (and what was left for one
	// the server answered with "not live").
	Headroom time.Duration
	// Err is the attempt's error; nil for ok.
	Err error
}

// ReleaseEvent reports one Release of a lease that did some work (a
// Release after a confirmed one returns at once and makes none), also the
// releases that Do, Elect and Close (Config.ReleaseOnClose) make. A release
// of a lease that was lost already (Lost) is one bounded attempt whose
// result is not reported (Err is nil). The end of the lease itself is the
// LossEvent (reason released or client_closed) that comes before it.
type ReleaseEvent struct {
	Resource string
	Holder   string
	Token    int64
	Kind     LeaseKind
	// Lost is true when the lease had been lost before Release was called.
	Lost bool
	// Start is when the call began; Duration is how long it took.
	Start    time.Time
	Duration time.Duration
	// Err is what Release returned.
	Err error
}

// LossReason says why a lease ended.
type LossReason string

// The reasons a lease ends.
const (
	// LossReleased: its holder released it (Release, or Do and Elect when
	// fn returned). The one reason that is not a loss of the lease.
	LossReleased LossReason = "released"
	// LossClientClosed: Client.Close ended it: released it
	// (Config.ReleaseOnClose; ErrReleased), or stopped renewing it (the
	// default; ErrLost: a TTL lease stays live on the server until its
	// expiry, a session lease's session is closed).
	LossClientClosed LossReason = "client_closed"
	// LossDeadlinePassed: no renewal succeeded before the local trust
	// deadline (the server unreachable or slow, the process paused), or a
	// renewal's reply came only after it.
	LossDeadlinePassed LossReason = "deadline_passed"
	// LossSuperseded: the server answered a renewal that it no longer has
	// this lease live: revoked (fence.revoke), superseded by a newer grant,
	// or expired by the server's clock.
	LossSuperseded LossReason = "superseded"
	// LossSessionEnded: the dedicated connection of a session lease failed
	// (the server ends the lease with the session).
	LossSessionEnded LossReason = "session_ended"
	// LossRenewFailed: a renewal failed with an error that retrying cannot
	// fix (a missing privilege, for example).
	LossRenewFailed LossReason = "renew_failed"
	// LossRefused: a write under its token was refused with FN001 (stale
	// token) inside Tx, UseToken or Do: the server has granted a newer
	// token, so the lease ends at once.
	LossRefused LossReason = "refused"
)

// LossEvent reports the end of a lease: every lease that an AcquireEvent
// reported granted ends with exactly one LossEvent, released or lost, so
// that granted acquires minus LossEvents is the number of leases held. It
// comes right after Lease.Done closed, on the goroutine that ended the
// lease (Release's, the keepalive's, the loss timer's): a signal that must
// be acted on is Done's, never an observer's.
type LossEvent struct {
	Resource string
	Holder   string
	Token    int64
	Kind     LeaseKind
	Reason   LossReason
	// Held is how long the lease was held, from the grant's reply.
	Held time.Duration
	// Err is the lease's Err: it matches ErrReleased for the reasons
	// released and client_closed, ErrLost for the others.
	Err error
}

// RefusalEvent reports a write that the database refused with a fencing
// SQLSTATE, as seen by Tx, UseToken or Do: FN001 (ErrStaleToken, a token
// older than the latest grant: this writer lost its lease), FN002
// (ErrNoToken, a write without a token) or FN003 (ErrUnknownToken, a token
// never granted). Do reports only refusals that did not go through a Tx or
// UseToken of this package (fn wrote some other way), so none is counted
// twice: the errors that Tx and UseToken return carry a mark that says so
// (their message and what they wrap are unchanged). A refusal that the
// caller's own code meets outside these calls is not seen; the database
// counts every refusal (the view fence.refusals), also those of clients
// that are not Go.
type RefusalEvent struct {
	// SQLState is "FN001", "FN002" or "FN003".
	SQLState string
	// Op is "tx" (Tx, Lease.Tx), "use_token" (UseToken, UseTokens) or "do"
	// (the lease of Do): where the refusal was seen.
	Op string
	// Resources and Tokens are the leases of the transaction (of Do's
	// lease for op do), in the order their tokens were registered (by
	// resource). The refused row may be another resource's (FN002: a write
	// whose resource has no token registered).
	Resources []string
	Tokens    []int64
	// Err is the error returned to the caller.
	Err error
}

// LeadershipEvent reports that Elect won leadership of Name (Leading true)
// or that it ended (Leading false): lost (Err matches ErrLost) or stepped
// down (Err nil: fn returned or Elect's context ended, and the lease was
// released). Each term makes one event of each.
type LeadershipEvent struct {
	Name   string
	Holder string
	// Term is the leader's fencing token: terms strictly increase.
	Term    int64
	Leading bool
	// Since is when the campaign began (Leading true) or when the term
	// began (Leading false); Duration is how long the campaign, or the
	// term, lasted.
	Since    time.Time
	Duration time.Duration
	// Err is the loss that ended the term; nil when gained or stepped down.
	Err error
}

// Type is "acquire".
func (*AcquireEvent) Type() string { return "acquire" }

// Type is "renew".
func (*RenewEvent) Type() string { return "renew" }

// Type is "release".
func (*ReleaseEvent) Type() string { return "release" }

// Type is "loss".
func (*LossEvent) Type() string { return "loss" }

// Type is "refusal".
func (*RefusalEvent) Type() string { return "refusal" }

// Type is "leadership".
func (*LeadershipEvent) Type() string { return "leadership" }

func (*AcquireEvent) event()    {}
func (*RenewEvent) event()      {}
func (*ReleaseEvent) event()    {}
func (*LossEvent) event()       {}
func (*RefusalEvent) event()    {}
func (*LeadershipEvent) event() {}

// observe passes e to the client's observer.
func (c *Client) observe(ctx context.Context, e Event) {
	observe(c.cfg.Observer, c.log, ctx, e)
}

// kind is the lease's kind.
func (l *Lease) kind() LeaseKind {
	if l.session != nil {
		return KindSession
	}
	return KindTTL
}

// ended reports the end of the lease; the caller made sure it is the one
// that ended it, so that each lease ends once.
func (l *Lease) ended(ctx context.Context, reason LossReason) {
	l.c.observe(ctx, &LossEvent{
		Resource: l.resource, Holder: l.t.holder, Token: l.token, Kind: l.kind(),
		Reason: reason, Held: time.Since(l.granted), Err: context.Cause(l.ctx),
	})
}

// acquired reports an Acquire that began at start and returned l or err.
func (c *Client) acquired(ctx context.Context, resource string, o LeaseOptions, t leaseTimings, start time.Time, l *Lease, err error) {
	if c.cfg.Observer == nil {
		return
	}
	e := &AcquireEvent{
		Resource: resource, Holder: cmp.Or(t.holder, o.Holder, c.cfg.Holder), Kind: KindTTL, Mode: ModeTry,
		Start: start, Wait: time.Since(start), Err: err,
	}
	if o.Session {
		e.Kind = KindSession
	}
	if o.Wait {
		e.Mode = ModeWait
	}
	switch {
	case err == nil:
		e.Outcome, e.Token = OutcomeGranted, l.token
	case errors.Is(err, ErrBusy):
		e.Outcome = OutcomeBusy
	case errors.Is(err, ErrHeld):
		e.Outcome = OutcomeHeld
	default:
		e.Outcome = OutcomeError
	}
	c.observe(ctx, e)
}

// The places a refused write is seen (RefusalEvent.Op).
const (
	opTx       = "tx"
	opUseToken = "use_token"
	opDo       = "do"
)

// refusalCode is the fencing SQLSTATE of a refused write in err (FN001,
// FN002 or FN003), or "".
func refusalCode(err error) string {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case sqlfuncs.CodeStaleToken, sqlfuncs.CodeNoToken, sqlfuncs.CodeUnknownToken:
		return pgErr.Code
	}
	return ""
}

// loseStale ends, at once, the lease of s that a stale-token refusal (err,
// FN001) names in its DETAIL ("resource=R token=T ..."): the server has a
// newer grant of R, so the lease is lost whatever its next renewal would
// say.
func (s leaseSet) loseStale(err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return
	}
	for _, l := range s {
		if strings.HasPrefix(pgErr.Detail, "resource="+l.resource+" token="+strconv.FormatInt(l.token, 10)+" ") {
			l.lose(LossRefused, "a write under its token was refused (FN001): the server has granted a newer token", nil)
		}
	}
}

// reportedRefusal marks an error whose refusal was reported already (by
// Tx or UseToken), so that Do does not report it again. It changes nothing
// else: its message and everything it wraps are err's.
type reportedRefusal struct{ err error }

func (r *reportedRefusal) Error() string { return r.err.Error() }
func (r *reportedRefusal) Unwrap() error { return r.err }

// refused reports err to the observer of every client of s when it is a
// refused write, seen by op, and returns it marked as reported.
func (s leaseSet) refused(ctx context.Context, op string, err error) error {
	code := refusalCode(err)
	if code == "" {
		return err
	}
	var done *reportedRefusal
	if errors.As(err, &done) {
		return err // a Tx inside a Tx's fn: seen already
	}
	if code == sqlfuncs.CodeStaleToken {
		s.loseStale(err)
	}
	resources, tokens := s.tokens()
	e := &RefusalEvent{SQLState: code, Op: op, Resources: resources, Tokens: tokens, Err: err}
	var seen []*Client
	for _, l := range s {
		if !slices.Contains(seen, l.c) {
			seen = append(seen, l.c)
			l.c.observe(ctx, e)
		}
	}
	return &reportedRefusal{err}
}
