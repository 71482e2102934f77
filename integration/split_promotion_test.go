package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Issue 10, item 8: two standbys of one primary are promoted one after the
// other. What the second one's tokens look like depends on whether it can
// see the timeline the first one created (docs/design.md, "Two promotions
// from one timeline").

// splitResources are granted on the old primary and on both promoted servers.
var splitResources = []string{"split/a", "split/b"}

// splitPromotion is what one run of the scenario saw.
type splitPromotion struct {
	primary       *ledger // every token the old primary granted
	first, second *ledger // the grants of the first and second promoted standby
	tli1, tli2    int64   // their timelines after promotion
	conn1, conn2  *pgx.Conn
}

// runSplitPromotion: a primary grants; two asynchronous standbys catch up;
// the primary crashes (immediate stop); standby 1 is promoted and grants;
// beforeSecond runs; standby 2 is promoted and grants. Both standbys replay
// the same WAL, so they start from the same lease rows and token counter.
func runSplitPromotion(t *testing.T, ctx context.Context, opts pgtest.ClusterOptions, beforeSecond func(s1, s2 *pgtest.Cluster)) splitPromotion {
	t.Helper()
	r := splitPromotion{primary: newLedger(), first: newLedger(), second: newLedger()}
	primary := pgtest.NewCluster(t, opts)
	pc := connect(t, ctx, primary.URL(), false)
	grantRound := func(res string) {
		tok := mustAcquire(t, ctx, pc, res, "primary")
		r.primary.add(res, tok)
		mustRelease(t, ctx, pc, res, tok)
		r.primary.add(res, mustRevoke(t, ctx, pc, res))
	}
	for _, res := range splitResources {
		grantRound(res)
	}
	s1 := primary.NewStandby(t)
	s2 := primary.NewStandby(t)
	for _, res := range splitResources {
		grantRound(res) // streamed to both standbys
	}
	primary.WaitCaughtUp(t, s1)
	primary.WaitCaughtUp(t, s2)
	primary.Stop(t, "immediate")

	s1.Promote(t)
	r.conn1 = connect(t, ctx, s1.URL(), false)
	r.tli1 = timeline(t, ctx, r.conn1)
	for _, res := range splitResources {
		tok := mustAcquire(t, ctx, r.conn1, res, "holder-on-standby-1")
		requireAbove(t, r.primary, res, tok, "first promoted standby")
		r.first.add(res, tok)
	}

	if beforeSecond != nil {
		beforeSecond(s1, s2)
	}
	s2.Promote(t)
	r.conn2 = connect(t, ctx, s2.URL(), false)
	r.tli2 = timeline(t, ctx, r.conn2)
	for _, res := range splitResources {
		tok, ok, err := sqlfuncs.Acquire(ctx, r.conn2, res, "holder-on-standby-2", leaseTTL)
		require.NoError(t, err, "acquire %s on standby 2", res)
		if !ok {
			// Standby 2 replayed standby 1's grant (it followed standby
			// 1's timeline), so the lease is live: take it over.
			r.second.add(res, mustRevoke(t, ctx, r.conn2, res))
			tok = mustAcquire(t, ctx, r.conn2, res, "holder-on-standby-2")
		}
		requireAbove(t, r.primary, res, tok, "second promoted standby")
		r.second.add(res, tok)
	}
	return r
}

// requireSecondAboveFirst: the second promoted server's timeline and every
// token it granted exceed the first one's, and the first one's tokens are
// stale on it.
func requireSecondAboveFirst(t *testing.T, ctx context.Context, r splitPromotion) {
	t.Helper()
	require.Equal(t, int64(2), r.tli1, "first promotion moves to timeline 2")
	require.Equal(t, int64(3), r.tli2, "second promotion knows timeline 2 and takes timeline 3")
	for _, res := range splitResources {
		t1, t2 := r.first.max(res), r.second.max(res)
		t.Logf("%s: standby 1 granted %d (epoch %d, counter %d); standby 2 granted %d (epoch %d, counter %d)",
			res, t1, epochOf(t1), counterOf(t1), t2, epochOf(t2), counterOf(t2))
		require.Greater(t, epochOf(t2), epochOf(t1), "%s: epoch of the second promoted server", res)
		for _, tok := range r.second.all(res) {
			requireAbove(t, r.first, res, tok, "second promoted standby, over the first one's grants")
		}
		err := sqlfuncs.Check(ctx, r.conn2, res, t1)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken, "%s: standby 1's token is stale on standby 2", res)
	}
}

// TestSplitPromotionWithoutArchiveDuplicatesTokens is a characterization
// test of a documented limitation (docs/design.md, "Two promotions from one
// timeline"): without a shared WAL archive, the second standby cannot know
// that the first one took timeline 2, takes timeline 2 too, and hands out
// exactly the tokens the first one handed out. If this test fails, the
// behaviour changed: update the documentation (and pgfence doctor) with it.
func TestSplitPromotionWithoutArchiveDuplicatesTokens(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	r := runSplitPromotion(t, ctx, pgtest.ClusterOptions{}, nil)

	require.Equal(t, int64(2), r.tli1, "first promotion moves to timeline 2")
	require.Equal(t, int64(2), r.tli2, "second promotion, from the same timeline without the first one's history file, also takes timeline 2")
	for _, res := range splitResources {
		t1, t2 := r.first.max(res), r.second.max(res)
		t.Logf("%s: old primary's last token %d (epoch %d); standby 1 granted %d (epoch %d, counter %d); standby 2 granted %d (epoch %d, counter %d)",
			res, r.primary.max(res), epochOf(r.primary.max(res)), t1, epochOf(t1), counterOf(t1), t2, epochOf(t2), counterOf(t2))
		require.Equal(t, t1, t2, "%s: DOCUMENTED LIMITATION: two servers promoted from one timeline without a shared archive grant the same token", res)
		// The duplicate is accepted: standby 1's holder, reconnected to
		// standby 2, passes the check of a lease granted to someone else.
		require.NoError(t, sqlfuncs.Check(ctx, r.conn2, res, t1), "%s: standby 2 accepts the token standby 1 granted", res)
	}
	t.Logf("DOCUMENTED LIMITATION (issue 10 item 8): both promoted servers are on timeline %d and granted the same tokens; see docs/design.md", r.tli2)
}

// TestSplitPromotionWithSharedArchive: with archive_mode on, every server
// archiving into one directory and every standby restoring from it
// (restore_command, recovery_target_timeline = 'latest'), the first promoted
// standby archives 00000002.history; once it is there, the second standby's
// promotion takes timeline 3 and every token it grants exceeds every token
// of the first one, and the first one's tokens are stale on it.
func TestSplitPromotionWithSharedArchive(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	archive := pgtest.NewWALArchive(t)
	require.Regexp(t, `^[A-Za-z0-9/._-]+$`, archive, "the archive path goes unquoted into shell commands")
	q := func(s string) string { return "'" + s + "'" }
	opts := pgtest.ClusterOptions{Config: map[string]string{
		"archive_mode":             "on",
		"archive_command":          q(fmt.Sprintf("test ! -f %s/%%f && cp %%p %s/%%f", archive, archive)),
		"restore_command":          q(fmt.Sprintf("cp %s/%%f %%p", archive)),
		"recovery_target_timeline": q("latest"),
	}}
	r := runSplitPromotion(t, ctx, opts, func(s1, s2 *pgtest.Cluster) {
		// The second promotion is safe only once the first one's history
		// file is in the archive: wait for the archiver of standby 1.
		waitArchived(t, ctx, archive, "00000002.history")
	})
	requireSecondAboveFirst(t, ctx, r)
}

// TestSplitPromotionOfStandbyThatFollowsTheNewPrimary: without an archive,
// standby 2 is re-pointed at the promoted standby 1 (what a failover
// manager does with the other standbys) before it is promoted in turn. It
// fetches 00000002.history over streaming replication, follows timeline 2,
// and its promotion takes timeline 3.
func TestSplitPromotionOfStandbyThatFollowsTheNewPrimary(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	r := runSplitPromotion(t, ctx, pgtest.ClusterOptions{}, func(s1, s2 *pgtest.Cluster) {
		c2 := connect(t, ctx, s2.URL(), false)
		_, err := c2.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=%d user=postgres'", s1.Port()))
		require.NoError(t, err)
		// A standby built from a copy of the data directory (no
		// pg_basebackup of the server's version here) streams through a
		// replication slot of the old primary, which standby 1 does not have.
		_, err = c2.Exec(ctx, "ALTER SYSTEM SET primary_slot_name = ''")
		require.NoError(t, err)
		_, err = c2.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
		// It can follow only if it did not replay past the point where
		// standby 1 left timeline 1 (both caught up with the primary before
		// it stopped, so it did not): wait until it streams timeline 2.
		pollUntil(t, ctx, "standby 2 streams timeline 2 from standby 1", func() bool {
			var tli *int64
			require.NoError(t, c2.QueryRow(ctx, "SELECT (SELECT received_tli::bigint FROM pg_stat_wal_receiver WHERE status = 'streaming')").Scan(&tli))
			return tli != nil && *tli == 2
		})
	})
	requireSecondAboveFirst(t, ctx, r)
}

// pollUntil calls cond until it returns true, or fails the test when ctx
// ends first.
func pollUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: gave up: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitArchived waits until the archive directory holds file name (what the
// archiver of a promoted server copies there), or ctx ends.
func waitArchived(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	pollUntil(t, ctx, name+" reaches the WAL archive "+dir, func() bool {
		_, err := os.Stat(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return false
		}
		require.NoError(t, err)
		return true
	})
}
