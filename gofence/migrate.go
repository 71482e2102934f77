package gofence

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Migrate applies every embedded migration that the database does not have
// yet, recording them in the fence_schema_migrations table, exactly as the
// upstream migrate CLI does with
// x-migrations-table=fence_schema_migrations. It is safe to run from several
// processes at once (golang-migrate serializes them with an advisory lock
// keyed on that table, distinct from an application's own migrations) and it
// does not close pool.
//
// It reads first: on a kit that is already at the latest version it
// returns nil without asking golang-migrate for anything, so an application
// role (which may not create golang-migrate's table, or even read it) can
// call it at start-up once the kit's owner has migrated. On a kit installed
// without golang-migrate (fence.version() answers but
// fence_schema_migrations does not exist) and older than the latest
// version, it returns an error matching ErrVersionNotRecorded and changes
// nothing: Baseline records the installed version first.
//
// Every migration function is bounded by ctx and hands back every connection
// it took from pool, also when it fails (an owner without CREATE on the
// schema of the version table, an application role). When ctx ends during a
// migration, its connection is closed: the server rolls that migration back
// (each file is one transaction) and golang-migrate's table records it
// dirty; ForceMigrationVersion to the previous version, then Migrate again.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	r, err := readRecord(ctx, pool)
	if err != nil {
		return err
	}
	if !r.tableExists {
		switch {
		case r.installed == migrations.Latest:
			return nil // up to date, however it was installed
		case r.installed > 0:
			return r.notRecorded()
		}
		return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Up() })
	}
	if v, dirty, err := MigrationVersion(ctx, pool); err == nil && v == migrations.Latest && !dirty {
		return nil
	}
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Up() })
}

// MigrateTo migrates up or down to version (0 removes the kit; see
// migrations/*.down.sql, which refuses while tables are protected). On a
// kit installed without golang-migrate it returns an error matching
// ErrVersionNotRecorded and changes nothing (see Baseline).
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, version uint) error {
	if err := refuseUnrecorded(ctx, pool); err != nil {
		return err
	}
	if version == 0 {
		return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Down() })
	}
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Migrate(version) })
}

// MigrateSteps applies n migrations up (n > 0) or down (n < 0). On a kit
// installed without golang-migrate it returns an error matching
// ErrVersionNotRecorded and changes nothing (see Baseline).
func MigrateSteps(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if err := refuseUnrecorded(ctx, pool); err != nil {
		return err
	}
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Steps(n) })
}

// ErrVersionNotRecorded: schema fence is installed (fence.version()
// answers) but golang-migrate's version table fence_schema_migrations does
// not exist in the role's current schema, as after the kit's files were
// applied by psql or copied into another migration tool. golang-migrate
// would take such a database for an empty one, create its table at version
// 0 and fail on the first file ("schema fence already exists"), leaving it
// dirty. Migrate (below the latest version), MigrateTo, MigrateSteps and
// ForceMigrationVersion return it before creating anything; Baseline (or
// `pgfence migrate baseline`) records the installed version.
var ErrVersionNotRecorded = errors.New("pgfence: schema fence is installed but its version is not recorded in " + migrations.Table)

// Baseline records the version of a kit that was installed without
// golang-migrate (ErrVersionNotRecorded): it creates fence_schema_migrations
// in the role's current schema and records there, clean, the version that
// fence.version() reports, running no migration. Migrate, the CLI and the
// upstream migrate CLI then go on from that version. It returns the version
// recorded.
//
// When the table exists already and records that same version clean,
// Baseline changes nothing and returns it. Any other record (another
// version, dirty) is refused, as is a database without the kit or with a
// kit newer than this package: ForceMigrationVersion is the tool for a
// record known to be wrong. Run it as the kit's owner, with CREATE on the
// schema of the version table.
func Baseline(ctx context.Context, pool *pgxpool.Pool) (uint, error) {
	r, err := readRecord(ctx, pool)
	if err != nil {
		return 0, err
	}
	switch {
	case r.installed == 0:
		return 0, errors.New("pgfence: schema fence is not installed, so there is no version to record: run Migrate (pgfence migrate up) to install it")
	case r.installed > migrations.Latest:
		return 0, fmt.Errorf("pgfence: fence.version() says %d, newer than this package's migrations (%d): record it with a build that carries them; nothing was changed", r.installed, migrations.Latest)
	}
	if r.tableExists {
		v, dirty, err := MigrationVersion(ctx, pool)
		if err != nil {
			return 0, err
		}
		if v == r.installed && !dirty {
			return v, nil
		}
		return 0, fmt.Errorf("pgfence: %s.%s already records version %d%s while fence.version() says %d: Baseline only records a kit installed without golang-migrate; if the record is wrong, repair it with ForceMigrationVersion (pgfence migrate force VERSION); nothing was changed",
			r.schema, migrations.Table, v, map[bool]string{true: " (dirty)"}[dirty], r.installed)
	}
	err = withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Force(int(r.installed)) })
	if err != nil {
		return 0, err
	}
	return r.installed, nil
}

// record is what the database says about the kit's version before
// golang-migrate is asked for anything.
type record struct {
	installed   uint   // fence.version(); 0 when schema fence is missing
	schema      string // where golang-migrate keeps its table for this role
	tableExists bool   // its table is there (whether or not this role may read it)
}

// readRecord reads the record, writing nothing. When schema fence exists
// but its version cannot be read and no version table exists, it cannot
// tell a copied install from anything else, and says so.
func readRecord(ctx context.Context, pool *pgxpool.Pool) (record, error) {
	var r record
	var err error
	r.schema, r.tableExists, err = sqlfuncs.VersionTable(ctx, pool, migrations.Table)
	if err != nil {
		return r, fmt.Errorf("pgfence: looking for the version table %s: %w", migrations.Table, err)
	}
	v, err := sqlfuncs.Version(ctx, pool)
	switch {
	case errors.Is(err, ErrNotInstalled):
	case err != nil && !r.tableExists:
		return r, fmt.Errorf("pgfence: schema fence exists, but this role can call neither fence.version() nor find %s in schema %q, so its version is unknown: migrate as the kit's owner; nothing was changed: %w", migrations.Table, r.schema, err)
	case err == nil && v > 0:
		r.installed = uint(v)
	}
	return r, nil
}

// notRecorded is the ErrVersionNotRecorded of r, with the fix.
func (r record) notRecorded() error {
	where := "no schema on this role's search_path"
	if r.schema != "" {
		where = fmt.Sprintf("schema %s has no table %s", r.schema, migrations.Table)
	}
	return fmt.Errorf("%w: fence.version() says %d and %s (the kit's files were applied without golang-migrate); as the kit's owner, record version %d with `pgfence migrate baseline` (gofence.Baseline), then migrate; nothing was changed",
		ErrVersionNotRecorded, r.installed, where, r.installed)
}

// refuseUnrecorded returns the ErrVersionNotRecorded of a kit installed
// without golang-migrate, before a changing call lets golang-migrate create
// an empty version table.
func refuseUnrecorded(ctx context.Context, pool *pgxpool.Pool) error {
	r, err := readRecord(ctx, pool)
	if err != nil {
		return err
	}
	if !r.tableExists && r.installed > 0 {
		return r.notRecorded()
	}
	return nil
}

// MigrationVersion reports the installed version and whether a migration
// failed half-way (dirty). Version 0 means the kit is not installed; (0, true)
// means a migration down from version 1 failed half-way.
//
// It only reads. golang-migrate's record in fence_schema_migrations is read
// in a READ ONLY transaction, so a database that never had the kit is not
// given the table (golang-migrate would create it). When this role cannot
// see that table (it does not exist, or an application role was never
// granted SELECT on it), the answer is fence.version(), which
// fence.grant_usage grants: the version of the schema actually installed,
// and never dirty, since only golang-migrate's record knows about a
// half-failed migration (ask as the role that migrates).
func MigrationVersion(ctx context.Context, pool *pgxpool.Pool) (version uint, dirty bool, err error) {
	err = withDriver(ctx, pool, readOnly, func(_ *migrate.Migrate, drv database.Driver) error {
		// Asked of the driver, not of migrate.Migrate.Version, which reports
		// "no version" and drops the dirty flag after a failed first up or last down.
		v, d, verr := drv.Version()
		if verr != nil {
			return verr
		}
		if v > 0 {
			version = uint(v)
		}
		dirty = d
		return nil
	})
	if err == nil || !cannotReadRecord(err) {
		return version, dirty, err
	}
	v, err := sqlfuncs.Version(ctx, pool)
	switch {
	case errors.Is(err, ErrNotInstalled):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("pgfence: reading the installed version with fence.version() (an application role needs fence.grant_usage): %w", err)
	}
	return uint(v), false, nil
}

// cannotReadRecord reports whether reading golang-migrate's record failed
// because this role cannot see it: the read-only transaction refused the
// CREATE TABLE that golang-migrate tries when the table is not visible, or
// the table is visible but not readable.
func cannotReadRecord(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "25006" || pgErr.Code == "42501")
}

// ForceMigrationVersion records version as applied and clean without running
// anything: the way out of a dirty state once the database was repaired by
// hand. -1 records "no version". On a kit installed without golang-migrate
// it returns an error matching ErrVersionNotRecorded and creates nothing:
// Baseline records the version fence.version() reports.
func ForceMigrationVersion(ctx context.Context, pool *pgxpool.Pool, version int) error {
	if err := refuseUnrecorded(ctx, pool); err != nil {
		return err
	}
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Force(version) })
}

// access says whether golang-migrate may write (migrations) or only read
// (the version).
type access bool

const (
	readWrite access = false
	readOnly  access = true
)

// withMigrate builds a golang-migrate instance over the embedded files and a
// database/sql view of pool, runs fn, and hands back every connection it took
// from pool, on every path.
func withMigrate(ctx context.Context, pool *pgxpool.Pool, fn func(*migrate.Migrate) error) error {
	return withDriver(ctx, pool, readWrite, func(m *migrate.Migrate, _ database.Driver) error { return fn(m) })
}

// withDriver is withMigrate that also hands fn the database driver, and
// with readOnly runs every connection in a READ ONLY transaction.
//
// golang-migrate runs its statements with context.Background() and keeps a
// connection of its own (for its advisory lock), which it does not give back
// when WithInstance fails. So the connections do not come from
// stdlib.OpenDBFromPool directly but through a migrateConns connector, which
// takes them from pool under ctx, closes their sockets when ctx ends (the
// statement in flight fails at once, and the server rolls its transaction
// back), and at the end discards whatever golang-migrate still holds. No
// call can then outlive ctx or leave a connection checked out.
func withDriver(ctx context.Context, pool *pgxpool.Pool, mode access, fn func(*migrate.Migrate, database.Driver) error) error {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return fmt.Errorf("pgfence: reading embedded migrations: %w", err)
	}
	conns := newMigrateConns(ctx, pool, mode)
	defer conns.finish()
	sqlDB := sql.OpenDB(conns)
	sqlDB.SetMaxIdleConns(0) // the pool manages idle connections, not database/sql
	defer sqlDB.Close()

	drv, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{MigrationsTable: migrations.Table})
	if err != nil {
		return migrateError(ctx, "opening the database for migrations", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		_ = drv.Close()
		return migrateError(ctx, "preparing migrations", err)
	}
	defer m.Close()

	// Between migrations, stop cleanly; within one, the connection is
	// closed under it (conns).
	stop := context.AfterFunc(ctx, func() {
		select {
		case m.GracefulStop <- true:
		default:
		}
	})
	defer stop()

	err = fn(m, drv)
	if errors.Is(err, migrate.ErrNoChange) {
		err = nil
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return migrateError(ctx, "migrations", err)
	}
	return nil
}

// migrateError wraps an error of golang-migrate, keeping the PgError
// reachable; when ctx ended, the error says so first (a closed connection is
// only the consequence).
func migrateError(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("pgfence: %s: %w (%w)", what, cerr, unwrapMigrate(err))
	}
	return fmt.Errorf("pgfence: %s: %w", what, unwrapMigrate(err))
}

// migrateConns is the driver.Connector behind golang-migrate's *sql.DB: it
// takes connections from pool, bounded by ctx, and keeps track of those that
// database/sql has not closed yet.
type migrateConns struct {
	ctx   context.Context
	pool  driver.Connector // stdlib's connector over the pool
	mode  access
	abort func() bool // stops the ctx watcher

	mu   sync.Mutex
	open map[*migrateConn]struct{}
}

func newMigrateConns(ctx context.Context, pool *pgxpool.Pool, mode access) *migrateConns {
	c := &migrateConns{ctx: ctx, pool: stdlib.GetPoolConnector(pool), mode: mode, open: map[*migrateConn]struct{}{}}
	c.abort = context.AfterFunc(ctx, c.closeSockets)
	return c
}

// Connect takes a connection from the pool, waiting no longer than both the
// caller's ctx and database/sql's (golang-migrate passes
// context.Background()) allow.
func (c *migrateConns) Connect(sqlCtx context.Context) (driver.Conn, error) {
	actx, cancel := context.WithCancel(sqlCtx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	dc, err := c.pool.Connect(actx)
	if err != nil {
		if c.ctx.Err() != nil {
			return nil, c.ctx.Err()
		}
		return nil, err
	}
	mc := &migrateConn{Conn: dc.(*stdlib.Conn), owner: c}
	if c.mode == readOnly {
		mc.tx, err = mc.Conn.Conn().BeginTx(actx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			mc.discard()
			return nil, err
		}
	}
	c.mu.Lock()
	done := c.ctx.Err() != nil || c.open == nil // the watcher or finish ran already
	if !done {
		c.open[mc] = struct{}{}
	}
	c.mu.Unlock()
	if done {
		mc.discard()
		return nil, cmp.Or(c.ctx.Err(), driver.ErrBadConn)
	}
	return mc, nil
}

// Driver implements driver.Connector.
func (c *migrateConns) Driver() driver.Driver { return c.pool.Driver() }

// closeSockets runs when ctx ends: it closes the network connection of every
// connection in use, so the statement golang-migrate waits for (its advisory
// lock, a migration blocked on a table lock) fails at once.
func (c *migrateConns) closeSockets() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for mc := range c.open {
		_ = mc.Conn.Conn().PgConn().Conn().Close()
	}
}

// finish discards the connections that golang-migrate still holds (it keeps
// one when WithInstance fails, possibly with its advisory lock taken): they
// are closed, so the pool replaces them instead of handing them out again.
func (c *migrateConns) finish() {
	c.abort()
	c.mu.Lock()
	left := c.open
	c.open = nil
	c.mu.Unlock()
	for mc := range left {
		mc.discard()
	}
}

// migrateConn is stdlib's connection (all of whose methods it keeps) with a
// Close that gives it back to the pool clean.
type migrateConn struct {
	*stdlib.Conn
	owner *migrateConns
	tx    pgx.Tx // the READ ONLY transaction, when reading
}

// Close is called by database/sql when it is done with the connection: a
// read-only transaction is rolled back and the connection goes back to the
// pool (which drops it when it is broken or still in a transaction).
func (mc *migrateConn) Close() error {
	c := mc.owner
	c.mu.Lock()
	_, mine := c.open[mc]
	delete(c.open, mc)
	c.mu.Unlock()
	if !mine {
		return nil // discarded by finish already
	}
	if c.ctx.Err() != nil {
		// closeSockets may have closed its socket while it was idle, which
		// pgx does not notice until the next use: do not hand it out again.
		mc.discard()
		return nil
	}
	if mc.tx != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 5*time.Second)
		defer cancel()
		if err := mc.tx.Rollback(rctx); err != nil {
			mc.discard()
			return nil
		}
	}
	return mc.Conn.Close()
}

// discard closes the connection and returns it to the pool, which then
// replaces it.
func (mc *migrateConn) discard() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = mc.Conn.Conn().Close(ctx)
	_ = mc.Conn.Close()
}

// unwrapMigrate keeps the underlying driver error reachable: golang-migrate's
// database.Error has no Unwrap method, so errors.As could not find the
// *pgconn.PgError inside it.
func unwrapMigrate(err error) error {
	var dbErr database.Error
	if errors.As(err, &dbErr) && dbErr.OrigErr != nil {
		return withWhat(dbErr.Err, dbErr.OrigErr)
	}
	var dbErrP *database.Error
	if errors.As(err, &dbErrP) && dbErrP.OrigErr != nil {
		return withWhat(dbErrP.Err, dbErrP.OrigErr)
	}
	return err
}

// withWhat prefixes err with golang-migrate's description of what failed,
// which is often empty (a failed query carries only the query): an empty
// description adds nothing, so no message has an empty ": :" segment.
func withWhat(what string, err error) error {
	if what == "" {
		return fmt.Errorf("%w", err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
