package gofence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// abandonedGrantWait bounds how long a grant whose caller went away keeps
// waiting for its reply, to learn the token and give it back. A grant
// whose reply does not come by then is nobody's and ends at its TTL.
const abandonedGrantWait = 5 * time.Second

// grantReply is the answer to one grant request.
type grantReply struct {
	token  int64
	ok     bool      // false: the resource is held (the answer was NULL)
	sentAt time.Time // just before the request was sent
}

// grant sends one grant request (send, on a pool connection) and waits for
// its reply or for ctx. Once sent, the request runs to completion whatever
// becomes of ctx, under ctx's values but not its cancellation: a caller that
// goes away (ctx done) gets ctx's cause at once, and the reply, when it
// comes, is given back, so that the lease is not left held by nobody until
// its TTL runs out. Such an abandoned request waits at most
// abandonedGrantWait for its reply, and less when Close stops waiting. k
// ends (k.done) when the abandoned request is over; otherwise the caller
// owns k and the token of the reply. The request itself waits at most
// bound (leaseTimings.grantBound): a connection that does not answer by
// then is dropped (attempt), and the error says so, so that a waiter's
// next try goes out on another one; a grant that reached the server on the
// dropped connection is nobody's and ends at its TTL.
func (c *Client) grant(ctx context.Context, k call, resource string, bound time.Duration, send func(context.Context, sqlfuncs.DB) (int64, bool, error)) (grantReply, error) {
	// No connection, no request: waiting for one ends with ctx (or Close).
	// The pool may ping an idle connection first: bounded as the request is.
	cctx, cancel := k.bound(ctx)
	pctx, pcancel := attempt(cctx, bound)
	pc, err := c.pool.Acquire(pctx)
	err = cutOff(cctx, pctx, err)
	pcancel()
	cancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return grantReply{}, context.Cause(ctx)
	case k.stop.Err() != nil:
		return grantReply{}, fmt.Errorf("%w: Close stopped waiting for a connection", ErrClosed)
	default:
		return grantReply{}, err
	}
	type answer struct {
		r   grantReply
		err error
	}
	answers := make(chan answer) // unbuffered: whoever takes the answer owns it
	abandoned := make(chan struct{})
	detached := context.WithoutCancel(ctx)
	actx, acancel := attempt(detached, bound)
	gctx, gcancel := context.WithCancel(actx)
	stopOnClose := context.AfterFunc(k.stop, gcancel)
	go func() {
		defer stopOnClose()
		defer acancel()
		a := answer{r: grantReply{sentAt: time.Now()}}
		a.r.token, a.r.ok, a.err = send(gctx, pc)
		if a.err != nil && k.stop.Err() != nil {
			a.err = fmt.Errorf("%w: Close stopped waiting for the server's answer: %w", ErrClosed, a.err)
		} else {
			a.err = cutOff(detached, actx, a.err)
		}
		gcancel()
		pc.Release()
		select {
		case answers <- a:
			return
		case <-abandoned:
		}
		defer k.done()
		if a.err == nil && a.r.ok {
			if err := c.giveBack(ctx, k, resource, a.r.token); err != nil {
				c.log.Warn("pgfence: giving back a grant whose caller went away failed; it ends at its expiry",
					"resource", resource, "token", a.r.token, "error", err.Error())
			}
		}
	}()
	select {
	case a := <-answers:
		return a.r, a.err
	case <-ctx.Done():
		close(abandoned)
		time.AfterFunc(abandonedGrantWait, gcancel)
		return grantReply{}, context.Cause(ctx)
	}
}

// giveBackTimeout bounds a give-back (giveBack): it runs in the
// background, after its caller went away or was told no.
const giveBackTimeout = 5 * time.Second

// giveBack releases token, a grant that nobody will hold, bounded by
// giveBackTimeout and by Close.
func (c *Client) giveBack(ctx context.Context, k call, resource string, token int64) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	rctx, cancelOnClose := k.bound(rctx)
	defer cancelOnClose()
	_, err := sqlfuncs.Release(rctx, c.pool, resource, token)
	return err
}

// giveBackWaiting gives token back in a goroutine of its own, ends k when
// that is over, and waits for it as long as ctx allows; it returns the
// give-back's error, or, when ctx ends first, an error that says the
// give-back goes on.
func (c *Client) giveBackWaiting(ctx context.Context, k call, resource string, token int64) error {
	res := make(chan error, 1)
	go func() {
		defer k.done()
		err := c.giveBack(ctx, k, resource, token)
		if err != nil {
			c.log.Warn("pgfence: giving back a grant failed; it ends at its expiry", "resource", resource, "token", token, "error", err.Error())
		}
		res <- err
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errStillGivingBack, context.Cause(ctx))
	}
}

// errStillGivingBack: the caller's ctx ended before the give-back did.
var errStillGivingBack = errors.New("the caller went away, the give-back goes on in the background")

// lateGrant is the error of a grant whose reply came late (after the trust
// deadline), and was given back (unless giveBackErr says otherwise).
func lateGrant(resource string, token int64, late time.Duration, t leaseTimings, giveBackErr error) error {
	var what string
	switch {
	case giveBackErr == nil:
		what = "so it was given back"
	case errors.Is(giveBackErr, errStillGivingBack):
		what = fmt.Sprintf("so it is being given back (%v)", giveBackErr)
	default:
		what = fmt.Sprintf("and giving it back failed, so it ends at its expiry (%v)", giveBackErr)
	}
	return fmt.Errorf("%w: %s: granted with token %d, but the reply came %s after the local trust deadline (request sent + TTL %s - SafetyMargin %s), %s; "+
		"the round trip took longer than the TTL allows: find what delays it (network, pool, server), or use a longer TTL",
		ErrLost, resource, token, late.Round(time.Millisecond), t.ttl, t.margin, what)
}
