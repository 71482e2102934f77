// Package migrations holds pgfence's SQL migrations in golang-migrate format
// (NNN_name.up.sql / NNN_name.down.sql), embedded so that Go programs can apply
// them without the files on disk.
//
// The same files work with the upstream migrate CLI:
//
//	migrate -path migrations -database 'pgx5://USER@HOST:PORT/DB?sslmode=disable&x-migrations-table=fence_schema_migrations' up
//
// Always use the fence_schema_migrations table so the kit's version never
// collides with an application's own schema_migrations.
//
// schema.sql, beside them, shows schema fence as the latest migration
// leaves it, generated from a migrated database by this package's test; it
// is for reading and is not embedded.
package migrations

import "embed"

// FS holds every migration file of the kit (NNN_name.up.sql and
// NNN_name.down.sql), at the root of the file system.
//
//go:embed *.up.sql *.down.sql
var FS embed.FS

// Table is the golang-migrate version table the kit's migrations are recorded in.
const Table = "fence_schema_migrations"

// Latest is the newest migration version in FS; Go code that needs the kit at a
// given version compares against it.
const Latest = 10
