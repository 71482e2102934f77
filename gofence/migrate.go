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
// Every migration function is bounded by ctx and hands back every connection
// it took from pool, also when it fails (an owner without CREATE on the
// schema of the version table, an application role). When ctx ends during a
// migration, its connection is closed: the server rolls that migration back
// (each file is one transaction) and golang-migrate's table records it
// dirty; ForceMigrationVersion to the previous version, then Migrate again.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Up() })
}

// MigrateTo migrates up or down to version (0 removes the kit; see
// migrations/*.down.sql, which refuses while tables are protected).
func MigrateTo(ctx context.Context, pool *pgxpool.Pool, version uint) error {
	if version == 0 {
		return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Down() })
	}
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Migrate(version) })
}

// MigrateSteps applies n migrations up (n > 0) or down (n < 0).
func MigrateSteps(ctx context.Context, pool *pgxpool.Pool, n int) error {
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Steps(n) })
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
// hand. -1 records "no version".
func ForceMigrationVersion(ctx context.Context, pool *pgxpool.Pool, version int) error {
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
		return fmt.Errorf("%s: %w", dbErr.Err, dbErr.OrigErr)
	}
	var dbErrP *database.Error
	if errors.As(err, &dbErrP) && dbErrP.OrigErr != nil {
		return fmt.Errorf("%s: %w", dbErrP.Err, dbErrP.OrigErr)
	}
	return err
}
