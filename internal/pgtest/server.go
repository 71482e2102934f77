package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// server is the shared PostgreSQL server of the test binary.
type server struct {
	source   string        // where it came from, for the log line
	version  string        // server_version, printed once so a log says what was tested
	adminURL string        // superuser URL to the postgres database
	admin    *pgxpool.Pool // pool on adminURL, for CREATE/DROP DATABASE and roles
	stop     func()        // shuts down what the harness started; nil when nothing
	// preserve, when not nil, is called instead of stop when a failed test
	// kept its database (PGFENCE_TEST_KEEP=1), so the database survives.
	preserve func()

	tplOnce sync.Once
	tplName string
	tplErr  error
}

var (
	serverOnce   sync.Once
	serverVal    *server
	serverErr    error
	shutdownOnce sync.Once
)

// getServer finds the shared server on first use and returns the same
// answer (server or error) afterwards.
func getServer() (*server, error) {
	serverOnce.Do(func() {
		srv, err := findServer()
		serverVal, serverErr = srv, err
		if err == nil {
			fmt.Fprintf(os.Stderr, "pgtest: using %s %s (PostgreSQL %s)\n", srv.source, pgcluster.Redact(srv.adminURL), srv.version)
		}
	})
	return serverVal, serverErr
}

// shutdown closes the admin pool and stops whatever server the harness
// started. It is called by Main once the tests are done (and their
// goroutines with them), and does nothing when no test asked for a server.
func shutdown() {
	shutdownOnce.Do(shutdownServer)
}

func shutdownServer() {
	// Mark the server as found, so that nothing can start one now.
	serverOnce.Do(func() { serverErr = errors.New("test binary is shutting down") })
	srv := serverVal
	if srv == nil {
		return
	}
	if srv.admin != nil {
		srv.admin.Close()
	}
	if srv.preserve != nil && keptDatabases.Load() {
		srv.preserve()
		return
	}
	if srv.stop != nil {
		if keptDatabases.Load() {
			fmt.Fprintf(os.Stderr, "pgtest: %s=1: the kept databases go away with the %s server\n", EnvKeep, srv.source)
		}
		srv.stop()
	}
}

// keptDatabases records that a failed test kept its database, so that
// shutdown must not throw away the local server holding it.
var keptDatabases atomic.Bool

// findServer tries the environment URL, then local binaries.
func findServer() (*server, error) {
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
			return nil, fmt.Errorf("%s must be a postgres:// URL (the harness derives per-test URLs from it)", EnvDatabaseURL)
		}
		srv, err := openServer(EnvDatabaseURL, URLFor(u, "postgres"), nil)
		if err != nil {
			return nil, fmt.Errorf("server from %s: %w", EnvDatabaseURL, err)
		}
		return srv, nil
	}

	reasons := []string{EnvDatabaseURL + " not set"}
	bins, err := pgcluster.LocalBins(os.Getenv(EnvBinDir))
	if err != nil {
		reasons = append(reasons, "local binaries: "+err.Error())
		return nil, &unavailableError{reasons: reasons}
	}
	srv, err := startLocalServer(bins)
	if err != nil {
		return nil, fmt.Errorf("local server from %s: %w", bins.Dir, err)
	}
	return srv, nil
}

// openServer checks that adminURL answers (retrying for a while, since a
// server may still be starting) and opens the admin pool.
func openServer(source, adminURL string, stop func()) (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := pgcluster.WaitReady(ctx, adminURL, nil); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("admin pool: %w", err)
	}
	var version string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		pool.Close()
		return nil, fmt.Errorf("server version: %w", err)
	}
	return &server{source: source, version: version, adminURL: adminURL, admin: pool, stop: stop}, nil
}

// startLocalServer initialises and starts the shared throwaway cluster. It
// trades durability for speed (fsync off), which ordinary tests do not
// observe; fault tests use NewCluster instead.
func startLocalServer(bins pgcluster.Bins) (*server, error) {
	inst, err := pgcluster.StartThrowaway(context.Background(), bins, []string{
		"fsync = off",
		"synchronous_commit = off",
		"full_page_writes = off",
		"max_connections = 300",
	})
	if err != nil {
		return nil, err
	}
	srv, err := openServer("local", inst.URL("postgres"), inst.Destroy)
	if err != nil {
		inst.Destroy()
		return nil, err
	}
	srv.preserve = func() {
		inst.Preserve()
		fmt.Fprintf(os.Stderr, "pgtest: %s=1: kept the local server with the failed tests' databases in %s; start it with: pg_ctl start -D %s -l %s\n",
			EnvKeep, inst.Base, inst.Data, inst.Logfile)
	}
	return srv, nil
}
