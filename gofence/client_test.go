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
// the TTL are per call, not only per Client.
func TestPerCallHolderAndTTL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{Holder: "default", TTL: time.Minute})

	one, err := c.Acquire(b.ctx, "a", gofence.WithHolder("worker-1"), gofence.WithTTL(5*time.Second))
	require.NoError(t, err)
	defer one.Release(b.ctx)
	two, err := c.AcquireWait(b.ctx, "b", gofence.WithHolder("worker-2"))
	require.NoError(t, err)
	defer two.Release(b.ctx)
	plain, err := c.Acquire(b.ctx, "c")
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

	err = c.Do(b.ctx, "d", &gofence.DoOptions{Holder: "worker-3", TTL: 2 * time.Second}, func(ctx context.Context, l *gofence.Lease) error {
		require.Equal(t, "worker-3", l.Holder())
		return nil
	})
	require.NoError(t, err)

	for name, opts := range map[string][]gofence.LeaseOption{
		"ttl too short":   {gofence.WithTTL(time.Millisecond)},
		"ttl too long":    {gofence.WithTTL(25 * time.Hour)},
		"holder too long": {gofence.WithHolder(strings.Repeat("x", 256))},
	} {
		_, err := c.Acquire(b.ctx, "e", opts...)
		require.Error(t, err, name)
	}
	_, err = c.AcquireSession(b.ctx, "e", gofence.WithTTL(time.Second))
	require.Error(t, err, "a session lease has no TTL")

	// A Config that set its intervals explicitly must fit a per-call TTL.
	fixed := b.client(t, nil, gofence.Config{TTL: time.Minute, RenewInterval: 20 * time.Second})
	_, err = fixed.Acquire(b.ctx, "f", gofence.WithTTL(10*time.Second))
	require.Error(t, err, "RenewInterval 20s does not fit a 10s TTL")
}

// AcquireSessionWait waits for a session lease as AcquireWait waits for a TTL lease.
func TestLockSessionWaitsForTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{PollInterval: 20 * time.Millisecond})
	first, err := c.AcquireSession(b.ctx, "job", gofence.WithHolder("first"))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	_, err = c.AcquireSessionWait(ctx, "job")
	require.ErrorIs(t, err, context.Canceled, "a waiter gives up with its context")

	got := make(chan *gofence.Lease, 1)
	errs := make(chan error, 1)
	go func() {
		l, err := c.AcquireSessionWait(b.ctx, "job", gofence.WithHolder("second"))
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
	go func() { _, _ = c.Acquire(first, "job") }()
	time.Sleep(200 * time.Millisecond)

	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Acquire(ctx, "other")
	require.Error(t, err)
	require.Less(t, time.Since(start), time.Second, "Acquire did not honour its ctx (200ms)")
}

// Close and AcquireWait may run at the same time: no data race (run with -race),
// and the notifier that AcquireWait creates is stopped. (Close used to read
// c.notify without synchronisation while AcquireWait created it; when Close won,
// the notifier AcquireWait created afterwards was never stopped.)
func TestCloseDoesNotRaceWithLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := holder.Acquire(b.ctx, "job")
	require.NoError(t, err)
	defer l.Release(b.ctx)
	for range 5 {
		c, err := gofence.New(b.db.Pool, &gofence.Config{Logger: quiet})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
		done := make(chan struct{})
		go func() { defer close(done); _, _ = c.AcquireWait(ctx, "job") }()
		c.Close()
		<-done
		cancel()
		c.Close()
	}
}
