package gofence

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Do takes a lease on resource as opts says (nil: a TTL lease under the
// Client's Config, tried once; set opts.Wait to wait for it), runs fn with
// a context that is cancelled when the lease is lost or ctx is done, and
// releases the lease when fn returns. The context's Err and Done look at
// the lease's trust deadline themselves (as Lease.Err does), so they say
// "lost" from the deadline on, even before the loss timer has run. Inside
// fn, write through lease.Tx so that the database refuses the writes if
// the lease was lost.
//
// Do returns fn's error, or Acquire's (ErrHeld, ErrBusy, ...) when fn did
// not run. When the lease was lost while fn ran, the error also matches
// ErrLost. A grant that came back after its trust deadline is given back,
// and Do returns an error matching ErrLost without running fn.
func (c *Client) Do(ctx context.Context, resource string, opts *LeaseOptions, fn func(ctx context.Context, lease *Lease) error) error {
	l, err := c.Acquire(ctx, resource, opts)
	if err != nil {
		return err
	}
	_, err = l.run(ctx, fn)
	// A refusal that fn's Tx or UseToken reported is marked: this reports
	// only those fn met some other way.
	return leaseSet{l}.refused(ctx, opDo, err)
}

// run runs fn under the lease and releases it afterwards. It returns the
// loss that happened while fn ran (nil if none) and fn's error, joined to
// that loss.
func (l *Lease) run(ctx context.Context, fn func(context.Context, *Lease) error) (lost, err error) {
	fctx, stop := l.merge(ctx)
	released := false
	release := func() {
		stop()
		// Before Release turns it into ErrReleased; a lease that Close
		// released (ReleaseOnClose) is a step-down, not a loss.
		if err := l.Err(); errors.Is(err, ErrLost) {
			lost = err
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.t.ttl)
		defer cancel()
		if rerr := l.Release(rctx); rerr != nil {
			l.c.log.Warn("pgfence: release failed", "resource", l.resource, "error", rerr.Error())
		}
		released = true
	}
	defer func() {
		if !released { // fn panicked: release, then let the panic go on
			release()
		}
	}()
	if l.Err() != nil { // the trust deadline passed before fn could start
		release()
		return lost, lost
	}
	ferr := fn(fctx, l)
	release()
	if ferr != nil && lost != nil && !errors.Is(ferr, lost) {
		return lost, fmt.Errorf("%w (%w)", ferr, lost)
	}
	return lost, ferr
}

// Elect campaigns for leadership of name and runs fn while this process
// leads, with a context cancelled when leadership is lost (its Err and Done
// look at the lease's trust deadline themselves, as in Do). opts are those
// of Acquire (nil: the Client's Config); Elect always waits for the lease,
// whatever opts.Wait says, since campaigning is waiting. When fn returns
// after a loss, Elect campaigns again; when ctx is done it steps down,
// releasing the lease so the next leader is elected at once (not after a
// TTL), and returns ctx's error; a grant still on its way then is given
// back when it comes. When fn returns on its own (nil or an error), Elect
// steps down and returns fn's result. A campaign that fails (a grant that
// came back after its trust deadline, which is given back without running
// fn, or an error of the database) is tried again after PollInterval. When
// Client.Close ends the term (it releases the lease with ReleaseOnClose, or
// else stops renewing it), Elect steps down (the LeadershipEvent's Err is
// nil) and returns ErrClosed, joined with fn's error if any. The
// lease's token is the leader's term: terms strictly increase.
func (c *Client) Elect(ctx context.Context, name string, opts *LeaseOptions, fn func(ctx context.Context, lease *Lease) error) error {
	var o LeaseOptions
	if opts != nil {
		o = *opts
	}
	o.Wait = true
	if _, _, err := c.leaseTimings(&o); err != nil {
		return err // bad options: campaigning again would not help
	}
	campaign := time.Now()
	for {
		l, err := c.Acquire(ctx, name, &o)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if errors.Is(err, ErrClosed) {
				return err
			}
			c.log.Warn("pgfence: campaign failed, trying again", "name", name, "error", err.Error())
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(jitter(c.cfg.PollInterval)):
			}
			continue
		}
		c.log.Info("pgfence: elected", "name", name, "term", l.Token(), "holder", l.Holder())
		term := time.Now()
		c.observe(ctx, &LeadershipEvent{Name: name, Holder: l.Holder(), Term: l.Token(), Leading: true, Since: campaign, Duration: term.Sub(campaign)})
		lost, err := l.run(ctx, fn)
		// Close ended the term (released the lease with ReleaseOnClose, or
		// stopped renewing it): a step-down, not a loss, and a closed client
		// campaigns no more.
		closed := l.closedByClient.Load()
		ended := lost
		if closed {
			ended = nil
		}
		c.observe(ctx, &LeadershipEvent{Name: name, Holder: l.Holder(), Term: l.Token(), Since: term, Duration: time.Since(term), Err: ended})
		campaign = time.Now()
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case closed:
			if err != nil {
				return fmt.Errorf("%w (%w)", ErrClosed, err)
			}
			return ErrClosed
		case lost != nil:
			c.log.Warn("pgfence: leadership lost, campaigning again", "name", name, "term", l.Token())
			continue
		default:
			return err
		}
	}
}
