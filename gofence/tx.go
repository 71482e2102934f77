package gofence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
// With others, the transaction is fenced by every lease at once: the token
// of each is registered in the same round trip, so fn may write rows of all
// their resources (the rows of several resources of a table protected per
// row, or several protected tables). The registrations go in the order of
// the resource names, whatever the order of the arguments, so two such
// transactions take the resources' gates in the same order. A nil lease
// among them is refused before anything is sent; a lease given twice counts
// once; two different leases on the same resource are refused (at most one
// of them can carry the latest token). Each registration holds its
// resource's gate until the transaction ends: for a handful of resources.
// A statement that writes rows of many resources of a per-row table should
// assign their tokens in its token column instead.
//
// Tx does not refuse on its own once a lease is lost: the database is the
// judge. While no newer token exists the writes are safe and succeed; once
// one exists they fail with ErrStaleToken. Errors name every lease of the
// transaction and match ErrStaleToken, ErrNoToken, ErrUnknownToken (with the
// *pgconn.PgError reachable through errors.As, whose message names the
// resource), and also ErrLost when any of the leases was lost by then.
func (l *Lease) Tx(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error, others ...*Lease) error {
	return l.TxWithOptions(ctx, pool, pgx.TxOptions{}, fn, others...)
}

// TxWithOptions is Tx with transaction options (isolation level, access mode).
func (l *Lease) TxWithOptions(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions, fn func(pgx.Tx) error, others ...*Lease) error {
	s, err := l.with(others)
	if err != nil {
		return err
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return s.txError(err)
	}
	defer pc.Release()
	return s.runTx(ctx, pc.Conn(), opts, fn)
}

// TxConn is Tx on a connection the caller holds.
func (l *Lease) TxConn(ctx context.Context, conn *pgx.Conn, fn func(pgx.Tx) error, others ...*Lease) error {
	s, err := l.with(others)
	if err != nil {
		return err
	}
	return s.runTx(ctx, conn, pgx.TxOptions{}, fn)
}

// leaseSet is the leases of one fenced transaction, the receiver first, each
// once.
type leaseSet []*Lease

// with is the receiver and others as a leaseSet: a nil lease, or two
// different leases on the same resource, are refused.
func (l *Lease) with(others []*Lease) (leaseSet, error) {
	if l == nil {
		return nil, errors.New("pgfence: fenced transaction on a nil *Lease (did the Acquire fail?)")
	}
	s := leaseSet{l}
	for i, o := range others {
		switch {
		case o == nil:
			return nil, fmt.Errorf("pgfence: transaction under %s: lease %d of the others is nil (did its Acquire fail?); nothing was sent", s, i)
		case slices.Contains(s, o):
			continue
		}
		if j := slices.IndexFunc(s, func(x *Lease) bool { return x.resource == o.resource }); j >= 0 {
			return nil, fmt.Errorf("pgfence: transaction under %s: two leases on %s (tokens %d and %d), and at most one can be the latest: pass only the current one; nothing was sent",
				s, o.resource, s[j].token, o.token)
		}
		s = append(s, o)
	}
	return s, nil
}

// String names the leases as errors show them: "orders token 5, invoice:7
// token 9".
func (s leaseSet) String() string {
	var b strings.Builder
	for i, l := range s {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s token %d", l.resource, l.token)
	}
	return b.String()
}

// tokens are the resources and tokens to register, ordered by resource.
func (s leaseSet) tokens() (resources []string, tokens []int64) {
	sorted := slices.SortedFunc(slices.Values(s), func(a, b *Lease) int { return strings.Compare(a.resource, b.resource) })
	for _, l := range sorted {
		resources = append(resources, l.resource)
		tokens = append(tokens, l.token)
	}
	return resources, tokens
}

// runTx runs fn in a transaction under the tokens. The deferred rollback
// covers every way out of fn, a panic included (as pgx's BeginFunc does): a
// transaction left open would keep the resources' gates, so that no newer
// grant (fence.revoke, the next holder) could happen until the connection
// closed. After a commit the rollback does nothing.
func (s leaseSet) runTx(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	resources, tokens := s.tokens()
	tx, err := sqlfuncs.BeginWithTokens(ctx, conn, opts, resources, tokens)
	if err != nil {
		return s.txError(err)
	}
	defer rollback(ctx, tx)
	if err := fn(tx); err != nil {
		return s.txError(sqlfuncs.Translate(err))
	}
	return s.txError(sqlfuncs.Translate(tx.Commit(ctx)))
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
// With others, it registers the token of every lease, in one statement, as
// Tx does (ordered by resource; nil refused, a lease given twice counted
// once, two leases on one resource refused, all before anything is sent).
//
// tx must be inside a transaction: outside one the token would be forgotten
// as soon as the statement ended, so a *pgxpool.Pool, or a *pgx.Conn or
// *pgxpool.Conn outside a transaction, is refused with an error. Errors
// match ErrStaleToken and ErrUnknownToken like those of Tx (and ErrLost
// when any of the leases was lost by then); the transaction is then
// aborted, and the caller's rollback ends it.
func (l *Lease) UseToken(ctx context.Context, tx DB, others ...*Lease) error {
	s, err := l.with(others)
	if err != nil {
		return err
	}
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
		return fmt.Errorf("pgfence: UseToken for %s needs a transaction (a pgx.Tx): outside one the token is forgotten when the statement ends", s)
	}
	if len(s) == 1 {
		return s.txError(sqlfuncs.UseToken(ctx, tx, l.resource, l.token))
	}
	resources, tokens := s.tokens()
	return s.txError(sqlfuncs.UseTokens(ctx, tx, resources, tokens))
}

// merge derives a context that ends with ctx or with the lease; its Err and
// Done look at the lease's clock (leaseContext).
func (l *Lease) merge(ctx context.Context) (context.Context, func()) {
	mctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	return &leaseContext{Context: mctx, l: l, cancel: cancel}, func() { stop(); cancel(nil) }
}

// txError adds the loss of any lease of s to an error that happened after it.
func (s leaseSet) txError(err error) error {
	if err == nil {
		return nil
	}
	format, args := "pgfence: transaction under %s: %w", []any{s, err}
	var lost []string
	for _, l := range s {
		if e := l.Err(); e != nil && errors.Is(e, ErrLost) && !errors.Is(err, e) {
			lost = append(lost, "%w")
			args = append(args, e)
		}
	}
	if len(lost) > 0 {
		format += " (" + strings.Join(lost, "; ") + ")"
	}
	return fmt.Errorf(format, args...)
}

// rollback rolls back with a context that is not cancelled, so that a
// cancelled caller still leaves the connection clean.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}
