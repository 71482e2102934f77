// Package gofence is the Go side of pgfence: it applies the kit's migrations
// and (as the package grows) holds leases, keeps them alive and runs fenced
// transactions over pgx v5. It reaches the SQL functions of schema fence only
// through package sqlfuncs.
//
// # Migrations
//
// Migrate applies the embedded migrations with golang-migrate, recording
// them in the fence_schema_migrations table, so the upstream migrate CLI and
// this package agree on the version and can be mixed.
package gofence
