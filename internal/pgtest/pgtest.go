// Package pgtest is the one test harness of pgfence that provides a real
// PostgreSQL server. Fencing tokens are only as good as the database semantics
// they rely on (row locks, advisory locks, durability, failover), so the kit is
// tested against real servers rather than mocks.
//
// Ordinary tests call [Setup] (a fresh database with the kit's migrations
// applied) or [Empty] (a fresh database without them). Both need a TestMain
// that calls [Main], so that whatever server the harness started is shut down
// when the test binary ends:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// The shared server is found lazily, once per test binary, in this order:
//
//  1. PGFENCE_TEST_DATABASE_URL: a superuser URL (postgres:// form) to an
//     existing server, such as the container of the repository's
//     docker-compose.yml; the harness creates and drops its own databases
//     there (PostgreSQL 13 or newer, for DROP DATABASE ... WITH (FORCE)).
//  2. A throwaway cluster built from local PostgreSQL binaries (initdb,
//     pg_ctl), found through PGFENCE_TEST_PG_BINDIR, PATH, pg_config --bindir,
//     or well-known install directories.
//
// The harness needs nothing but pgx: it is part of the library's module
// (the library's own tests use it), and whatever it imported would be
// carried by every module that requires pgfence.
//
// When none is available, tests that need a database are skipped, unless
// PGFENCE_TEST_REQUIRE_DB=1, in which case they fail: CI should set it so that a
// broken environment cannot pass silently.
//
// Fault tests (crash, restart, promotion) call [NewCluster] instead, which
// always builds a private cluster from local binaries, with fsync on.
//
// PGFENCE_TEST_KEEP=1 keeps the databases, roles and cluster directories of
// failed tests so that a person can inspect them; their URLs are logged.
//
// Under go test -short, NewCluster and NewWALArchive skip their test (a
// cluster of its own costs seconds), and tests that run long on purpose
// (randomized histories, sustained load, large statements) call [Long]
// first; everything else runs. CI runs without -short.
//
// Runnable examples cannot skip: when no server can be found at all (no
// PGFENCE_TEST_DATABASE_URL, no local binaries) and PGFENCE_TEST_REQUIRE_DB
// is not 1, Main leaves them out with go test's -skip, and says so.
package pgtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgfence/pgfence/internal/pgcluster"
)

// Environment variables understood by the harness.
const (
	// EnvDatabaseURL names a superuser URL of an existing server to use.
	EnvDatabaseURL = "PGFENCE_TEST_DATABASE_URL"
	// EnvRequireDB, set to 1, turns "no PostgreSQL available" from a skip
	// into a failure.
	EnvRequireDB = "PGFENCE_TEST_REQUIRE_DB"
	// EnvKeep, set to 1, keeps the databases of failed tests.
	EnvKeep = "PGFENCE_TEST_KEEP"
	// EnvBinDir names a directory holding initdb, pg_ctl and friends; it is
	// tried before PATH.
	EnvBinDir = "PGFENCE_TEST_PG_BINDIR"
)

// opTimeout bounds every single harness operation (creating a database,
// starting a server, waiting for replay...) so that a wedged server turns
// into a clear test failure rather than a hung test binary.
const opTimeout = 2 * time.Minute

// mainCalled records that the test binary's TestMain goes through Main, which
// is what guarantees that a server started by the harness is shut down.
var mainCalled atomic.Bool

// Main runs the tests of a package, shuts down whatever shared server the
// harness started (a local cluster), runs atExit, and exits with the
// tests' exit code. Call it from TestMain; Setup, Empty, AdminURL and
// NewRole refuse to run without it, because a local cluster started without
// it would outlive the test binary.
func Main(m *testing.M, atExit ...func()) {
	mainCalled.Store(true)
	skipExamplesWithoutServer()
	raiseParallel()
	code := m.Run()
	shutdown()
	for _, f := range atExit {
		f()
	}
	os.Exit(code)
}

// Long skips t under go test -short: a test that runs for seconds on
// purpose (a randomized history, sustained load, statements over many
// rows) and that the full run, and CI, keep. why says what it does.
func Long(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("pgtest: -short: skipping %s", why)
	}
}

// parallelPerCPU is how many parallel tests per CPU Main lets run at once
// on the harness's own server (see raiseParallel).
const parallelPerCPU = 4

// raiseParallel lets parallelPerCPU × GOMAXPROCS tests marked t.Parallel
// run at once (at most 16), instead of go test's default of GOMAXPROCS,
// under -short, when the tests will use the harness's own throwaway
// cluster and the command line does not set -parallel. The tests spend
// most of their time waiting (for a TTL, a proxy's delay, a server's
// answer), not on a CPU; on a 2-CPU machine the default kept all but two
// of them waiting, and a package took twice as long. The full run keeps
// the default: with four per CPU, tests whose TTLs are a few hundred
// milliseconds missed their deadlines on a loaded CI machine. A server of
// PGFENCE_TEST_DATABASE_URL keeps the default: its max_connections is not
// the harness's to know.
func raiseParallel() {
	if os.Getenv(EnvDatabaseURL) != "" || !testing.Short() {
		return
	}
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	set := false
	flag.Visit(func(g *flag.Flag) { set = set || g.Name == "test.parallel" })
	if set {
		return
	}
	_ = f.Value.Set(strconv.Itoa(min(parallelPerCPU*runtime.GOMAXPROCS(0), 16)))
}

// skipExamplesWithoutServer leaves the runnable examples out (-skip
// ^Example) when no server can be found and none is required: an example
// cannot skip, and without a database its output would be wrong. It finds
// out without starting anything: the URL is set, or local binaries exist.
// A -skip of the caller's own is kept, and then the examples run (and fail
// without a server).
func skipExamplesWithoutServer() {
	if !flag.Parsed() {
		flag.Parse()
	}
	if os.Getenv(EnvDatabaseURL) != "" || os.Getenv(EnvRequireDB) == "1" {
		return
	}
	if _, err := pgcluster.LocalBins(os.Getenv(EnvBinDir)); err == nil {
		return
	}
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
		if err := f.Value.Set("^Example"); err == nil {
			fmt.Fprintf(os.Stderr, "pgtest: no PostgreSQL (%s not set, no local server binaries): leaving out the examples, which cannot skip\n", EnvDatabaseURL)
		}
	}
}

// DB is a database created for one test. It is dropped when the test ends
// (kept, and its URL logged, when the test failed and PGFENCE_TEST_KEEP=1).
type DB struct {
	// URL connects to the database as the server's superuser.
	URL string
	// Name is the database name, unique on the server.
	Name string
	// Pool is a connection pool on URL, closed before the database is
	// dropped. It has pgxpool's default size; tests that need more, or
	// pinned, sessions open them with Conn.
	Pool *pgxpool.Pool
}

// Setup creates a fresh database for the test, cloned from a template that
// was migrated up once per test binary with the kit's migrations, so every
// test starts from the schema users get without paying for the migrations
// each time. The database, its pool and any Conn are cleaned up with the
// test.
func Setup(t testing.TB) *DB {
	t.Helper()
	srv := requireServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	tpl, err := srv.template(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return newDB(t, srv, tpl)
}

// Empty creates a fresh database without any migration (cloned from
// template0), for tests of the migrations themselves. It is cleaned up like
// the databases of Setup.
func Empty(t testing.TB) *DB {
	t.Helper()
	srv := requireServer(t)
	return newDB(t, srv, "template0")
}

// newDB clones template into a uniquely named database and registers its
// cleanup.
func newDB(t testing.TB, srv *server, template string) *DB {
	t.Helper()
	stateFor(t) // registers its cleanup first, so roles are dropped after the databases
	name := pgcluster.ScratchName("pgtest_", 6)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	drop, err := pgcluster.CreateDBStrategy(ctx, srv.admin, name, template, srv.cloneStrategy)
	if err != nil {
		t.Fatalf("pgtest: create database %s from %s: %v", name, template, err)
	}
	db := &DB{URL: URLFor(srv.adminURL, name), Name: name}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: database of failed test: %s", db.URL)
			if keep() {
				t.Logf("pgtest: %s=1: keeping database %s", EnvKeep, name)
				keptDatabases.Store(true)
				return
			}
		}
		if err := drop(context.Background()); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})

	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatalf("pgtest: pool for %s: %v", name, err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgtest: ping %s: %v", name, err)
	}
	db.Pool = pool
	return db
}

// Conn opens an extra dedicated connection to the database, closed when the
// test ends. Tests of fencing need several real concurrent sessions (one
// holding a lock, one being fenced), which a pool does not guarantee.
func (db *DB) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	return connect(t, db.URL)
}

// URLAs returns the database URL with the user replaced by role and no
// password, for tests that check what a less privileged role may do. It
// relies on trust authentication, which is what the local servers use; with
// PGFENCE_TEST_DATABASE_URL the server must trust local roles too (the
// container of docker-compose.yml does).
func (db *DB) URLAs(role string) string {
	return URLAs(db.URL, role)
}

// AdminURL returns a superuser URL to the postgres database of the shared
// server, for tests that manage databases or roles themselves.
func AdminURL(t testing.TB) string {
	t.Helper()
	return requireServer(t).adminURL
}

// KitCatalog describes everything in schema fence, one sorted line per
// object, so that two installs (or one before a down migration and after
// it) can be compared: functions (with a hash of their bodies, security,
// settings and privileges; the guards fence.protect and fence.protect_rows
// generate included), relations, columns, constraints, triggers, views, the
// schema's privileges, and the golang-migrate version row.
func KitCatalog(t testing.TB, ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) []string {
	t.Helper()
	rows, err := db.Query(ctx, kitCatalogQuery)
	if err == nil {
		var lines []string
		if lines, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
			return lines
		}
	}
	t.Fatalf("pgtest: read the kit's catalog: %v", err)
	return nil
}

const kitCatalogQuery = `
SELECT 'function ' || p.oid::regprocedure || ' ' || md5(p.prosrc) || ' definer=' || p.prosecdef
       || ' config=' || coalesce(p.proconfig::text, '') || ' acl=' || coalesce(p.proacl::text, '')
  FROM pg_proc p WHERE p.pronamespace = 'fence'::regnamespace
UNION ALL
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' acl=' || coalesce(c.relacl::text, '') || ' options=' || coalesce(c.reloptions::text, '')
  FROM pg_class c WHERE c.relnamespace = 'fence'::regnamespace
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relnamespace = 'fence'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
UNION ALL
SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE connamespace = 'fence'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'fence'::regnamespace
UNION ALL
SELECT 'view ' || viewname || ' ' || md5(definition) FROM pg_views WHERE schemaname = 'fence'
UNION ALL
SELECT 'schema acl=' || coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname = 'fence'
UNION ALL
SELECT 'version ' || version || ' dirty=' || dirty FROM fence_schema_migrations
ORDER BY 1`

// RequireNoDatabases fails the test when the shared server has a database
// whose name starts with prefix: a program under test (the bench) must drop
// the scratch databases it made.
func RequireNoDatabases(t testing.TB, prefix string) {
	t.Helper()
	srv := requireServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	var left []string
	rows, err := srv.admin.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY 1`, prefix)
	if err == nil {
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatalf("pgtest: list databases: %v", err)
	}
	if len(left) > 0 {
		t.Fatalf("pgtest: databases left behind: %v", left)
	}
}

// URLFor returns base with its database name replaced by dbname, keeping the
// host, credentials and query parameters. It panics on a URL that does not
// parse, since harness URLs always do.
func URLFor(base, dbname string) string {
	u := mustParseURL(base)
	u.Path = "/" + dbname
	u.RawPath = ""
	return u.String()
}

// URLAs returns base with its user replaced by role and no password; see
// (*DB).URLAs.
func URLAs(base, role string) string {
	u := mustParseURL(base)
	u.User = url.User(role)
	return u.String()
}

// NewRole creates a unique LOGIN role whose name starts with prefix, and
// drops it when the test ends, after the test's databases are gone (however
// the calls are ordered), so that objects and grants inside them do not keep
// the role alive. Dropping objects the role owns elsewhere is the caller's
// job; a role that still cannot be dropped is logged, not failed.
func NewRole(t testing.TB, prefix string) string {
	t.Helper()
	srv := requireServer(t)
	st := stateFor(t)
	name := pgcluster.ScratchName(prefix+"_", 5)
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if _, err := srv.admin.Exec(ctx, "CREATE ROLE "+ident(name)+" LOGIN"); err != nil {
		t.Fatalf("pgtest: create role %s: %v", name, err)
	}
	st.mu.Lock()
	st.roles = append(st.roles, name)
	st.mu.Unlock()
	return name
}

// testState is what the harness remembers per test: the roles to drop once
// the test's databases are gone.
type testState struct {
	mu    sync.Mutex
	roles []string
}

var (
	statesMu sync.Mutex
	states   = map[testing.TB]*testState{}
)

// stateFor returns the state of t, creating it and registering its cleanup
// on first use. Because cleanups run last-registered-first and this one is
// registered before any database of the test, it runs after they are dropped.
func stateFor(t testing.TB) *testState {
	statesMu.Lock()
	defer statesMu.Unlock()
	if st, ok := states[t]; ok {
		return st
	}
	st := &testState{}
	states[t] = st
	t.Cleanup(func() {
		statesMu.Lock()
		delete(states, t)
		statesMu.Unlock()
		st.mu.Lock()
		roles := st.roles
		st.mu.Unlock()
		if len(roles) == 0 {
			return
		}
		if t.Failed() && keep() {
			t.Logf("pgtest: %s=1: keeping roles %v", EnvKeep, roles)
			return
		}
		srv, err := getServer()
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		for _, r := range roles {
			if _, err := srv.admin.Exec(ctx, "DROP ROLE IF EXISTS "+ident(r)); err != nil {
				t.Logf("pgtest: could not drop role %s (still owns objects or holds grants somewhere): %v", r, err)
			}
		}
	})
	return st
}

// requireServer returns the shared server, skipping the test when there is
// none (failing it under PGFENCE_TEST_REQUIRE_DB=1) and failing it when the
// server could not be set up.
func requireServer(t testing.TB) *server {
	t.Helper()
	if !mainCalled.Load() {
		t.Fatal("pgtest: the package's TestMain must call pgtest.Main(m), so that the shared PostgreSQL server is shut down when the tests end")
	}
	srv, err := getServer()
	if err != nil {
		skipOrFatal(t, err)
	}
	return srv
}

// skipOrFatal ends the test: a skip when err only says that no PostgreSQL is
// available and the environment does not require one, a failure otherwise.
func skipOrFatal(t testing.TB, err error) {
	t.Helper()
	var na *unavailableError
	if errors.As(err, &na) && os.Getenv(EnvRequireDB) != "1" {
		t.Skipf("pgtest: skipping, %v (set %s to a superuser URL, for instance of docker-compose.yml's server, or install PostgreSQL server binaries)", err, EnvDatabaseURL)
	}
	t.Fatalf("pgtest: %v", err)
}

// unavailableError says that no PostgreSQL server could be found at all, as
// opposed to one that was found but misbehaved.
type unavailableError struct{ reasons []string }

func (e *unavailableError) Error() string {
	msg := "no PostgreSQL available"
	for i, r := range e.reasons {
		if i == 0 {
			msg += ": "
		} else {
			msg += "; "
		}
		msg += r
	}
	return msg
}

// connect opens a dedicated connection closed with the test.
func connect(t testing.TB, connURL string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", pgcluster.Redact(connURL), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	})
	return conn
}

func keep() bool { return os.Getenv(EnvKeep) == "1" }

// ident quotes a name as an SQL identifier.
func ident(name string) string { return pgcluster.Ident(name) }

func mustParseURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(fmt.Sprintf("pgtest: bad URL %q: %v", pgcluster.Redact(s), err))
	}
	return u
}

// MustMigratedDB is Setup for code that gets no *testing.T, such as
// runnable examples: a fresh database cloned from the migrated template,
// and a function that drops it. The package's TestMain must call Main,
// which leaves the examples out when no server can be found (examples
// cannot skip, and their output would be wrong); a server that was found
// but fails makes it panic.
func MustMigratedDB() (url string, drop func()) {
	if !mainCalled.Load() {
		panic("pgtest: the package's TestMain must call pgtest.Main(m)")
	}
	srv, err := getServer()
	if err != nil {
		panic(fmt.Sprintf("pgtest: examples need PostgreSQL: %v", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	tpl, err := srv.template(ctx)
	if err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	name := pgcluster.ScratchName("pgtest_", 6)
	dropDB, err := pgcluster.CreateDBStrategy(ctx, srv.admin, name, tpl, srv.cloneStrategy)
	if err != nil {
		panic(fmt.Sprintf("pgtest: create database %s: %v", name, err))
	}
	return URLFor(srv.adminURL, name), func() { _ = dropDB(context.Background()) }
}
