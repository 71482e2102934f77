package sqlfuncs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// LeaseState is what the kit knows of one resource's lease: a row of the
// view fence.leases, read with the server's clock. It is the one type for a
// lease's state in every package (gofence.LeaseInfo and gofence.HeldError
// are this type).
type LeaseState struct {
	// Resource is the resource name.
	Resource string
	// Holder is who holds (or last held) the lease; empty after fence.revoke.
	Holder string
	// Token is the latest token granted for the resource.
	Token int64
	// Kind is "ttl", "session" or "revoked".
	Kind string
	// AcquiredAt is when the latest token was granted (server clock).
	AcquiredAt time.Time
	// ExpiresAt is when a TTL lease expires (server clock); zero for other kinds.
	ExpiresAt time.Time
	// EndedAt is when the lease was released or revoked; zero while not ended.
	EndedAt time.Time
	// Live reports whether the lease is live now by the server's clock.
	Live bool
	// SessionPID is the backend pid of a session lease; zero for other kinds.
	SessionPID int32
	// ServerNow is the server's clock_timestamp() when the row was read:
	// ExpiresAt.Sub(ServerNow) is the time left by the server's clock.
	ServerNow time.Time
}

const leaseColumns = `resource, coalesce(holder, ''), token, kind, acquired_at,
	coalesce(expires_at, '-infinity'), coalesce(ended_at, '-infinity'), live, coalesce(session_pid, 0), clock_timestamp()`

func scanLease(row pgx.Row) (LeaseState, error) {
	var l LeaseState
	var exp, ended timeOrInf
	err := row.Scan(&l.Resource, &l.Holder, &l.Token, &l.Kind, &l.AcquiredAt, &exp, &ended, &l.Live, &l.SessionPID, &l.ServerNow)
	l.ExpiresAt, l.EndedAt = exp.t, ended.t
	return l, err
}

// GetLease reads the row of resource from fence.leases; ok is false when the
// resource has never been granted.
func GetLease(ctx context.Context, db DB, resource string) (l LeaseState, ok bool, err error) {
	l, err = scanLease(db.QueryRow(ctx, `SELECT `+leaseColumns+` FROM fence.leases WHERE resource = $1`, resource))
	if errors.Is(err, pgx.ErrNoRows) {
		return LeaseState{}, false, nil
	}
	return l, err == nil, Translate(err)
}

// Querier is a DB that can also run multi-row queries.
type Querier interface {
	DB
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ListLeases reads every row of fence.leases, ordered by resource.
func ListLeases(ctx context.Context, db Querier) ([]LeaseState, error) {
	rows, err := db.Query(ctx, `SELECT `+leaseColumns+` FROM fence.leases ORDER BY resource`)
	if err != nil {
		return nil, Translate(err)
	}
	defer rows.Close()
	var out []LeaseState
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, Translate(err)
		}
		out = append(out, l)
	}
	return out, Translate(rows.Err())
}

// BeginWithToken begins a transaction on conn and registers token with
// fence.use_token in the same round trip (both statements go in one simple
// query), so statements on guarded tables are accepted from the first one
// on. It fails like UseToken (ErrStaleToken, ...) and then leaves conn
// outside any transaction.
func BeginWithToken(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions, resource string, token int64) (pgx.Tx, error) {
	return BeginWithTokens(ctx, conn, opts, []string{resource}, []int64{token})
}

// BeginWithTokens is BeginWithToken for several resources: it begins a
// transaction on conn and registers tokens[i] for resources[i] with
// fence.use_token, in the order given, all in the same round trip as BEGIN.
// The first token that fails the check ends it like UseToken (ErrStaleToken,
// ...), and conn is then outside any transaction. The two slices must have
// the same, non-zero length (else an error, and nothing is sent).
func BeginWithTokens(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions, resources []string, tokens []int64) (pgx.Tx, error) {
	if err := checkPairs(resources, tokens); err != nil {
		return nil, err
	}
	begin := "BEGIN"
	if opts.IsoLevel != "" {
		begin += " ISOLATION LEVEL " + string(opts.IsoLevel)
	}
	if opts.AccessMode != "" {
		begin += " " + string(opts.AccessMode)
	}
	if opts.DeferrableMode != "" {
		begin += " " + string(opts.DeferrableMode)
	}
	// One SELECT whose columns are the calls, evaluated left to right. The
	// simple query protocol takes no parameters, hence the literals.
	var q strings.Builder
	q.WriteString(begin + "; SELECT ")
	for i, r := range resources {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("fence.use_token(" + quoteLiteral(r) + ", " + strconv.FormatInt(tokens[i], 10) + ")")
	}
	opts.BeginQuery = q.String()
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			// BEGIN ran and use_token failed: leave the aborted transaction.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
				return nil, fmt.Errorf("%w (and rolling back: %v)", Translate(err), rerr)
			}
		}
		return nil, Translate(err)
	}
	return tx, nil
}

// checkPairs refuses resource and token lists that do not pair up, before
// anything is sent: registering fewer tokens than the caller meant would
// only show later, as a refused write.
func checkPairs(resources []string, tokens []int64) error {
	if len(resources) != len(tokens) {
		return fmt.Errorf("pgfence: %d resources but %d tokens: pass one token per resource", len(resources), len(tokens))
	}
	if len(resources) == 0 {
		return errors.New("pgfence: no resources given: pass at least one resource and its token")
	}
	return nil
}

// quoteLiteral quotes s as an E” string literal, correct whatever
// standard_conforming_strings says. Resource names cannot hold NUL bytes
// (PostgreSQL text cannot), so doubling quotes and backslashes is enough.
func quoteLiteral(s string) string {
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `'`, `''`)
	return `E'` + s + `'`
}

// ReleaseChannel is the NOTIFY channel on which fence.release and fence.revoke
// announce a free resource (the payload is the resource name).
const ReleaseChannel = "fence_release"

// Listen subscribes conn to ReleaseChannel. Notifications then arrive through
// conn.WaitForNotification.
func Listen(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, "LISTEN "+ReleaseChannel)
	return Translate(err)
}
