package gofence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// ErrPooledSession: a session lease was asked for over a connection that a
// connection pooler (PgBouncer, Supavisor, RDS Proxy, ...) stands in front
// of. A session lease lives as long as one server session, and a pooler
// decouples the client's connection from the server's: behind a
// transaction-mode pooler the next statement may run in another backend,
// and the backend that holds the lease lives on in the pool after the
// holder dies, so the lease would stay live with nobody holding it. Use a
// TTL lease (LeaseOptions.Session false), which works through poolers, or
// give the session leases a pool that connects to PostgreSQL directly.
var ErrPooledSession = errors.New("pgfence: session leases need a direct connection to PostgreSQL, and this one goes through a connection pooler")

// refusePooledSession checks, after fence.acquire_session granted token on
// conn, that the backend which holds the lease is the one conn was opened
// with (the process id of the startup's BackendKeyData). A pooler answers
// the startup itself with a key of its own, so the two differ behind any
// pooler, whatever its mode, and agree on a direct connection or through a
// plain TCP proxy. On a mismatch it releases the lease (the row ends at
// once; the advisory lock that a pooled backend may keep is keyed by this
// token, which no later grant reuses) and returns ErrPooledSession.
func (c *Client) refusePooledSession(ctx context.Context, conn *pgx.Conn, resource string, token int64) error {
	row, ok, err := sqlfuncs.GetLease(ctx, conn, resource)
	if err != nil {
		return fmt.Errorf("pgfence: acquiring %s: checking the session that holds it: %w", resource, err)
	}
	if !ok || row.Token != token || row.SessionPID == 0 || uint32(row.SessionPID) == conn.PgConn().PID() {
		return nil
	}
	if _, err := sqlfuncs.Release(ctx, conn, resource, token); err != nil {
		c.log.Warn("pgfence: releasing a session lease refused behind a pooler failed; it ends when the pooler closes that server connection",
			"resource", resource, "token", token, "error", err)
	}
	return fmt.Errorf("%w: the lease of %s was granted in backend %d, the connection was opened with %d (take a TTL lease, without LeaseOptions.Session: TTL leases work behind poolers)",
		ErrPooledSession, resource, row.SessionPID, conn.PgConn().PID())
}

// ErrPoolerStatementCache: the pool given to New caches prepared statements
// (pgx's default, QueryExecModeCacheStatement) and its connections go
// through a pooler that lets one client's named statements be used by
// another: a transaction-mode pooler that does not track prepared
// statements (PgBouncer before 1.21, or with max_prepared_statements = 0).
// Such a pool works in a small test and fails under load, when statements
// land on server connections that another client prepared them on
// ("prepared statement stmtcache_... already exists", 42P05) or that never
// saw them (26000), whatever gofence does. Every call of the Client returns
// it, naming the fix: default_query_exec_mode=exec (or cache_describe,
// simple_protocol) in the connection string, or a pooler that tracks
// prepared statements. See README, "Behind a connection pooler".
var ErrPoolerStatementCache = errors.New("pgfence: the pool caches prepared statements (pgx QueryExecModeCacheStatement, the default), and its pooler shares them between clients")

// poolerProbeAttempts bounds the tries of the statement probe: each needs
// the pooler to hand the second connection the server connection the first
// one just left (PgBouncer does, reusing the most recently released one
// first, unless another client takes it in between).
const poolerProbeAttempts = 3

// poolerProbeWait bounds the wait for the probe's second connection when
// the pool is busy: past it the probe gives up and warns instead.
const poolerProbeWait = 2 * time.Second

// checkPoolerStatementCache refuses a pool that caches named prepared
// statements when its pooler shares them between clients (see
// ErrPoolerStatementCache). It runs on the first call of the Client, with
// that call's ctx, and costs nothing for a pool in another query mode; on
// a direct connection, one round trip. Through a pooler (the backend that
// runs a statement is not the one announced at connect, the test of
// refusePooledSession), it shows how the pooler treats a named statement:
//
//  1. connection a prepares a statement with a unique name inside a
//     transaction, on server connection x;
//  2. connection b opens a transaction; when the pooler gives it x (x is
//     free again, and PgBouncer reuses the connection released last), b
//     executes a's statement. It runs: the pooler passes names through and
//     shares server connections, which is what breaks pgx's cache: refuse.
//     It does not exist (26000): statements belong to their client, the
//     cache works (a pooler that tracks them, such as PgBouncer 1.21+ with
//     max_prepared_statements).
//
// When b never gets x the pooler keeps each client on its own server
// connection (session mode) or the pool is too busy to tell; the Client then
// warns through its Logger and goes on. Every probe statement is
// deallocated where it lives; a probe cut short in transaction mode may
// leave one empty statement on a server connection until the pooler closes
// it. The probe statements are empty ("") and their names random, so they
// meet nothing of the application's.
func (c *Client) checkPoolerStatementCache(ctx context.Context) error {
	cc := c.pool.Config().ConnConfig
	if cc.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cc.StatementCacheCapacity <= 0 {
		return nil
	}
	// One probe at a time per Client: first calls that start together
	// (workers started at once) would otherwise each hold a connection and
	// wait for a second one, and all give up undecided on a small pool.
	p := &c.pooler
	if err := p.lock(ctx); err != nil {
		return err
	}
	defer p.unlock()
	if p.settled {
		return p.err
	}
	err := c.probePooler(ctx)
	if err == nil || errors.Is(err, ErrPoolerStatementCache) {
		p.settled, p.err = true, err // the pool's mode and its pooler do not change
	}
	return err
}

// poolerCheck is the state of checkPoolerStatementCache in a Client; its
// zero value is ready.
type poolerCheck struct {
	once    sync.Once
	sem     chan struct{} // capacity 1: held while a probe runs
	settled bool          // decided: err is the answer for every later call
	err     error         // nil, or the refusal
}

// lock waits for the probe of another call, as long as ctx allows.
func (p *poolerCheck) lock(ctx context.Context) error {
	p.once.Do(func() { p.sem = make(chan struct{}, 1) })
	select {
	case p.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *poolerCheck) unlock() { <-p.sem }

// probePooler is checkPoolerStatementCache's probe: ErrPoolerStatementCache
// (wrapped) when the pooler shares named statements, nil when it does not
// or when that cannot be told (then it warns), another error when the probe
// itself failed.
func (c *Client) probePooler(ctx context.Context) error {
	a, err := c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer a.Release()
	pid, err := sqlfuncs.BackendPID(ctx, execMode{a})
	if err != nil {
		return err
	}
	if pid == a.Conn().PgConn().PID() {
		return nil // a direct connection (or a plain TCP proxy)
	}
	if c.pool.Config().MaxConns >= 2 {
		for range poolerProbeAttempts {
			shared, known, err := probeSharedStatements(ctx, c.pool, a)
			if err != nil {
				return fmt.Errorf("pgfence: checking how the connection pooler treats prepared statements: %w", err)
			}
			if known && shared {
				return fmt.Errorf("%w: under load its statements fail with \"prepared statement ... already exists\" (42P05) or \"does not exist\" (26000); "+
					"add default_query_exec_mode=exec to the connection string (or set ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec), "+
					"or let the pooler track prepared statements (PgBouncer 1.21+: max_prepared_statements)", ErrPoolerStatementCache)
			}
			if known {
				return nil // the pooler keeps each client's statements apart
			}
		}
	}
	c.log.Warn("pgfence: the pool caches prepared statements and goes through a connection pooler whose mode could not be told (session mode, or a busy pool); "+
		"behind a transaction-mode pooler that does not track prepared statements its statements fail under load: use default_query_exec_mode=exec there",
		"announced_pid", a.Conn().PgConn().PID(), "backend_pid", pid)
	return nil
}

// probeSharedStatements is one try of the probe of
// checkPoolerStatementCache: known is false when b did not get a's server
// connection, and then shared means nothing.
func probeSharedStatements(ctx context.Context, pool *pgxpool.Pool, a *pgxpool.Conn) (shared, known bool, err error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	name := "pgfence_probe_" + hex.EncodeToString(nonce[:])
	// Clean-up goes on when ctx ends, bounded on its own.
	bg, cancelBg := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancelBg()

	tx, err := a.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	x, err := sqlfuncs.BackendPID(ctx, execMode{tx})
	if err == nil {
		_, err = a.Conn().PgConn().Prepare(ctx, name, "", nil)
	}
	if err != nil {
		_ = tx.Rollback(bg)
		return false, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, false, err
	}
	// Wherever it lives now, the statement goes at the end: through a
	// pooler that tracks statements, a's own Close reaches it; otherwise b
	// closes it on x below, or (b never got x) a's Close may miss it.
	deallocateByA := true
	defer func() {
		if deallocateByA {
			_ = a.Conn().PgConn().Deallocate(bg, name)
		}
	}()

	bctx, cancel := context.WithTimeout(ctx, poolerProbeWait)
	defer cancel()
	b, err := pool.Acquire(bctx)
	if err != nil {
		if ctx.Err() != nil {
			return false, false, ctx.Err()
		}
		return false, false, nil // the pool is busy: cannot tell
	}
	defer b.Release()
	btx, err := b.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer func() { _ = btx.Rollback(bg) }()
	y, err := sqlfuncs.BackendPID(ctx, execMode{btx})
	if err != nil {
		return false, false, err
	}
	if y != x {
		return false, false, nil
	}
	_, err = b.Conn().PgConn().ExecPrepared(ctx, name, nil, nil, nil).Close()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		// b runs on x, where a's statement is: close it there.
		deallocateByA = false
		_ = b.Conn().PgConn().Deallocate(ctx, name)
		return true, true, nil
	case errors.As(err, &pgErr) && pgErr.Code == "26000": // invalid_sql_statement_name
		return false, true, nil
	}
	return false, false, err
}

// execMode runs the probe's own statements in pgx's exec mode (unnamed), so
// that the probe prepares nothing but its own statement on any connection.
type execMode struct{ db sqlfuncs.DB }

func (e execMode) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return e.db.Exec(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}

func (e execMode) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return e.db.QueryRow(ctx, sql, append([]any{pgx.QueryExecModeExec}, args...)...)
}
