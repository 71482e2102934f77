package integration

import (
	"time"

	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestGrantsSurviveCrash: tokens returned before a crash (pg_ctl stop -m
// immediate right after the last grant returned) are never handed out again
// after crash recovery, also when the granting sessions ran with
// synchronous_commit = off.
func TestGrantsSurviveCrash(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Config: map[string]string{
		// The WAL writer flushes asynchronous commits at most every 10s,
		// so an async commit made just before the crash is lost: a grant
		// that did not force synchronous_commit back on would be lost too.
		"wal_writer_delay": "'10s'",
	}})

	sessions := []*pgx.Conn{
		connect(t, ctx, c.URL(), false),
		connect(t, ctx, c.URL(), true),
		connect(t, ctx, c.URL(), true),
	}
	probe := sessions[2]
	_, err := sessions[0].Exec(ctx, "CREATE TABLE async_probe (v int)")
	require.NoError(t, err)

	t.Run("grant forces synchronous_commit on in an async session", func(t *testing.T) {
		tx, err := sessions[1].Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // rolled back on failure only
		var before, after string
		require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&before))
		_, err = sqlfuncs.Revoke(ctx, tx, "crash/sync-probe")
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
		require.Equal(t, "off", before)
		require.Equal(t, "on", after, "the granting transaction must commit synchronously")
		require.NoError(t, tx.Commit(ctx))
	})

	resources := []string{"crash/r0", "crash/r1", "crash/r2", "crash/r3"}
	before := newLedger()
	// Rounds of grants: acquire + release and revoke, rotated over sessions
	// with synchronous_commit on and off.
	const rounds = 6
	for i := range rounds {
		for j, res := range resources {
			db := sessions[(i+j)%len(sessions)]
			if (i+j)%2 == 0 {
				tok := mustAcquire(t, ctx, db, res, fmt.Sprintf("h%d", i))
				before.add(res, tok)
				mustRelease(t, ctx, db, res, tok)
			} else {
				before.add(res, mustRevoke(t, ctx, db, res))
			}
		}
	}
	// The last grant of every resource comes from an async session and stays
	// live across the crash.
	for _, res := range resources {
		before.add(res, mustAcquire(t, ctx, sessions[1], res, "last"))
	}
	// An ordinary async commit after the last grant: the control that shows
	// this crash does lose what was not flushed.
	_, err = probe.Exec(ctx, "INSERT INTO async_probe VALUES (1)")
	require.NoError(t, err)
	epochBefore := epochOf(before.max(resources[0]))
	c.Stop(t, "immediate")
	t.Logf("crashed after %d grants on %d resources (epoch %d)", before.count(), len(resources), epochBefore)
	c.Start(t)

	conn := connect(t, ctx, c.URL(), false)
	var probeRows int64
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM async_probe").Scan(&probeRows))
	t.Logf("control: the async commit made after the last grant survived the crash: %v", probeRows == 1)

	t.Run("returned grants are durable", func(t *testing.T) {
		got := leaseTokens(t, ctx, conn)
		for _, res := range resources {
			require.Equal(t, before.max(res), got[res], "fence.lease of %s after crash recovery", res)
		}
	})

	after := newLedger()
	t.Run("new grants exceed every token granted before the crash", func(t *testing.T) {
		for _, res := range resources {
			r, a := grantAfterFault(t, ctx, conn, before, res, "after crash")
			after.add(res, r)
			after.add(res, a)
			require.Equal(t, epochBefore, epochOf(a), "crash recovery keeps the timeline, so the epoch")
		}
	})

	t.Run("tokens from before the crash are stale", func(t *testing.T) {
		for _, res := range resources {
			requireStale(t, ctx, conn, before, res)
			require.NoError(t, sqlfuncs.Check(ctx, conn, res, after.max(res)), "the newest token is valid")
		}
	})

	t.Run("brand-new resource gets a token of the current epoch above every earlier token", func(t *testing.T) {
		tok := mustAcquire(t, ctx, conn, "crash/new", "fresh")
		epoch := currentEpoch(t, ctx, conn)
		require.Positive(t, tok)
		require.Equal(t, epoch, epochOf(tok), "token %d", tok)
		for _, res := range resources {
			require.Greater(t, tok, after.max(res), "tokens are unique across resources: one counter for all")
		}
		require.Equal(t, epochBefore, epoch)
	})
}

// TestGrantSurvivesCrashWhenTheCallerTurnsAsyncCommitOnAfterwards: a caller
// that sets synchronous_commit = off later in the granting transaction (SET
// LOCAL after fence.acquire) must not make the grant asynchronous: the
// deferred trigger lease_durable turns it back on at commit. Without it the
// grant is lost in the crash and the same token is handed out again (found
// by review).
func TestGrantSurvivesCrashWhenTheCallerTurnsAsyncCommitOnAfterwards(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Config: map[string]string{
		"wal_writer_delay": "'10s'", // an asynchronous commit stays unflushed until the crash
	}})
	conn := connect(t, ctx, c.URL(), false)
	var first int64
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var ok bool
		var err error
		first, ok, err = sqlfuncs.Acquire(ctx, tx, "late-async", "holder-1", time.Hour)
		require.True(t, ok)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
		return err
	}))
	conn.Close(ctx)
	c.Stop(t, "immediate")
	c.Start(t)

	conn = connect(t, ctx, c.URL(), false)
	var token int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT token FROM fence.leases WHERE resource = 'late-async'`).Scan(&token),
		"the grant was lost in the crash")
	require.Equal(t, first, token)
	_, err := sqlfuncs.Revoke(ctx, conn, "late-async")
	require.NoError(t, err)
	second := mustAcquire(t, ctx, conn, "late-async", "holder-2")
	require.Greater(t, second, first)
}
