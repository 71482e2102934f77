package gofence

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// wait calls try until it grants a lease, fails with an error that is
// neither "held", "busy" nor transient, or ctx is done (LeaseOptions.Wait).
// It is woken by the NOTIFY that fence.release and fence.revoke send (one
// dedicated LISTEN connection per Client), and asks again every
// PollInterval (jittered) or when the held lease expires by the server's
// clock, whichever comes first, so lost notifications and poolers that
// block LISTEN cost latency, never progress.
func (c *Client) wait(ctx context.Context, resource string, try func() (*Lease, error)) (*Lease, error) {
	var wake <-chan struct{}
	if !c.cfg.DisableNotify {
		ch, unsubscribe := c.notifier().subscribe(resource)
		defer unsubscribe()
		wake = ch
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		l, err := try()
		if err == nil {
			return l, nil
		}
		var held *HeldError
		busy := errors.Is(err, ErrBusy)
		if !errors.As(err, &held) && !busy && !transient(err) {
			return nil, err
		}
		wait := jitter(c.cfg.PollInterval)
		switch {
		case busy:
			// Nothing live: it ended between the try and the look (or the
			// grant gave up waiting, which took fence.grant_wait already).
			wait = jitter(10 * time.Millisecond)
		case held != nil && !held.ExpiresAt.IsZero():
			if left := held.ExpiresAt.Sub(held.ServerNow) + time.Millisecond; left < wait {
				wait = max(left, time.Millisecond)
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-wake:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
	}
}

// jitter spreads d by ±25% so that waiters do not ask in lockstep.
func jitter(d time.Duration) time.Duration {
	return d*3/4 + time.Duration(rand.Int64N(int64(d)/2+1))
}

func (c *Client) notifier() *notifier {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notify == nil {
		// After Close, a notifier is born closed: waiters then poll.
		c.notify = &notifier{c: c, subs: map[string]map[chan struct{}]struct{}{}, closed: c.closed}
	}
	return c.notify
}

// notifier keeps one LISTEN connection per Client and wakes the waiters of
// a resource when its release is announced. It starts with the first waiter,
// reconnects with backoff, and wakes every waiter after a reconnect
// (notifications sent while it was away are lost).
type notifier struct {
	c *Client

	mu      sync.Mutex
	subs    map[string]map[chan struct{}]struct{}
	running bool
	closed  bool
	pooled  bool // the pool goes through a connection pooler: no LISTEN, waiters poll
	stop    context.CancelFunc
	done    chan struct{}
}

func (n *notifier) subscribe(resource string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.subs[resource] == nil {
		n.subs[resource] = map[chan struct{}]struct{}{}
	}
	n.subs[resource][ch] = struct{}{}
	if !n.running && !n.closed && !n.pooled {
		ctx, stop := context.WithCancel(context.Background())
		n.running, n.stop, n.done = true, stop, make(chan struct{})
		go n.run(ctx)
	}
	return ch, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.subs[resource], ch)
		if len(n.subs[resource]) == 0 {
			delete(n.subs, resource)
		}
	}
}

func (n *notifier) wake(resource string, all bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for res, chans := range n.subs {
		if !all && res != resource {
			continue
		}
		for ch := range chans {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

func (n *notifier) run(ctx context.Context) {
	defer close(n.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := n.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errBehindPooler) {
			n.c.log.Info("pgfence: the pool goes through a connection pooler: no LISTEN (behind a transaction-mode pooler it would stay on a pooled server connection, and its notifications reach other clients); waiters poll every PollInterval",
				"detail", err.Error())
			n.mu.Lock()
			n.pooled, n.running = true, false
			n.mu.Unlock()
			return
		}
		n.c.log.Info("pgfence: notification listener stopped; waiters fall back to polling until it reconnects",
			"error", errString(err), "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// listen holds one LISTEN session until it fails or ctx is done.
func (n *notifier) listen(ctx context.Context) error {
	pc, err := n.c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer closeConn(conn)
	// Behind a pooler (the backend that answers is not the one announced
	// at connect, as refusePooledSession tells) LISTEN is not used.
	pid, err := sqlfuncs.BackendPID(ctx, execMode{conn})
	if err != nil {
		return err
	}
	if pid != conn.PgConn().PID() {
		return fmt.Errorf("%w (backend %d, announced %d)", errBehindPooler, pid, conn.PgConn().PID())
	}
	if err := sqlfuncs.Listen(ctx, conn); err != nil {
		return err
	}
	n.wake("", true) // anything released while we were not listening
	for {
		msg, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		n.wake(msg.Payload, false)
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	n.closed = true
	stop, done, running := n.stop, n.done, n.running
	n.mu.Unlock()
	if running {
		stop()
		<-done
	}
}

// errBehindPooler: the notifier's connection goes through a connection
// pooler; the notifier then stops for good, and waiters poll.
var errBehindPooler = errors.New("the connection goes through a connection pooler")

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
