package sqlfuncs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

func TestSessionLease(t *testing.T) {
	t.Parallel()

	t.Run("ends when its session is terminated; the next grant is larger", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, db := b.ctx, b.db.Pool
		owner, other := b.db.Conn(t), b.db.Conn(t)

		t1, ok, err := sqlfuncs.AcquireSession(ctx, owner, "leader", "owner")
		require.NoError(t, err)
		require.True(t, ok)

		_, ok, err = sqlfuncs.Acquire(ctx, other, "leader", "other", time.Second)
		require.NoError(t, err)
		require.False(t, ok, "a TTL acquire is excluded by a live session lease")
		_, ok, err = sqlfuncs.AcquireSession(ctx, other, "leader", "other")
		require.NoError(t, err)
		require.False(t, ok, "so is another session acquire")
		_, ok, err = sqlfuncs.AcquireSession(ctx, owner, "leader", "owner")
		require.NoError(t, err)
		require.False(t, ok, "and the same session acquiring again")
		_, ok, err = sqlfuncs.Acquire(ctx, owner, "leader", "owner", time.Second)
		require.NoError(t, err)
		require.False(t, ok, "and a TTL acquire from the owning session")
		require.True(t, live(t, ctx, db, "leader"))

		_, err = db.Exec(ctx, `SELECT pg_terminate_backend($1)`, owner.PgConn().PID())
		require.NoError(t, err)
		t2 := acquireWhenFree(t, ctx, other, "leader", "other", time.Minute)
		require.Greater(t, t2, t1)
		require.ErrorIs(t, sqlfuncs.Check(ctx, db, "leader", t1), sqlfuncs.ErrStaleToken)
	})

	t.Run("a live TTL lease excludes a session acquire", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := b.ctx
		a, s := b.db.Conn(t), b.db.Conn(t)
		tok, ok, err := sqlfuncs.Acquire(ctx, a, "r", "ttl-holder", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = sqlfuncs.AcquireSession(ctx, s, "r", "session-holder")
		require.NoError(t, err)
		require.False(t, ok)
		released, err := sqlfuncs.Release(ctx, a, "r", tok)
		require.NoError(t, err)
		require.True(t, released)
		_, ok, err = sqlfuncs.AcquireSession(ctx, s, "r", "session-holder")
		require.NoError(t, err)
		require.True(t, ok, "the failed attempt left no advisory lock behind")
	})

	t.Run("release from its own session frees it at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, db := b.ctx, b.db.Pool
		s1, s2 := b.db.Conn(t), b.db.Conn(t)
		tok, ok, err := sqlfuncs.AcquireSession(ctx, s1, "r", "one")
		require.NoError(t, err)
		require.True(t, ok)
		_, _, err = sqlfuncs.Renew(ctx, s1, "r", tok, time.Minute)
		require.Error(t, err, "a session lease has no TTL")
		requireCode(t, err, "22023")
		released, err := sqlfuncs.Release(ctx, s1, "r", tok)
		require.NoError(t, err)
		require.True(t, released)
		var held int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, s1.PgConn().PID()).Scan(&held))
		require.Zero(t, held, "the session's advisory lock is gone")
		t2, ok, err := sqlfuncs.AcquireSession(ctx, s2, "r", "two")
		require.NoError(t, err)
		require.True(t, ok)
		require.Greater(t, t2, tok)
	})
}

// Session leases take an advisory lock per token; those locks never block a
// later grant: not after a revoke, not after a rolled-back acquire_session,
// not when one session acquires twice.
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
