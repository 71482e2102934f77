package gofence_test

// Tests from an independent review: each one demonstrated a bug, fixed since;
// the comments describe the bug as it was.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// A panic in Do's function (recovered by the caller, as net/http does for
// every handler) leaves the lease held and renewed forever: Do releases only
// on a normal return.
func TestDoReleasesWhenFnPanics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 300 * time.Millisecond})
	func() {
		defer func() { _ = recover() }()
		_ = c.Do(b.ctx, "job", nil, func(ctx context.Context, l *gofence.Lease) error {
			panic("handler bug")
		})
	}()
	// Do releases before the panic goes on, so the lease has ended by now;
	// a lease left held would still be live (and renewed in the background).
	require.False(t, b.serverLive(t, "job"),
		"the lease of a Do whose function panicked is still live (renewed in the background, never released)")
}

// Tx replaces the function's error by sqlfuncs.Translate's new *Error when
// the function's error wraps a fencing PgError: the caller's own wrapping
// (message and sentinels) is dropped.
func TestTxKeepsTheFunctionsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := c.Acquire(b.ctx, "job")
	require.NoError(t, err)
	defer l.Release(b.ctx)

	errMine := errors.New("my sentinel")
	err = l.Tx(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		// A token older than the lease's: the guard refuses with FN001.
		_, err := tx.Exec(b.ctx, `INSERT INTO work (who, token) VALUES ('x', $1)`, l.Token()-1)
		return fmt.Errorf("writing row 42: %w", errors.Join(errMine, err))
	})
	require.Error(t, err)
	require.True(t, errors.Is(err, gofence.ErrStaleToken) || errors.Is(err, gofence.ErrUnknownToken), "%v", err)
	require.ErrorIs(t, err, errMine, "Tx lost the function's own error: %v", err)
	require.ErrorContains(t, err, "writing row 42")
}

// Release waits for an in-flight renewal (<-keepaliveDone) without looking
// at its ctx; a renewal stuck in a partition is only cut at the trust
// deadline, so Release(ctx with 200ms) blocks for seconds.
func TestReleaseHonoursCtxWhileARenewalHangs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	viaProxy := b.pool(t, proxy.URL(b.db.URL))
	c := b.client(t, viaProxy, gofence.Config{TTL: 6 * time.Second, RenewInterval: time.Second})
	l, err := c.Acquire(b.ctx, "job")
	require.NoError(t, err)

	proxy.Freeze()
	defer proxy.Thaw()
	time.Sleep(1300 * time.Millisecond) // the renewal sent at 1s hangs
	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = l.Release(ctx)
	require.Less(t, time.Since(start), time.Second, "Release did not honour its ctx (200ms)")
}

// The doc of Release says "a call after the lease was lost returns nil". In
// a partition (the usual cause of loss) it returns an error instead.
func TestReleaseAfterLossInPartitionReturnsNil(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy := pgtest.NewProxy(t, b.db.URL)
	viaProxy := b.pool(t, proxy.URL(b.db.URL))
	c := b.client(t, viaProxy, gofence.Config{TTL: time.Second, RenewInterval: 200 * time.Millisecond, SafetyMargin: 100 * time.Millisecond})
	l, err := c.Acquire(b.ctx, "job")
	require.NoError(t, err)
	proxy.Freeze()
	defer proxy.Thaw()
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("never lost")
	}
	require.ErrorIs(t, l.Err(), gofence.ErrLost)
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	require.NoError(t, l.Release(ctx), "documented: a call after the lease was lost returns nil")
}

// ensureInstalled holds installedMu across a network call made with the
// first caller's ctx; every other caller waits on the mutex and its own ctx
// is ignored.
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

// Close reads c.notify without synchronisation while Lock creates it in
// notifyOnce: a data race (run with -race). When Close wins, the notifier
// Lock creates afterwards is never stopped.
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
		go func() { defer close(done); _, _ = c.Lock(ctx, "job") }()
		c.Close()
		<-done
		cancel()
		c.Close()
	}
}
