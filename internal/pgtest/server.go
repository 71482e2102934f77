package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

	// cloneStrategy is the STRATEGY of the CREATE DATABASE that clones the
	// template for each test: FILE_COPY on the local throwaway cluster of
	// PostgreSQL 15 or newer (fsync off: its checkpoints cost little, and a
	// clone takes about 0.1 s instead of 0.4-0.6 s), else the default.
	cloneStrategy string

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

// localConf is the configuration of the shared throwaway cluster: it trades
// durability for speed, which ordinary tests do not observe. Prepared
// transactions are on for the interleaving tester's prepared family
// (sqlfuncs' TestInterleavings).
var localConf = []string{
	"fsync = off",
	"synchronous_commit = off",
	"full_page_writes = off",
	"max_connections = 300",
	"max_prepared_transactions = 20",
}

// startLocalServer starts the shared throwaway cluster (fsync off; fault
// tests use NewCluster instead), in memory when the system has a RAM
// directory (pgcluster.RAMDir: on a busy or virtual disk, writes cost many
// times more than in memory, and durability is no concern here). It starts
// from a copy of a snapshot when one exists for these binaries, this
// configuration and these migrations (see snapshotDir), which skips initdb
// and the template's migrations; else it runs initdb, and saves a snapshot
// for the next test binaries.
func startLocalServer(bins pgcluster.Bins) (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	parent := pgcluster.RAMDir()
	snap, err := snapshotDir(ctx, bins, parent)
	if err == nil {
		if _, statErr := os.Stat(filepath.Join(snap, "data")); statErr == nil {
			inst, err := pgcluster.StartCopy(ctx, bins, parent, filepath.Join(snap, "data"), nil)
			if err == nil {
				now := time.Now()
				_ = os.Chtimes(snap, now, now) // in use: not one to clean up
				return localServer(inst, "local (from a snapshot)")
			}
			fmt.Fprintf(os.Stderr, "pgtest: starting from the snapshot %s failed, running initdb: %v\n", snap, err)
		}
	}
	inst, err := pgcluster.StartThrowawayIn(ctx, bins, parent, localConf)
	if err != nil {
		return nil, err
	}
	if snap != "" {
		saveSnapshot(ctx, inst, snap)
	}
	return localServer(inst, "local")
}

// snapshotDir names the directory of the snapshot for bins, localConf and
// the migrations: in parent ("": the temporary directory), named after a
// hash of the server's version, its binaries' directory, the configuration
// and the migrations, so that any change of these gets a snapshot of its
// own. (A change of what ensureTemplate makes needs a new "snapshot N".)
func snapshotDir(ctx context.Context, bins pgcluster.Bins, parent string) (string, error) {
	version, err := exec.CommandContext(ctx, bins.Path("postgres"), "--version").Output()
	if err != nil {
		return "", fmt.Errorf("postgres --version: %w", err)
	}
	migs, err := migrationsHash()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "snapshot 1\n%s\n%s\n%s\n%s\n", bins.Dir, strings.TrimSpace(string(version)), strings.Join(localConf, "\n"), migs)
	if parent == "" {
		parent = os.TempDir()
	}
	return filepath.Join(parent, snapshotPrefix+hex.EncodeToString(h.Sum(nil))[:16]), nil
}

// snapshotPrefix begins the names of the snapshot directories (not
// pgcluster's "pgfence-pg-", whose directories belong to a process).
const snapshotPrefix = "pgfence-pgtest-snapshot-"

// saveSnapshot makes the template database in the freshly initialised
// cluster inst, stops it, copies its data directory to snap (atomically: a
// copy under another name, then renamed; another test binary that saved
// the same snapshot first wins), and starts it again. Snapshots that no test
// binary used for a day are removed. It only speeds later binaries up: on
// any failure it says so and leaves inst running as it found it.
func saveSnapshot(ctx context.Context, inst *pgcluster.Instance, snap string) {
	warn := func(err error) {
		fmt.Fprintf(os.Stderr, "pgtest: no snapshot of the local server for the next test binaries: %v\n", err)
	}
	srv, err := openServer("local", inst.URL("postgres"), nil)
	if err != nil {
		warn(err)
		return
	}
	_, err = srv.ensureTemplate(ctx)
	srv.admin.Close()
	if err != nil {
		warn(err)
		return
	}
	if err := inst.Stop(ctx, "fast"); err != nil {
		warn(err)
		return
	}
	defer func() {
		if err := inst.Start(ctx); err != nil {
			warn(err)
		}
	}()
	tmp, err := os.MkdirTemp(filepath.Dir(snap), snapshotPrefix+"tmp-")
	if err != nil {
		warn(err)
		return
	}
	defer os.RemoveAll(tmp) // empty once renamed
	if err := inst.Snapshot(ctx, filepath.Join(tmp, "data")); err != nil {
		warn(err)
		return
	}
	if err := os.Rename(tmp, snap); err != nil && !errors.Is(err, fs.ErrExist) && !isNotEmpty(err) {
		warn(err)
		return
	}
	removeOldSnapshots(snap)
}

// isNotEmpty reports whether err is rename's answer for a target directory
// that exists and is not empty (ENOTEMPTY, or EEXIST on some systems).
func isNotEmpty(err error) bool {
	return strings.Contains(err.Error(), "directory not empty") || strings.Contains(err.Error(), "file exists")
}

// removeOldSnapshots removes the snapshot directories other than keep that
// no test binary started from for a day (each start touches its snapshot),
// and copies left behind by a binary that died while saving one.
func removeOldSnapshots(keep string) {
	dirs, _ := filepath.Glob(filepath.Join(filepath.Dir(keep), snapshotPrefix+"*"))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if d == keep || err != nil || time.Since(fi.ModTime()) < 24*time.Hour {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

// localServer is the server of a started throwaway cluster.
func localServer(inst *pgcluster.Instance, source string) (*server, error) {
	srv, err := openServer(source, inst.URL("postgres"), inst.Destroy)
	if err != nil {
		inst.Destroy()
		return nil, err
	}
	var num int
	if err := srv.admin.QueryRow(context.Background(), "SELECT current_setting('server_version_num')::int").Scan(&num); err == nil && num >= 150000 {
		srv.cloneStrategy = "FILE_COPY"
	}
	srv.preserve = func() {
		inst.Preserve()
		fmt.Fprintf(os.Stderr, "pgtest: %s=1: kept the local server with the failed tests' databases in %s; start it with: pg_ctl start -D %s -l %s\n",
			EnvKeep, inst.Base, inst.Data, inst.Logfile)
	}
	return srv, nil
}
