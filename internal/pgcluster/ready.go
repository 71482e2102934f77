package pgcluster

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
)

// WaitReady polls until a connection to connURL succeeds and check (when
// not nil) returns true on it, or ctx ends. It is how a server state (up,
// promoted, replaying) is waited for without sleeping blindly: each attempt
// is bounded by five seconds, and attempts are 100 ms apart. The error names
// connURL without its password and wraps the last attempt's error (or the
// one before it, when ctx cut the last one short).
func WaitReady(ctx context.Context, connURL string, check func(context.Context, *pgx.Conn) (bool, error)) error {
	var last error
	for {
		ok, err := tryReady(ctx, connURL, check)
		if ok {
			return nil
		}
		switch {
		case err == nil:
			last = nil // reached, not ready yet
		case last == nil || ctx.Err() == nil:
			last = err
		default:
			// ctx cut this attempt short, which says only that time ran
			// out: keep the error of the attempt before it, which says why.
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return fmt.Errorf("waiting for %s: %w", Redact(connURL), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tryReady is one attempt of WaitReady.
func tryReady(ctx context.Context, connURL string, check func(context.Context, *pgx.Conn) (bool, error)) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, connURL)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	if check == nil {
		return true, nil
	}
	return check(cctx, conn)
}

// Redact returns URL s with its password hidden, for logs and errors.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}
