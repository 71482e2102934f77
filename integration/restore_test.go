package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestDumpRestoreIntoFreshCluster: the fence database of cluster A is dumped
// (pg_dump -Fc, or through the server where no pg_dump of the server's
// version exists: see dumpFence), A grants more (those grants are lost), and the dump is
// restored into a fresh cluster B (new system identifier, timeline 1 again).
// Grants on B exceed every token of the dump and every token A granted after
// the dump.
func TestDumpRestoreIntoFreshCluster(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	a := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	ac := connect(t, ctx, a.URL(), false)

	resources := []string{"restore/x", "restore/y"}
	const lostOnly = "restore/z" // first granted on A after the dump
	everything := []string{"restore/x", "restore/y", lostOnly}
	granted := newLedger()
	for range 3 {
		for _, res := range resources {
			tok := mustAcquire(t, ctx, ac, res, "A")
			granted.add(res, tok)
			mustRelease(t, ctx, ac, res, tok)
			granted.add(res, mustRevoke(t, ctx, ac, res))
		}
	}
	dumped := granted.clone()
	sysidA := systemIdentifier(t, ctx, ac)

	dump := dumpFence(t, ctx, ac, a.URL())

	// Grants after the dump: a restore of the dump loses them.
	for _, res := range everything {
		granted.add(res, mustAcquire(t, ctx, ac, res, "A-after-dump"))
	}
	require.Equal(t, int64(1), timeline(t, ctx, ac), "A stays on timeline 1 after the dump")
	maxEpochA := granted.maxEpoch()
	t.Logf("A (system identifier %d): %d tokens in the dump, %d in all, max epoch %d",
		sysidA, dumped.count(), granted.count(), maxEpochA)

	b := pgtest.NewCluster(t, pgtest.ClusterOptions{NoMigrate: true})
	bc := connect(t, ctx, b.URL(), false)
	sysidB := systemIdentifier(t, ctx, bc)
	require.NotEqual(t, sysidA, sysidB)

	t.Run("restore of the fence database succeeds", func(t *testing.T) {
		out := restoreFence(t, ctx, dump, b.URL())
		if out != "" {
			t.Logf("pg_restore output:\n%s", out)
		}
		v, err := sqlfuncs.Version(ctx, bc)
		require.NoError(t, err)
		require.Positive(t, v)
	})
	bc = connect(t, ctx, b.URL(), false) // a fresh session sees the restored schema from scratch

	t.Run("restored state is the dump", func(t *testing.T) {
		got := leaseTokens(t, ctx, bc)
		for _, res := range resources {
			require.Equal(t, dumped.max(res), got[res], "restored lease row of %s", res)
		}
		require.NotContains(t, got, lostOnly)
		st := readEpochState(t, ctx, bc)
		require.Equal(t, sysidA, st.sysid, "epoch_state still describes A before the first grant on B")
		require.Equal(t, int64(1), timeline(t, ctx, bc), "a fresh cluster is on timeline 1")
	})

	after := newLedger()
	t.Run("grants on B exceed the dump and A's later grants", func(t *testing.T) {
		for _, res := range everything {
			r, acq := grantAfterFault(t, ctx, bc, granted, res, "after restore")
			after.add(res, r)
			after.add(res, acq)
			require.Greater(t, epochOf(r), maxEpochA, "epoch on B, %s", res)
			t.Logf("%s: max on A %d (epoch %d) -> on B %d (epoch %d)", res, granted.max(res), epochOf(granted.max(res)), acq, epochOf(acq))
		}
		st := readEpochState(t, ctx, bc)
		require.Equal(t, sysidB, st.sysid, "the first grant on B adopts B's system identifier")
		require.Equal(t, int64(1), st.timeline)
		require.GreaterOrEqual(t, st.base, maxEpochA, "the base moves past every epoch A used")
	})

	t.Run("tokens of A are stale on B", func(t *testing.T) {
		for _, res := range everything {
			requireStale(t, ctx, bc, granted, res)
		}
	})
}

// TestDumpRestoreIntoSameCluster restores the dump into another database of
// the cluster it came from (the same as restoring over the lost database in
// place): same system identifier, same timeline. The tokens granted after the
// dump are lost; fence._epoch must notice the restored copy (the OID of
// fence.epoch_state changed) and move to a new epoch, instead of handing out
// again tokens that the source database had already returned. (This test
// found that gap in the first version of migration 001.)
func TestDumpRestoreIntoSameCluster(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	conn := connect(t, ctx, c.URL(), false)

	const res = "same/x"
	granted := newLedger()
	granted.add(res, mustRevoke(t, ctx, conn, res))
	dump := dumpFence(t, ctx, conn, c.URL())
	granted.add(res, mustRevoke(t, ctx, conn, res)) // lost by the restore
	granted.add(res, mustRevoke(t, ctx, conn, res)) // lost by the restore

	_, err := conn.Exec(ctx, "CREATE DATABASE fence_restored")
	require.NoError(t, err)
	url := pgtest.URLFor(c.URL(), "fence_restored")
	restoreFence(t, ctx, dump, url)
	rc := connect(t, ctx, url, false)

	tok, err := sqlfuncs.Revoke(ctx, rc, res)
	require.NoError(t, err)
	t.Logf("%s: tokens on the source %v, first grant on the restored copy %d", res, granted.all(res), tok)
	requireAbove(t, granted, res, tok, "after a restore into the same cluster")
}

// TestForgedSystemIdentifierSettingDoesNotHideARestore: a restored copy is
// recognised by its state row (fence.epoch_state), which names the cluster
// it was written on by its system identifier. Up to migration 5 the grant's
// unlocked fast path compared that identifier with a per-session cache kept
// in the setting fence._system_identifier, which any role can SET. A role
// that set it to the source cluster's identifier (pg_control_system() is
// readable by every role there) kept a data-only restore into an identically
// migrated fresh cluster (same OID of fence.epoch_state, same timeline) on
// the source's epoch, and could be granted tokens the source had granted
// after the dump. The restore is simulated by writing another identifier
// into the state row; the forging session is an application role with
// usage.
func TestForgedSystemIdentifierSettingDoesNotHideARestore(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Setup(t)
	app := pgtest.NewRole(t, "app")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	appConn := connect(t, ctx, db.URLAs(app), false)

	first := mustAcquire(t, ctx, appConn, "forge/a", "app")
	var source int64
	// What a restore of another cluster's data looks like: its state row,
	// and no cache this server validated (crash recovery empties it; a
	// restored copy names the source).
	require.NoError(t, db.Pool.QueryRow(ctx,
		`UPDATE fence.epoch_state SET system_identifier = system_identifier + 1 RETURNING system_identifier`).Scan(&source))
	_, err := db.Pool.Exec(ctx, `DELETE FROM fence.epoch_cache`)
	require.NoError(t, err)
	_, err = appConn.Exec(ctx, `SELECT set_config('fence._system_identifier', $1::bigint::text, false)`, source)
	require.NoError(t, err)

	second := mustAcquire(t, ctx, appConn, "forge/b", "app")
	require.Greater(t, epochOf(second), epochOf(first),
		"the state row names another cluster: the grant moves to a new epoch, whatever the session's settings say")
	require.Equal(t, systemIdentifier(t, ctx, appConn), readEpochState(t, ctx, db.Pool).sysid,
		"and the state row names this cluster again")
}

// TestTemplateCopyStartsANewEpoch (issue 19, item 5): CREATE DATABASE ...
// TEMPLATE copies the kit byte for byte: the system identifier, the
// timeline, every OID, fence.epoch_state and the counter, so on 006 nothing
// told the copy from the original, and the copy granted again the tokens
// the original granted after the copy (put in place of the original, or
// written by the same workers, two holders of one token). The copy has
// another database OID, and fence.origin names the database the kit was
// installed in: the copy's first grant moves to a new epoch, above every
// token of the original's epoch. Also when the original never granted
// before the copy.
func TestTemplateCopyStartsANewEpoch(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	admin := connect(t, ctx, c.AdminURL(), false)
	copyOf := func(t *testing.T, name string, before func(conn *pgx.Conn)) (orig, cp *pgx.Conn) {
		t.Helper()
		src := connect(t, ctx, c.URL(), false)
		before(src)
		require.NoError(t, src.Close(ctx)) // CREATE DATABASE needs the template idle
		_, err := admin.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE fence`)
		require.NoError(t, err)
		orig, err = pgx.Connect(ctx, c.URL())
		require.NoError(t, err)
		cp, err = pgx.Connect(ctx, pgtest.URLFor(c.URL(), name))
		require.NoError(t, err)
		t.Cleanup(func() { // before the next copy of the template
			_ = orig.Close(context.WithoutCancel(ctx))
			_ = cp.Close(context.WithoutCancel(ctx))
		})
		return orig, cp
	}

	t.Run("the original never granted", func(t *testing.T) {
		orig, cp := copyOf(t, "copy_fresh", func(*pgx.Conn) {})
		o1 := mustAcquire(t, ctx, orig, "copy/a", "original")
		o2 := mustAcquire(t, ctx, orig, "copy/b", "original")
		c1 := mustAcquire(t, ctx, cp, "copy/a", "copy")
		require.Greater(t, epochOf(c1), epochOf(o2), "the copy's first grant is in a later epoch than the original's grants")
		require.Greater(t, c1, max(o1, o2))
	})

	t.Run("the original granted before and after the copy", func(t *testing.T) {
		var before int64
		orig, cp := copyOf(t, "copy_used", func(src *pgx.Conn) {
			before = mustAcquire(t, ctx, src, "copy/c", "original")
		})
		after := newLedger()
		for range 3 {
			after.add("copy/d", mustRevoke(t, ctx, orig, "copy/d"))
		}
		tok := mustRevoke(t, ctx, cp, "copy/d")
		requireAbove(t, after, "copy/d", tok, "the copy's first grant")
		require.Greater(t, tok, before)
		require.Greater(t, epochOf(tok), after.maxEpoch())
		// The copy is at home now: its next grants stay in its epoch.
		next := mustRevoke(t, ctx, cp, "copy/d")
		require.Equal(t, epochOf(tok), epochOf(next))
		// And the original was never moved.
		require.Equal(t, epochOf(before), epochOf(mustRevoke(t, ctx, orig, "copy/d")))
	})
}
