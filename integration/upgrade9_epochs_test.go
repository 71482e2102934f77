package integration

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestUpgradeFrom008KeepsTheEpochAndTheCounter (issue 31, breaks 2 and 3):
// migration 9's epoch section on a database that granted at version 8. The
// upgrade stores fence.origin again with the columns that name its writer
// and its backup_label.old, so the database stays at home: the next grant
// after it is in the same epoch with the next counter value (no new epoch,
// no move of 2^32), and a role granted usage at version 8 reads
// fence.token_budget(). The down gives back exactly version 8's catalog and
// keeps the epoch and the counter too, and a second upgrade the same. A
// cache whose file was empty at the upgrade (no grant since a crash
// recovery) stays empty, so the first grant still moves the counter.
func TestUpgradeFrom008KeepsTheEpochAndTheCounter(t *testing.T) {
	t.Parallel()
	t.Run("granted since the last start", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		db := pgtest.Empty(t)
		app := pgtest.NewRole(t, "app")
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
		require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
		appConn := connect(t, ctx, db.URLAs(app), false)
		book := newGrantBook(t)
		lease, ok, err := sqlfuncs.Acquire(ctx, appConn, "up9/held", "app", time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
		book.per.add("up9/held", lease)
		book.where[lease] = "version 8"
		var last int64
		for range 3 {
			last = book.grant(ctx, db.Pool, "up9/r", "version 8")
		}
		catalog8 := kitCatalog(t, ctx, db.Pool)

		next := func(what string) {
			t.Helper()
			tok := book.grant(ctx, db.Pool, "up9/r", what)
			require.Equal(t, epochOf(last), epochOf(tok), "%s: the same epoch", what)
			require.Equal(t, counterOf(last)+1, counterOf(tok), "%s: the next counter value", what)
			last = tok
		}
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 9))
		next("after the upgrade")
		budget, err := sqlfuncs.TokenBudget(ctx, appConn)
		require.NoError(t, err, "a role granted usage at version 8 reads the budget")
		require.Equal(t, epochOf(last), budget.Epoch)
		require.Equal(t, counterOf(last), budget.Counter)
		require.NoError(t, sqlfuncs.Check(ctx, appConn, "up9/held", lease), "the lease granted at version 8 stays valid")

		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
		require.Equal(t, catalog8, kitCatalog(t, ctx, db.Pool), "the down gives back version 8 exactly")
		next("after the down")
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 9))
		next("after the second upgrade")
		require.NoError(t, sqlfuncs.Check(ctx, appConn, "up9/held", lease))
	})
	t.Run("no grant since a crash recovery", func(t *testing.T) {
		t.Parallel()
		ctx := testContext(t)
		db := pgtest.Empty(t)
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
		book := newGrantBook(t)
		last := book.grant(ctx, db.Pool, "up9/r", "version 8")
		// What crash recovery leaves: an empty file of the unlogged cache.
		_, err := db.Pool.Exec(ctx, `TRUNCATE fence.epoch_cache`)
		require.NoError(t, err)
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 9))
		tok := book.grant(ctx, db.Pool, "up9/r", "after the upgrade")
		require.Equal(t, epochOf(last), epochOf(tok))
		require.Equal(t, counterOf(last)+1<<32+1, counterOf(tok), "the first grant after the crash still moves the counter")
	})
}
