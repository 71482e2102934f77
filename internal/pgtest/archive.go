package pgtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// NewWALArchive returns a new, empty directory that the servers of
// NewCluster can write to and read from (they run as the OS user postgres
// when the tests run as root), for a WAL archive shared by several servers:
// name it in archive_command and restore_command through
// ClusterOptions.Config, which standbys inherit. It lives in a cluster
// directory of its own, so it is removed when the test ends (kept under
// PGFENCE_TEST_KEEP=1 when the test failed), and reaped by a later run if
// the test process dies first. Under go test -short the test is skipped.
func NewWALArchive(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: -short: skipping a test that needs clusters of its own")
	}
	bins, err := pgcluster.LocalBins(os.Getenv(EnvBinDir))
	if err != nil {
		skipOrFatal(t, &unavailableError{reasons: []string{"NewWALArchive needs local PostgreSQL binaries: " + err.Error()}})
	}
	inst, err := pgcluster.New(bins) // a base directory owned by the server's OS user; no data directory
	if err != nil {
		t.Fatalf("pgtest: new WAL archive: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() && keep() {
			inst.Preserve()
			t.Logf("pgtest: %s=1: keeping WAL archive %s", EnvKeep, inst.Base)
			return
		}
		inst.Destroy()
	})
	// The base directory is private to the server's user; the archive inside
	// it may be written by whichever user the servers run as.
	dir := filepath.Join(inst.Base, "archive")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("pgtest: new WAL archive: %v", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatalf("pgtest: new WAL archive: %v", err)
	}
	return dir
}
