package sqlfuncs

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs of pgfence's fencing outcomes (class FN).
const (
	// CodeStaleToken: the token is older than the resource's latest grant.
	CodeStaleToken = "FN001"
	// CodeNoToken: a write to a protected table carried no token.
	CodeNoToken = "FN002"
	// CodeUnknownToken: the token was never granted for the resource.
	CodeUnknownToken = "FN003"
	// CodeBusy: a grant waited fence.grant_wait for an open guarded
	// transaction under the old token and gave up (fence.revoke raises it;
	// fence.acquire answers NULL instead).
	CodeBusy = "FN004"
)

// Sentinel errors, usable with errors.Is on any error a binding returns.
var (
	// ErrStaleToken: the token is older than the latest grant (FN001). The
	// holder lost its lease; it must stop writing.
	ErrStaleToken = errors.New("pgfence: stale fencing token")
	// ErrNoToken: a write to a protected table carried no token (FN002).
	ErrNoToken = errors.New("pgfence: no fencing token")
	// ErrUnknownToken: the token was never granted for that resource (FN003).
	ErrUnknownToken = errors.New("pgfence: unknown fencing token")
	// ErrBusy: a grant gave up waiting for an open guarded transaction (FN004).
	ErrBusy = errors.New("pgfence: resource busy")
	// ErrNotInstalled: schema fence, or a function this package calls, is
	// missing from the database. Apply the migrations (pgfence migrate up).
	ErrNotInstalled = errors.New("pgfence: schema fence is not installed or is older than this package; run `pgfence migrate up`")
)

// Error is what the bindings return for a PostgreSQL error they recognise.
// It matches its sentinel (errors.Is) and still unwraps to the
// *pgconn.PgError (errors.As), so SQLSTATE, DETAIL and HINT stay reachable.
type Error struct {
	// Kind is one of the sentinels above.
	Kind error
	// PgErr is the error PostgreSQL sent.
	PgErr *pgconn.PgError
	// Err is the error that was translated: PgErr itself, or an error of the
	// caller's that wraps it (its message and other wrapped errors are kept).
	Err error
}

// Error gives PostgreSQL's message, its detail and its hint on one line,
// after the caller's own context when the translated error had some.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Err != nil && e.Err.Error() != e.PgErr.Error() {
		// The caller's context around the PgError: keep its words.
		b.WriteString(e.Err.Error())
		if e.PgErr.Hint != "" {
			b.WriteString("; " + e.PgErr.Hint)
		}
		if e.Kind == ErrNotInstalled {
			b.WriteString(": " + ErrNotInstalled.Error())
		}
		return b.String()
	}
	b.WriteString(e.PgErr.Message)
	if e.PgErr.Detail != "" {
		b.WriteString(" (" + e.PgErr.Detail + ")")
	}
	if e.PgErr.Hint != "" {
		b.WriteString("; " + e.PgErr.Hint)
	}
	if e.Kind == ErrNotInstalled {
		b.WriteString(": " + ErrNotInstalled.Error())
	}
	return b.String()
}

// Unwrap exposes the sentinel and the translated error (and through it the
// PgError).
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind, e.PgErr}
}

// Translate is the one place where PostgreSQL errors become pgfence errors.
// Errors it does not recognise pass through untouched.
func Translate(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) {
		return err
	}
	var done *Error
	if errors.As(err, &done) {
		return err // translated already
	}
	var kind error
	switch pgErr.Code {
	case CodeStaleToken:
		kind = ErrStaleToken
	case CodeNoToken:
		kind = ErrNoToken
	case CodeUnknownToken:
		kind = ErrUnknownToken
	case CodeBusy:
		kind = ErrBusy
	case "3F000": // invalid_schema_name: schema "fence" does not exist
		if strings.Contains(pgErr.Message, `"fence"`) {
			kind = ErrNotInstalled
		}
	case "42883": // undefined_function: an older schema lacks it
		if strings.Contains(pgErr.Message, "fence.") {
			kind = ErrNotInstalled
		}
	}
	if kind == nil {
		return err
	}
	return &Error{Kind: kind, PgErr: pgErr, Err: err}
}
