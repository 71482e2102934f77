package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// connectError is a connection that failed, said once: pgx reports every
// attempt (each address of a host name, with and without TLS under
// sslmode=prefer), so one cause used to appear two or three times, behind
// a "server refused TLS connection" that was no cause at all. It keeps the
// one cause that matters and the fix that matches it.
type connectError struct {
	cause string // what went wrong, once
	fix   string // what to do about it
	// unreachable: no server answered at all (refused, timed out, no such
	// host), as opposed to one that answered with an error.
	unreachable bool
	err         error // pgx's error, for errors.As (the SQLSTATE in --json)
}

func (e *connectError) Error() string { return e.cause + "; " + e.fix }
func (e *connectError) Unwrap() error { return e.err }

// newConnectError reads the attempts of pgx's error and says what failed at
// host:port, for user and database.
func newConnectError(host string, port uint16, user, database string, err error) *connectError {
	where := fmt.Sprintf("%s:%d", host, port)
	if strings.HasPrefix(host, "/") {
		where = fmt.Sprintf("socket %s (port %d)", host, port)
	}
	attempts := connectAttempts(err)

	// A server that answered is the cause, whatever an earlier attempt met
	// (a TLS refusal before the plaintext attempt, under sslmode=prefer).
	for i := len(attempts) - 1; i >= 0; i-- {
		var pgErr *pgconn.PgError
		if errors.As(attempts[i], &pgErr) {
			return &connectError{
				cause: fmt.Sprintf("PostgreSQL at %s refused the connection of user %s: %s", where, user, pgErr.Error()),
				fix:   loginFix(pgErr, user, database),
				err:   err,
			}
		}
	}
	var msgs []string
	for _, a := range attempts {
		msg := a.Error()
		if u := errors.Unwrap(a); u != nil && strings.HasSuffix(msg, ": "+u.Error()) {
			msg = u.Error() // without pgx's "127.0.0.1:5432 (localhost): "
		}
		if i := strings.LastIndex(msg, ": "); i >= 0 && strings.HasPrefix(msg, "dial error: ") {
			msg = msg[i+2:] // "dial error: dial tcp 127.0.0.1:1: connect: connection refused" -> "connection refused"
		}
		if !slices.Contains(msgs, msg) {
			msgs = append(msgs, msg)
		}
	}
	// Under sslmode=prefer (the default) a server without TLS refuses the
	// first attempt, as expected; the other attempts tell what went wrong.
	if len(msgs) > 1 {
		msgs = slices.DeleteFunc(msgs, func(m string) bool { return strings.HasSuffix(m, "server refused TLS connection") })
	}
	cause := strings.Join(msgs, "; ")
	ce := &connectError{err: err, unreachable: true}
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		ce.cause = fmt.Sprintf("cannot reach PostgreSQL at %s (%s)", where, cause)
		ce.fix = "start it (for example `pg_ctlcluster 15 main start`), or fix the host and port (--database-url, DATABASE_URL, PGHOST, PGPORT)"
	case errors.As(err, &dnsErr):
		ce.cause = fmt.Sprintf("cannot reach PostgreSQL at %s: no such host (%s)", where, cause)
		ce.fix = "fix the host name (--database-url, DATABASE_URL, PGHOST)"
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		ce.cause = fmt.Sprintf("cannot reach PostgreSQL at %s: no answer in time (%s)", where, cause)
		ce.fix = "check the host and port (--database-url, DATABASE_URL, PGHOST, PGPORT) and that the network lets them through, or raise connect_timeout"
	case strings.Contains(cause, "tls") || strings.Contains(cause, "TLS") || strings.Contains(cause, "x509"):
		ce.unreachable = false
		ce.cause = fmt.Sprintf("cannot open a TLS connection to PostgreSQL at %s (%s)", where, cause)
		ce.fix = "check sslmode and the certificate settings (sslrootcert, sslcert, sslkey) in the connection string, and the server's ssl settings"
	default:
		ce.cause = fmt.Sprintf("cannot connect to PostgreSQL at %s (%s)", where, cause)
		ce.fix = "check --database-url / DATABASE_URL / PG* variables"
	}
	return ce
}

// loginFix is the fix for a server's refusal to let the user in.
func loginFix(e *pgconn.PgError, user, database string) string {
	switch {
	case e.Code == "28P01":
		return "check the user and password (in --database-url or DATABASE_URL, PGUSER, PGPASSWORD or ~/.pgpass)"
	case e.Code == "28000" && strings.Contains(e.Message, "does not exist"):
		return "check the user name (in --database-url or DATABASE_URL, or PGUSER), or create the role"
	case e.Code == "28000" && strings.Contains(e.Message, "pg_hba.conf"):
		return "the server's pg_hba.conf admits no such host, user, database and SSL mode: connect as another user or with another sslmode, or have its administrator add a line"
	case strings.HasPrefix(e.Code, "28"):
		return "check the user and how it authenticates (password, ~/.pgpass, certificate) against the server's pg_hba.conf"
	case e.Code == "3D000":
		return "check the database name (in --database-url or DATABASE_URL, or PGDATABASE), or create the database"
	case e.Code == "42501":
		return fmt.Sprintf("as the database's owner: GRANT CONNECT ON DATABASE %s TO %s", quoteIdent(database), quoteIdent(user))
	case e.Code == "53300":
		return "the server has no connection slot left: close idle connections or raise max_connections"
	case e.Code == "57P03":
		return "the server is starting up, shutting down or in recovery: try again shortly"
	}
	return "check --database-url / DATABASE_URL / PG* variables"
}

// connectAttempts lists the errors of each connection attempt in pgx's
// error (an errors.Join under *pgconn.ConnectError), or err itself.
func connectAttempts(err error) []error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return []error{err}
	}
	// The attempts are an errors.Join, possibly wrapped ("hostname resolving
	// error: ...").
	for e := ce.Unwrap(); e != nil; e = errors.Unwrap(e) {
		if joined, ok := e.(interface{ Unwrap() []error }); ok {
			return joined.Unwrap()
		}
	}
	return []error{ce.Unwrap()}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
