package gofence

import (
	"context"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/migrations"
)

// Migrate applies every embedded migration that the database does not have
// yet, recording them in the fence_schema_migrations table, exactly as the
// upstream migrate CLI does with
// x-migrations-table=fence_schema_migrations. It is safe to run from several
// processes at once (golang-migrate serializes them with an advisory lock
// keyed on that table, distinct from an application's own migrations) and it
// does not close pool.
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

// MigrationVersion reports the applied version and whether a migration failed
// half-way (dirty). Version 0 means the kit is not installed; (0, true) means a
// migration down from version 1 failed half-way.
func MigrationVersion(ctx context.Context, pool *pgxpool.Pool) (version uint, dirty bool, err error) {
	err = withDriver(ctx, pool, func(_ *migrate.Migrate, drv database.Driver) error {
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
	return version, dirty, err
}

// ForceMigrationVersion records version as applied and clean without running
// anything: the way out of a dirty state once the database was repaired by
// hand. -1 records "no version".
func ForceMigrationVersion(ctx context.Context, pool *pgxpool.Pool, version int) error {
	return withMigrate(ctx, pool, func(m *migrate.Migrate) error { return m.Force(version) })
}

// withMigrate builds a golang-migrate instance over the embedded files and a
// database/sql view of pool (closing that view leaves the pool open), runs fn,
// and stops fn early (between migrations) when ctx is done.
func withMigrate(ctx context.Context, pool *pgxpool.Pool, fn func(*migrate.Migrate) error) error {
	return withDriver(ctx, pool, func(m *migrate.Migrate, _ database.Driver) error { return fn(m) })
}

// withDriver is withMigrate that also hands fn the database driver.
func withDriver(ctx context.Context, pool *pgxpool.Pool, fn func(*migrate.Migrate, database.Driver) error) error {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return fmt.Errorf("pgfence: reading embedded migrations: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	drv, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{MigrationsTable: migrations.Table})
	if err != nil {
		_ = sqlDB.Close()
		return fmt.Errorf("pgfence: opening the database for migrations: %w", unwrapMigrate(err))
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		_ = drv.Close()
		return fmt.Errorf("pgfence: preparing migrations: %w", unwrapMigrate(err))
	}
	defer m.Close()

	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			select {
			case m.GracefulStop <- true:
			default:
			}
		case <-done:
		}
	}()

	err = fn(m, drv)
	if errors.Is(err, migrate.ErrNoChange) {
		err = nil
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("pgfence: migrations: %w", unwrapMigrate(err))
	}
	return nil
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
