package gofence

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
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
	// ErrBusy: a revoke gave up waiting for an open guarded transaction (FN004).
	ErrBusy = sqlfuncs.ErrBusy
	// ErrNotInstalled: schema fence is missing or older than this package
	// needs. Run `pgfence migrate up` (or gofence.Migrate).
	ErrNotInstalled = sqlfuncs.ErrNotInstalled

	// ErrHeld: another live lease holds the resource. The error is a
	// *HeldError that says who and until when.
	ErrHeld = errors.New("pgfence: resource is held by another lease")
	// ErrLost: the lease ended without Release: it was superseded, revoked,
	// or could not be renewed before its local trust deadline. Acquire,
	// AcquireWait, Do and Elect also return it for a grant whose reply came
	// only after its trust deadline: that grant was given back, never
	// handed over.
	ErrLost = errors.New("pgfence: lease lost")
	// ErrReleased: the lease was released by its holder.
	ErrReleased = errors.New("pgfence: lease released")
	// ErrClosed: the Client was closed; it grants no more leases.
	ErrClosed = errors.New("pgfence: client is closed")
)

// HeldError is returned by Acquire when a live lease holds the resource. It
// carries the holder's lease as LeaseInfo (Resource is the resource asked
// for; Holder, Token, Kind, ExpiresAt and ServerNow describe the live lease,
// and are empty when the resource was busy with an open guarded transaction
// of a previous holder rather than held): ExpiresAt.Sub(ServerNow) is the
// time left by the server's clock.
type HeldError struct {
	LeaseInfo
}

func (e *HeldError) Error() string {
	switch {
	case e.Holder == "":
		return fmt.Sprintf("pgfence: %s is busy: a transaction under the previous token is still open; try again, or use AcquireWait to wait for it", e.Resource)
	case e.ExpiresAt.IsZero():
		return fmt.Sprintf("pgfence: %s is held by %s (session lease, token %d); use AcquireWait to wait for it", e.Resource, e.Holder, e.Token)
	default:
		return fmt.Sprintf("pgfence: %s is held by %s (token %d) for another %s by the server's clock; use AcquireWait to wait for it",
			e.Resource, e.Holder, e.Token, e.ExpiresAt.Sub(e.ServerNow).Round(time.Millisecond))
	}
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// transient reports whether an error is worth retrying for an idempotent
// call (renew, release): anything that is not an answer from PostgreSQL
// (a broken or refused connection, a timeout), and the PostgreSQL errors of
// a server in trouble (connection, resources, shutdown, serialization,
// deadlock, lock timeout). Fencing outcomes, bad input and missing
// privileges are answers, and final; so is a lost lease (a grant that came
// back after its trust deadline: AcquireWait says so instead of asking
// again).
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

// LockKey is fence.lock_key computed in Go: the first 8 bytes of
// sha256(name as UTF-8), big-endian, with the top bit set. It is always
// negative, so it never collides with golang-migrate's migration lock keys
// ([0, 2^32)) or with session-lease keys ([2^62, 2^63)).
func LockKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]) | 1<<63)
}
