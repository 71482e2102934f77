package gofence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// Tx runs fn in a transaction on a connection from pool in which the lease's
// token is already registered with fence.use_token: BEGIN and use_token go
// to the server in one round trip, so every statement of fn on a protected
// table (with or without a token column) is fenced. The transaction commits
// when fn returns nil and rolls back otherwise, also when fn panics (the
// panic then goes on, with the connection outside any transaction).
//
// Tx does not refuse on its own once the lease is lost: the database is the
// judge. While no newer token exists the writes are safe and succeed; once
// one exists they fail with ErrStaleToken. Errors match ErrStaleToken,
// ErrNoToken, ErrUnknownToken (with the *pgconn.PgError reachable through
// errors.As), and also ErrLost when the lease was lost by then.
func (l *Lease) Tx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return l.TxOptions(ctx, pool, pgx.TxOptions{}, fn)
}

// TxOptions is Tx with transaction options (isolation level, access mode).
func (l *Lease) TxOptions(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return l.txError(err)
	}
	defer pc.Release()
	return l.runTx(ctx, pc.Conn(), opts, fn)
}

// TxConn is Tx on a connection the caller holds.
func (l *Lease) TxConn(ctx context.Context, conn *pgx.Conn, fn func(pgx.Tx) error) error {
	return l.runTx(ctx, conn, pgx.TxOptions{}, fn)
}

// runTx runs fn in a transaction under the token. The deferred rollback
// covers every way out of fn, a panic included (as pgx's BeginFunc does): a
// transaction left open would keep the resource's gate, so that no newer
// grant (fence.revoke, the next holder) could happen until the connection
// closed. After a commit the rollback does nothing.
func (l *Lease) runTx(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	tx, err := sqlfuncs.BeginWithToken(ctx, conn, opts, l.resource, l.token)
	if err != nil {
		return l.txError(err)
	}
	defer rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return l.txError(sqlfuncs.Translate(err))
	}
	return l.txError(sqlfuncs.Translate(tx.Commit(ctx)))
}

// DB is the small interface of pgx that UseToken needs: pgx.Tx (and so
// *pgxpool.Tx), *pgx.Conn and *pgxpool.Conn satisfy it, as do the wrappers
// that job queues and other libraries hand their callbacks.
type DB = sqlfuncs.DB

// UseToken fences a transaction the caller already has (a job queue's
// transaction, one begun by another library): it registers the lease's
// token in tx with fence.use_token, so every later statement of tx on a
// protected table is fenced, with or without a token column, and the
// transaction holds the resource's gate until it ends (no newer grant can
// happen before it commits or rolls back). Call it inside the transaction,
// before the writes; the caller commits or rolls back as usual.
//
// tx must be inside a transaction: outside one the token would be forgotten
// as soon as the statement ended, so a *pgxpool.Pool, or a *pgx.Conn or
// *pgxpool.Conn outside a transaction, is refused with an error. Errors
// match ErrStaleToken and ErrUnknownToken like those of Tx (and ErrLost
// when the lease was lost by then); the transaction is then aborted, and
// the caller's rollback ends it.
func (l *Lease) UseToken(ctx context.Context, tx DB) error {
	var status byte = 'T'
	switch db := tx.(type) {
	case *pgxpool.Pool:
		status = 'I' // each statement may run on another connection
	case *pgx.Conn:
		status = db.PgConn().TxStatus()
	case *pgxpool.Conn:
		status = db.Conn().PgConn().TxStatus()
	}
	if status == 'I' {
		return fmt.Errorf("pgfence: UseToken for %s needs a transaction (a pgx.Tx): outside one the token is forgotten when the statement ends", l.resource)
	}
	return l.txError(sqlfuncs.UseToken(ctx, tx, l.resource, l.token))
}

// merge derives a context that ends with ctx or with the lease.
func (l *Lease) merge(ctx context.Context) (context.Context, func()) {
	mctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	return mctx, func() { stop(); cancel(nil) }
}

// txError adds the lease's loss to an error that happened after it.
func (l *Lease) txError(err error) error {
	if err == nil {
		return nil
	}
	if lost := l.Err(); lost != nil && errors.Is(lost, ErrLost) && !errors.Is(err, lost) {
		return fmt.Errorf("pgfence: transaction under %s token %d: %w (%w)", l.resource, l.token, err, lost)
	}
	return fmt.Errorf("pgfence: transaction under %s token %d: %w", l.resource, l.token, err)
}

// rollback rolls back with a context that is not cancelled, so that a
// cancelled caller still leaves the connection clean.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}
