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

// Beginner is what a fenced transaction begins on, as pgx.BeginFunc takes
// it: *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn begin a transaction of
// their own, and pgx.Tx (so *pgxpool.Tx, and the transaction a job queue
// hands its callback) a nested one, a savepoint, as pgx does. Wrappers
// with a Begin method of that form fit too.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// TxOptions says how Tx runs a fenced transaction.
type TxOptions struct {
	// Leases fence the transaction: the token of each is registered with
	// fence.use_token before fn runs. At least one; see Tx.
	Leases []*Lease

	// TxOptions are pgx's options of the transaction (isolation level,
	// access mode, deferrable mode, CommitQuery), for a Beginner that begins
	// a transaction of its own (a pool or a connection; a pgx.Tx begins a
	// savepoint, which takes none, and is then refused). BeginQuery is
	// refused: Tx writes the BEGIN itself, with the tokens. So is a READ
	// ONLY transaction under REPEATABLE READ or SERIALIZABLE: the kit's check
	// locks the lease row there, which a read-only transaction may not.
	pgx.TxOptions
}

// Tx runs fn in a transaction begun on db in which the token of every lease
// of opts.Leases is already registered with fence.use_token, so that every
// statement of fn on a protected table (with or without a token column) is
// fenced. On a pool or a connection, BEGIN and the registrations go to the
// server in one round trip (on a pool, on a connection of its own for the
// transaction); in a pgx.Tx (or another Beginner), Tx begins a savepoint
// and registers the tokens in it. The transaction commits when fn returns
// nil and rolls back otherwise, also when fn panics (the panic then goes
// on, with the connection outside the transaction) and when ctx ends (the
// rollback is sent under a context of its own, bounded, so that no guarded
// transaction is left open: it would hold the resources' gates).
//
// With several leases, fn may write rows of all their resources (the rows
// of several resources of a table protected per row, or several protected
// tables). The registrations go in the order of the resource names,
// whatever the order of opts.Leases, so two such transactions take the
// resources' gates in the same order. A nil lease, or none, is refused
// before anything is sent; a lease given twice counts once; two different
// leases on the same resource are refused (at most one of them can carry
// the latest token). Each registration holds its resource's gate until the
// transaction ends: for a handful of resources. A statement that writes
// rows of many resources of a per-row table should assign their tokens in
// its token column instead.
//
// Tx does not refuse on its own once a lease is lost: the database is the
// judge. While no newer token exists the writes are safe and succeed; once
// one exists they fail with ErrStaleToken. Errors name every lease of the
// transaction and match ErrStaleToken, ErrNoToken, ErrUnknownToken (with
// the *pgconn.PgError reachable through errors.As, whose message names the
// resource), and also ErrLost when any of the leases was lost by then; an
// error of fn keeps its own message and wrapped errors.
func Tx(ctx context.Context, db Beginner, opts *TxOptions, fn func(pgx.Tx) error) (err error) {
	var o TxOptions
	if opts != nil {
		o = *opts
	}
	s, err := leasesOf(o.Leases)
	if err != nil {
		return err
	}
	defer func() { err = s.refused(ctx, opTx, err) }() // observer.go
	if o.BeginQuery != "" {
		return fmt.Errorf("pgfence: transaction under %s: TxOptions.BeginQuery is refused: Tx writes the BEGIN itself, with the tokens; nothing was sent", s)
	}
	if o.AccessMode == pgx.ReadOnly && (o.IsoLevel == pgx.RepeatableRead || o.IsoLevel == pgx.Serializable) {
		return fmt.Errorf("pgfence: transaction under %s: a READ ONLY transaction under %s cannot be fenced: the check locks the lease row there, which a read-only transaction may not (use READ COMMITTED, or a read-write transaction); nothing was sent", s, o.IsoLevel)
	}
	switch d := db.(type) {
	case nil:
		return fmt.Errorf("pgfence: transaction under %s: db is nil; nothing was sent", s)
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return s.txError(err)
		}
		defer pc.Release()
		return s.runTx(ctx, pc.Conn(), o.TxOptions, fn)
	case *pgxpool.Conn:
		return s.runTx(ctx, d.Conn(), o.TxOptions, fn)
	case *pgx.Conn:
		return s.runTx(ctx, d, o.TxOptions, fn)
	}
	return s.runNested(ctx, db, o.TxOptions, fn)
}

// Tx is the package's Tx under this lease alone: it runs fn in a
// transaction begun on db (a pool, a connection or a pgx.Tx) in which the
// lease's token is registered with fence.use_token, so that every statement
// of fn on a protected table is fenced. For several leases, or pgx's
// transaction options, call gofence.Tx with TxOptions.
func (l *Lease) Tx(ctx context.Context, db Beginner, fn func(pgx.Tx) error) error {
	return Tx(ctx, db, &TxOptions{Leases: []*Lease{l}}, fn)
}

// leaseSet is the leases of one fenced transaction, in the order given,
// each once.
type leaseSet []*Lease

// leasesOf is leases as a leaseSet: none, a nil lease, or two different
// leases on the same resource, are refused.
func leasesOf(leases []*Lease) (leaseSet, error) {
	switch {
	case len(leases) == 0:
		return nil, errors.New("pgfence: a fenced transaction needs at least one lease (TxOptions.Leases); nothing was sent")
	case len(leases) == 1 && leases[0] == nil:
		return nil, errors.New("pgfence: fenced transaction under a nil *Lease (did the Acquire fail?); nothing was sent")
	}
	var s leaseSet
	for i, o := range leases {
		switch {
		case o == nil:
			return nil, fmt.Errorf("pgfence: transaction under %s: lease %d of %d is nil (a nil *Lease: did its Acquire fail?); nothing was sent", leaseSet(slices.DeleteFunc(slices.Clone(leases), func(l *Lease) bool { return l == nil })), i+1, len(leases))
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

// runTx runs fn in a transaction on conn under the tokens, begun with them
// in one round trip. The deferred rollback covers every way out of fn, a
// panic included (as pgx's BeginFunc does): a transaction left open would
// keep the resources' gates, so that no newer grant (fence.revoke, the next
// holder) could happen until the connection closed. After a commit the
// rollback does nothing.
func (s leaseSet) runTx(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	resources, tokens := s.tokens()
	tx, err := sqlfuncs.BeginWithTokens(ctx, conn, opts, resources, tokens)
	if err != nil {
		return s.txError(err)
	}
	return s.run(ctx, tx, fn)
}

// runNested runs fn in a transaction that db begins (a savepoint, when db is
// a pgx.Tx), with the tokens registered by a statement of their own.
func (s leaseSet) runNested(ctx context.Context, db Beginner, opts pgx.TxOptions, fn func(pgx.Tx) error) error {
	var (
		tx  pgx.Tx
		err error
	)
	if opts == (pgx.TxOptions{}) {
		tx, err = db.Begin(ctx)
	} else if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		return fmt.Errorf("pgfence: transaction under %s: TxOptions (isolation level, access mode, ...) need a pool or a connection; a %T begins a savepoint, which takes none; nothing was sent", s, db)
	}
	if err != nil {
		return s.txError(sqlfuncs.Translate(err))
	}
	resources, tokens := s.tokens()
	if err := sqlfuncs.UseTokens(ctx, tx, resources, tokens); err != nil {
		rollback(ctx, tx)
		return s.txError(err)
	}
	return s.run(ctx, tx, fn)
}

// run runs fn in tx, under the tokens already registered, and commits.
func (s leaseSet) run(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
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
// before the writes; the caller commits or rolls back as usual. For several
// leases, UseTokens.
//
// tx must be inside a transaction: outside one the token would be forgotten
// as soon as the statement ended, so a *pgxpool.Pool, or a *pgx.Conn or
// *pgxpool.Conn outside a transaction, is refused with an error. Errors
// match ErrStaleToken and ErrUnknownToken like those of Tx (and ErrLost
// when the lease was lost by then); the transaction is then aborted, and
// the caller's rollback ends it.
func (l *Lease) UseToken(ctx context.Context, tx DB) error {
	return UseTokens(ctx, tx, l)
}

// UseTokens is UseToken for several leases: it registers the token of every
// lease in tx, in one statement, ordered by resource as Tx does (none or a
// nil lease refused, a lease given twice counted once, two leases on one
// resource refused, all before anything is sent).
func UseTokens(ctx context.Context, tx DB, leases ...*Lease) (err error) {
	s, err := leasesOf(leases)
	if err != nil {
		return err
	}
	defer func() { err = s.refused(ctx, opUseToken, err) }() // observer.go
	var status byte = 'T'
	switch db := tx.(type) {
	case nil:
		return fmt.Errorf("pgfence: UseToken for %s: tx is nil", s)
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
		return s.txError(sqlfuncs.UseToken(ctx, tx, s[0].resource, s[0].token))
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
