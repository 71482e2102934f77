package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// EnvRequirePgBouncer, set to 1, turns "no pgbouncer binary" from a skip
// into a failure, like EnvRequireDB for the server.
const EnvRequirePgBouncer = "PGFENCE_TEST_REQUIRE_PGBOUNCER"

// PgBouncerPoolSize is the number of server connections PgBouncer keeps per
// database and user in the tests: small, so that clients really share
// backends, as they do behind a production pooler.
const PgBouncerPoolSize = 3

// PgBouncer is a PgBouncer (in transaction pooling mode, unless started with
// NewPgBouncerInMode) in front of a test server, started for one test on a
// free port of 127.0.0.1 with a generated configuration, and stopped when
// the test ends. Every database of the server is reachable through it under
// its own name, as the user postgres.
type PgBouncer struct {
	// Port is the port PgBouncer listens on.
	Port int
	// Version is what `pgbouncer --version` printed first.
	Version string
	// Mode is its pool_mode: transaction or session.
	Mode string
	dir  string
	log  string
}

// NewPgBouncer starts PgBouncer (pool_mode = transaction) in front of the
// server that serverURL points to. Without a pgbouncer binary the test is
// skipped, or failed under PGFENCE_TEST_REQUIRE_PGBOUNCER=1 (CI installs
// Debian's pgbouncer and sets it). As root, PgBouncer runs as the OS user
// postgres, since it refuses to run as root.
func NewPgBouncer(t testing.TB, serverURL string) *PgBouncer {
	t.Helper()
	return NewPgBouncerInMode(t, serverURL, "transaction")
}

// NewPgBouncerInMode is NewPgBouncer with another pool_mode ("session" or
// "transaction"): a session-mode pooler keeps a client on one server
// connection, which tests tell from transaction mode.
func NewPgBouncerInMode(t testing.TB, serverURL, mode string) *PgBouncer {
	t.Helper()
	if mode != "transaction" && mode != "session" {
		t.Fatalf("pgtest: pool_mode %q: use transaction or session", mode)
	}
	bin, err := findPgBouncer()
	if err != nil {
		if os.Getenv(EnvRequirePgBouncer) == "1" {
			t.Fatalf("pgtest: %v (%s=1)", err, EnvRequirePgBouncer)
		}
		t.Skipf("pgtest: skipping, %v (install pgbouncer, or set %s=1 to fail instead)", err, EnvRequirePgBouncer)
	}
	target := mustParseURL(serverURL)
	host, port := target.Hostname(), target.Port()
	if port == "" {
		port = "5432"
	}
	version := "pgbouncer"
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		version = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}

	dir, err := os.MkdirTemp("", "pgfence-pgbouncer-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := pgcluster.ChownToServerUser(dir); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	b := &PgBouncer{Version: version, Mode: mode, dir: dir, log: filepath.Join(dir, "pgbouncer.log")}
	// Run before the directory goes (cleanups run last registered first),
	// after PgBouncer stopped: a failed test shows what the pooler saw.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: the test failed; pgbouncer's log:\n%s", b.LogTail(200))
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	var lastErr error
	for range 3 { // another process may take the free port before PgBouncer binds it
		b.Port, err = pgcluster.FreePort()
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		conf := strings.Join([]string{
			"[databases]",
			fmt.Sprintf("* = host=%s port=%s user=postgres", host, port),
			"[pgbouncer]",
			"listen_addr = 127.0.0.1",
			"listen_port = " + strconv.Itoa(b.Port),
			"unix_socket_dir =",
			"auth_type = any",
			"pool_mode = " + mode,
			"default_pool_size = " + strconv.Itoa(PgBouncerPoolSize),
			"max_client_conn = 500",
			"ignore_startup_parameters = extra_float_digits",
			// After a server connection fails (a loaded server refusing
			// or slow to accept), PgBouncer waits server_login_retry before
			// it tries again, 15 s by default, holding or refusing the
			// pool's clients meanwhile (seen here: clients queued 15 s
			// behind one failed connect); a test's pooler retries after 1 s.
			"server_login_retry = 1",
			"logfile = " + b.log,
			"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
			"",
		}, "\n")
		ini := filepath.Join(dir, "pgbouncer.ini")
		if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		lastErr = b.start(t, ctx, bin, ini)
		if lastErr == nil {
			t.Logf("pgtest: %s in %s mode on 127.0.0.1:%d in front of %s:%s (pool size %d)", version, mode, b.Port, host, port, PgBouncerPoolSize)
			return b
		}
		if !strings.Contains(b.LogTail(20), "in use") {
			break
		}
	}
	t.Fatalf("pgtest: start pgbouncer: %v\nlog:\n%s", lastErr, b.LogTail(30))
	return nil
}

// start runs PgBouncer in the foreground as a child, registers its stop,
// and waits until a connection through it reaches the server.
func (b *PgBouncer) start(t testing.TB, ctx context.Context, bin, ini string) error {
	cmd, err := pgcluster.ServerCommand(b.dir, bin, ini)
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		// SIGTERM: immediate shutdown; SIGKILL when it does not exit.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	probe := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", b.Port)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan error, 1)
	go func() { ready <- pgcluster.WaitReady(wctx, probe, nil) }()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			return err
		}
		t.Cleanup(stop)
		return nil
	case err := <-exited:
		exited <- err // for stop, should it be called
		cancel()
		<-ready
		if err == nil {
			err = errors.New("pgbouncer exited")
		}
		return err
	}
}

// URL returns dbURL (a URL of the server behind PgBouncer) rewritten to go
// through PgBouncer: same database, user and parameters, PgBouncer's host
// and port.
func (b *PgBouncer) URL(dbURL string) string {
	u := mustParseURL(dbURL)
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port))
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	return u.String()
}

// LogTail returns the last n lines of PgBouncer's log, for failure messages.
func (b *PgBouncer) LogTail(n int) string {
	return pgcluster.TailFile(b.log, "pgbouncer log", n)
}

// ServerListens returns the channels that PgBouncer's server connections
// to the database of dbURL (a URL of the server behind it) listen on, as
// pg_listening_channels() says on each: it holds PgBouncerPoolSize
// transactions through PgBouncer at once, so that each runs on a server
// connection of its own and together they cover the pool.
func (b *PgBouncer) ServerListens(t testing.TB, dbURL string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	var txs []pgx.Tx
	defer func() {
		for _, tx := range txs {
			_ = tx.Rollback(context.Background())
		}
	}()
	var channels []string
	for range PgBouncerPoolSize {
		conn, err := pgx.Connect(ctx, b.URL(dbURL)+"&default_query_exec_mode=exec")
		if err != nil {
			t.Fatalf("pgtest: connect through pgbouncer: %v", err)
		}
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatalf("pgtest: begin through pgbouncer: %v", err)
		}
		txs = append(txs, tx)
		rows, err := tx.Query(ctx, `SELECT pg_listening_channels()`)
		if err != nil {
			t.Fatalf("pgtest: pg_listening_channels through pgbouncer: %v", err)
		}
		chans, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("pgtest: pg_listening_channels through pgbouncer: %v", err)
		}
		channels = append(channels, chans...)
	}
	return channels
}

func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("no pgbouncer binary (PATH, /usr/sbin)")
}
