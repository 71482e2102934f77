package gofence

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

// DoOptions tunes Do. The zero value (or nil) waits for the lease.
type DoOptions struct {
	// NoWait makes Do try once (Acquire) instead of waiting (AcquireWait); a held
	// resource then gives an error matching ErrHeld.
	NoWait bool
	// Holder names the holder of this lease instead of Config.Holder
	// (WithHolder). Default: the Client's.
	Holder string
	// TTL is the TTL of this lease instead of Config.TTL (WithTTL).
	// Default: the Client's.
	TTL time.Duration
}

// optionsOf turns Holder and TTL fields into options.
func optionsOf(holder string, ttl time.Duration) []LeaseOption {
	var opts []LeaseOption
	if holder != "" {
		opts = append(opts, WithHolder(holder))
	}
	if ttl != 0 {
		opts = append(opts, WithTTL(ttl))
	}
	return opts
}

// Do takes a lease on resource (waiting for it unless opts.NoWait), runs fn
// with a context that is cancelled when the lease is lost or ctx is done,
// and releases the lease when fn returns. The context's Err and Done look
// at the lease's trust deadline themselves (as Lease.Err does), so they say
// "lost" from the deadline on, even before the loss timer has run. Inside
// fn, write through lease.Tx so that the database refuses the writes if the
// lease was lost.
//
// Do returns fn's error. When the lease was lost while fn ran, the error
// also matches ErrLost. A grant that came back after its trust deadline is
// given back, and Do returns an error matching ErrLost without running fn.
func (c *Client) Do(ctx context.Context, resource string, opts *DoOptions, fn func(ctx context.Context, lease *Lease) error) error {
	var (
		l   *Lease
		err error
	)
	var o DoOptions
	if opts != nil {
		o = *opts
	}
	if o.NoWait {
		l, err = c.Acquire(ctx, resource, optionsOf(o.Holder, o.TTL)...)
	} else {
		l, err = c.AcquireWait(ctx, resource, optionsOf(o.Holder, o.TTL)...)
	}
	if err != nil {
		return err
	}
	_, err = l.run(ctx, fn)
	return err
}

// run runs fn under the lease and releases it afterwards. It returns the
// loss that happened while fn ran (nil if none) and fn's error, joined to
// that loss.
func (l *Lease) run(ctx context.Context, fn func(context.Context, *Lease) error) (lost, err error) {
	fctx, stop := l.merge(ctx)
	released := false
	release := func() {
		stop()
		lost = l.Err() // before Release turns it into ErrReleased
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

// ElectOptions tunes Elect. The zero value (or nil) is fine.
type ElectOptions struct {
	// Backoff is the pause after an error before campaigning again.
	// Default: the client's PollInterval.
	Backoff time.Duration
	// Holder names this candidate in fence.leases instead of Config.Holder
	// (WithHolder). Default: the Client's.
	Holder string
	// TTL is the TTL of this candidate's leases instead of Config.TTL
	// (WithTTL). Default: the Client's.
	TTL time.Duration
}

// Elect campaigns for leadership of name and runs fn while this process
// leads, with a context cancelled when leadership is lost (its Err and Done
// look at the lease's trust deadline themselves, as in Do). When fn returns
// after a loss, Elect campaigns again; when ctx is done it steps down,
// releasing the lease so the next leader is elected at once (not after a
// TTL), and returns ctx's error; a grant still on its way then is given
// back when it comes. When fn returns on its own (nil or an error), Elect
// steps down and returns fn's result. A grant that came back after its
// trust deadline is given back without running fn, and Elect campaigns
// again. The lease's token is the leader's term: terms strictly increase.
func (c *Client) Elect(ctx context.Context, name string, opts *ElectOptions, fn func(ctx context.Context, lease *Lease) error) error {
	var o ElectOptions
	if opts != nil {
		o = *opts
	}
	backoff := cmp.Or(max(o.Backoff, 0), c.cfg.PollInterval)
	lockOpts := optionsOf(o.Holder, o.TTL)
	if _, err := c.leaseTimings(lockOpts); err != nil {
		return err // bad options: campaigning again would not help
	}
	for {
		l, err := c.AcquireWait(ctx, name, lockOpts...)
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
			case <-time.After(backoff):
			}
			continue
		}
		c.log.Info("pgfence: elected", "name", name, "term", l.Token(), "holder", l.Holder())
		lost, err := l.run(ctx, fn)
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case lost != nil:
			c.log.Warn("pgfence: leadership lost, campaigning again", "name", name, "term", l.Token())
			continue
		default:
			return err
		}
	}
}

// Leader tells who leads name now, for observers that do not campaign.
// Live is false (and Holder empty) when nobody leads.
func (c *Client) Leader(ctx context.Context, name string) (LeaseInfo, error) {
	info, ok, err := c.LeaseOf(ctx, name)
	if err != nil || !ok || !info.Live {
		return LeaseInfo{}, err
	}
	return info, nil
}
