package gofence_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []gofence.Event
}

func (r *recorder) Observe(_ context.Context, e gofence.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// all returns the events so far.
func (r *recorder) all() []gofence.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gofence.Event(nil), r.events...)
}

// eventsOf returns the events of r of type T, in order.
func eventsOf[T gofence.Event](r *recorder) []T {
	var out []T
	for _, e := range r.all() {
		if e, ok := e.(T); ok {
			out = append(out, e)
		}
	}
	return out
}

// observed is a client of b whose events r records. A failed test prints
// them, so that a failure seen once in a loaded run says what happened.
func (b *bundle) observed(t *testing.T, cfg gofence.Config) (*gofence.Client, *recorder) {
	t.Helper()
	r := &recorder{}
	cfg.Observer = r
	t.Cleanup(func() {
		if t.Failed() {
			for i, e := range r.all() {
				t.Logf("event %d: %s %+v", i, e.Type(), e)
			}
		}
	})
	return b.client(t, nil, cfg), r
}

// Acquires report their mode, outcome, wait and token; a granted lease
// ends with exactly one loss event, released by Release; a Release after
// a confirmed one reports nothing.
func TestObserverSeesAcquiresReleasesAndEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, r := b.observed(t, gofence.Config{Holder: "A", PollInterval: 20 * time.Millisecond})
	other := b.client(t, nil, gofence.Config{Holder: "B"})

	before := time.Now()
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	acq := eventsOf[*gofence.AcquireEvent](r)
	require.Len(t, acq, 1)
	a := acq[0]
	require.Equal(t, "acquire", a.Type())
	require.Equal(t, "job", a.Resource)
	require.Equal(t, "A", a.Holder)
	require.Equal(t, gofence.KindTTL, a.Kind)
	require.Equal(t, gofence.ModeTry, a.Mode)
	require.Equal(t, gofence.OutcomeGranted, a.Outcome)
	require.Equal(t, l.Token(), a.Token)
	require.NoError(t, a.Err)
	require.False(t, a.Start.Before(before))
	require.Positive(t, a.Wait)

	// Held: c itself tries again, under another holder name.
	_, err = c.Acquire(b.ctx, "job", &gofence.LeaseOptions{Holder: "A2"})
	require.ErrorIs(t, err, gofence.ErrHeld)
	acq = eventsOf[*gofence.AcquireEvent](r)
	require.Len(t, acq, 2)
	require.Equal(t, gofence.OutcomeHeld, acq[1].Outcome)
	require.Equal(t, "A2", acq[1].Holder)
	require.ErrorIs(t, acq[1].Err, gofence.ErrHeld)
	require.Zero(t, acq[1].Token)

	// Error: a wait that ends with its context.
	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	_, err = c.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	acq = eventsOf[*gofence.AcquireEvent](r)
	require.Len(t, acq, 3, "one event for the whole wait, not one per attempt")
	require.Equal(t, gofence.ModeWait, acq[2].Mode)
	require.Equal(t, gofence.OutcomeError, acq[2].Outcome)
	require.GreaterOrEqual(t, acq[2].Wait, 100*time.Millisecond)
	require.ErrorIs(t, acq[2].Err, context.DeadlineExceeded)

	require.NoError(t, l.Release(b.ctx))
	rel := eventsOf[*gofence.ReleaseEvent](r)
	require.Len(t, rel, 1)
	require.Equal(t, "job", rel[0].Resource)
	require.Equal(t, l.Token(), rel[0].Token)
	require.False(t, rel[0].Lost)
	require.NoError(t, rel[0].Err)
	require.Positive(t, rel[0].Duration)
	losses := eventsOf[*gofence.LossEvent](r)
	require.Len(t, losses, 1)
	require.Equal(t, gofence.LossReleased, losses[0].Reason)
	require.Equal(t, l.Token(), losses[0].Token)
	require.ErrorIs(t, losses[0].Err, gofence.ErrReleased)
	require.Positive(t, losses[0].Held)

	require.NoError(t, l.Release(b.ctx), "idempotent")
	require.Len(t, eventsOf[*gofence.ReleaseEvent](r), 1, "a second Release does nothing and says nothing")
	require.Len(t, eventsOf[*gofence.LossEvent](r), 1)

	// A session lease ends when its session does.
	s, err := c.Acquire(b.ctx, "session-job", &gofence.LeaseOptions{Session: true})
	require.NoError(t, err)
	acq = eventsOf[*gofence.AcquireEvent](r)
	require.Equal(t, gofence.KindSession, acq[len(acq)-1].Kind)
	require.Equal(t, gofence.OutcomeGranted, acq[len(acq)-1].Outcome)
	var pid int32
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT session_pid FROM fence.leases WHERE resource = 'session-job'`).Scan(&pid))
	_, err = b.db.Pool.Exec(b.ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	waitDone(t, r, s)
	losses = eventsOf[*gofence.LossEvent](r)
	require.Len(t, losses, 2)
	require.Equal(t, gofence.LossSessionEnded, losses[1].Reason)
	require.Equal(t, gofence.KindSession, losses[1].Kind)
	require.ErrorIs(t, losses[1].Err, gofence.ErrLost)
	require.NoError(t, s.Release(b.ctx))
	rel = eventsOf[*gofence.ReleaseEvent](r)
	require.True(t, rel[len(rel)-1].Lost, "a Release after the loss says the lease was lost")
	require.Len(t, eventsOf[*gofence.LossEvent](r), 2, "a lost lease ends once")

	// other's acquires are other's.
	l2, err := other.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	require.NoError(t, l2.Release(b.ctx))
	require.Len(t, eventsOf[*gofence.AcquireEvent](r), 4)
}

// A resource whose previous holder still has a guarded transaction open
// is reported busy, not held.
func TestObserverSeesBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := &recorder{}
	c := b.client(t, b.pool(t, b.db.URL+"&fence.grant_wait=100ms"), gofence.Config{Observer: r})
	tok, ok, err := sqlfuncs.Acquire(b.ctx, b.db.Pool, "job", "old", 200*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx)
	require.NoError(t, sqlfuncs.UseToken(b.ctx, tx, "job", tok))
	poll(t, "the old lease expired by the server's clock", func() bool { return !b.serverLive(t, "job") })

	_, err = c.Acquire(b.ctx, "job", nil)
	require.ErrorIs(t, err, gofence.ErrBusy)
	acq := eventsOf[*gofence.AcquireEvent](r)
	require.Len(t, acq, 1)
	require.Equal(t, gofence.OutcomeBusy, acq[0].Outcome)
	require.GreaterOrEqual(t, acq[0].Wait, 100*time.Millisecond, "the grant waited fence.grant_wait")
}

// waitDone waits (at most 30s) for l to end, and for r to have seen its
// LossEvent: Done closes first, the event follows on the goroutine that
// ended the lease.
func waitDone(t *testing.T, r *recorder, l *gofence.Lease) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the lease on %s never ended", l.Resource())
	}
	poll(t, "the loss event", func() bool {
		for _, e := range eventsOf[*gofence.LossEvent](r) {
			if e.Resource == l.Resource() && e.Token == l.Token() {
				return true
			}
		}
		return false
	})
}

// waitRenewLost waits (at most 30s) for r to have seen a lost renewal.
func waitRenewLost(t *testing.T, r *recorder) {
	t.Helper()
	poll(t, "the lost renewal", func() bool {
		return slices.ContainsFunc(eventsOf[*gofence.RenewEvent](r), func(e *gofence.RenewEvent) bool { return e.Result == gofence.RenewLost })
	})
}

// Renewals report their latency and headroom; a lease that the server no
// longer has live (revoked) is lost at its next renewal, reported as a
// lost renewal and a superseded loss.
func TestObserverSeesRenewalsAndASupersededLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A TTL long enough for a loaded machine: the loss must be the revoke's.
	c, r := b.observed(t, gofence.Config{TTL: 1500 * time.Millisecond})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	// The first renewal that got through: on a loaded machine an attempt
	// may be cut off by its bound first and retried (RenewRetry), which is
	// the documented behaviour, not this test's subject.
	poll(t, "a renewal", func() bool {
		return slices.ContainsFunc(eventsOf[*gofence.RenewEvent](r), func(e *gofence.RenewEvent) bool { return e.Result == gofence.RenewOK })
	})
	var ren *gofence.RenewEvent
	for _, e := range eventsOf[*gofence.RenewEvent](r) {
		if e.Result == gofence.RenewOK {
			ren = e
			break
		}
		require.Equal(t, gofence.RenewRetry, e.Result, "before the first successful renewal: %+v", e)
	}
	require.Equal(t, "renew", ren.Type())
	require.Equal(t, gofence.RenewOK, ren.Result)
	require.Equal(t, l.Token(), ren.Token)
	require.Positive(t, ren.Latency)
	require.NoError(t, ren.Err)
	// Sent at TTL/3 after the acquire, against a deadline at TTL - TTL/10:
	// at most 1500 - 150 - 500 ms left, less the renewal's latency.
	require.Positive(t, ren.Headroom)
	require.LessOrEqual(t, ren.Headroom, 850*time.Millisecond)

	require.NoError(t, l.Renew(b.ctx), "Lease.Renew reports too")
	_, err = c.Revoke(b.ctx, "job")
	require.NoError(t, err)
	waitDone(t, r, l)
	waitRenewLost(t, r)
	require.ErrorIs(t, l.Err(), gofence.ErrLost)
	var lost []*gofence.RenewEvent
	for _, e := range eventsOf[*gofence.RenewEvent](r) {
		if e.Result == gofence.RenewLost {
			lost = append(lost, e)
		}
	}
	require.Len(t, lost, 1)
	require.Positive(t, lost[0].Latency, "the renewal that heard it ran")
	losses := eventsOf[*gofence.LossEvent](r)
	require.Len(t, losses, 1)
	require.Equal(t, gofence.LossSuperseded, losses[0].Reason)
	require.ErrorIs(t, losses[0].Err, gofence.ErrLost)
	require.NoError(t, l.Release(b.ctx))
}

// A renewal that cannot reach the server is retried until the trust
// deadline, each attempt reported, and the lease is then lost: a lost
// renewal and a deadline_passed loss.
func TestObserverSeesRenewalRetriesThenTheLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	r := &recorder{}
	c := b.client(t, b.pool(t, proxy.URL(b.db.URL)), gofence.Config{
		TTL: 2 * time.Second, RenewInterval: 300 * time.Millisecond, SafetyMargin: 600 * time.Millisecond,
		RetryInterval: 50 * time.Millisecond, Observer: r,
	})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	poll(t, "a renewal", func() bool { return len(eventsOf[*gofence.RenewEvent](r)) > 0 })

	// Every connection closed and every new one refused: renewals fail at
	// once, with a transient error, until the deadline.
	proxy.Close()
	waitDone(t, r, l)
	waitRenewLost(t, r)
	require.ErrorIs(t, l.Err(), gofence.ErrLost)
	require.ErrorContains(t, l.Err(), "trust deadline")

	var results []gofence.RenewResult
	var retries int
	for _, e := range eventsOf[*gofence.RenewEvent](r) {
		results = append(results, e.Result)
		if e.Result == gofence.RenewRetry {
			retries++
			require.Error(t, e.Err)
			require.Less(t, e.Headroom, 2*time.Second)
		}
	}
	require.GreaterOrEqual(t, retries, 2, "renewals were retried: %v", results)
	require.Equal(t, gofence.RenewOK, results[0], "%v", results)
	require.Equal(t, gofence.RenewLost, results[len(results)-1], "the last renewal lost the lease: %v", results)
	for i, res := range results[1 : len(results)-1] {
		require.NotEqual(t, gofence.RenewLost, res, "%d: %v", i, results)
	}
	losses := eventsOf[*gofence.LossEvent](r)
	require.Len(t, losses, 1)
	require.Equal(t, gofence.LossDeadlinePassed, losses[0].Reason)
	rctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, l.Release(rctx))
}

// Tx, UseToken and Do report the writes the database refused, with their
// SQLSTATE, once each.
func TestObserverSeesRefusedWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, r := b.observed(t, gofence.Config{})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	defer l.Release(b.ctx)
	other, err := c.Acquire(b.ctx, "other", nil)
	require.NoError(t, err)
	defer other.Release(b.ctx)

	insert := func(ctx context.Context, l *gofence.Lease, token any) error {
		return l.Tx(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO work (who, token) VALUES ('w', $1)`, token)
			return err
		})
	}
	require.NoError(t, insert(b.ctx, l, l.Token()))
	require.Empty(t, eventsOf[*gofence.RefusalEvent](r), "an accepted write reports nothing")

	// FN003: a token above the latest grant; FN002: a write without the
	// token of the table's resource.
	require.ErrorIs(t, insert(b.ctx, l, l.Token()+1000), gofence.ErrUnknownToken)
	require.ErrorIs(t, insert(b.ctx, other, nil), gofence.ErrNoToken)
	// Do: fn writes on its own, outside Tx, with an unknown token; and
	// through Tx, reported once.
	err = c.Do(b.ctx, "do-job", nil, func(ctx context.Context, dl *gofence.Lease) error {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO work (who, token) VALUES ('w', $1)`, l.Token()+1000)
		return err
	})
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "Do returns fn's error as it is")
	require.Equal(t, "FN003", pgErr.Code)
	err = c.Do(b.ctx, "do-job", nil, func(ctx context.Context, dl *gofence.Lease) error {
		return insert(ctx, l, l.Token()+1000)
	})
	require.ErrorIs(t, err, gofence.ErrUnknownToken)

	// FN001: the lease revoked, then a write under its token; UseToken in
	// the caller's transaction.
	_, err = c.Revoke(b.ctx, "job")
	require.NoError(t, err)
	require.ErrorIs(t, insert(b.ctx, l, l.Token()), gofence.ErrStaleToken)
	tx, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	require.ErrorIs(t, l.UseToken(b.ctx, tx), gofence.ErrStaleToken)
	require.NoError(t, tx.Rollback(b.ctx))

	type seen struct{ code, op, resources string }
	var got []seen
	for _, e := range eventsOf[*gofence.RefusalEvent](r) {
		require.Equal(t, "refusal", e.Type())
		require.Error(t, e.Err)
		require.Len(t, e.Tokens, len(e.Resources))
		got = append(got, seen{e.SQLState, e.Op, strings.Join(e.Resources, ",")})
	}
	require.Equal(t, []seen{
		{"FN003", "tx", "job"},
		{"FN002", "tx", "other"},
		{"FN003", "do", "do-job"},
		{"FN003", "tx", "job"},
		{"FN001", "tx", "job"},
		{"FN001", "use_token", "job"},
	}, got)
}

// Elect reports each term: gained, then lost (the lease revoked) or
// stepped down (ctx done), with strictly increasing terms.
func TestObserverSeesLeadership(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, r := b.observed(t, gofence.Config{TTL: time.Second, PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	terms := make(chan int64, 2)
	done := make(chan error, 1)
	go func() {
		done <- c.Elect(ctx, "leader", nil, func(ctx context.Context, l *gofence.Lease) error {
			terms <- l.Token()
			<-ctx.Done()
			return nil
		})
	}()
	first := <-terms
	_, err := c.Revoke(b.ctx, "leader")
	require.NoError(t, err)
	second := <-terms
	require.Greater(t, second, first)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	ev := eventsOf[*gofence.LeadershipEvent](r)
	require.Len(t, ev, 4)
	for i, want := range []struct {
		leading bool
		term    int64
		lost    bool
	}{{true, first, false}, {false, first, true}, {true, second, false}, {false, second, false}} {
		e := ev[i]
		require.Equal(t, "leadership", e.Type())
		require.Equal(t, "leader", e.Name, i)
		require.Equal(t, c.Holder(), e.Holder, i)
		require.Equal(t, want.leading, e.Leading, i)
		require.Equal(t, want.term, e.Term, i)
		require.GreaterOrEqual(t, e.Duration, time.Duration(0), i)
		require.False(t, e.Since.IsZero(), i)
		if want.lost {
			require.ErrorIs(t, e.Err, gofence.ErrLost, i)
		} else {
			require.NoError(t, e.Err, i)
		}
	}
}

// Close with ReleaseOnClose ends the leases it releases with the reason
// client_closed.
func TestObserverSeesCloseReleasing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, r := b.observed(t, gofence.Config{ReleaseOnClose: true})
	_, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, c.Close(ctx))
	losses := eventsOf[*gofence.LossEvent](r)
	require.Len(t, losses, 1)
	require.Equal(t, gofence.LossClientClosed, losses[0].Reason)
	require.ErrorIs(t, losses[0].Err, gofence.ErrReleased)
}

// logged is a slog handler that keeps the messages of its records.
type logged struct {
	mu   sync.Mutex
	msgs []string
}

func (h *logged) Enabled(context.Context, slog.Level) bool { return true }
func (h *logged) Handle(_ context.Context, rec slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (h *logged) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logged) WithGroup(string) slog.Handler      { return h }

func (h *logged) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// An observer that panics on every event breaks nothing: leases are
// granted, renewed, written under and released, the panics are logged, and
// an observer combined with it by Observers still sees every event.
func TestObserverThatPanics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := &logged{}
	r := &recorder{}
	panics := gofence.ObserverFunc(func(context.Context, gofence.Event) { panic("observer bug") })
	// Not b.client, which sets a logger of its own: this test reads it.
	c, err := gofence.New(b.db.Pool, &gofence.Config{TTL: time.Second, Observer: gofence.Observers(panics, r), Logger: slog.New(h)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })

	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	poll(t, "a renewal", func() bool { return len(eventsOf[*gofence.RenewEvent](r)) > 0 })
	require.NoError(t, l.Err(), "the keepalive survived the panics")
	require.NoError(t, write(b.ctx, l, b.db.Pool, "still here"))
	require.NoError(t, l.Release(b.ctx))
	require.NoError(t, c.Do(b.ctx, "job", nil, func(context.Context, *gofence.Lease) error { return nil }))

	require.Len(t, eventsOf[*gofence.AcquireEvent](r), 2)
	require.Len(t, eventsOf[*gofence.LossEvent](r), 2)
	require.Equal(t, len(r.all()), h.count("Config.Observer panicked"), "every panic logged, once")
}

// Observers leaves out nil, flattens, and passes each event to every
// observer even when one panics, then lets the first panic go on.
func TestObservers(t *testing.T) {
	t.Parallel()
	require.Nil(t, gofence.Observers())
	require.Nil(t, gofence.Observers(nil, nil))
	r := &recorder{}
	require.Same(t, r, gofence.Observers(nil, r))

	var calls []string
	named := func(name string, fail bool) gofence.Observer {
		return gofence.ObserverFunc(func(context.Context, gofence.Event) {
			calls = append(calls, name)
			if fail {
				panic(errors.New(name))
			}
		})
	}
	o := gofence.Observers(named("a", false), gofence.Observers(named("b", true), named("c", true)), nil, named("d", false))
	func() {
		defer func() {
			p := recover()
			require.NotNil(t, p)
			require.EqualError(t, p.(error), "b", "the first panic goes on")
		}()
		o.Observe(context.Background(), &gofence.LossEvent{})
	}()
	require.Equal(t, []string{"a", "b", "c", "d"}, calls)
}
