package gofence_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// One Client serves two named workers with their own TTLs: the holder and
// the TTL are per call, not only per Client, and Acquire, Do and Elect take
// them (and refuse bad ones) in the same LeaseOptions.
func TestPerCallHolderAndTTL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{Holder: "default", TTL: time.Minute})

	one, err := c.Acquire(b.ctx, "a", &gofence.LeaseOptions{Holder: "worker-1", TTL: 5 * time.Second})
	require.NoError(t, err)
	defer one.Release(b.ctx)
	two, err := c.Acquire(b.ctx, "b", &gofence.LeaseOptions{Wait: true, Holder: "worker-2"})
	require.NoError(t, err)
	defer two.Release(b.ctx)
	plain, err := c.Acquire(b.ctx, "c", nil)
	require.NoError(t, err)
	defer plain.Release(b.ctx)

	for _, tc := range []struct {
		lease  *gofence.Lease
		holder string
		ttl    time.Duration
	}{{one, "worker-1", 5 * time.Second}, {two, "worker-2", time.Minute}, {plain, "default", time.Minute}} {
		require.Equal(t, tc.holder, tc.lease.Holder())
		info, ok, err := c.LeaseOf(b.ctx, tc.lease.Resource())
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, tc.holder, info.Holder)
		require.InDelta(t, tc.ttl.Seconds(), info.ExpiresAt.Sub(info.AcquiredAt).Seconds(), 0.5, "the server's expiry follows the lease's TTL")
		require.LessOrEqual(t, time.Until(tc.lease.TrustDeadline()), tc.ttl, "the local trust deadline follows the lease's TTL")
	}

	var holder string
	err = c.Do(b.ctx, "d", &gofence.LeaseOptions{Holder: "worker-3", TTL: 2 * time.Second}, func(ctx context.Context, l *gofence.Lease) error {
		holder = l.Holder()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "worker-3", holder)
	err = c.Elect(b.ctx, "leader", &gofence.LeaseOptions{Holder: "worker-4", TTL: 2 * time.Second}, func(ctx context.Context, l *gofence.Lease) error {
		holder = l.Holder()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "worker-4", holder)

	for name, opts := range map[string]*gofence.LeaseOptions{
		"ttl too short":         {TTL: time.Millisecond},
		"ttl too long":          {TTL: 25 * time.Hour},
		"holder too long":       {Holder: strings.Repeat("x", 256)},
		"a session has no ttl":  {Session: true, TTL: time.Second},
		"waiting, ttl too long": {Wait: true, TTL: 25 * time.Hour},
	} {
		_, err := c.Acquire(b.ctx, "e", opts)
		require.ErrorContains(t, err, "LeaseOptions.", name)
		ran := false
		err = c.Do(b.ctx, "e", opts, func(context.Context, *gofence.Lease) error { ran = true; return nil })
		require.ErrorContains(t, err, "LeaseOptions.", name)
		err = c.Elect(b.ctx, "e", opts, func(context.Context, *gofence.Lease) error { ran = true; return nil })
		require.ErrorContains(t, err, "LeaseOptions.", name)
		require.False(t, ran, name)
	}
	require.False(t, b.serverLive(t, "e"))

	// A Config that set its intervals explicitly must fit a per-call TTL.
	fixed := b.client(t, nil, gofence.Config{TTL: time.Minute, RenewInterval: 20 * time.Second})
	_, err = fixed.Acquire(b.ctx, "f", &gofence.LeaseOptions{TTL: 10 * time.Second})
	require.Error(t, err, "RenewInterval 20s does not fit a 10s TTL")
}

// A waiting Acquire of a session lease waits as one of a TTL lease does.
func TestWaitingForASessionLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{PollInterval: 20 * time.Millisecond})
	first, err := c.Acquire(b.ctx, "job", &gofence.LeaseOptions{Session: true, Holder: "first"})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err = c.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true, Session: true})
	require.ErrorIs(t, err, context.Canceled, "a waiter gives up with its context")

	got := make(chan *gofence.Lease, 1)
	errs := make(chan error, 1)
	go func() {
		l, err := c.Acquire(b.ctx, "job", &gofence.LeaseOptions{Wait: true, Session: true, Holder: "second"})
		if err != nil {
			errs <- err
			return
		}
		got <- l
	}()
	require.NoError(t, first.Release(b.ctx))
	select {
	case err := <-errs:
		t.Fatal(err)
	case second := <-got:
		defer second.Release(b.ctx)
		require.Greater(t, second.Token(), first.Token())
		info, ok, err := c.LeaseOf(b.ctx, "job")
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "session", info.Kind)
		require.Equal(t, "second", info.Holder)
	}
}

// The install check honours each caller's ctx while the first caller's check
// hangs. (ensureInstalled used to hold a mutex across a network call made
// with the first caller's ctx: every other caller waited on it, its own ctx
// ignored.)
func TestInstallCheckHonoursEachCallersCtx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	viaProxy := b.pool(t, proxy.URL(b.db.URL))
	c := b.client(t, viaProxy, gofence.Config{TTL: 10 * time.Second})
	proxy.Freeze()
	defer proxy.Thaw()

	first, cancelFirst := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancelFirst()
	go func() { _, _ = c.Acquire(first, "job", nil) }()
	// The first call's check is on its way: its connection hangs in the proxy.
	poll(t, "the first caller's connection accepted by the frozen proxy", func() bool { return proxy.Opened() > 0 })

	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Acquire(ctx, "other", nil)
	require.Error(t, err)
	require.Less(t, time.Since(start), time.Second, "Acquire did not honour its ctx (200ms)")
}

// Close and a waiting Acquire may run at the same time: no data race (run
// with -race), and the notifier that the waiter creates is stopped. (Close
// used to read c.notify without synchronisation while the waiter (then
// AcquireWait) created it; when Close won, the notifier created afterwards
// was never stopped.)
func TestCloseDoesNotRaceWithAWaiter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := holder.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	defer l.Release(b.ctx)
	for range 5 {
		c, err := gofence.New(b.db.Pool, &gofence.Config{Logger: quiet})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
		done := make(chan struct{})
		go func() { defer close(done); _, _ = c.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true}) }()
		require.NoError(t, c.Close(b.ctx))
		<-done
		cancel()
		require.NoError(t, c.Close(b.ctx))
	}
}
