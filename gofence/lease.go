package gofence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// Lease is a granted lease with its fencing token. It renews itself in the
// background until Release, and reports its loss (Err, Done, Context) no
// later than its local trust deadline: those look at the clock themselves,
// so they never say "held" at a local time past the deadline, also right
// after the process was paused. Its methods are safe for concurrent use.
type Lease struct {
	c        *Client
	t        leaseTimings // holder, TTL and the intervals that follow from it
	resource string
	token    int64
	session  *pgx.Conn // the dedicated connection of a session lease; nil for TTL leases
	granted  time.Time // when the grant came back, for LossEvent.Held

	ctx    context.Context // ends at loss or release; Context returns view
	cancel context.CancelCauseFunc
	view   *leaseContext
	// renewCtx ends with the lease or when Release stops the keepalive, so
	// that a renewal stuck in a partition does not hold Release up.
	renewCtx      context.Context
	renewCancel   context.CancelFunc
	keepaliveDone chan struct{} // closed when the keepalive goroutine returns

	// mu guards the lease's timing; it is never held across a network call.
	mu        sync.Mutex
	deadline  time.Time   // local trust deadline (monotonic clock reading inside)
	expiresAt time.Time   // the server's expiry, as last reported
	lossTimer *time.Timer // fires loss at the trust deadline

	// releasing lets one Release run at a time (a second call retries a
	// failed first one) without blocking the readers of mu's fields; a
	// channel of one, so that a second call waits only as long as its ctx
	// allows.
	releasing chan struct{}
	released  bool // the server confirmed the release (or the session is gone); guarded by releasing

	// closedByClient: Client.Close ended the lease (released it, or
	// stopped renewing it), not its holder.
	closedByClient atomic.Bool
}

// Acquire takes a lease on resource, as opts says (nil: a TTL lease under
// the Client's Config, tried once). Tried once, a resource that another live
// lease holds gives a *HeldError (errors.Is(err, ErrHeld)) that names the
// holder and its expiry, and a resource whose previous holder still has a
// guarded transaction open gives an error matching ErrBusy; with
// opts.Wait it waits through both until it is granted the lease or ctx is
// done (see LeaseOptions.Wait).
//
// A TTL lease is handed over only before its trust deadline (the request's
// send time + TTL - SafetyMargin): a grant whose reply came later is given
// back at once, and the error matches ErrLost and says why (waiting longer
// would not make the round trip shorter). When ctx ends while the grant is
// on its way, Acquire returns ctx's cause at once; the grant runs to
// completion in the background (at most 5s longer) and whatever it was
// granted is given back, so nobody waits for its TTL.
//
// A session lease (opts.Session) lives until Release or until its
// dedicated connection breaks; the lease then reports itself lost. Because
// the server ends the lease the moment the session ends
// (pg_terminate_backend, for example), a session lease can be granted to
// someone else shortly before this process notices (within RenewInterval,
// when the connection is checked): the fencing token still protects every
// guarded write. Behind a connection pooler it refuses with
// ErrPooledSession (see README, "Behind a connection pooler"). A waiter for
// a session lease is mostly woken by polling: fence.acquire_session cannot
// ask the holder's release to send a notification (as fence.acquire does),
// so lower Config.PollInterval for a faster handoff; it holds a pool
// connection only while it asks, and a dedicated one once granted.
func (c *Client) Acquire(ctx context.Context, resource string, opts *LeaseOptions) (l *Lease, err error) {
	start := time.Now()
	o, t, err := c.leaseTimings(opts)
	defer func() { c.acquired(ctx, resource, o, t, start, l, err) }()
	if err != nil {
		return nil, err
	}
	try := func() (*Lease, error) {
		if o.Session {
			return c.acquireSession(ctx, resource, t)
		}
		return c.acquire(ctx, resource, o.Wait && !c.cfg.DisableNotify, t)
	}
	if !o.Wait {
		return try()
	}
	return c.wait(ctx, resource, try)
}

// acquire tries once to take a TTL lease; waiting asks the holder's release
// to NOTIFY (LeaseOptions.Wait).
func (c *Client) acquire(ctx context.Context, resource string, waiting bool, t leaseTimings) (*Lease, error) {
	k, err := c.begin()
	if err != nil {
		return nil, err
	}
	if err := k.ensureInstalled(ctx); err != nil {
		k.done()
		return nil, err
	}
	grant := sqlfuncs.Acquire
	if waiting {
		grant = sqlfuncs.AcquireWaiting
	}
	r, err := c.grant(ctx, k, resource, t.callBound(), func(ctx context.Context, db sqlfuncs.DB) (int64, bool, error) {
		return grant(ctx, db, resource, t.holder, t.ttl)
	})
	if err != nil || !r.ok {
		k.done()
		if err != nil {
			return nil, fmt.Errorf("pgfence: acquiring %s: %w", resource, err)
		}
		return nil, c.heldError(ctx, resource, t)
	}
	// The trust deadline counts from the moment the request was sent: the
	// server reads its clock later than that, so its expiry is later too.
	deadline := r.sentAt.Add(t.ttl - t.margin)
	if late := time.Since(deadline); late >= 0 {
		// Handed over now, the lease would be held past its deadline (and
		// perhaps by someone else already, by the server's clock).
		return nil, lateGrant(resource, r.token, late, t, c.giveBackWaiting(ctx, k, resource, r.token))
	}
	l := c.newLease(resource, r.token, nil, t)
	// Set before track: from then on Close may Release the lease.
	l.deadline = deadline
	l.lossTimer = time.AfterFunc(time.Until(l.deadline), l.trustDeadlinePassed)
	if !c.track(l) { // Close ran meanwhile: give the lease straight back
		l.lossTimer.Stop()
		l.cancel(ErrClosed)
		_ = c.giveBackWaiting(ctx, k, resource, r.token)
		return nil, ErrClosed
	}
	k.done()
	go l.keepalive(r.sentAt)
	c.log.Debug("pgfence: lease acquired", "resource", resource, "token", r.token, "holder", t.holder)
	return l, nil
}

// acquireSession tries once to take a session lease.
func (c *Client) acquireSession(ctx context.Context, resource string, t leaseTimings) (*Lease, error) {
	// Close waits for this call, and cuts it off when it stops waiting: the
	// session then closes, and with it ends any lease it was granted.
	k, err := c.begin()
	if err != nil {
		return nil, err
	}
	defer k.done()
	ctx, cancel := k.bound(ctx)
	defer cancel()
	if err := c.ensureInstalled(ctx); err != nil {
		return nil, err
	}
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgfence: acquiring %s: %w", resource, err)
	}
	conn := pc.Hijack() // the pool forgets it: the lease owns this session now
	tok, ok, err := sqlfuncs.AcquireSession(ctx, conn, resource, t.holder)
	if err != nil || !ok {
		closeConn(conn)
		if err != nil {
			return nil, fmt.Errorf("pgfence: acquiring %s: %w", resource, err)
		}
		return nil, c.heldError(ctx, resource, t)
	}
	if err := c.refusePooledSession(ctx, conn, resource, tok); err != nil {
		closeConn(conn)
		return nil, err
	}
	l := c.newLease(resource, tok, conn, t)
	if !c.track(l) { // Close ran meanwhile: ending the session ends the lease
		closeConn(conn)
		l.cancel(ErrClosed)
		return nil, ErrClosed
	}
	go l.keepalive(time.Now().Add(-l.t.renew / 2)) // first check after RenewInterval/2
	return l, nil
}

func (c *Client) newLease(resource string, token int64, session *pgx.Conn, t leaseTimings) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	renewCtx, renewCancel := context.WithCancel(ctx)
	l := &Lease{
		c: c, t: t, resource: resource, token: token, session: session, granted: time.Now(),
		ctx: ctx, cancel: cancel, renewCtx: renewCtx, renewCancel: renewCancel,
		keepaliveDone: make(chan struct{}), releasing: make(chan struct{}, 1),
	}
	l.view = &leaseContext{Context: ctx, l: l}
	return l
}

// heldError reads who holds resource, after a grant answered NULL. When the
// row says nobody holds it live, the grant gave up waiting for an open
// guarded transaction of the previous holder (fence.grant_wait), or the
// lease ended between the grant and the read: the resource is busy, not
// held. The read is one attempt, bounded as a grant is.
func (c *Client) heldError(ctx context.Context, resource string, t leaseTimings) error {
	actx, cancel := attempt(ctx, t.callBound())
	defer cancel()
	row, ok, err := sqlfuncs.GetLease(actx, c.pool, resource)
	if err = cutOff(ctx, actx, err); err != nil {
		return fmt.Errorf("pgfence: %s is held, and reading its holder failed: %w", resource, err)
	}
	if !ok || !row.Live {
		return fmt.Errorf("%w: %s: a transaction under the previous token is still open (or the lease ended just now); try again, or set LeaseOptions.Wait to wait for it", ErrBusy, resource)
	}
	return &HeldError{LeaseInfo: row}
}

// Token is the fencing token of the lease: pass it with every write to a
// protected resource.
func (l *Lease) Token() int64 { return l.token }

// Resource is the resource the lease is on.
func (l *Lease) Resource() string { return l.resource }

// Holder is the name the lease is held under.
func (l *Lease) Holder() string { return l.t.holder }

// Context is cancelled when the lease is lost or released; context.Cause
// tells which (ErrLost or ErrReleased, wrapped with the reason). Its Err and
// Done look at the clock as Lease.Err does, so they never report the lease
// held past its trust deadline. Contexts derived from it (WithTimeout, ...)
// are cancelled when the loss is declared: at the first look at the lease
// after the deadline (Err, Done, this context's Err or Done), or by the loss
// timer, whichever runs first.
func (l *Lease) Context() context.Context { return l.view }

// Done is closed when the lease is lost or released. Done itself looks at
// the clock first (as Err does): a channel asked for at or after the trust
// deadline is already closed. A goroutine that blocks on a channel taken
// earlier is woken by the loss timer, as soon as the process runs again
// after a pause.
func (l *Lease) Done() <-chan struct{} {
	l.checkDeadline()
	return l.ctx.Done()
}

// Err is nil while the lease is held, then the reason it ended: an error
// matching ErrLost or ErrReleased. It looks at the clock itself rather than
// waiting for the loss timer: at or after the local trust deadline it
// declares the lease lost and says so, also when the process was paused
// past the deadline and the timer's goroutine has not run yet.
func (l *Lease) Err() error {
	l.checkDeadline()
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// leaseContext is a context that ends with a lease: Lease.Context, and the
// context that Do and Elect give fn. Err and Done look at the lease's clock
// before they answer, so they never say "held" past the trust deadline,
// even when the loss timer's goroutine has not run yet (a process that was
// paused runs its own goroutines first as often as not).
type leaseContext struct {
	context.Context
	l *Lease
	// cancel ends the embedded context when it is not the lease's own (fn's
	// context, which also ends with the caller's); nil for Lease.Context.
	cancel context.CancelCauseFunc
}

func (c *leaseContext) Done() <-chan struct{} {
	c.look()
	return c.Context.Done()
}

func (c *leaseContext) Err() error {
	c.look()
	return c.Context.Err()
}

// look declares the lease lost if its trust deadline has passed, and ends a
// derived context at once (without waiting for context.AfterFunc).
func (c *leaseContext) look() {
	if c.cancel == nil {
		c.l.checkDeadline()
		return
	}
	if err := c.l.Err(); err != nil {
		c.cancel(err)
	}
}

// TrustDeadline is the local monotonic time until which this process may
// trust that it holds the lease, if no renewal succeeds before then. Zero for
// session leases.
func (l *Lease) TrustDeadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// ExpiresAt is the lease's expiry by the server's clock, as last reported by
// the server (zero for session leases).
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// lose ends the lease with a cause matching ErrLost (unless it already
// ended), and reports it with reason.
func (l *Lease) lose(reason LossReason, why string, err error) {
	if l.ctx.Err() != nil {
		return
	}
	cause := fmt.Errorf("%w: %s: %s", ErrLost, l.resource, why)
	if err != nil {
		cause = fmt.Errorf("%w: %s: %s: %w", ErrLost, l.resource, why, err)
	}
	l.cancel(cause)
	if context.Cause(l.ctx) == cause { // not ended another way meanwhile
		l.c.log.Warn("pgfence: lease lost", "resource", l.resource, "token", l.token, "reason", cause.Error())
		l.ended(context.Background(), reason)
	}
}

// trustDeadlineIsPast reports whether the current trust deadline (which a
// concurrent renewal may have moved) has passed. Session leases have none.
func (l *Lease) trustDeadlineIsPast() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.deadline.IsZero() && !time.Now().Before(l.deadline)
}

// checkDeadline declares the lease lost when its trust deadline has passed.
// Every reader of the lease's state calls it, so that being held is a
// matter of the clock, not of when the loss timer's goroutine gets to run.
func (l *Lease) checkDeadline() {
	if l.session == nil && l.ctx.Err() == nil && l.trustDeadlineIsPast() {
		l.trustDeadlinePassed()
	}
}

// trustDeadlinePassed loses the lease, unless a renewal moved the deadline
// since the caller (the loss timer, a look) found it past.
func (l *Lease) trustDeadlinePassed() {
	if !l.trustDeadlineIsPast() {
		return
	}
	l.lose(LossDeadlinePassed, "no renewal succeeded before the local trust deadline (acquire or last renew sent + TTL - SafetyMargin)", nil)
}

// keepalive renews a TTL lease every RenewInterval, counted from the last
// renewal sent, or checks the connection of a session lease, until the lease
// ends or Release stops it (either ends renewCtx).
func (l *Lease) keepalive(lastSent time.Time) {
	defer close(l.keepaliveDone)
	timer := time.NewTimer(time.Until(lastSent.Add(l.t.renew)))
	defer timer.Stop()
	for {
		select {
		case <-l.renewCtx.Done():
			return
		case <-timer.C:
		}
		if l.session != nil {
			// Checked every RenewInterval/2, each check bounded by as much:
			// a session that ended (or went silent) is noticed within
			// RenewInterval.
			l.checkSession()
			timer.Reset(l.t.renew / 2)
			continue
		}
		sent, err := l.renewUntilDeadline()
		if err != nil {
			return // lost
		}
		timer.Reset(time.Until(sent.Add(l.t.renew)))
	}
}

// renewUntilDeadline renews, retrying transient errors until the trust
// deadline; it returns the time the successful renewal was sent, or an error
// once the lease is lost or Release stopped the keepalive.
func (l *Lease) renewUntilDeadline() (time.Time, error) {
	for {
		deadline, start := l.TrustDeadline(), time.Now()
		sent, err := l.renewOnce(l.renewCtx)
		if err == nil {
			l.renewed(RenewOK, deadline, start, nil)
			return sent, nil
		}
		if l.renewCtx.Err() != nil { // lost, or Release stopped us
			if errors.Is(l.Err(), ErrLost) {
				l.renewed(RenewLost, deadline, start, err)
			}
			return time.Time{}, l.renewCtx.Err()
		}
		if !transient(err) {
			l.lose(LossRenewFailed, "renewal failed", err)
			l.renewed(RenewLost, deadline, start, err)
			return time.Time{}, l.Err()
		}
		l.renewed(RenewRetry, deadline, start, err)
		l.c.log.Info("pgfence: renewal failed, retrying", "resource", l.resource, "error", err.Error())
		select {
		case <-l.renewCtx.Done():
			if errors.Is(l.Err(), ErrLost) { // the deadline passed between attempts
				l.renewed(RenewLost, deadline, time.Time{}, l.Err())
			}
			return time.Time{}, l.renewCtx.Err()
		case <-time.After(l.t.retry):
		}
	}
}

// renewed reports a renewal attempt sent at start (zero: none was in
// flight) under the trust deadline then in force.
func (l *Lease) renewed(result RenewResult, deadline, start time.Time, err error) {
	now := time.Now()
	e := &RenewEvent{
		Resource: l.resource, Holder: l.t.holder, Token: l.token, Result: result,
		Start: start, Headroom: deadline.Sub(now), Err: err,
	}
	if !start.IsZero() {
		e.Latency = now.Sub(start)
	}
	l.c.observe(context.Background(), e)
}

// renewOnce renews the lease, never waiting past the trust deadline, and
// moves the deadline when it succeeds. A NULL answer (the server no longer
// has this lease live) loses the lease at once. A call that runs into the
// deadline loses the lease, unless another renewal (the keepalive beside a
// caller's Renew) moved the deadline meanwhile: then the lease is alive and
// the renewal is sent again, bounded by the new deadline.
func (l *Lease) renewOnce(ctx context.Context) (time.Time, error) {
	for {
		l.mu.Lock()
		deadline := l.deadline
		l.mu.Unlock()
		if err := l.Err(); err != nil {
			return time.Now(), err
		}
		sent, retry, err := l.renewBefore(ctx, deadline)
		if !retry {
			return sent, err
		}
	}
}

// renewBefore sends one renewal bounded by deadline; retry is true when the
// call ran into deadline and a later deadline has been set since.
func (l *Lease) renewBefore(ctx context.Context, deadline time.Time) (sent time.Time, retry bool, err error) {
	// One attempt, bounded (attempt.go): a renewal on a connection that went
	// silent is cut off while there is time left to send another.
	rctx, cancel := attempt(ctx, l.t.attemptBound(time.Until(deadline)))
	defer cancel()
	sent = time.Now()
	exp, ok, err := sqlfuncs.Renew(rctx, l.c.pool, l.resource, l.token, l.t.ttl)
	if err != nil {
		if ctx.Err() != nil || rctx.Err() == nil {
			return sent, false, err // the caller's ctx, or a failure of its own
		}
		if !l.trustDeadlineIsPast() {
			if l.TrustDeadline().After(deadline) {
				return sent, true, err // another renewal moved the deadline meanwhile
			}
			return sent, false, cutOff(ctx, rctx, err) // retried after RetryInterval
		}
		// The trust deadline passed while the renewal was in flight: the
		// lease is lost, whichever of this call and the loss timer notices
		// first.
		l.trustDeadlinePassed()
		return sent, false, l.Err()
	}
	if !ok {
		l.lose(LossSuperseded, "the server no longer has this lease live (it expired, was released, revoked or superseded)", nil)
		return sent, false, l.Err()
	}
	l.mu.Lock()
	if l.ctx.Err() != nil {
		l.mu.Unlock()
		return sent, false, context.Cause(l.ctx) // lost while we waited: loss is final
	}
	if !time.Now().Before(l.deadline) {
		l.mu.Unlock()
		// The reply came after the deadline: from the deadline on, any look
		// at the lease says lost, so it is lost, even though the server did
		// renew it. (A passed deadline never moves again: a renewal moves it
		// only before it passes.)
		l.lose(LossDeadlinePassed, "the renewal's reply came after the local trust deadline", nil)
		return sent, false, context.Cause(l.ctx)
	}
	l.expiresAt = exp
	if d := sent.Add(l.t.ttl - l.t.margin); d.After(l.deadline) {
		l.deadline = d
		l.lossTimer.Reset(time.Until(d))
	}
	l.mu.Unlock()
	return sent, false, nil
}

// checkSession pings the dedicated connection of a session lease; a broken
// connection means the server has ended (or will end) the lease, and one
// that does not answer within sessionCheckBound (RenewInterval/2, at least
// 250ms) cannot prove that it still holds it: the lease is lost either way
// (fail closed).
func (l *Lease) checkSession() {
	ctx, cancel := attempt(l.ctx, l.t.sessionCheckBound())
	defer cancel()
	if err := l.session.Ping(ctx); err != nil && l.ctx.Err() == nil {
		l.lose(LossSessionEnded, "the session holding the lease failed", err)
		closeConn(l.session)
	}
}

// Renew renews the lease now, in addition to the background renewals. It
// returns an error matching ErrLost once the lease is lost, and ErrReleased
// after Release. It never waits past the trust deadline: a renewal held up
// until then loses the lease, unless another renewal moved the deadline
// meanwhile, in which case it is sent again under the new one. Each
// attempt is bounded (a third of the time left, at least four
// RetryIntervals): one cut off is sent again on another connection after
// RetryInterval.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Err(); err != nil {
		return err
	}
	if l.session != nil {
		return nil // a session lease has nothing to renew
	}
	var err error
	for {
		deadline, start := l.TrustDeadline(), time.Now()
		_, err = l.renewOnce(ctx)
		switch {
		case err == nil:
			l.renewed(RenewOK, deadline, start, nil)
		case errors.Is(l.Err(), ErrLost):
			l.renewed(RenewLost, deadline, start, err)
		case ctx.Err() == nil && l.Err() == nil: // not the caller's giving up, nor a Release
			l.renewed(RenewRetry, deadline, start, err)
		}
		var cut errNoAnswer
		if err == nil || !errors.As(err, &cut) || ctx.Err() != nil || l.Err() != nil {
			break
		}
		// Cut off by its bound (a silent connection): sent again, on
		// another connection, until the trust deadline.
		select {
		case <-ctx.Done():
		case <-l.ctx.Done():
		case <-time.After(l.t.retry):
		}
	}
	if err != nil && l.Err() != nil {
		return l.Err()
	}
	if err != nil {
		return fmt.Errorf("pgfence: renewing %s: %w", l.resource, err)
	}
	return nil
}

// Release ends the lease and stops its keepalive. It returns nil only
// when the server ended the lease, or when the lease was already gone
// there (expired, superseded, revoked, or its session ended); a Release
// that could not reach the server says so every time it is called, until
// one reaches it, so that `for lease.Release(ctx) != nil {}` ends with the
// lease released. From the first call on the lease is no longer held here
// (Err says ErrReleased) whatever the server answers. A call after the
// lease was lost returns nil: it tells the server once, best effort, and
// does not wait for an unreachable one. Transient errors are retried until
// ctx is done, each attempt bounded as a renewal is (it gives up a silent
// connection and tries another one), and a retry after a lost reply never
// touches a newer lease (fence.release only ends the lease that carries
// this token). When the release cannot reach the server, a TTL lease still
// ends there at its expiry.
//
// A session lease is released on its own session. When that session does
// not answer, Release asks the server over the pool whether the lease is
// still live: nil when it is not, else an error that names the lease and
// says that it lives on the server until that session ends.
//
// A Release that finds another Release of the lease still trying waits for
// it only as long as ctx allows, and then returns an error that says so.
func (l *Lease) Release(ctx context.Context) error {
	return l.release(ctx, LossReleased)
}

// release is Release; reason is what the end of the lease is reported as
// (released, or client_closed for Close).
func (l *Lease) release(ctx context.Context, reason LossReason) (err error) {
	start := time.Now()
	select {
	case l.releasing <- struct{}{}:
	default: // another Release is running: wait for it, bounded by ctx
		select {
		case l.releasing <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("pgfence: releasing %s: another Release of it is still trying (it ends on its own at expiry): %w", l.resource, context.Cause(ctx))
		}
	}
	defer func() { <-l.releasing }()
	if l.released {
		return nil
	}
	// Lost (not ended by an earlier Release of ours, which failed and is
	// being retried now).
	lostBefore := errors.Is(l.Err(), ErrLost)
	defer func() {
		l.c.observe(ctx, &ReleaseEvent{
			Resource: l.resource, Holder: l.t.holder, Token: l.token, Kind: l.kind(),
			Lost: errors.Is(context.Cause(l.ctx), ErrLost), Start: start, Duration: time.Since(start), Err: err,
		})
	}()
	l.mu.Lock()
	if l.lossTimer != nil {
		l.lossTimer.Stop()
	}
	l.mu.Unlock()
	l.renewCancel()
	select { // a renewal in flight ends at once now
	case <-l.keepaliveDone:
	case <-ctx.Done():
	}
	if cause := fmt.Errorf("%w: %s", ErrReleased, l.resource); l.ctx.Err() == nil {
		if reason == LossClientClosed {
			l.closedByClient.Store(true)
		}
		l.cancel(cause)
		if context.Cause(l.ctx) == cause { // not lost meanwhile
			l.ended(ctx, reason)
		}
	}
	if lostBefore {
		// Lost already: the server may be unreachable (that may be why).
		// One attempt, bounded, and no error: the lease is over either way.
		bctx, cancel := context.WithTimeout(ctx, min(l.t.retry, time.Second))
		defer cancel()
		var db sqlfuncs.DB = l.c.pool
		if l.session != nil {
			db = l.session
			defer closeConn(l.session)
		}
		_, _ = sqlfuncs.Release(bctx, db, l.resource, l.token)
		l.released = true
		return nil
	}

	var db sqlfuncs.DB = l.c.pool
	if l.session != nil {
		db = l.session
	}
	bound := l.t.callBound()
	for {
		var err error
		if l.session == nil || !l.session.IsClosed() {
			actx, cancel := attempt(ctx, bound)
			_, err = sqlfuncs.Release(actx, db, l.resource, l.token)
			err = cutOff(ctx, actx, err)
			cancel()
			if err == nil {
				// Released; a false answer means the lease had already
				// ended: done either way.
				l.released = true
				if l.session != nil {
					closeConn(l.session)
				}
				return nil
			}
		}
		if l.session != nil && l.session.IsClosed() {
			// The session broke, or did not answer and was dropped here:
			// only the server can say whether it still holds the lease.
			return l.confirmSessionEnded(ctx, bound, err)
		}
		if !transient(err) || ctx.Err() != nil {
			return fmt.Errorf("pgfence: releasing %s (it ends on its own at expiry): %w", l.resource, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgfence: releasing %s (it ends on its own at expiry): %w", l.resource, errors.Join(err, ctx.Err()))
		case <-time.After(l.t.retry):
		}
	}
}

// stopAtClose ends a lease that Client.Close does not release: its
// keepalive stops (Close waits for it as long as ctx allows), and the lease
// is lost here with reason client_closed. A TTL lease stays live on the
// server until its expiry (so a program can hand its token to another
// process); a session lease's session is closed, which ends it there.
func (l *Lease) stopAtClose(ctx context.Context) {
	l.mu.Lock()
	if l.lossTimer != nil {
		l.lossTimer.Stop()
	}
	l.mu.Unlock()
	l.renewCancel()
	select {
	case <-l.keepaliveDone:
	case <-ctx.Done():
	}
	if l.ctx.Err() == nil {
		l.closedByClient.Store(true)
	}
	if l.session == nil {
		l.lose(LossClientClosed, "the client was closed: the lease is no longer renewed, and stays live on the server until its expiry (release it before Close, or set Config.ReleaseOnClose, to end it there)", nil)
		return
	}
	l.lose(LossClientClosed, "the client was closed: the session holding the lease is closed, which ends it on the server", nil)
	select {
	case <-l.keepaliveDone:
	default:
		return // its check still runs (ctx ended first): it closes the session when it fails
	}
	select { // a Release of the caller may be using the session
	case l.releasing <- struct{}{}:
		if !l.released {
			closeConn(l.session)
			l.released = true
		}
		<-l.releasing
	case <-ctx.Done():
	}
}

// confirmSessionEnded asks the server, over the pool, whether the session
// lease l is still live, after its own session broke or went silent
// (sessionErr, when a release on it failed): nil when it is not (the
// server ended the session, and with it the lease), else an error that
// names the lease. The caller holds l.releasing.
func (l *Lease) confirmSessionEnded(ctx context.Context, bound time.Duration, sessionErr error) error {
	actx, cancel := attempt(ctx, bound)
	defer cancel()
	row, ok, err := sqlfuncs.GetLease(actx, l.c.pool, l.resource)
	if err = cutOff(ctx, actx, err); err != nil {
		return fmt.Errorf("pgfence: releasing %s (session lease, token %d): its session is gone here, and asking the server whether the lease ended failed: %w",
			l.resource, l.token, errors.Join(sessionErr, err))
	}
	if !ok || row.Token != l.token || !row.Live {
		l.released = true
		return nil
	}
	return fmt.Errorf("pgfence: releasing %s (session lease, token %d): its session (backend pid %d) did not answer, and the server still has the lease live: it ends when the server ends that session (pg_terminate_backend, or TCP keepalive): %w",
		l.resource, l.token, row.SessionPID, cmpErr(sessionErr))
}

// cmpErr is err, or a placeholder when there is none, so that no message
// ends in an empty segment.
func cmpErr(err error) error {
	if err == nil {
		return errors.New("the session's connection was closed")
	}
	return err
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}
