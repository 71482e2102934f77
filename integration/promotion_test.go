package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// writeGuarded inserts a row into the protected table promo_rows under tok.
func writeGuarded(ctx context.Context, conn *pgx.Conn, note string, tok int64) error {
	_, err := conn.Exec(ctx, "INSERT INTO promo_rows (note, tok) VALUES ($1, $2)", note, tok)
	return sqlfuncs.Translate(err)
}

// TestPromotionOfStandbyThatMissedGrants: an asynchronous standby that never
// received the last grants of its primary is promoted after the primary
// crashes. Every grant on the promoted server exceeds every token the old
// primary ever returned, also the ones the standby never saw, and writes
// guarded by pre-failover tokens are refused.
func TestPromotionOfStandbyThatMissedGrants(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	pc := connect(t, ctx, primary.URL(), false)
	pAsync := connect(t, ctx, primary.URL(), true)

	const guarded = "promo/a"
	resources := []string{guarded, "promo/b"}
	const unseen = "promo/unseen" // first granted after the standby stopped
	everything := []string{guarded, "promo/b", unseen}
	_, err := pc.Exec(ctx, "CREATE TABLE promo_rows (id bigserial PRIMARY KEY, note text NOT NULL, tok bigint)")
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, pc, "promo_rows", guarded, "tok"))

	granted := newLedger()
	grantRound := func(db *pgx.Conn, res string) {
		t.Helper()
		tok := mustAcquire(t, ctx, db, res, "primary")
		granted.add(res, tok)
		mustRelease(t, ctx, db, res, tok)
		granted.add(res, mustRevoke(t, ctx, db, res))
	}
	for _, res := range resources {
		grantRound(pc, res)
	}

	standby := primary.NewStandby(t)
	for _, res := range resources {
		grantRound(pAsync, res)
	}
	require.NoError(t, writeGuarded(ctx, pc, "before standby stop", granted.max(guarded)))
	primary.WaitCaughtUp(t, standby)
	seen := granted.clone()

	// The standby stops; the primary goes on granting, then crashes.
	standby.Stop(t, "fast")
	for _, res := range resources {
		grantRound(pAsync, res)
		granted.add(res, mustAcquire(t, ctx, pAsync, res, "missed"))
	}
	granted.add(unseen, mustAcquire(t, ctx, pAsync, unseen, "missed"))
	require.NoError(t, writeGuarded(ctx, pc, "missed by standby", granted.max(guarded)))
	oldEpoch := granted.maxEpoch()
	primary.Stop(t, "immediate")
	t.Logf("old primary granted %d tokens (epoch %d); the standby saw %d of them", granted.count(), oldEpoch, seen.count())

	standby.Start(t) // it cannot catch up: its primary is down
	sc := connect(t, ctx, standby.URL(), false)

	t.Run("standby missed the last grants", func(t *testing.T) {
		got := leaseTokens(t, ctx, sc)
		for _, res := range resources {
			require.Equal(t, seen.max(res), got[res], "standby's lease row of %s", res)
			require.Less(t, got[res], granted.max(res))
		}
		require.NotContains(t, got, unseen)
	})

	standby.Promote(t)
	sc = connect(t, ctx, standby.URL(), false)
	require.Equal(t, int64(2), timeline(t, ctx, sc), "promotion moves to timeline 2")

	t.Run("writes under tokens the promoted server never saw are refused", func(t *testing.T) {
		err := writeGuarded(ctx, sc, "missed token", granted.max(guarded))
		require.ErrorIs(t, err, sqlfuncs.ErrUnknownToken)
	})

	after := newLedger()
	t.Run("new grants exceed every token of the old primary", func(t *testing.T) {
		for _, res := range everything {
			r, a := grantAfterFault(t, ctx, sc, granted, res, "after promotion")
			after.add(res, r)
			after.add(res, a)
			require.Greater(t, epochOf(r), oldEpoch, "epoch after promotion, %s", res)
			t.Logf("%s: old max %d (epoch %d) -> new %d (epoch %d)", res, granted.max(res), epochOf(granted.max(res)), a, epochOf(a))
		}
		require.Greater(t, after.all(unseen)[0], granted.max(unseen),
			"the promoted server never saw %s, and its first grant is still above the old primary's", unseen)
	})

	t.Run("pre-failover tokens are stale on the promoted server", func(t *testing.T) {
		for _, res := range everything {
			requireStale(t, ctx, sc, granted, res)
		}
	})

	t.Run("guarded writes under pre-failover tokens are refused", func(t *testing.T) {
		for _, tok := range granted.all(guarded) {
			err := writeGuarded(ctx, sc, "stale", tok)
			require.ErrorIs(t, err, sqlfuncs.ErrStaleToken, "write under token %d", tok)
		}
		require.NoError(t, writeGuarded(ctx, sc, "new holder", after.max(guarded)), "the new token may write")
		var n int64
		require.NoError(t, sc.QueryRow(ctx, "SELECT count(*) FROM promo_rows").Scan(&n))
		require.Equal(t, int64(2), n, "the row the standby saw and the new holder's row; the missed row is gone")
	})
}
