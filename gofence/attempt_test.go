package gofence_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// A renewal whose pool connection went silent (a NAT timeout, a dropped
// route: the connection stays open, nothing answers, new connections work)
// is cut off by its attempt's bound and sent again on another connection
// before the trust deadline: the lease lives. (It used to sit on the
// silent connection until the trust deadline, and the lease was lost.)
func TestRenewalLeavesASilentConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	r := &recorder{}
	// Renewal at 2s; trust deadline 5.4s after the send; RetryInterval 250ms:
	// the first attempt is cut off at about 3.1s, the next goes at 3.4s.
	c := b.client(t, b.pool(t, proxy.URL(b.db.URL)), gofence.Config{TTL: 6 * time.Second, RetryInterval: 250 * time.Millisecond, Observer: r})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	proxy.FreezeOpen()
	defer proxy.Thaw()
	poll(t, "a renewal that succeeded", func() bool {
		return slices.ContainsFunc(eventsOf[*gofence.RenewEvent](r), func(e *gofence.RenewEvent) bool { return e.Result == gofence.RenewOK })
	})
	require.NoError(t, l.Err())
	var retried bool
	for _, e := range eventsOf[*gofence.RenewEvent](r) {
		if e.Result == gofence.RenewRetry {
			retried = true
			require.ErrorContains(t, e.Err, "no answer within")
			require.ErrorIs(t, e.Err, context.DeadlineExceeded)
		}
	}
	require.True(t, retried, "the first attempt sat on the silent connection and was cut off")
	row, ok, err := sqlfuncs.GetLease(b.ctx, b.db.Pool, "job")
	require.NoError(t, err)
	require.True(t, ok && row.Live && row.Token == l.Token())
	require.NoError(t, l.Release(b.ctx))
}

// A waiter whose pool connections went silent gives up its try after the
// grant's bound and asks again on a new connection: it is granted the lease
// soon after the holder released it. (Its try used to sit on the silent
// connection until its context ended.)
func TestWaiterLeavesASilentConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	holder := b.client(t, nil, gofence.Config{Holder: "B"})
	// TTL 3s: a grant's bound is 2.7s (TTL - SafetyMargin).
	waiter := b.client(t, b.pool(t, proxy.URL(b.db.URL)), gofence.Config{Holder: "A", TTL: 3 * time.Second, PollInterval: 100 * time.Millisecond, DisableNotify: true})
	held, err := holder.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
		if err == nil {
			defer l.Release(context.Background())
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // the waiter asks every 100ms
	proxy.FreezeOpen()
	defer proxy.Thaw()
	frozen := time.Now()
	require.NoError(t, held.Release(b.ctx))
	require.NoError(t, <-got)
	require.Less(t, time.Since(frozen), 6*time.Second, "granted after the grant's bound (2.7s) and a poll, not at the end of ctx (15s)")
}

// A Release that cannot reach the server says so every time it is called,
// until one reaches it; the lease then ends on the server. (The second
// call used to return nil with the lease still live on the server.)
func TestReleaseSaysSoUntilItReachesTheServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	c := b.client(t, b.pool(t, proxy.URL(b.db.URL)), gofence.Config{TTL: 10 * time.Second})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	proxy.Freeze()
	for _, d := range []time.Duration{300 * time.Millisecond, time.Second, 0} {
		ctx, cancel := context.WithTimeout(b.ctx, max(d, 200*time.Millisecond))
		err := l.Release(ctx)
		cancel()
		require.Error(t, err, "the network is down: the release did not happen")
		require.ErrorContains(t, err, "releasing job")
		require.ErrorIs(t, l.Err(), gofence.ErrReleased, "not held here any more")
		require.True(t, b.serverLive(t, "job"))
	}
	proxy.Thaw()
	require.NoError(t, l.Release(b.ctx))
	require.False(t, b.serverLive(t, "job"))
	require.NoError(t, l.Release(b.ctx), "released: idempotent")
}

// A session lease whose session the server ended while its link is silent
// is reported lost within RenewInterval. (It took two.)
func TestSessionLeaseLossNoticedWithinRenewInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	const renew = 2 * time.Second
	c := b.client(t, b.pool(t, proxy.URL(b.db.URL)), gofence.Config{RenewInterval: renew})
	l, err := c.Acquire(b.ctx, "job", &gofence.LeaseOptions{Session: true})
	require.NoError(t, err)
	row, ok, err := sqlfuncs.GetLease(b.ctx, b.db.Pool, "job")
	require.NoError(t, err)
	require.True(t, ok && row.Live)
	proxy.FreezeOpen()
	defer proxy.Thaw()
	_, err = b.db.Pool.Exec(b.ctx, `SELECT pg_terminate_backend($1)`, row.SessionPID)
	require.NoError(t, err)
	ended := time.Now()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the loss was never noticed")
	}
	took := time.Since(ended)
	require.ErrorIs(t, l.Err(), gofence.ErrLost)
	// Within RenewInterval, and a quarter of it for a loaded machine; it
	// used to take up to two (a check every RenewInterval, waiting as long).
	require.Less(t, took, renew*5/4, "noticed %s after the session ended", took)
	require.NoError(t, l.Release(b.ctx))
}

// A Release or a Close (ReleaseOnClose) of a session lease whose session
// does not answer says that the lease is still live on the server, and
// names it; once the server ended the session, Release returns nil. (Both
// used to return nil with the lease live on the server.)
func TestSessionReleaseOverASilentSessionSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	pool := b.pool(t, proxy.URL(b.db.URL))
	c := b.client(t, pool, gofence.Config{})
	closing := b.client(t, pool, gofence.Config{ReleaseOnClose: true})
	l, err := c.Acquire(b.ctx, "job", &gofence.LeaseOptions{Session: true})
	require.NoError(t, err)
	l2, err := closing.Acquire(b.ctx, "other", &gofence.LeaseOptions{Session: true})
	require.NoError(t, err)
	proxy.FreezeOpen() // new connections (the pool's) work, the sessions are silent
	defer proxy.Thaw()
	ctx, cancel := context.WithTimeout(b.ctx, time.Second)
	defer cancel()
	err = l.Release(ctx)
	require.Error(t, err)
	require.ErrorContains(t, err, "releasing job (session lease, token")
	ctx2, cancel2 := context.WithTimeout(b.ctx, time.Second)
	defer cancel2()
	err = closing.Close(ctx2)
	require.Error(t, err)
	require.ErrorContains(t, err, "releasing other (session lease, token")
	require.True(t, b.serverLive(t, "job"))
	require.True(t, b.serverLive(t, "other"))
	err = l.Release(b.ctx)
	require.ErrorContains(t, err, "the server still has the lease live")

	row, _, err := sqlfuncs.GetLease(b.ctx, b.db.Pool, "job")
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, `SELECT pg_terminate_backend($1)`, row.SessionPID)
	require.NoError(t, err)
	poll(t, "the server ended the session", func() bool { return !b.serverLive(t, "job") })
	require.NoError(t, l.Release(b.ctx))
	_ = l2
}

// logLines is a slog handler's output, safe for concurrent use.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *logLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *logLines) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Close ends a leader's term as a step-down: the LeadershipEvent's Err is
// nil, nothing is logged as a loss, Elect returns ErrClosed, and the lease
// is released (by Close with ReleaseOnClose, else by Elect when fn returns). (With ReleaseOnClose the term was reported lost,
// "lease released", and logged at WARN as "leadership lost, campaigning
// again"; without it the lease kept renewing after Close.)
func TestElectStepsDownOnClose(t *testing.T) {
	t.Parallel()
	for _, release := range []bool{true, false} {
		t.Run(fmt.Sprintf("ReleaseOnClose %v", release), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			r := &recorder{}
			var logs logLines
			c, err := gofence.New(b.db.Pool, &gofence.Config{ReleaseOnClose: release, Observer: r,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			require.NoError(t, err)
			leading := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- c.Elect(b.ctx, "leader", nil, func(ctx context.Context, _ *gofence.Lease) error {
					close(leading)
					<-ctx.Done()
					return nil
				})
			}()
			<-leading
			require.NoError(t, c.Close(b.ctx))
			require.ErrorIs(t, <-done, gofence.ErrClosed)
			events := eventsOf[*gofence.LeadershipEvent](r)
			require.Len(t, events, 2)
			require.False(t, events[1].Leading)
			require.NoError(t, events[1].Err, "a step-down, not a loss")
			require.NotContains(t, logs.String(), "leadership lost")
			require.NotContains(t, logs.String(), "campaign")
			require.False(t, b.serverLive(t, "leader"), "Elect releases when fn returns")
		})
	}
}

// A write inside Lease.Tx refused with FN001 (a newer grant exists) ends
// the lease at once: Done is closed and Err matches ErrLost when Tx
// returns, with a loss reason "refused". (The lease stayed held until its
// next renewal.)
func TestStaleRefusalInsideTxEndsTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, r := b.observed(t, gofence.Config{})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	other, err := c.Acquire(b.ctx, "other", nil)
	require.NoError(t, err)
	_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "job")
	require.NoError(t, err)
	err = write(b.ctx, l, b.db.Pool, "A")
	require.ErrorIs(t, err, gofence.ErrStaleToken)
	select {
	case <-l.Done():
	default:
		t.Fatal("the refused lease is still held")
	}
	require.ErrorIs(t, l.Err(), gofence.ErrLost)
	losses := eventsOf[*gofence.LossEvent](r)
	require.Len(t, losses, 1)
	require.Equal(t, gofence.LossReason("refused"), losses[0].Reason)
	require.NoError(t, other.Err(), "a lease the refusal does not name is not touched")
	require.NoError(t, other.Release(b.ctx))
	require.NoError(t, l.Release(b.ctx))
}
