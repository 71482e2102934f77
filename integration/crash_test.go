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

// TestGrantSurvivesCrashWhenTheCallerPlantsAnEqualsOperator (issue 10 item
// 9): fence._durable runs at COMMIT under the caller's search_path. An
// application role plants "=" and "<>" (text, text) operators that answer
// false in its own schema, puts that schema before pg_catalog, acquires a
// lease, turns synchronous_commit off for the rest of the transaction and
// commits. Migration 002 compared the setting with an unqualified "=", so
// the planted operator kept the commit asynchronous: the grant vanished in
// the crash and the same token was handed out again.
func TestGrantSurvivesCrashWhenTheCallerPlantsAnEqualsOperator(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Config: map[string]string{
		"wal_writer_delay": "'10s'", // an asynchronous commit stays unflushed until the crash
	}})
	const app = "planter"
	admin := connect(t, ctx, c.URL(), false)
	for _, sql := range []string{
		`CREATE ROLE ` + app + ` LOGIN`,
		`CREATE SCHEMA evil AUTHORIZATION ` + app,
		`SELECT fence.grant_usage('` + app + `')`,
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	admin.Close(ctx)

	conn := connect(t, ctx, c.URLAs(app), false)
	for _, sql := range []string{
		`CREATE FUNCTION evil.never(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT false'`,
		`CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.never)`,
		`CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.never)`,
		`SET search_path = evil, pg_catalog`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}

	t.Run("the planted operators are what this session resolves", func(t *testing.T) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // read-only probe
		_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
		require.NoError(t, err)
		// The comparison of migration 002's fence._durable, verbatim.
		var eq, ne bool
		require.NoError(t, tx.QueryRow(ctx,
			`SELECT pg_catalog.current_setting('synchronous_commit') = 'off', pg_catalog.current_setting('synchronous_commit') <> 'off'`).
			Scan(&eq, &ne))
		require.False(t, eq, "the planted = answers false")
		require.False(t, ne, "the planted <> answers false")
	})

	var first int64
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var ok bool
		var err error
		first, ok, err = sqlfuncs.Acquire(ctx, tx, "planted-eq", "holder-1", time.Hour)
		if err != nil {
			return err
		}
		require.True(t, ok)
		_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
		return err
	}))
	require.Positive(t, first)
	conn.Close(ctx)
	c.Stop(t, "immediate")
	c.Start(t)

	conn = connect(t, ctx, c.URL(), false)
	var token int64
	require.NoError(t, conn.QueryRow(ctx, `SELECT token FROM fence.leases WHERE resource = 'planted-eq'`).Scan(&token),
		"the grant was lost in the crash")
	require.Equal(t, first, token)
	revoked, err := sqlfuncs.Revoke(ctx, conn, "planted-eq")
	require.NoError(t, err)
	require.Greater(t, revoked, first, "a token is never handed out twice")
	second := mustAcquire(t, ctx, conn, "planted-eq", "holder-2")
	require.Greater(t, second, revoked)
}
