package riverfence_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// throughPgBouncer makes a fenced bundle whose River clients and gofence
// client reach the database through PgBouncer in transaction mode: a pool
// that sends no named prepared statements (default_query_exec_mode=exec),
// River without LISTEN (PollOnly) and gofence without notifications.
func throughPgBouncer(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, true)
	pb := pgtest.NewPgBouncer(t, b.db.URL)
	pool, err := pgxpool.New(b.ctx, pb.URL(b.db.URL)+"&default_query_exec_mode=exec")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b.usePool(pool)
	b.pollOnly = true
	b.start(t, gofence.Config{DisableNotify: true})
	return b
}

// TestThroughPgBouncer: the pause-and-rescue scenario and a history of jobs
// with random pauses, with River and the middleware behind PgBouncer in
// transaction mode (3 server connections for all clients).
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	t.Run("a paused attempt past its timeout is fenced", func(t *testing.T) {
		t.Parallel()
		b := throughPgBouncer(t)
		rep := pauseAndRescue(t, b)
		require.NoError(t, rep.safe(), b.db.URL)
		require.ErrorIs(t, rep.old.step, gofence.ErrStaleToken)
		require.ErrorIs(t, rep.old.complete, gofence.ErrStaleToken)
		require.Equal(t, "completed", rep.state)
	})
	t.Run("many jobs with random pauses", func(t *testing.T) {
		t.Parallel()
		pgtest.Long(t, "12 jobs with pauses past their timeout through PgBouncer")
		b := throughPgBouncer(t)
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		runHistory(t, b, seed, 12)
	})
}
