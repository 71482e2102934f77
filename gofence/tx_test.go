package gofence_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

	t.Run("on a connection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.client(t, nil, gofence.Config{})
		l, err := c.Acquire(b.ctx, "job", nil)
		require.NoError(t, err)
		defer l.Release(b.ctx)
		conn := b.db.Conn(t)

		mustPanic(t, func() {
			_ = l.Tx(b.ctx, conn, func(tx pgx.Tx) error {
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
		l, err := c.Acquire(b.ctx, "job", nil)
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
	l, err := c.Acquire(b.ctx, "job", nil)
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

// rowsSetup is setup plus a table inv(id, note) protected per row without a
// token column (row 42 belongs to resource "inv:42", and every write needs
// fence.use_token for it), and a client.
func rowsSetup(t *testing.T) (*bundle, *gofence.Client) {
	t.Helper()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{})
	_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE inv (id int PRIMARY KEY, note text NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, c.ProtectRows(b.ctx, "inv", "id", "inv:", ""))
	return b, c
}

// invRows returns the rows of inv as "id:note", in id order.
func (b *bundle) invRows(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT coalesce(string_agg(id || ':' || note, ',' ORDER BY id), '') FROM inv`).Scan(&s))
	return s
}

func acquire(t *testing.T, b *bundle, c *gofence.Client, resource string) *gofence.Lease {
	t.Helper()
	l, err := c.Acquire(b.ctx, resource, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// A transaction under several leases may write the rows of all their
// resources in a table protected per row; without the lease of one row's
// resource it is refused and nothing commits; a stale lease among them
// refuses the whole transaction before fn runs.
func TestTxUnderSeveralLeases(t *testing.T) {
	t.Parallel()

	t.Run("writes rows of every lease's resource", func(t *testing.T) {
		t.Parallel()
		b, c := rowsSetup(t)
		l1, l2 := acquire(t, b, c, "inv:1"), acquire(t, b, c, "inv:2")
		require.NoError(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2}}, func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `INSERT INTO inv VALUES (1, 'a'), (2, 'b')`)
			return err
		}))
		require.Equal(t, "1:a,2:b", b.invRows(t))
		// The order of the leases does not matter, nor does the form.
		require.NoError(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l2, l1}, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `UPDATE inv SET note = note || '!'`)
			return err
		}))
		require.NoError(t, gofence.Tx(b.ctx, b.db.Conn(t), &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2}}, func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `DELETE FROM inv WHERE id = 2`)
			return err
		}))
		require.Equal(t, "1:a!", b.invRows(t))
	})

	t.Run("a row whose lease is missing is refused and nothing commits", func(t *testing.T) {
		t.Parallel()
		b, c := rowsSetup(t)
		l1 := acquire(t, b, c, "inv:1")
		acquire(t, b, c, "inv:2") // held, but not passed to the Tx
		err := l1.Tx(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `INSERT INTO inv VALUES (1, 'a')`); err != nil {
				return err
			}
			_, err := tx.Exec(b.ctx, `INSERT INTO inv VALUES (2, 'b')`)
			return err
		})
		require.ErrorIs(t, err, gofence.ErrNoToken)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr))
		require.Contains(t, pgErr.Detail, "resource=inv:2")
		require.Empty(t, b.invRows(t), "row 1 was rolled back with the rest")
	})

	t.Run("a stale lease among several refuses the transaction", func(t *testing.T) {
		t.Parallel()
		b, c := rowsSetup(t)
		l1, l2, l3 := acquire(t, b, c, "inv:1"), acquire(t, b, c, "inv:2"), acquire(t, b, c, "inv:3")
		_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, "inv:2") // an operator, in another session
		require.NoError(t, err)
		ran := false
		err = gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2, l3}}, func(tx pgx.Tx) error {
			ran = true
			_, err := tx.Exec(b.ctx, `INSERT INTO inv VALUES (1, 'a'), (2, 'b'), (3, 'c')`)
			return err
		})
		require.ErrorIs(t, err, gofence.ErrStaleToken)
		require.False(t, ran, "the tokens are checked with BEGIN, before fn")
		require.ErrorContains(t, err, "stale fencing token")
		require.ErrorContains(t, err, "inv:2")

		// Once the lease knows it is lost, the error says so too, and names
		// every lease of the transaction.
		require.ErrorIs(t, l2.Renew(b.ctx), gofence.ErrLost)
		err = gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l3, l1, l2}}, func(tx pgx.Tx) error { return nil })
		require.ErrorIs(t, err, gofence.ErrStaleToken)
		require.ErrorIs(t, err, gofence.ErrLost)
		require.ErrorContains(t, err, fmt.Sprintf("transaction under inv:3 token %d, inv:1 token %d, inv:2 token %d:", l3.Token(), l1.Token(), l2.Token()))
		require.NoError(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l3}}, func(tx pgx.Tx) error { return nil }), "the others still hold")
		require.Empty(t, b.invRows(t))
	})

	t.Run("every lease's gate is held until the transaction ends", func(t *testing.T) {
		t.Parallel()
		b, c := rowsSetup(t)
		l1, l2 := acquire(t, b, c, "inv:1"), acquire(t, b, c, "inv:2")
		inside, proceed := make(chan struct{}), make(chan struct{})
		txDone := make(chan error, 1)
		go func() {
			txDone <- gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2}}, func(tx pgx.Tx) error {
				close(inside)
				<-proceed
				_, err := tx.Exec(b.ctx, `INSERT INTO inv VALUES (1, 'a'), (2, 'b')`)
				return err
			})
		}()
		<-inside
		op := b.db.Conn(t) // the operator's session
		var pid uint32
		require.NoError(t, op.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		revoked := make(chan error, 1)
		go func() { _, err := sqlfuncs.Revoke(b.ctx, op, "inv:2"); revoked <- err }()
		for waiting := false; !waiting; { // until the revoke waits for a lock, failing if it finishes
			select {
			case err := <-revoked:
				close(proceed)
				t.Fatalf("the revoke of inv:2 finished while the transaction under its token was open (err %v)", err)
			case <-time.After(10 * time.Millisecond):
			}
			require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`, pid).Scan(&waiting))
		}
		close(proceed)
		require.NoError(t, <-txDone, "the writes under both tokens commit before the revoke")
		require.NoError(t, <-revoked)
		require.Equal(t, "1:a,2:b", b.invRows(t))
		err := gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2}}, func(tx pgx.Tx) error {
			_, err := tx.Exec(b.ctx, `UPDATE inv SET note = 'late'`)
			return err
		})
		require.ErrorIs(t, err, gofence.ErrStaleToken)
		require.Equal(t, "1:a,2:b", b.invRows(t))
	})

	t.Run("nil leases, duplicates and two leases on one resource", func(t *testing.T) {
		t.Parallel()
		b, c := rowsSetup(t)
		l1, l2 := acquire(t, b, c, "inv:1"), acquire(t, b, c, "inv:2")
		ran := false
		fn := func(tx pgx.Tx) error {
			ran = true
			_, err := tx.Exec(b.ctx, `INSERT INTO inv VALUES (1, 'a'), (2, 'b')`)
			return err
		}
		err := gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2, nil}}, fn)
		require.ErrorContains(t, err, "is nil")
		require.False(t, ran, "refused before anything was sent")
		var none *gofence.Lease
		require.ErrorContains(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{none, l1, l2}}, fn), "nil *Lease")
		require.False(t, ran)

		// The same lease twice counts once.
		require.NoError(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2, l1, l2}}, fn))
		require.Equal(t, "1:a,2:b", b.invRows(t))

		// An old lease and a new one on the same resource: at most one can
		// be current, so the pair is refused whatever the database says.
		_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "inv:1")
		require.NoError(t, err)
		newer := acquire(t, b, c, "inv:1")
		ran = false
		err = gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{newer, l2, l1}}, fn)
		require.ErrorContains(t, err, "two leases on inv:1")
		require.False(t, ran)
	})
}

// UseToken with several leases registers all their tokens in the caller's
// transaction.
func TestUseTokenWithSeveralLeases(t *testing.T) {
	t.Parallel()
	b, c := rowsSetup(t)
	l1, l2, l3 := acquire(t, b, c, "inv:1"), acquire(t, b, c, "inv:2"), acquire(t, b, c, "inv:3")

	t.Run("every token is registered", func(t *testing.T) {
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx)
		require.NoError(t, gofence.UseTokens(b.ctx, tx, l1, l2, l3))
		_, err = tx.Exec(b.ctx, `INSERT INTO inv VALUES (1, 'a'), (2, 'b'), (3, 'c')`)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, `DELETE FROM inv WHERE id = 3`)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.ctx))
		require.Equal(t, "1:a,2:b", b.invRows(t))
	})

	t.Run("outside a transaction, or with a nil lease, it refuses", func(t *testing.T) {
		err := gofence.UseTokens(b.ctx, b.db.Pool, l1, l2)
		require.ErrorContains(t, err, "needs a transaction")
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx)
		require.ErrorContains(t, gofence.UseTokens(b.ctx, tx, l1, nil), "is nil")
		_, err = tx.Exec(b.ctx, `SELECT 1`)
		require.NoError(t, err, "nothing was sent: the transaction is not aborted")
	})

	t.Run("a stale lease among them aborts the transaction", func(t *testing.T) {
		_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, "inv:3")
		require.NoError(t, err)
		tx, err := b.db.Pool.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx)
		err = gofence.UseTokens(b.ctx, tx, l1, l2, l3)
		require.ErrorIs(t, err, gofence.ErrStaleToken)
		require.ErrorContains(t, err, "inv:3")
		_, err = tx.Exec(b.ctx, `UPDATE inv SET note = 'x'`)
		require.Error(t, err, "the transaction is aborted")
		require.NoError(t, tx.Rollback(b.ctx))
		require.Equal(t, "1:a,2:b", b.invRows(t))
	})
}

// When the function's error wraps a fencing PgError, Tx keeps that error
// (message and sentinels) and adds the fencing sentinel. (It used to replace
// it by sqlfuncs.Translate's new *Error, dropping the caller's wrapping.)
func TestTxKeepsTheFunctionsError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := c.Acquire(b.ctx, "job", nil)
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

// Tx takes whatever begins a transaction: a pool, a *pgxpool.Conn, a
// *pgx.Conn, or a pgx.Tx, in which it fences a savepoint: its writes are
// fenced, a stale lease rolls back the savepoint only, and the outer
// transaction goes on.
func TestTxOnEveryBeginner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	defer l.Release(b.ctx)
	insert := func(who string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			// No token column assigned: only use_token lets the row in.
			_, err := tx.Exec(b.ctx, `INSERT INTO work (who) VALUES ($1)`, who)
			return err
		}
	}
	pc, err := b.db.Pool.Acquire(b.ctx)
	require.NoError(t, err)
	defer pc.Release()
	require.NoError(t, l.Tx(b.ctx, b.db.Pool, insert("pool")))
	require.NoError(t, l.Tx(b.ctx, pc, insert("pool conn")))
	require.NoError(t, l.Tx(b.ctx, b.db.Conn(t), insert("conn")))

	// In a pgx.Tx: a savepoint, which ends with the outer transaction.
	outer, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer outer.Rollback(b.ctx)
	require.NoError(t, l.Tx(b.ctx, outer, insert("savepoint, rolled back")))
	require.NoError(t, outer.Rollback(b.ctx))

	outer, err = b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer outer.Rollback(b.ctx)
	require.NoError(t, l.Tx(b.ctx, outer, insert("savepoint, committed")))
	require.NoError(t, outer.Commit(b.ctx))

	rows, err := b.db.Pool.Query(b.ctx, `SELECT who FROM work ORDER BY id`)
	require.NoError(t, err)
	who, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"pool", "pool conn", "conn", "savepoint, committed"}, who)

	// A stale lease refuses the savepoint before fn runs; the outer
	// transaction is still usable and commits what it wrote itself.
	_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "job")
	require.NoError(t, err)
	outer, err = b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer outer.Rollback(b.ctx)
	err = l.Tx(b.ctx, outer, func(pgx.Tx) error { t.Error("fn ran under a stale token"); return nil })
	require.ErrorIs(t, err, gofence.ErrStaleToken)
	_, err = outer.Exec(b.ctx, `CREATE TABLE after_the_savepoint (x int)`)
	require.NoError(t, err, "the outer transaction goes on")
	require.NoError(t, outer.Commit(b.ctx))
}

// What Tx cannot honour it refuses before anything is sent: no lease, a
// nil db, pgx's BeginQuery (Tx writes the BEGIN), transaction options in a
// savepoint, a read-only REPEATABLE READ or SERIALIZABLE transaction.
func TestTxRefusesWhatItCannotHonour(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, nil, gofence.Config{TTL: 10 * time.Second})
	l, err := c.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	defer l.Release(b.ctx)
	fn := func(pgx.Tx) error { t.Error("fn ran"); return nil }

	require.ErrorContains(t, gofence.Tx(b.ctx, b.db.Pool, nil, fn), "at least one lease")
	require.ErrorContains(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{}, fn), "at least one lease")
	require.ErrorContains(t, l.Tx(b.ctx, nil, fn), "db is nil")
	var none *gofence.Lease
	require.ErrorContains(t, none.Tx(b.ctx, b.db.Pool, fn), "nil *Lease")
	require.ErrorContains(t, gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l}, TxOptions: pgx.TxOptions{BeginQuery: "BEGIN"}}, fn), "BeginQuery")

	outer, err := b.db.Pool.Begin(b.ctx)
	require.NoError(t, err)
	defer outer.Rollback(b.ctx)
	err = gofence.Tx(b.ctx, outer, &gofence.TxOptions{Leases: []*gofence.Lease{l}, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, fn)
	require.ErrorContains(t, err, "begins a savepoint")
	_, err = outer.Exec(b.ctx, `SELECT 1`)
	require.NoError(t, err, "nothing was sent: the outer transaction is not aborted")

	// A read-only snapshot transaction cannot be fenced: the check locks the
	// lease row under REPEATABLE READ and SERIALIZABLE (25006 in a read-only
	// one), and the kit cannot trust transaction_read_only (it can be turned
	// off again: TestRedteam8bReadOnlyTurnedOnMidStatement).
	err = gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l}, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable, AccessMode: pgx.ReadOnly}}, fn)
	require.ErrorContains(t, err, "READ ONLY transaction under serializable cannot be fenced")

	// Options it can honour: a serializable transaction, and a read-only
	// READ COMMITTED one, on a pool.
	for _, o := range []pgx.TxOptions{{IsoLevel: pgx.Serializable}, {IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}} {
		err = gofence.Tx(b.ctx, b.db.Pool, &gofence.TxOptions{Leases: []*gofence.Lease{l}, TxOptions: o}, func(tx pgx.Tx) error {
			var iso, ro string
			if err := tx.QueryRow(b.ctx, `SELECT current_setting('transaction_isolation'), current_setting('transaction_read_only')`).Scan(&iso, &ro); err != nil {
				return err
			}
			if iso != string(o.IsoLevel) || (ro == "on") != (o.AccessMode == pgx.ReadOnly) {
				return fmt.Errorf("isolation %s, read only %s", iso, ro)
			}
			return nil
		})
		require.NoError(t, err, "%+v", o)
	}
}
