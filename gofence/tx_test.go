package gofence_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// mustPanic runs f and reports whether it panicked (the way net/http
// recovers a handler's panic and goes on).
func mustPanic(t *testing.T, f func()) {
	t.Helper()
	panicked := true
	func() {
		defer func() { _ = recover() }()
		f()
		panicked = false
	}()
	require.True(t, panicked, "fn was expected to panic")
}

// A panic in the function of a fenced transaction used to leave its
// connection inside the open transaction, which kept the resource's gate: a
// later revoke waited fence.grant_wait and failed with FN004.
func TestTxRollsBackWhenFnPanics(t *testing.T) {
	t.Parallel()

	t.Run("TxConn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.client(t, nil, gofence.Config{})
		l, err := c.Acquire(b.ctx, "job")
		require.NoError(t, err)
		defer l.Release(b.ctx)
		conn := b.db.Conn(t)

		mustPanic(t, func() {
			_ = l.TxConn(b.ctx, conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(b.ctx, `INSERT INTO work (who, token) VALUES ('panics', $1)`, l.Token())
				require.NoError(t, err)
				panic("handler bug")
			})
		})
		require.Equal(t, byte('I'), conn.PgConn().TxStatus(), "the connection is outside any transaction")
		_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "job")
		require.NoError(t, err, "no open transaction holds the resource's gate")
		var n int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM work`).Scan(&n))
		require.Zero(t, n, "the write before the panic was rolled back")
	})

	t.Run("Tx", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool := closingPool(t, b.db.URL, 1)
		c := b.client(t, nil, gofence.Config{})
		l, err := c.Acquire(b.ctx, "job")
		require.NoError(t, err)
		defer l.Release(b.ctx)

		var pid uint32
		mustPanic(t, func() {
			_ = l.Tx(b.ctx, pool, func(tx pgx.Tx) error {
				pid = tx.Conn().PgConn().PID()
				panic("handler bug")
			})
		})
		_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "job")
		require.NoError(t, err, "no open transaction holds the resource's gate")
		pc, err := pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer pc.Release()
		require.Equal(t, pid, pc.Conn().PgConn().PID(),
			"the connection went back to the pool clean (a connection handed back inside a transaction is closed)")
	})
}
