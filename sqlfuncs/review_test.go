package sqlfuncs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestGrantWaitIsBoundedUnderOverlappingWriters: writers whose guarded
// transactions overlap so that some writer always holds the lease row must
// not hold a grant off past fence.grant_wait. Row locks alone let each new
// FOR KEY SHARE join ahead of a waiting FOR UPDATE (found by review: a revoke
// waited 23 s with grant_wait 2 s); the gate lock queues them fairly.
func TestGrantWaitIsBoundedUnderOverlappingWriters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	tok, err := sqlfuncs.Revoke(ctx, db, "starve")
	require.NoError(t, err)

	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 3 {
		conn := b.db.Conn(t)
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond) // overlap the three
			for wctx.Err() == nil {
				_ = pgx.BeginFunc(wctx, conn, func(tx pgx.Tx) error {
					if err := sqlfuncs.Check(wctx, tx, "starve", tok); err != nil {
						return err
					}
					_, err := tx.Exec(wctx, `SELECT pg_sleep(0.3)`)
					return err
				})
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	granter := b.db.Conn(t)
	_, err = granter.Exec(ctx, `SET fence.grant_wait = '500ms'`)
	require.NoError(t, err)
	time.Sleep(400 * time.Millisecond) // let the writers overlap first
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // without a fair gate it would wait for the writers forever
	defer cancel()
	newTok, err := sqlfuncs.Revoke(rctx, granter, "starve")
	took := time.Since(start)
	// The revoke either got in (after the writers that were already in) or
	// gave up as busy; it must not wait for the stream of writers to end.
	if err != nil {
		require.ErrorIs(t, err, sqlfuncs.ErrBusy)
	} else {
		require.Greater(t, newTok, tok)
	}
	require.Less(t, took, 5*time.Second, "the grant waited %s with fence.grant_wait = 500ms", took)
	t.Logf("revoke under overlapping writers returned after %s (err=%v)", took, err)
}

func TestSessionLeaseAdvisoryLocksNeverBlockLaterGrants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	a, other := b.db.Conn(t), b.db.Conn(t)

	t.Run("after revoke, another session can take a session lease", func(t *testing.T) {
		_, ok, err := sqlfuncs.AcquireSession(ctx, a, "r1", "a")
		require.NoError(t, err)
		require.True(t, ok)
		_, err = sqlfuncs.Revoke(ctx, db, "r1")
		require.NoError(t, err)
		_, ok, err = sqlfuncs.AcquireSession(ctx, other, "r1", "other")
		require.NoError(t, err)
		require.True(t, ok, "a's leftover lock belongs to a revoked token and blocks nothing")
	})

	t.Run("a rolled-back acquire_session leaves nothing that blocks", func(t *testing.T) {
		tx, err := a.Begin(ctx)
		require.NoError(t, err)
		_, ok, err := sqlfuncs.AcquireSession(ctx, tx, "r2", "a")
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, tx.Rollback(ctx))
		tok, ok, err := sqlfuncs.AcquireSession(ctx, other, "r2", "other")
		require.NoError(t, err)
		require.True(t, ok)
		// The rolled-back grant computed the same first token: its key is
		// still held by a, so the grant skipped to the next token.
		require.Positive(t, tok)
		require.NoError(t, sqlfuncs.Check(ctx, db, "r2", tok))
	})

	t.Run("acquiring twice in one session takes the lock once", func(t *testing.T) {
		tok, ok, err := sqlfuncs.AcquireSession(ctx, a, "r3", "a")
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = sqlfuncs.AcquireSession(ctx, a, "r3", "a")
		require.NoError(t, err)
		require.False(t, ok)
		released, err := sqlfuncs.Release(ctx, a, "r3", tok)
		require.NoError(t, err)
		require.True(t, released)
		_, ok, err = sqlfuncs.AcquireSession(ctx, other, "r3", "other")
		require.NoError(t, err)
		require.True(t, ok)
	})
}

func TestProtectedTableAttachedLaterStaysGuarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.exec(t, `CREATE TABLE part_1 (id int, v int)`)
	require.NoError(t, sqlfuncs.Protect(ctx, db, "part_1", "parts", ""))
	b.exec(t, `CREATE TABLE parts (id int, v int) PARTITION BY RANGE (id)`)
	b.exec(t, `ALTER TABLE parts ATTACH PARTITION part_1 FOR VALUES FROM (0) TO (100)`)

	_, err := db.Exec(ctx, `INSERT INTO parts VALUES (1, 1)`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "an insert routed through the parent meets the guard")
	tok, ok, err := sqlfuncs.Acquire(ctx, db, "parts", "h", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "parts", tok))
		_, err := tx.Exec(ctx, `INSERT INTO parts VALUES (1, 1)`)
		return err
	}))
	_, err = db.Exec(ctx, `UPDATE parts SET v = 2`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
	_, err = db.Exec(ctx, `DELETE FROM parts`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
}
