// Package cli is the command tree of the pgfence CLI. It takes its arguments
// and writers as parameters so that every command runs in-process in tests.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

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
	// resource, or it is busy: the previous holder's guarded transaction is
	// still open), or renew found the token no longer live.
	ExitHeld = 3
	// ExitRunNotAcquired: pgfence run did not start the command because
	// another holder has the lease, or the previous holder's guarded
	// transaction is still open (with --wait --timeout: still at the
	// timeout). Only then: any other failure is ExitError, so that a wrapper
	// may read 75 as "another instance is running". The default of
	// --conflict-exit-code (-E), which picks another code.
	ExitRunNotAcquired = 75
	// ExitRunLost: pgfence run lost the lease and stopped the command. The
	// default of --lost-exit-code.
	ExitRunLost = 76
	// ExitInterrupted: the command was stopped by SIGINT or SIGTERM before it
	// finished (128 + SIGINT, as shells report it).
	ExitInterrupted = 130
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
// Errors are printed to stderr on one line, with a single "pgfence: " prefix;
// with --json they are also printed on stdout as {"error", "exit_code"} (and
// "sqlstate" when PostgreSQL sent the error).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Commands write from several goroutines (a child's output copied by
	// pgfence run, the logger, the command itself): serialize the writes.
	g := &globals{stdout: &lockedWriter{w: stdout}, stderr: &lockedWriter{w: stderr}}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)

	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	if cmd == root && !errors.As(err, new(exitError)) {
		// root runs nothing: its only errors are command lines that name
		// no command (flag errors are usageErrors already).
		err = usageError{err}
	}
	code := ExitError
	var xerr exitError
	var uerr usageError
	switch {
	case errors.As(err, &xerr):
		code = xerr.code
		err = xerr.err
	case errors.As(err, &uerr):
		code = ExitUsage
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		code = ExitInterrupted
		err = errors.New("interrupted")
	}
	if err == nil {
		return code // the command already said everything
	}
	msg := message(err)
	fmt.Fprintln(g.stderr, "pgfence: "+msg)
	if g.json || jsonRequested(args) {
		out := jsonError{Error: msg, ExitCode: code}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			out.SQLState = pgErr.Code
		}
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	}
	return code
}

// newRoot is the command tree, its commands and flags bound to g.
func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "pgfence",
		Short: "Leases with fencing tokens that PostgreSQL itself enforces",
		Long: `pgfence hands out leases with fencing tokens and makes PostgreSQL refuse
writes that carry a stale token, inside the writing transaction.

Connection: --database-url, else DATABASE_URL, else the standard libpq
variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGSERVICE, ...), else ` + DefaultDatabaseURL + `.`,
		Version:       Version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("pgfence {{.Version}}\n")
	root.PersistentFlags().StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection URL (default: $DATABASE_URL, libpq PG* variables, "+DefaultDatabaseURL+")")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "machine-readable output (one JSON document on stdout; errors as {\"error\", \"exit_code\", \"sqlstate\"}, sqlstate when PostgreSQL raised the error)")
	root.AddCommand(commands(g)...)
	typeUsageErrors(root)
	return root
}

// jsonError is what --json prints on stdout when a command fails.
type jsonError struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
	SQLState string `json:"sqlstate,omitempty"`
}

// jsonRequested reports whether --json appears among the flags of args (before
// a "--"), for errors that happen before the flags were parsed.
func jsonRequested(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "--json=true", "--json=1":
			return true
		}
	}
	return false
}

// typeUsageErrors makes every command-line error of cmd and its subcommands a
// usageError, so that Run decides the exit code by type: flags that do not
// parse and arguments that the command's Args rejects.
func typeUsageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				var uerr usageError
				if errors.As(err, &uerr) {
					return err
				}
				return usageError{fmt.Errorf("%s: %w (usage: pgfence %s)", c.Name(), err, c.Use)}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		typeUsageErrors(sub)
	}
}

// message is err on one line, ready for the single "pgfence: " prefix that
// Run adds: the prefixes of the layers below are dropped, Go API names are
// replaced by the flags that set them, and a PostgreSQL HINT that the message
// lost on its way up (golang-migrate keeps only the message) is added back.
func message(err error) string {
	msg := strings.ReplaceAll(oneLine(err), "pgfence: ", "")
	msg = apiToFlags.Replace(msg)
	if errors.Is(err, context.DeadlineExceeded) {
		// Whatever the layer below called it, say it timed out.
		msg = strings.ReplaceAll(msg, "context deadline exceeded", "timed out")
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Hint != "" {
		if hint := strings.Join(strings.Fields(pgErr.Hint), " "); !strings.Contains(msg, hint) {
			msg += "; " + hint
		}
	}
	return msg
}

// apiToFlags renames the gofence API in messages that reach a CLI user.
var apiToFlags = strings.NewReplacer(
	"Config.TTL", "--ttl",
	"Config.Holder", "--holder",
	"set LeaseOptions.Wait to wait for it", "pass --wait to wait for it",
	"TTL - SafetyMargin", "--ttl - TTL/10",
	" (or set ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec)", "",
	" (or gofence.Migrate)", "",
)

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

// usageError marks errors in the command line (exit 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// libpqEnv lists the environment variables libpq reads to choose and open a
// connection (PostgreSQL's documentation, "Environment Variables"). Any of
// them set means the user configured the connection that way; other PG*
// names (PGFENCE_TOKEN, which pgfence run exports, for one) do not.
var libpqEnv = []string{
	"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD",
	"PGPASSFILE", "PGREQUIREAUTH", "PGCHANNELBINDING", "PGSERVICE",
	"PGSERVICEFILE", "PGOPTIONS", "PGAPPNAME", "PGSSLMODE", "PGREQUIRESSL",
	"PGSSLNEGOTIATION", "PGSSLCOMPRESSION", "PGSSLCERT", "PGSSLKEY",
	"PGSSLCERTMODE", "PGSSLROOTCERT", "PGSSLCRL", "PGSSLCRLDIR", "PGSSLSNI",
	"PGREQUIREPEER", "PGSSLMINPROTOCOLVERSION", "PGSSLMAXPROTOCOLVERSION",
	"PGGSSENCMODE", "PGKRBSRVNAME", "PGGSSLIB", "PGGSSDELEGATION",
	"PGCONNECT_TIMEOUT", "PGCLIENTENCODING", "PGTARGETSESSIONATTRS",
	"PGLOADBALANCEHOSTS", "PGDATESTYLE", "PGTZ", "PGGEQO", "PGSYSCONFDIR",
	"PGLOCALEDIR", "PGSSLPASSWORD",
}

// connString resolves where the database is, in the documented order.
func (g *globals) connString() string {
	if g.databaseURL != "" {
		return g.databaseURL
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	for _, name := range libpqEnv {
		if os.Getenv(name) != "" {
			return "" // pgx reads the PG* variables itself
		}
	}
	return DefaultDatabaseURL
}

// connect opens a pool and checks that the server answers, turning a failed
// connection into its one cause and the fix for it (connectError).
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
		closePool(pool)
		if ctx.Err() != nil {
			return nil, err // interrupted, not a connection problem
		}
		return nil, newConnectError(cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.User, cfg.ConnConfig.Database, err)
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
// What the client logs goes to stderr as the CLI's own lines (newLogger),
// unless cfg.Logger is set.
func (g *globals) client(ctx context.Context, cfg gofence.Config) (*gofence.Client, *pgxpool.Pool, error) {
	pool, err := g.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = newLogger(g.stderr, nil)
	}
	c, err := gofence.New(pool, &cfg)
	if err != nil {
		closePool(pool)
		return nil, nil, usageError{err}
	}
	return c, pool, nil
}

// withClient connects, runs fn with a client, and closes both. A missing
// privilege on the kit gets its fix (explainDenied).
func (g *globals) withClient(ctx context.Context, cfg gofence.Config, fn func(*gofence.Client) error) error {
	c, pool, err := g.client(ctx, cfg)
	if err != nil {
		return err
	}
	defer closePool(pool)
	defer closeClient(c)
	return explainDenied(ctx, pool, fn(c))
}

// closeWait bounds closePool and closeClient (a variable for the test of
// that bound).
var closeWait = 3 * time.Second

// closePool closes pool, waiting at most closeWait. pgxpool.Close waits for
// every acquired connection to be released, forever; a connection that a
// library failed to hand back (golang-migrate keeps the one it took when
// preparing its version table fails) would otherwise keep pgfence from ever
// exiting. The CLI exits soon after, which closes such a connection anyway.
func closePool(pool *pgxpool.Pool) { bounded(pool.Close) }

// closeClient closes the client (its acquires in flight, its listener),
// waiting at most closeWait: its connections may sit on a network that no
// longer answers.
func closeClient(c *gofence.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), closeWait)
	defer cancel()
	_ = c.Close(ctx)
}

// bounded runs fn and waits for it at most closeWait; past that, fn goes on
// in the background.
func bounded(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// oneLine folds an error onto a single line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
