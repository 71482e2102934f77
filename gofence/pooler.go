package gofence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// ErrPooledSession: a session lease was asked for over a connection that a
// connection pooler (PgBouncer, Supavisor, RDS Proxy, ...) stands in front
// of. A session lease lives as long as one server session, and a pooler
// decouples the client's connection from the server's: behind a
// transaction-mode pooler the next statement may run in another backend,
// and the backend that holds the lease lives on in the pool after the
// holder dies, so the lease would stay live with nobody holding it. Use a
// TTL lease (Acquire, Lock, Do), which works through poolers, or give the
// session leases a pool that connects to PostgreSQL directly.
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
	return fmt.Errorf("%w: the lease of %s was granted in backend %d, the connection was opened with %d (use Acquire, Lock or Do: TTL leases work behind poolers)",
		ErrPooledSession, resource, row.SessionPID, conn.PgConn().PID())
}
