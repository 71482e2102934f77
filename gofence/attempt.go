package gofence

import (
	"context"
	"fmt"
	"time"
)

// defaultGrantWait is fence.grant_wait when it is not set: how long the
// server may hold a grant (or a revoke) while the previous holder's guarded
// transaction is still open. A grant's attempt allows for it.
const defaultGrantWait = 2 * time.Second

// attemptBound is how long one attempt (a grant, a renewal, a release, a
// waiter's try, a session lease's check) may wait for the server when left
// is the time until the point past which its answer is of no use (the
// trust deadline, for a renewal): a third of it, but at least four
// RetryIntervals, and never more than left. A healthy server answers well
// within that; a connection that does not answer by then is treated as
// dead, and the next attempt goes out on another one, while there is still
// time for it.
func (t leaseTimings) attemptBound(left time.Duration) time.Duration {
	return max(0, min(left, max(4*t.retry, left/3)))
}

// callBound is the bound of one attempt that races no trust deadline: a
// grant request (a reply that comes after the lease's trust deadline is
// still of use: it names the token to give back), the read of the holder
// after a grant answered NULL, a release. It is attemptBound of the
// lease's whole trust window (TTL - SafetyMargin), plus the default
// fence.grant_wait, for a grant that the server holds while a previous
// holder's guarded transaction ends.
func (t leaseTimings) callBound() time.Duration {
	return t.attemptBound(t.ttl-t.margin) + defaultGrantWait
}

// sessionCheckBound bounds the check of a session lease's connection: half
// of RenewInterval (the checks are that far apart, so that a session that
// ended is noticed within RenewInterval), but at least minSessionCheck, so
// that a short RenewInterval on a loaded machine does not end a healthy
// session lease.
func (t leaseTimings) sessionCheckBound() time.Duration {
	return max(t.renew/2, minSessionCheck)
}

// minSessionCheck is the shortest bound of a session lease's check.
const minSessionCheck = 250 * time.Millisecond

// attempt derives the context of one attempt from ctx: it ends when ctx
// does, or after bound. pgx closes a connection whose call was cut off by
// its context (its default context watcher sets a past deadline on the
// socket and the read fails), and the pool then destroys it, so the next
// attempt takes another connection instead of waiting again on one that
// is dead. The error of an attempt cut off says so (noAnswer).
func attempt(ctx context.Context, bound time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, bound, errNoAnswer{bound})
}

// errNoAnswer is the cause of an attempt that the server did not answer
// within its bound.
type errNoAnswer struct{ bound time.Duration }

func (e errNoAnswer) Error() string {
	return fmt.Sprintf("no answer within %s (the attempt's bound; its connection was dropped, the next attempt takes another)", e.bound.Round(time.Millisecond))
}

// Is makes an attempt cut off match context.DeadlineExceeded: transient.
func (e errNoAnswer) Is(target error) bool { return target == context.DeadlineExceeded }

// cutOff returns err, said to be the attempt's bound when actx ended by its
// bound and not by the caller's ctx.
func cutOff(ctx, actx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || actx.Err() == nil {
		return err
	}
	return fmt.Errorf("%w: %w", context.Cause(actx), err)
}
