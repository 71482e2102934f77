package gofence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// Errors, usable with errors.Is. The fencing outcomes are those of package
// sqlfuncs, so an error from either package matches the same sentinel, and
// the *pgconn.PgError stays reachable with errors.As.
var (
	// ErrStaleToken: a write carried a token older than the resource's latest
	// grant (SQLSTATE FN001). The holder lost its lease; it must stop.
	ErrStaleToken = sqlfuncs.ErrStaleToken
	// ErrNoToken: a write to a protected table carried no token (FN002).
	ErrNoToken = sqlfuncs.ErrNoToken
	// ErrUnknownToken: a token never granted for the resource (FN003).
	ErrUnknownToken = sqlfuncs.ErrUnknownToken
	// ErrBusy: the resource is not held, but its previous holder still has a
	// guarded transaction open (its gate is taken), so no new token can be
	// granted yet: try again soon. Acquire returns it when it tries once
	// (LeaseOptions.Wait waits through it); Revoke returns it when it gave
	// up waiting for such a transaction (SQLSTATE FN004, fence.grant_wait).
	// Nobody is named: for a resource that a live lease holds, see ErrHeld.
	ErrBusy = sqlfuncs.ErrBusy
	// ErrNotInstalled: schema fence is missing or older than this package
	// needs. Run `pgfence migrate up` (or gofence.Migrate).
	ErrNotInstalled = sqlfuncs.ErrNotInstalled

	// ErrHeld: another live lease holds the resource. The error is a
	// *HeldError that says who and until when.
	ErrHeld = errors.New("pgfence: resource is held by another lease")
	// ErrLost: the lease ended without Release: it was superseded, revoked,
	// or could not be renewed before its local trust deadline. Acquire, Do
	// and Elect also return it for a grant whose reply came only after its
	// trust deadline: that grant was given back, never handed over.
	ErrLost = errors.New("pgfence: lease lost")
	// ErrReleased: the lease was released by its holder.
	ErrReleased = errors.New("pgfence: lease released")
	// ErrClosed: the Client was closed; it grants no more leases.
	ErrClosed = errors.New("pgfence: client is closed")
)

// HeldError is returned by Acquire (tried once) when a live lease holds the
// resource: it carries that lease as LeaseInfo (Resource, Holder, Token,
// Kind, ExpiresAt, ServerNow, ...), so it always names a holder.
// ExpiresAt.Sub(ServerNow) is the time left by the server's clock (zero
// ExpiresAt: a session lease). A resource that is busy without a holder
// (ErrBusy) is not a HeldError.
type HeldError struct {
	LeaseInfo
}

func (e *HeldError) Error() string {
	if e.ExpiresAt.IsZero() {
		return fmt.Sprintf("pgfence: %s is held by %s (session lease, token %d); set LeaseOptions.Wait to wait for it", e.Resource, e.Holder, e.Token)
	}
	return fmt.Sprintf("pgfence: %s is held by %s (token %d) for another %s by the server's clock; set LeaseOptions.Wait to wait for it",
		e.Resource, e.Holder, e.Token, e.ExpiresAt.Sub(e.ServerNow).Round(time.Millisecond))
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// transient reports whether an error is worth retrying for an idempotent
// call (renew, release): anything that is not an answer from PostgreSQL
// (a broken or refused connection, a timeout), and the PostgreSQL errors of
// a server in trouble (connection, resources, shutdown, serialization,
// deadlock, lock timeout). Fencing outcomes, bad input and missing
// privileges are answers, and final; so is a lost lease (a grant that came
// back after its trust deadline: a waiting Acquire says so instead of
// asking again).
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed) || errors.Is(err, ErrLost) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "53", "57", "40": // connection, resources, operator intervention, rollback
			return true
		}
		return pgErr.Code == "55P03" // lock_not_available
	}
	return true
}
