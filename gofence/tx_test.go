package gofence_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

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

// UseToken fences a transaction that the caller began itself: writes without
// a token column go through, the gate is held until the transaction ends,
// a stale token is refused, and a call outside a transaction is refused.
func TestUseTokenFencesTheCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{})
	_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE journal (line text)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "journal", "job", ""))
	l, err := c.Acquire(b.ctx, "job")
	require.NoError(t, err)
	defer l.Release(b.ctx)

	t.Run("in a pgx.Tx of the pool", func(t *testing.T) {
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx)
		require.NoError(t, l.UseToken(b.ctx, tx))
		_, err = tx.Exec(b.ctx, `INSERT INTO journal VALUES ('fenced')`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.ctx))
	})

	t.Run("outside a transaction it refuses", func(t *testing.T) {
		require.Error(t, l.UseToken(b.ctx, b.db.Pool))
		conn := b.db.Conn(t)
		require.Error(t, l.UseToken(b.ctx, conn))
		pc, err := b.db.Pool.Acquire(b.ctx)
		require.NoError(t, err)
		defer pc.Release()
		require.Error(t, l.UseToken(b.ctx, pc))
	})

	t.Run("a stale token is refused", func(t *testing.T) {
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx)
		_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "job")
		require.NoError(t, err)
		err = l.UseToken(b.ctx, tx)
		require.ErrorIs(t, err, gofence.ErrStaleToken)
	})
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM journal`).Scan(&n))
	require.Equal(t, 1, n)
}

// When the function's error wraps a fencing PgError, Tx keeps that error
// (message and sentinels) and adds the fencing sentinel. (It used to replace
// it by sqlfuncs.Translate's new *Error, dropping the caller's wrapping.)
func TestTxKeepsTheFunctionsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := c.Acquire(b.ctx, "job")
	require.NoError(t, err)
	defer l.Release(b.ctx)

	errMine := errors.New("my sentinel")
	err = l.Tx(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		// A token older than the lease's: the guard refuses with FN001.
		_, err := tx.Exec(b.ctx, `INSERT INTO work (who, token) VALUES ('x', $1)`, l.Token()-1)
		return fmt.Errorf("writing row 42: %w", errors.Join(errMine, err))
	})
	require.Error(t, err)
	require.True(t, errors.Is(err, gofence.ErrStaleToken) || errors.Is(err, gofence.ErrUnknownToken), "%v", err)
	require.ErrorIs(t, err, errMine, "Tx lost the function's own error: %v", err)
	require.ErrorContains(t, err, "writing row 42")
}
