// Package cli is the command tree of the pgfence CLI. It takes its arguments
// and writers as parameters so that every command runs in-process in tests.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/gofence"
)

// Exit codes of every command.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitError: the command failed (bad input, database error).
	ExitError = 1
	// ExitUsage: the command line could not be parsed.
	ExitUsage = 2
	// ExitHeld: acquire was not granted (another live lease holds the
	// resource), or renew found the token no longer live.
	ExitHeld = 3
	// ExitRunNotAcquired: pgfence run could not get the lease, so the
	// command never started.
	ExitRunNotAcquired = 75
	// ExitRunLost: pgfence run lost the lease and stopped the command.
	ExitRunLost = 76
)

// exitError carries a specific exit code with its error (the message may be
// empty when the command already said everything).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}
func (e exitError) Unwrap() error { return e.err }

// DefaultDatabaseURL is used when neither --database-url, DATABASE_URL nor
// any PG* variable says where the database is.
const DefaultDatabaseURL = "postgres://localhost:5432/postgres"

// globals are the flags every command shares.
type globals struct {
	databaseURL string
	json        bool
	stdout      io.Writer
	stderr      io.Writer
}

// Run parses args, runs the command and returns the process exit code.
// Errors are printed to stderr on one line.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Commands write from several goroutines (a child's output copied by
	// pgfence run, the logger, the command itself): serialize the writes.
	g := &globals{stdout: &lockedWriter{w: stdout}, stderr: &lockedWriter{w: stderr}}
	root := &cobra.Command{
		Use:   "pgfence",
		Short: "Leases with fencing tokens that PostgreSQL itself enforces",
		Long: `pgfence hands out leases with fencing tokens and makes PostgreSQL refuse
writes that carry a stale token, inside the writing transaction.

Connection: --database-url, else DATABASE_URL, else the standard libpq PG*
variables (PGHOST, PGPORT, PGUSER, PGDATABASE, ...), else ` + DefaultDatabaseURL + `.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection URL (default: $DATABASE_URL, PG* variables, "+DefaultDatabaseURL+")")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "machine-readable output (one JSON document on stdout)")
	root.AddCommand(commands(g)...)

	if err := root.ExecuteContext(ctx); err != nil {
		var xerr exitError
		if errors.As(err, &xerr) {
			if xerr.err != nil {
				fmt.Fprintln(g.stderr, "pgfence: "+oneLine(xerr.err))
			}
			return xerr.code
		}
		fmt.Fprintln(g.stderr, "pgfence: "+oneLine(err))
		var uerr usageError
		if errors.As(err, &uerr) || strings.HasPrefix(err.Error(), "unknown command") || strings.Contains(err.Error(), "flag") {
			return ExitUsage
		}
		return ExitError
	}
	return ExitOK
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// unreachableError marks a server that did not answer at all.
type unreachableError struct{ error }

func (e unreachableError) Unwrap() error { return e.error }

// usageError marks errors in the command line.
type usageError struct{ error }

// connString resolves where the database is, in the documented order.
func (g *globals) connString() string {
	if g.databaseURL != "" {
		return g.databaseURL
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") && strings.Contains(kv, "=") {
			return "" // pgx reads the PG* variables itself
		}
	}
	return DefaultDatabaseURL
}

// connect opens a pool and checks that the server answers, turning a refused
// connection into advice.
func (g *globals) connect(ctx context.Context) (*pgxpool.Pool, error) {
	return connectTo(ctx, g.connString())
}

func connectTo(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("bad connection string: %w", err)
	}
	// A short-lived CLI gains nothing from pgx's statement cache, and named
	// prepared statements break behind a transaction-mode pooler (PgBouncer:
	// "prepared statement stmtcache_... already exists", 42P05, on the next
	// command): exec mode sends each statement unnamed, in one round trip,
	// with parameters bound by the server. A default_query_exec_mode in the
	// URL still wins. Its cost is in docs/platforms.md.
	if !strings.Contains(connString, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return nil, fmt.Errorf("connecting to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
		}
		return nil, unreachableError{fmt.Errorf("cannot reach PostgreSQL at %s:%d (%v); start it (for example `pg_ctlcluster 15 main start`) or point --database-url / DATABASE_URL at a running server",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)}
	}
	return pool, nil
}

// emit writes v as JSON under --json, else calls text.
func (g *globals) emit(v any, text func(w io.Writer) error) error {
	if g.json {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return text(g.stdout)
}

// client connects and returns a gofence client (and the pool to close).
func (g *globals) client(ctx context.Context, cfg gofence.Config) (*gofence.Client, *pgxpool.Pool, error) {
	pool, err := g.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := gofence.New(pool, &cfg)
	if err != nil {
		pool.Close()
		return nil, nil, usageError{err}
	}
	return c, pool, nil
}

// withClient connects, runs fn with a client, and closes both.
func (g *globals) withClient(ctx context.Context, cfg gofence.Config, fn func(*gofence.Client) error) error {
	c, pool, err := g.client(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer c.Close()
	return fn(c)
}

// oneLine folds an error onto a single line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
