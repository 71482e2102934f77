package pgtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// ClusterDB is the database NewCluster creates (and migrates) for the test.
const ClusterDB = "fence"

// ClusterOptions tunes NewCluster.
type ClusterOptions struct {
	// NoMigrate leaves the fence database empty, for tests that apply the
	// migrations themselves.
	NoMigrate bool
	// Config holds extra postgresql.conf settings (name to value, written
	// verbatim, so quote strings: "synchronous_standby_names": "'*'").
	// Standbys inherit them.
	Config map[string]string
}

// Cluster is a private PostgreSQL cluster for one test, built from local
// binaries, for fault tests that crash, restart or promote servers. Unlike
// the shared server it keeps fsync on, since durability across a crash is
// what such tests check, and it is configured for streaming replication.
type Cluster struct {
	inst *pgcluster.Instance
}

// NewCluster initialises and starts a private cluster listening on a free
// port of 127.0.0.1, creates the database "fence" and migrates it (unless
// opts.NoMigrate); URL points at it. The cluster is stopped and removed when
// the test ends, after its server log tail has been logged if the test
// failed. Without local PostgreSQL binaries the test is skipped (failed
// under PGFENCE_TEST_REQUIRE_DB=1): a server of PGFENCE_TEST_DATABASE_URL
// cannot stand in, because the test needs to control the server process
// and its files. Under go test -short the test is skipped.
func NewCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: -short: skipping a test that needs a cluster of its own")
	}
	bins, err := pgcluster.LocalBins(os.Getenv(EnvBinDir))
	if err != nil {
		skipOrFatal(t, &unavailableError{reasons: []string{"NewCluster needs local PostgreSQL binaries: " + err.Error()}})
	}
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()

	conf := []string{
		"fsync = on",
		"wal_level = replica",
		"max_wal_senders = 10",
		"hot_standby = on",
		"max_connections = 100",
		"shared_buffers = 32MB",
	}
	keys := make([]string, 0, len(opts.Config))
	for k := range opts.Config {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		conf = append(conf, k+" = "+opts.Config[k])
	}
	inst, err := pgcluster.StartThrowaway(ctx, bins, conf)
	if err != nil {
		t.Fatalf("pgtest: new cluster: %v", err)
	}
	c := &Cluster{inst: inst}
	c.registerCleanup(t)

	admin, err := pgx.Connect(ctx, c.AdminURL())
	if err != nil {
		t.Fatalf("pgtest: connect to new cluster: %v", err)
	}
	defer admin.Close(context.Background())
	t.Logf("pgtest: private cluster: PostgreSQL %s from %s", admin.PgConn().ParameterStatus("server_version"), bins.Dir)
	if _, err := pgcluster.CreateDB(ctx, admin, ClusterDB, ""); err != nil {
		t.Fatalf("pgtest: create database %s: %v", ClusterDB, err)
	}
	if !opts.NoMigrate {
		if err := migrateURL(ctx, c.URL()); err != nil {
			t.Fatalf("pgtest: new cluster: %v", err)
		}
	}
	return c
}

// registerCleanup stops and removes the cluster when the test ends; when the
// test failed it logs the server log tail, and under PGFENCE_TEST_KEEP=1 it
// keeps the (stopped) data directory for inspection.
func (c *Cluster) registerCleanup(t testing.TB) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: cluster %s (%s), server log tail:\n%s", c.URL(), c.inst.Base, c.inst.LogTail(40))
			if keep() {
				c.inst.Preserve()
				t.Logf("pgtest: %s=1: keeping %s (pg_ctl start -D %s -l %s)", EnvKeep, c.inst.Base, c.inst.Data, c.inst.Logfile)
				return
			}
		}
		c.inst.Destroy()
	})
}

// URL returns the superuser URL of the cluster's fence database.
func (c *Cluster) URL() string { return c.inst.URL(ClusterDB) }

// AdminURL returns the superuser URL of the cluster's postgres database.
func (c *Cluster) AdminURL() string { return c.inst.URL("postgres") }

// URLAs returns URL with the user replaced by role and no password; the
// cluster uses trust authentication.
func (c *Cluster) URLAs(role string) string { return URLAs(c.URL(), role) }

// Port returns the TCP port the cluster listens on (on 127.0.0.1). It stays
// the same across Stop and Start.
func (c *Cluster) Port() int { return c.inst.Port }

// DataDir returns the cluster's data directory, for tests that inspect or
// damage its files while it is stopped.
func (c *Cluster) DataDir() string { return c.inst.Data }

// Logfile returns the path of the server log.
func (c *Cluster) Logfile() string { return c.inst.Logfile }

// LogTail returns the last n lines of the server log, for failure messages.
func (c *Cluster) LogTail(n int) string { return c.inst.LogTail(n) }

// Stop stops the server with pg_ctl's shutdown mode: "immediate" simulates a
// crash (no checkpoint, recovery at the next start), "fast" is a clean
// shutdown that disconnects sessions, "smart" waits for them.
func (c *Cluster) Stop(t testing.TB, mode string) {
	t.Helper()
	switch mode {
	case "immediate", "fast", "smart":
	default:
		t.Fatalf("pgtest: Stop mode %q: want immediate, fast or smart", mode)
	}
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := c.inst.Stop(ctx, mode); err != nil {
		t.Fatalf("pgtest: stop cluster: %v", err)
	}
}

// Start starts the stopped server on the same port and waits until it
// accepts connections, crash recovery included.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := c.inst.Start(ctx); err != nil {
		t.Fatalf("pgtest: start cluster: %v\nserver log:\n%s", err, c.inst.LogTail(30))
	}
}

// Restart stops the server with mode (see Stop) and starts it again.
func (c *Cluster) Restart(t testing.TB, mode string) {
	t.Helper()
	c.Stop(t, mode)
	c.Start(t)
}

// NewStandby clones the cluster with pg_basebackup (-R -X stream), or, when
// the server's bin directory has none (the server-only binaries of the
// version matrix), with a copy of the data directory taken between
// pg_backup_start and pg_backup_stop, into a new
// asynchronous streaming standby on another free port, starts it, and waits
// until it is in recovery and accepts read-only connections. It is stopped
// and removed when the test ends, like its primary.
func (c *Cluster) NewStandby(t testing.TB) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	inst, err := pgcluster.New(c.inst.Bins)
	if err != nil {
		t.Fatalf("pgtest: new standby: %v", err)
	}
	s := &Cluster{inst: inst}
	s.registerCleanup(t)

	appName := filepath.Base(inst.Base)
	if _, err := os.Stat(inst.Bins.Path("pg_basebackup")); err == nil {
		conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", c.inst.Port, appName)
		if _, err := inst.Run(ctx, "pg_basebackup", "-D", inst.Data, "-R", "-X", "stream",
			"-c", "fast", "-w", "-d", conninfo); err != nil {
			t.Fatalf("pgtest: new standby: %v", err)
		}
	} else {
		// Server-only binaries (the version matrix): the same base backup
		// by hand, through the server's backup functions.
		t.Logf("pgtest: no pg_basebackup in %s: standby built from a copy of the data directory taken between pg_backup_start and pg_backup_stop", inst.Bins.Dir)
		if err := copyBaseBackup(ctx, c.inst, inst, appName); err != nil {
			t.Fatalf("pgtest: new standby (copied base backup): %v", err)
		}
	}
	if err := inst.AppendConf([]string{"unix_socket_directories = " + pgcluster.QuoteConf(inst.Base)}); err != nil {
		t.Fatalf("pgtest: new standby: %v", err)
	}
	if err := inst.StartNewPort(ctx); err != nil {
		t.Fatalf("pgtest: start standby: %v\nserver log:\n%s", err, inst.LogTail(30))
	}
	err = pgcluster.WaitReady(ctx, s.AdminURL(), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var inRecovery bool
		err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		return inRecovery, err
	})
	if err != nil {
		t.Fatalf("pgtest: standby never reached recovery: %v", err)
	}
	return s
}

// Promote promotes a standby (pg_ctl promote -w) and waits until it accepts
// writes, that is until pg_is_in_recovery() is false.
func (c *Cluster) Promote(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if _, err := c.inst.Run(ctx, "pg_ctl", "promote", "-w", "-t", strconv.Itoa(int(opTimeout/time.Second)), "-D", c.inst.Data); err != nil {
		t.Fatalf("pgtest: promote: %v\nserver log:\n%s", err, c.inst.LogTail(30))
	}
	err := pgcluster.WaitReady(ctx, c.AdminURL(), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var inRecovery bool
		err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		return !inRecovery, err
	})
	if err != nil {
		t.Fatalf("pgtest: promoted server still in recovery: %v", err)
	}
}

// WaitCaughtUp waits until standby has replayed everything the cluster had
// written when WaitCaughtUp was called, so that a test can reason about what
// a promoted standby knows.
func (c *Cluster) WaitCaughtUp(t testing.TB, standby *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	var lsn string
	if err := pgcluster.WaitReady(ctx, c.AdminURL(), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
		return err == nil, err
	}); err != nil {
		t.Fatalf("pgtest: primary WAL position: %v", err)
	}
	err := pgcluster.WaitReady(ctx, standby.AdminURL(), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var done bool
		err := conn.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&done)
		return done, err
	})
	if err != nil {
		t.Fatalf("pgtest: standby did not replay up to %s: %v", lsn, err)
	}
}
