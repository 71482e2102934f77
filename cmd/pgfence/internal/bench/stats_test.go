package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestReadLeaseStatsWithoutFlushHandsBackItsConnections: where the server
// cannot be asked to flush statistics (PostgreSQL 13 and 14 have no
// pg_stat_force_next_flush; on 15 a function of that name earlier on the
// search_path stands in for it here, raising what 13 raises), readLeaseStats
// used to return on the first error, keeping the other connections it had
// taken, and the bench's deferred pool Close then waited forever.
func TestReadLeaseStatsWithoutFlushHandsBackItsConnections(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Setup(t)
	for _, sql := range []string{
		`CREATE SCHEMA before15`,
		`CREATE FUNCTION before15.pg_stat_force_next_flush() RETURNS void LANGUAGE plpgsql AS
		 $$ BEGIN RAISE EXCEPTION 'function pg_stat_force_next_flush() does not exist' USING ERRCODE = '42883'; END $$`,
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	_, ok, err := sqlfuncs.Acquire(ctx, db.Pool, "r", "t", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = 3
	cfg.ConnConfig.RuntimeParams["search_path"] = "before15, pg_catalog, public"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	closed := make(chan struct{})
	t.Cleanup(func() {
		go func() { pool.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("pool.Close still waits after 10s for a connection readLeaseStats never handed back: %+v", pool.Stat())
		}
	})

	// Three idle connections, as after a renew loop.
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}

	st, note, err := readLeaseStats(ctx, pool)
	require.NoError(t, err)
	require.Contains(t, note, "without pg_stat_force_next_flush()")
	require.Positive(t, st.size, "fence.lease was read")

	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for range 3 {
		c, err := pool.Acquire(actx)
		require.NoError(t, err, "a connection is still checked out: %+v", pool.Stat())
		defer c.Release()
	}
}
