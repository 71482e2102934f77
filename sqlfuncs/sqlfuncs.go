// Package sqlfuncs is the Go binding of pgfence's SQL surface: one function
// per function of schema fence, over pgx v5 (and BackendPID, for gofence's
// pooler check). It holds the SQL text with which the library talks to the
// kit; gofence and the CLI reach the kit's functions through it. The CLI's
// read-only catalog reads (pgfence doctor, pgfence migrate) are the CLI's
// own (cmd/pgfence/internal/catalog), and the tables of the demo and the
// benchmark, the tests and internal/pgtest's scratch servers keep their own
// SQL.
//
// Every binding takes a DB, which *pgx.Conn, pgx.Tx and *pgxpool.Pool all
// satisfy, sends exactly one statement (one round trip once pgx has the
// statement prepared on that connection), and returns typed results. NULL
// answers of the SQL functions ("no lease granted", "not the live lease")
// become a false ok, not an error.
//
// Errors raised by the SQL functions keep their *pgconn.PgError (reachable
// with errors.As) and, for pgfence's own outcomes, also match an exported
// sentinel with errors.Is: ErrStaleToken (SQLSTATE FN001), ErrNoToken (FN002),
// ErrUnknownToken (FN003), ErrBusy (FN004) and ErrNotInstalled (schema fence
// or one of its functions is missing).
package sqlfuncs

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DB is the part of pgx that the bindings use. *pgx.Conn, pgx.Tx and
// *pgxpool.Pool all satisfy it, so every binding can run on a dedicated
// connection, inside the caller's transaction, or on a pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// interval converts a Go duration to a PostgreSQL interval with microsecond
// precision (the resolution of interval).
func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// nullText maps the empty string to SQL NULL.
func nullText(s string) pgtype.Text {
	return pgtype.Text{String: s, Valid: s != ""}
}

// scalar runs a one-row, one-column query and scans it, translating errors.
func scalar[T any](ctx context.Context, db DB, sql string, args ...any) (T, error) {
	var v T
	err := db.QueryRow(ctx, sql, args...).Scan(&v)
	return v, Translate(err)
}

// exec runs a statement whose result is of no interest (functions returning void).
func exec(ctx context.Context, db DB, sql string, args ...any) error {
	_, err := db.Exec(ctx, sql, args...)
	return Translate(err)
}

// Acquire calls fence.acquire(resource, holder, ttl): ok is true and token is
// the new fencing token when no live lease existed for resource; ok is false
// when the resource is held by a live lease or stayed busy past
// fence.grant_wait (an old holder's guarded transaction is still open).
func Acquire(ctx context.Context, db DB, resource, holder string, ttl time.Duration) (token int64, ok bool, err error) {
	t, err := scalar[pgtype.Int8](ctx, db, `SELECT fence.acquire($1, $2, $3)`, resource, holder, interval(ttl))
	return t.Int64, t.Valid, err
}

// AcquireWaiting is Acquire for a caller that will wait for the lease when
// it is held (fence.acquire(..., waiting => true)): a NULL answer asks the
// holder's release to send a NOTIFY on ReleaseChannel. Releases that nobody
// waits for send none, because NOTIFY serializes the commits of every
// notifying transaction in the cluster.
func AcquireWaiting(ctx context.Context, db DB, resource, holder string, ttl time.Duration) (token int64, ok bool, err error) {
	t, err := scalar[pgtype.Int8](ctx, db, `SELECT fence.acquire($1, $2, $3, waiting => true)`, resource, holder, interval(ttl))
	return t.Int64, t.Valid, err
}

// AcquireSession calls fence.acquire_session(resource, holder): a lease bound
// to the session (connection) db runs on, with no TTL. It lives until
// Release or until that session ends, so db should be a dedicated
// connection, not a pool.
func AcquireSession(ctx context.Context, db DB, resource, holder string) (token int64, ok bool, err error) {
	t, err := scalar[pgtype.Int8](ctx, db, `SELECT fence.acquire_session($1, $2)`, resource, holder)
	return t.Int64, t.Valid, err
}

// Renew calls fence.renew(resource, token, ttl): ok is true and expires is
// the new expiry (server clock) when token is the live lease of resource;
// ok is false when it is not (expired, released, superseded).
func Renew(ctx context.Context, db DB, resource string, token int64, ttl time.Duration) (expires time.Time, ok bool, err error) {
	e, err := scalar[pgtype.Timestamptz](ctx, db, `SELECT fence.renew($1, $2, $3)`, resource, token, interval(ttl))
	return e.Time, e.Valid, err
}

// Release calls fence.release(resource, token): true when it ended the live
// lease held with token, false when token was not the live lease (already
// released, expired or superseded). A false answer is not an error, and a
// repeated release never touches a newer lease.
func Release(ctx context.Context, db DB, resource string, token int64) (bool, error) {
	return scalar[bool](ctx, db, `SELECT fence.release($1, $2)`, resource, token)
}

// Revoke calls fence.revoke(resource), the operator action: it ends any lease
// of resource and grants a new token to nobody, so every outstanding token of
// the resource is stale. It returns that token, or an error matching ErrBusy
// when a guarded transaction under the current token stays open past
// fence.grant_wait.
func Revoke(ctx context.Context, db DB, resource string) (int64, error) {
	return scalar[int64](ctx, db, `SELECT fence.revoke($1)`, resource)
}

// Check calls fence.check(resource, token): nil when token is the latest
// grant of resource, else an error matching ErrStaleToken, ErrNoToken or
// ErrUnknownToken. On success the transaction db runs in holds the
// resource's gate until it ends, so no newer grant can happen before it
// commits.
func Check(ctx context.Context, db DB, resource string, token int64) error {
	return exec(ctx, db, `SELECT fence.check($1, $2)`, resource, token)
}

// UseToken calls fence.use_token(resource, token): Check, then remembers the
// token for the rest of the transaction, so statements on guarded tables
// without a token column are accepted. Call it inside a transaction (a pgx.Tx):
// outside one, the token is forgotten when the statement ends.
func UseToken(ctx context.Context, db DB, resource string, token int64) error {
	return exec(ctx, db, `SELECT fence.use_token($1, $2)`, resource, token)
}

// UseTokens calls fence.use_token(resources[i], tokens[i]) for every i, in
// the order given, in one statement: the first token that fails the check
// ends the statement (ErrStaleToken, ...) and aborts the transaction. Each
// registration takes the resource's gate (a shared advisory lock) until the
// transaction ends, so this is for a handful of resources; a statement that
// writes rows of many resources of a per-row table should assign the token
// column instead. The two slices must have the same, non-zero length (else
// an error, and nothing is sent). Call it inside a transaction, as UseToken.
func UseTokens(ctx context.Context, db DB, resources []string, tokens []int64) error {
	if err := checkPairs(resources, tokens); err != nil {
		return err
	}
	return exec(ctx, db, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, resources, tokens)
}

// Protect calls fence.protect(table, resource, token_column): it installs the
// guard triggers on table (a name as PostgreSQL would parse it, such as
// "public.orders" or `"Mixed Case"`). With tokenColumn, INSERT and UPDATE take
// the token from that bigint column of the row; with tokenColumn == "" every
// statement needs UseToken first. DELETE and TRUNCATE always need UseToken.
// Only the table's owner may protect it.
func Protect(ctx context.Context, db DB, table, resource, tokenColumn string) error {
	return exec(ctx, db, `SELECT fence.protect($1::regclass, $2, $3::name)`, table, resource, nullText(tokenColumn))
}

// ProtectRows calls fence.protect_rows(table, resource_column, resource_prefix,
// token_column): it guards table per row. The resource of a row is
// prefix + the row's resourceColumn as text (resourceColumn "id" and prefix
// "invoice:" put row 42 under resource "invoice:42"), and a write commits only
// when it presented the latest token of the resource of every row it wrote:
// by assigning tokenColumn in the statement, or with UseToken for that
// row's resource earlier in the transaction (tokenColumn == "": UseToken
// only). DELETE, moving a row to another resource (its old resource) and
// TRUNCATE (every resource with rows) need UseToken. Only the table's owner
// may protect it; Unprotect removes either form.
func ProtectRows(ctx context.Context, db DB, table, resourceColumn, prefix, tokenColumn string) error {
	return exec(ctx, db, `SELECT fence.protect_rows($1::regclass, $2::name, $3, $4::name)`, table, resourceColumn, prefix, nullText(tokenColumn))
}

// AllowProducers calls fence.allow_producers(table, enabled) (migration 9):
// with enabled, an INSERT into the per-row table that presents no token
// creates the row of a resource that was never granted (no lease row), so
// a producer can enqueue rows without a lease per row; a resource that was
// ever granted still needs its latest token (FN002 without one, FN001 with
// a stale one). Such an INSERT runs under READ COMMITTED (FN002 under the
// other levels) and serializes with the resource's first grant through the
// resource's gate, at most 64 new resources per transaction. Off by
// default; ProtectRows keeps the setting. Only the table's owner may change
// it; the table must be guarded per row by migration 9's guard.
func AllowProducers(ctx context.Context, db DB, table string, enabled bool) error {
	return exec(ctx, db, `SELECT fence.allow_producers($1::regclass, $2)`, table, enabled)
}

// FireAlways calls fence.fire_always(table, enabled): with enabled, the
// guards of a protected table (either form) fire in replica mode too
// (session_replication_role = replica, which superusers and roles granted
// SET on that parameter can choose, skips ordinary triggers); without, they
// fire in origin and local mode only, PostgreSQL's default. Protect and
// ProtectRows keep the setting. Only the table's owner may change it.
func FireAlways(ctx context.Context, db DB, table string, enabled bool) error {
	return exec(ctx, db, `SELECT fence.fire_always($1::regclass, $2)`, table, enabled)
}

// Unprotect calls fence.unprotect(table): it removes the guard triggers that
// Protect or ProtectRows installed. Only the table's owner may unprotect it.
func Unprotect(ctx context.Context, db DB, table string) error {
	return exec(ctx, db, `SELECT fence.unprotect($1::regclass)`, table)
}

// LockKey calls fence.lock_key(name): the advisory-lock key of name, the
// first 8 bytes of sha256(name) read big-endian with the top bit set.
func LockKey(ctx context.Context, db DB, name string) (int64, error) {
	return scalar[int64](ctx, db, `SELECT fence.lock_key($1)`, name)
}

// TryLock calls fence.try_lock(name): a session-level advisory lock on
// LockKey(name), taken without waiting. It belongs to the session db runs on.
func TryLock(ctx context.Context, db DB, name string) (bool, error) {
	return scalar[bool](ctx, db, `SELECT fence.try_lock($1)`, name)
}

// Unlock calls fence.unlock(name): releases a TryLock of this session; false
// when the session did not hold it.
func Unlock(ctx context.Context, db DB, name string) (bool, error) {
	return scalar[bool](ctx, db, `SELECT fence.unlock($1)`, name)
}

// TryXactLock calls fence.try_xact_lock(name): a transaction-level advisory
// lock on LockKey(name), taken without waiting and released when the
// transaction ends.
func TryXactLock(ctx context.Context, db DB, name string) (bool, error) {
	return scalar[bool](ctx, db, `SELECT fence.try_xact_lock($1)`, name)
}

// Version calls fence.version(): the migration version of the installed
// schema. A missing schema gives an error matching ErrNotInstalled.
func Version(ctx context.Context, db DB) (int, error) {
	v, err := scalar[int32](ctx, db, `SELECT fence.version()`)
	return int(v), err
}

// GrantUsage calls fence.grant_usage(role, operator): it grants role what an
// application needs (leases, guards, advisory helpers, the leases view); with
// operator also fence.revoke. Run it as the role that applied the migrations.
func GrantUsage(ctx context.Context, db DB, role string, operator bool) error {
	return exec(ctx, db, `SELECT fence.grant_usage($1, $2)`, role, operator)
}

// RevokeUsage calls fence.revoke_usage(role): it takes back everything
// GrantUsage gave role.
func RevokeUsage(ctx context.Context, db DB, role string) error {
	return exec(ctx, db, `SELECT fence.revoke_usage($1)`, role)
}

// timeOrInf scans a timestamptz that may be -infinity (NULL mapped by
// coalesce) into the zero time.
type timeOrInf struct{ t time.Time }

func (v *timeOrInf) ScanTimestamptz(ts pgtype.Timestamptz) error {
	if ts.Valid && ts.InfinityModifier == pgtype.Finite {
		v.t = ts.Time
	} else {
		v.t = time.Time{}
	}
	return nil
}
