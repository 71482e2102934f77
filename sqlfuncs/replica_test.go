package sqlfuncs_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestFireAlwaysInReplicaMode (issue 19, item 4): a session with
// session_replication_role = replica skips ordinary triggers, the guards
// included. Since PostgreSQL 15 a superuser can GRANT SET on that parameter
// to any role (before, only superusers can set it). docs/security.md of 006
// told owners to ENABLE ALWAYS three trigger names, which covered only the
// table-wide form: per-row tables check in other triggers. fence.fire_always
// makes every guard of either form fire in replica mode; fence.protect and
// fence.protect_rows keep it, and fence.protected shows it.
func TestFireAlwaysInReplicaMode(t *testing.T) {
	t.Parallel()
	f := rowsStory(t) // items and pitems, per row
	b, ctx := f.b, f.b.ctx
	_, t2 := staleStory(t, b, "res") // cols and plain, table-wide
	var writer *pgxpool.Pool
	if serverVersion(t, ctx, b.db.Pool) >= 150000 {
		b.exec(t, `GRANT SET ON PARAMETER session_replication_role TO `+f.aSchema)
		t.Cleanup(func() { // a parameter's privileges are global: they would keep the role from being dropped
			_, err := b.db.Pool.Exec(context.Background(), `REVOKE SET ON PARAMETER session_replication_role FROM `+f.aSchema)
			require.NoError(t, err)
		})
		b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON cols, plain TO `+f.aSchema)
		writer = f.aPool
	} else {
		writer = b.db.Pool // only superusers can choose replica mode before 15
	}
	replica := []string{`SET LOCAL session_replication_role = replica`}
	stale := []string{
		f.sql(`UPDATE items SET val = 'stale', tok = {t1} WHERE id = 1`),
		`UPDATE pitems SET val = 'stale' WHERE id = 1`,
		`DELETE FROM items WHERE id = 4`,
		`TRUNCATE pitems`,
		fmt.Sprintf(`UPDATE cols SET val = 'stale', tok = %d WHERE id = 1`, t2-1),
		`UPDATE plain SET val = 'stale' WHERE id = 1`,
		`TRUNCATE plain`,
	}
	t.Run("replica mode skips guards that do not fire always", func(t *testing.T) {
		for _, w := range stale {
			_, err := attemptRolledBack(ctx, writer, pgx.ReadCommitted, replica, w, `SELECT 'x'`)
			require.NoError(t, err, "%s: PostgreSQL skips ordinary triggers in replica mode", w)
		}
	})
	for _, tbl := range []string{"items", "pitems", "cols", "plain"} {
		require.NoError(t, sqlfuncs.FireAlways(ctx, b.db.Pool, tbl, true))
	}
	check := func(t *testing.T) {
		t.Helper()
		for _, w := range stale {
			requireOneOf(t, attempt(ctx, writer, pgx.ReadCommitted, replica, w), "FN001|FN002|FN003")
		}
		var all bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT bool_and(fires_always) FROM fence.protected`).Scan(&all))
		require.True(t, all, "fence.protected shows it")
	}
	t.Run("every guard fires in replica mode", check)
	t.Run("protecting again keeps it", func(t *testing.T) {
		require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "items", "job", "job:", "tok"))
		require.NoError(t, sqlfuncs.Protect(ctx, b.db.Pool, "plain", "res", ""))
		check(t)
	})
	t.Run("only the owner", func(t *testing.T) {
		err := sqlfuncs.FireAlways(ctx, f.aPool, "items", false)
		requireCode(t, err, "42501")
		err = sqlfuncs.FireAlways(ctx, b.db.Pool, "toks_not_protected", true)
		requireCode(t, err, "42P01")
		b.exec(t, `CREATE TABLE unguarded (id int)`)
		err = sqlfuncs.FireAlways(ctx, b.db.Pool, "unguarded", true)
		requireCode(t, err, "55000")
	})
	t.Run("and back", func(t *testing.T) {
		require.NoError(t, sqlfuncs.FireAlways(ctx, b.db.Pool, "items", false))
		var always bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT fires_always FROM fence.protected WHERE tbl = 'items'::regclass`).Scan(&always))
		require.False(t, always)
	})
}
