package pgcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs the CREATE DATABASE and DROP DATABASE statements of the
// scratch database helpers: a *pgx.Conn or *pgxpool.Pool connected as a
// role with CREATEDB, to a database other than the scratch one.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// DropTimeout bounds the DROP DATABASE of the drop function that
// CreateDB and CreateScratchDB return.
const DropTimeout = Timeout

// ScratchName returns prefix followed by n random bytes in hex (2n
// characters), a database name unlikely to be taken.
func ScratchName(prefix string, n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return prefix + hex.EncodeToString(b)
}

// CreateDB creates database name on admin's server, cloned from template
// (the server's default, template1, when template is empty), and returns
// the function that drops it again. The error of CREATE DATABASE is
// returned as is, for the caller to say what the database was for.
//
// drop runs DROP DATABASE IF EXISTS ... WITH (FORCE) (PostgreSQL 13 or
// newer), which ends the sessions still connected to the database. It runs
// even when its ctx is already cancelled (an interrupt must not leave the
// database behind): it keeps ctx's values but not its cancellation, and is
// bounded by DropTimeout.
func CreateDB(ctx context.Context, admin Execer, name, template string) (drop func(context.Context) error, err error) {
	return CreateDBStrategy(ctx, admin, name, template, "")
}

// CreateDBStrategy is CreateDB with CREATE DATABASE's STRATEGY (PostgreSQL
// 15 or newer): "FILE_COPY" copies the template's files after a checkpoint,
// a fraction of WAL_LOG's time for a small template on a server without
// fsync; "" leaves the server's default (WAL_LOG).
func CreateDBStrategy(ctx context.Context, admin Execer, name, template, strategy string) (drop func(context.Context) error, err error) {
	sql := "CREATE DATABASE " + Ident(name)
	if template != "" {
		sql += " TEMPLATE " + Ident(template)
	}
	if strategy != "" {
		sql += " STRATEGY " + strategy
	}
	if _, err := admin.Exec(ctx, sql); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DropTimeout)
		defer cancel()
		return DropDB(dctx, admin, name)
	}, nil
}

// CreateScratchDB creates a database named prefix followed by 8 random hex
// digits, as CreateDB does from the default template, and returns its name
// and the function that drops it.
func CreateScratchDB(ctx context.Context, admin Execer, prefix string) (name string, drop func(context.Context) error, err error) {
	name = ScratchName(prefix, 4)
	drop, err = CreateDB(ctx, admin, name, "")
	if err != nil {
		return "", nil, err
	}
	return name, drop, nil
}

// DropDB drops database name, if it exists, ending the sessions connected
// to it (DROP DATABASE ... WITH (FORCE), PostgreSQL 13 or newer).
func DropDB(ctx context.Context, admin Execer, name string) error {
	_, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+Ident(name)+" WITH (FORCE)")
	return err
}

// Ident quotes name as an SQL identifier.
func Ident(name string) string { return pgx.Identifier{name}.Sanitize() }
