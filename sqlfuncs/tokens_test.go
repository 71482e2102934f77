package sqlfuncs_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestSeveralTokensInOneTransaction: BeginWithTokens and UseTokens register
// the tokens of several resources in one statement, so that one transaction
// may write rows of all of them to a table protected per row; each holds its
// resource's gate to the end of the transaction; a stale token among them
// refuses the lot; lists that do not pair up are refused before anything is
// sent.
func TestSeveralTokensInOneTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	b.exec(t, `CREATE TABLE inv (id int PRIMARY KEY, note text NOT NULL)`)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "inv", "id", "inv:", ""))
	t1 := acquireWhenFree(t, ctx, b.db.Pool, "inv:1", "A", time.Minute)
	t2 := acquireWhenFree(t, ctx, b.db.Pool, "inv:2", "A", time.Minute)
	resources, tokens := []string{"inv:1", "inv:2"}, []int64{t1, t2}
	conn := b.db.Conn(t)
	count := func() (n int) {
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM inv`).Scan(&n))
		return n
	}

	t.Run("BeginWithTokens registers every token before the first statement", func(t *testing.T) {
		tx, err := sqlfuncs.BeginWithTokens(ctx, conn, pgx.TxOptions{}, resources, tokens)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = tx.Exec(ctx, `INSERT INTO inv VALUES (1, 'one'), (2, 'two')`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 2, count())
	})

	t.Run("UseTokens in a transaction holds every gate until it ends", func(t *testing.T) {
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		require.NoError(t, sqlfuncs.UseTokens(ctx, tx, resources, tokens))
		_, err = tx.Exec(ctx, `UPDATE inv SET note = note || '!'`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `DELETE FROM inv WHERE id = 2`)
		require.NoError(t, err, "DELETE takes its token from use_token")

		g := b.db.Conn(t)
		var gpid uint32
		require.NoError(t, g.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&gpid))
		revoked := make(chan error, 1)
		go func() { _, err := sqlfuncs.Revoke(ctx, g, "inv:2"); revoked <- err }()
		waitLockWait(t, ctx, b.db.Pool, gpid) // the gate of the second resource is held too
		require.NoError(t, tx.Commit(ctx))
		require.NoError(t, <-revoked)
		require.Equal(t, 1, count())
	})

	t.Run("a stale token among them refuses the lot", func(t *testing.T) {
		// inv:2 was revoked above: t2 is stale.
		_, err := sqlfuncs.BeginWithTokens(ctx, conn, pgx.TxOptions{}, resources, tokens)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken)
		require.ErrorContains(t, err, "inv:2")
		require.Equal(t, byte('I'), conn.PgConn().TxStatus(), "the aborted transaction was rolled back")

		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		err = sqlfuncs.UseTokens(ctx, tx, resources, tokens)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken)
		_, err = tx.Exec(ctx, `SELECT 1`)
		requireCode(t, err, "25P02") // the transaction is aborted
	})

	t.Run("lists that do not pair up are refused before anything is sent", func(t *testing.T) {
		for _, c := range []struct {
			res  []string
			toks []int64
		}{{resources, tokens[:1]}, {nil, nil}, {[]string{}, []int64{}}} {
			_, err := sqlfuncs.BeginWithTokens(ctx, conn, pgx.TxOptions{}, c.res, c.toks)
			require.Error(t, err)
			require.Equal(t, byte('I'), conn.PgConn().TxStatus(), "no BEGIN was sent")

			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			require.Error(t, sqlfuncs.UseTokens(ctx, tx, c.res, c.toks))
			_, err = tx.Exec(ctx, `SELECT 1`)
			require.NoError(t, err, "nothing was sent, so the transaction is not aborted")
			require.NoError(t, tx.Rollback(ctx))
		}
	})

	t.Run("resource names are quoted in the BEGIN round trip", func(t *testing.T) {
		odd := `it's a \ name`
		tok := acquireWhenFree(t, ctx, b.db.Pool, odd, "A", time.Minute)
		t3 := acquireWhenFree(t, ctx, b.db.Pool, "inv:3", "A", time.Minute)
		tx, err := sqlfuncs.BeginWithTokens(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, []string{odd, "inv:3"}, []int64{tok, t3})
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		var got int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT (current_setting('fence.tokens')::jsonb ->> $1)::bigint`, odd).Scan(&got))
		require.Equal(t, tok, got)
		_, err = tx.Exec(ctx, `INSERT INTO inv VALUES (3, 'three')`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	})
}
