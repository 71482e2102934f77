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
