package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestPatroniGofenceAcrossFailover: gofence on a Patroni cluster's
// multi-host URL when the primary node dies (Patroni and PostgreSQL
// killed, a replica promoted once the leader key expired). A held lease
// cannot renew and is lost, and reported lost (Done, Err matching ErrLost)
// by its trust deadline, not later (Release of it then returns nil at once); a waiter on the same resource finds the
// new primary and is granted a larger token once the old lease expired
// there by the server's clock; the old holder's write is then refused; an
// Elect loop loses leadership and is elected again on the new primary with
// a larger term; and every call returns within its bounds, Close included.
func TestPatroniGofenceAcrossFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := pgtest.NewPatroni(t, pgtest.PatroniOptions{Nodes: 2})
	url := c.URL(pgtest.ClusterDB)

	setup, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	_, err = setup.Exec(ctx, "CREATE TABLE gf_rows (id bigserial PRIMARY KEY, tok bigint NOT NULL)")
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, setup, "gf_rows", "gf/res", "tok"))
	require.NoError(t, setup.Close(ctx))

	const ttl = 3 * time.Second
	newClient := func(holder string) (*gofence.Client, *pgxpool.Pool) {
		t.Helper()
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		client, err := gofence.New(pool, &gofence.Config{Holder: holder, TTL: ttl, PollInterval: 200 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() {
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			start := time.Now()
			require.NoError(t, client.Close(cctx), "Close of %s", holder)
			require.Less(t, time.Since(start), 10*time.Second)
		})
		return client, pool
	}
	holderC, holderPool := newClient("holder")
	waiterC, waiterPool := newClient("waiter")
	electC, _ := newClient("elect")

	held, err := holderC.Acquire(ctx, "gf/res", nil)
	require.NoError(t, err)
	require.NoError(t, held.Tx(ctx, holderPool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO gf_rows (tok) VALUES ($1)", held.Token())
		return err
	}))

	// The waiter waits for the held resource; the elector leads.
	type waitResult struct {
		lease *gofence.Lease
		err   error
		at    time.Time
	}
	waited := make(chan waitResult, 1)
	go func() {
		wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
		defer wcancel()
		l, err := waiterC.Acquire(wctx, "gf/res", &gofence.LeaseOptions{Wait: true})
		waited <- waitResult{l, err, time.Now()}
	}()
	type term struct {
		tok        int64
		start, end time.Time
		lost       error
	}
	var termsMu sync.Mutex
	var terms []term
	ectx, ecancel := context.WithCancel(ctx)
	elected := make(chan error, 1)
	go func() {
		elected <- electC.Elect(ectx, "gf/leader", nil, func(lctx context.Context, l *gofence.Lease) error {
			start := time.Now()
			<-lctx.Done()
			termsMu.Lock()
			terms = append(terms, term{tok: l.Token(), start: start, end: time.Now(), lost: l.Err()})
			termsMu.Unlock()
			return nil
		})
	}()
	require.Eventually(t, func() bool {
		info, ok, err := holderC.LeaseOf(ctx, "gf/leader")
		return err == nil && ok && info.Live
	}, 30*time.Second, 50*time.Millisecond, "Elect leads")
	time.Sleep(ttl / 2) // a renewal or two on the old primary

	leader := c.WaitLeader(t, "")
	lastTrust := held.TrustDeadline()
	killed := time.Now()
	leader.Kill(t)

	// The held lease: lost by its trust deadline, reported lost.
	select {
	case <-held.Done():
	case <-time.After(ttl + 5*time.Second):
		t.Fatalf("the held lease was not reported lost %s after the primary died (trust deadline was %s)", ttl+5*time.Second, lastTrust.Sub(killed))
	}
	lostAt := time.Now()
	require.ErrorIs(t, held.Err(), gofence.ErrLost)
	require.False(t, lostAt.After(held.TrustDeadline().Add(time.Second)), "lost at its trust deadline, not after it")
	t.Logf("held lease (token %d) reported lost %s after the kill: %v", held.Token(), lostAt.Sub(killed).Round(time.Millisecond), held.Err())

	next := c.WaitLeader(t, leader.Name)
	promoted := time.Now()

	// The waiter: granted on the new primary, above the old token.
	var w waitResult
	select {
	case w = <-waited:
	case <-time.After(90 * time.Second):
		t.Fatal("the waiter never returned")
	}
	require.NoError(t, w.err, "the waiter finds the new primary")
	require.Greater(t, w.lease.Token(), held.Token(), "the new primary's grant exceeds the old one")
	require.Greater(t, epochOf(w.lease.Token()), epochOf(held.Token()), "a promotion moves the epoch")
	t.Logf("waiter granted token %d on %s %s after the kill (%s after %s accepted writes)", w.lease.Token(), next.Name,
		w.at.Sub(killed).Round(time.Millisecond), w.at.Sub(promoted).Round(time.Millisecond), next.Name)
	t.Logf("NOTE: gofence across a Patroni failover (node killed): lease lost after %.1fs, waiter granted after %.1fs",
		lostAt.Sub(killed).Seconds(), w.at.Sub(killed).Seconds())

	// The old holder's write is refused on the new primary; the new one's
	// is not.
	err = held.Tx(ctx, holderPool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO gf_rows (tok) VALUES ($1)", held.Token())
		return err
	})
	require.Error(t, err)
	require.True(t, errors.Is(err, gofence.ErrStaleToken) || errors.Is(err, gofence.ErrUnknownToken), "%v", err)
	require.ErrorIs(t, err, gofence.ErrLost, "the error says the lease was lost too")
	require.NoError(t, w.lease.Tx(ctx, waiterPool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO gf_rows (tok) VALUES ($1)", w.lease.Token())
		return err
	}))
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	require.NoError(t, held.Release(rctx), "releasing a lost lease is not an error, and returns at once")
	rcancel()
	require.ErrorIs(t, held.Err(), gofence.ErrLost, "and the lease stays reported lost")
	require.NoError(t, w.lease.Release(ctx))

	// Elect: the first term ended lost, a second one began on the new
	// primary with a larger term.
	require.Eventually(t, func() bool {
		info, ok, err := waiterC.LeaseOf(ctx, "gf/leader")
		termsMu.Lock()
		defer termsMu.Unlock()
		return err == nil && ok && info.Live && len(terms) >= 1 && info.Token > terms[0].tok
	}, 60*time.Second, 100*time.Millisecond, "Elect leads again on the new primary")
	ecancel()
	select {
	case err := <-elected:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(15 * time.Second):
		t.Fatal("Elect did not return after its context was cancelled")
	}
	termsMu.Lock()
	defer termsMu.Unlock()
	require.GreaterOrEqual(t, len(terms), 2)
	require.ErrorIs(t, terms[0].lost, gofence.ErrLost, "the first term ended lost")
	require.Greater(t, terms[1].tok, terms[0].tok, "terms increase across the failover")
	t.Logf("Elect: term %d lost %s after the kill, term %d began %s after it", terms[0].tok, terms[0].end.Sub(killed).Round(time.Millisecond),
		terms[1].tok, terms[1].start.Sub(killed).Round(time.Millisecond))

	leader.Start(t) // rejoins; the harness stops it with the rest
}
