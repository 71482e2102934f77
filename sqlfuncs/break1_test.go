package sqlfuncs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestGrantInASavepointAfterARowLockFailsOlderSnapshots is break 1 of the
// third review of 008 (issue 31), as it was found: a role with usage only
// (not the holder, no operator rights), in one transaction, releases the
// holder's lease under its token (tokens are readable in fence.leases),
// locks the lease row FOR KEY SHARE at the top level with fence.check,
// grants itself the resource inside a savepoint, releases the savepoint and
// commits. The version the grant replaced then carried a MultiXact {key
// share by the top-level xid, FOR UPDATE and a no-key update by the
// subtransaction}; the update-chain walk of a writer's FOR KEY SHARE judged
// each member alone and found no conflict. On 008 every case below
// committed its stale row: REPEATABLE READ and SERIALIZABLE writers whose
// snapshot predates the grant, on a table-wide and a per-row table, and a
// READ COMMITTED statement of 17 resources (past the gate budget, so its
// rows are checked by row locks alone) that waited for the grant's row lock.
// Since 009 the grant is a key update (lease_token_key UNIQUE (token)):
// the snapshot writers fail with 40001, the READ COMMITTED statement
// re-reads the newest version and fails with FN001.
func TestGrantInASavepointAfterARowLockFailsOlderSnapshots(t *testing.T) {
	t.Parallel()
	// attack runs the usage role's transaction on g up to (not including)
	// its COMMIT and returns the new token.
	attack := func(t *testing.T, ctx context.Context, g pgx.Tx, res string, old int64) int64 {
		t.Helper()
		ok, err := sqlfuncs.Release(ctx, g, res, old)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, sqlfuncs.Check(ctx, g, res, old), "the row lock at the top level")
		_, err = g.Exec(ctx, `SAVEPOINT s`)
		require.NoError(t, err)
		tok, ok, err := sqlfuncs.Acquire(ctx, g, res, "G", time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
		require.Greater(t, tok, old)
		_, err = g.Exec(ctx, `RELEASE s`)
		require.NoError(t, err)
		return tok
	}

	for _, form := range []string{"cols", "rows"} {
		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			t.Run(fmt.Sprintf("%s/%s", form, strings.ReplaceAll(string(iso), " ", "_")), func(t *testing.T) {
				t.Parallel()
				f := rt8bSetup(t, "brk1")
				ctx := f.b.ctx
				res := rt8bResource(form, 1)
				old, ok, err := sqlfuncs.Acquire(ctx, f.ac, res, "A", time.Hour)
				require.NoError(t, err)
				require.True(t, ok)

				w := roleConn(t, f.b, f.role) // the old holder, paused
				wtx, err := w.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				require.NoError(t, err)
				defer wtx.Rollback(ctx)
				_, err = wtx.Exec(ctx, `SELECT count(*) FROM rt_free`) // its snapshot
				require.NoError(t, err)

				gtx, err := f.ac.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
				require.NoError(t, err)
				defer gtx.Rollback(ctx)
				attack(t, ctx, gtx, res, old)
				require.NoError(t, gtx.Commit(ctx))

				_, err = wtx.Exec(ctx, rt8bInsert(form, 1, old, "(VALUES (1)) v"))
				if err == nil {
					err = wtx.Commit(ctx)
				}
				require.Error(t, err, "BYPASS: a write under the superseded token committed")
				requireCode(t, err, "40001")
				require.False(t, f.committed(t, "rt_"+form, 1))
			})
		}
	}

	t.Run("rows/read_committed_17_resources", func(t *testing.T) {
		t.Parallel()
		f := rt8bSetup(t, "brk1")
		ctx := f.b.ctx
		toks := make([]int64, 18)
		var vals []string
		for id := 1; id <= 17; id++ {
			tok, ok, err := sqlfuncs.Acquire(ctx, f.ac, rt8bResource("rows", id), "A", time.Hour)
			require.NoError(t, err)
			require.True(t, ok)
			toks[id] = tok
			vals = append(vals, fmt.Sprintf("(%d, %d, %d, 'A')", id, id, tok))
		}

		gtx, err := f.ac.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		defer gtx.Rollback(ctx)
		attack(t, ctx, gtx, rt8bResource("rows", 1), toks[1])

		// The old holder's statement of 17 resources meets the grant's row
		// lock on rtj:1, waits, and goes on once the grant commits.
		w := roleConn(t, f.b, f.role)
		done := make(chan error, 1)
		go func() {
			_, err := w.Exec(ctx, `INSERT INTO rt_rows VALUES `+strings.Join(vals, ", "))
			done <- err
		}()
		waitLockWait(t, ctx, f.b.db.Pool, w.PgConn().PID())
		require.NoError(t, gtx.Commit(ctx))
		err = <-done
		require.Error(t, err, "BYPASS: a write under the superseded token committed")
		requireCode(t, err, "FN001")
		require.False(t, f.committed(t, "rt_rows", 1))
	})
}
