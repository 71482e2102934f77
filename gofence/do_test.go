package gofence_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
)

func TestDoReleasesWhenTheParentContextIsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	ctx, cancel := context.WithCancel(b.ctx)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.Do(ctx, "job", &gofence.LeaseOptions{Wait: true}, func(ctx context.Context, l *gofence.Lease) error {
			if err := write(ctx, l, b.db.Pool, "do"); err != nil {
				return err
			}
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-started
	require.True(t, b.serverLive(t, "job"))
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.False(t, b.serverLive(t, "job"), "released at once, not left to expire")
}

func TestDoNoWaitOnAHeldResource(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	defer l.Release(b.ctx)
	err = c.Do(b.ctx, "job", nil, func(context.Context, *gofence.Lease) error {
		t.Fatal("ran without the lease")
		return nil
	})
	require.ErrorIs(t, err, gofence.ErrHeld)
}

// When Do's function panics (and the caller recovers, as net/http does for
// every handler), Do releases the lease before the panic goes on. (It used
// to release only on a normal return: the lease stayed held and renewed
// forever.)
func TestDoReleasesWhenFnPanics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 300 * time.Millisecond})
	func() {
		defer func() { _ = recover() }()
		_ = c.Do(b.ctx, "job", &gofence.LeaseOptions{Wait: true}, func(ctx context.Context, l *gofence.Lease) error {
			panic("handler bug")
		})
	}()
	// Do releases before the panic goes on, so the lease has ended by now;
	// a lease left held would still be live (and renewed in the background).
	require.False(t, b.serverLive(t, "job"),
		"the lease of a Do whose function panicked is still live (renewed in the background, never released)")
}
