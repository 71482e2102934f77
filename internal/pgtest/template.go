package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/migrations"
)

// templateLockKey is the advisory lock under which test binaries sharing a
// server create templates, so that two of them never migrate the same
// template at once.
const templateLockKey int64 = 0x7067_7465_7374_01 // "pgtest" + 1

// template returns the name of the migrated template database, creating it
// on first use in this test binary.
func (s *server) template(ctx context.Context) (string, error) {
	s.tplOnce.Do(func() { s.tplName, s.tplErr = s.ensureTemplate(ctx) })
	return s.tplName, s.tplErr
}

// ensureTemplate creates, unless a finished one exists, a template database
// named after the hash of the migration files, so that binaries built from
// the same migrations share it and edited migrations get a fresh one. A
// template is finished once it is marked IS_TEMPLATE and closed to
// connections; a half-migrated one left by a crashed binary is dropped and
// rebuilt. Closing it to connections is also what keeps CREATE DATABASE ...
// TEMPLATE from failing because "other users are accessing" it.
func (s *server) ensureTemplate(ctx context.Context) (string, error) {
	sum, err := migrationsHash()
	if err != nil {
		return "", err
	}
	name := "pgtest_tpl_" + sum[:16]

	conn, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return "", fmt.Errorf("template %s: connect: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", fmt.Errorf("template %s: advisory lock: %w", name, err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", templateLockKey) //nolint:errcheck // closing the connection releases it anyway

	var isTemplate, allowConn bool
	err = conn.QueryRow(ctx, "SELECT datistemplate, datallowconn FROM pg_database WHERE datname = $1", name).Scan(&isTemplate, &allowConn)
	switch {
	case err == nil && isTemplate && !allowConn:
		return name, nil
	case err == nil:
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH IS_TEMPLATE false"); err != nil {
			return "", fmt.Errorf("template %s: unmark unfinished template: %w", name, err)
		}
		if err := pgcluster.DropDB(ctx, conn, name); err != nil {
			return "", fmt.Errorf("template %s: drop unfinished template: %w", name, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return "", fmt.Errorf("template %s: look up: %w", name, err)
	}

	if _, err := pgcluster.CreateDB(ctx, conn, name, "template0"); err != nil {
		return "", fmt.Errorf("template %s: create: %w", name, err)
	}
	if err := migrateURL(ctx, URLFor(s.adminURL, name)); err != nil {
		return "", fmt.Errorf("template %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH ALLOW_CONNECTIONS false IS_TEMPLATE true"); err != nil {
		return "", fmt.Errorf("template %s: mark as template: %w", name, err)
	}
	// migrateURL closed its connections, but a backend may not have exited
	// yet; make sure none is left to block the first clone.
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name); err != nil {
		return "", fmt.Errorf("template %s: close sessions: %w", name, err)
	}
	return name, nil
}

// migrateURL applies every migration of migrations.FS to the database at
// dbURL with gofence.Migrate (golang-migrate, recording them in
// migrations.Table exactly as users' tooling does), through a pool of its
// own that it closes, with all its connections, before returning.
func migrateURL(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	return gofence.Migrate(ctx, pool)
}

// migrationsHash is the SHA-256 of the migration files' names and contents.
func migrationsHash() (string, error) {
	var names []string
	err := fs.WalkDir(migrations.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list migrations: %w", err)
	}
	sort.Strings(names)
	h := sha256.New()
	fmt.Fprintf(h, "table=%s\n", migrations.Table)
	for _, n := range names {
		b, err := fs.ReadFile(migrations.FS, n)
		if err != nil {
			return "", fmt.Errorf("read migration %s: %w", n, err)
		}
		fmt.Fprintf(h, "%s\n%d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
