package gofence_test

import (
	"context"
	"io/fs"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// copyInstall applies the up files of versions 1 to upTo one by one, each
// as one simple-protocol statement (what psql -f or a migration tool of
// another language does with them), without golang-migrate: no version
// table is written.
func copyInstall(t *testing.T, ctx context.Context, pool *pgxpool.Pool, upTo int) {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.up.sql")
	require.NoError(t, err)
	applied := 0
	for _, name := range files { // fs.Glob sorts: 001_ ... 009_
		v, err := strconv.Atoi(name[:strings.IndexByte(name, '_')])
		require.NoError(t, err, name)
		if v > upTo {
			break
		}
		sql, err := fs.ReadFile(migrations.FS, name)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(sql))
		require.NoError(t, err, name)
		applied++
	}
	require.Equal(t, upTo, applied)
	v, err := sqlfuncs.Version(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, upTo, v)
}

// TestACopiedInstallIsRefusedUntilBaseline: a kit applied file by file
// has fence.version() but no fence_schema_migrations. golang-migrate took
// it for an empty database: Migrate failed on 001 ("schema fence already
// exists") and left version 1 dirty, and MigrateTo / ForceMigrationVersion
// created an empty version table. Now every changing call refuses with
// ErrVersionNotRecorded and creates nothing, Baseline records the version,
// and Migrate goes on from there to the same schema as a Go install.
func TestACopiedInstallIsRefusedUntilBaseline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	copied := migrations.Latest - 1
	copyInstall(t, ctx, db.Pool, copied)

	for name, call := range map[string]func() error{
		"Migrate":                    func() error { return gofence.Migrate(ctx, db.Pool) },
		"MigrateTo 1":                func() error { return gofence.MigrateTo(ctx, db.Pool, 1) },
		"MigrateTo 0":                func() error { return gofence.MigrateTo(ctx, db.Pool, 0) },
		"MigrateSteps -1":            func() error { return gofence.MigrateSteps(ctx, db.Pool, -1) },
		"MigrateSteps 1":             func() error { return gofence.MigrateSteps(ctx, db.Pool, 1) },
		"ForceMigrationVersion copy": func() error { return gofence.ForceMigrationVersion(ctx, db.Pool, copied) },
	} {
		err := call()
		require.ErrorIs(t, err, gofence.ErrVersionNotRecorded, name)
		require.Contains(t, err.Error(), "pgfence migrate baseline", name)
		require.Contains(t, err.Error(), "record version "+strconv.Itoa(copied), name)
		require.False(t, versionTableExists(t, ctx, db), "%s created the version table", name)
	}
	requireVersion(t, ctx, db.Pool, uint(copied)) // from fence.version()

	v, err := gofence.Baseline(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, uint(copied), v)
	require.True(t, versionTableExists(t, ctx, db))
	var recorded int
	var dirty bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT version, dirty FROM public.fence_schema_migrations`).Scan(&recorded, &dirty))
	require.Equal(t, copied, recorded)
	require.False(t, dirty)

	v, err = gofence.Baseline(ctx, db.Pool) // again: the same record, nothing to do
	require.NoError(t, err)
	require.Equal(t, uint(copied), v)

	require.NoError(t, gofence.Migrate(ctx, db.Pool))
	requireVersion(t, ctx, db.Pool, migrations.Latest)
	viaGo := pgtest.Empty(t)
	require.NoError(t, gofence.Migrate(ctx, viaGo.Pool))
	require.Equal(t, catalog(t, ctx, viaGo.Pool), catalog(t, ctx, db.Pool))

	// A record that disagrees with fence.version() is refused: repairing a
	// wrong record is ForceMigrationVersion's job.
	_, err = db.Pool.Exec(ctx, `UPDATE public.fence_schema_migrations SET version = 3`)
	require.NoError(t, err)
	_, err = gofence.Baseline(ctx, db.Pool)
	require.ErrorContains(t, err, "already records version 3")
}

// TestBaselineRefusesWithoutAKit: nothing installed, nothing to record, and
// no version table left behind.
func TestBaselineRefusesWithoutAKit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	_, err := gofence.Baseline(ctx, db.Pool)
	require.ErrorContains(t, err, "not installed")
	require.False(t, versionTableExists(t, ctx, db))
}

// TestACopiedInstallAtTheLatestVersionNeedsNoMigration: Migrate reads
// first, and a kit already at the latest version is left alone however it
// was installed.
func TestACopiedInstallAtTheLatestVersionNeedsNoMigration(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	copyInstall(t, ctx, db.Pool, migrations.Latest)
	require.NoError(t, gofence.Migrate(ctx, db.Pool))
	require.False(t, versionTableExists(t, ctx, db))
}

// TestUpstreamMigrateCLIGoesOnAfterBaseline: after Baseline, the upstream
// migrate CLI (x-migrations-table=fence_schema_migrations) reads the
// record and applies only what is missing; down then removes the kit.
func TestUpstreamMigrateCLIGoesOnAfterBaseline(t *testing.T) {
	t.Parallel()
	cli := migrateCLI(t)
	ctx := t.Context()
	db := pgtest.Empty(t)
	copied := migrations.Latest - 1
	copyInstall(t, ctx, db.Pool, copied)
	_, err := gofence.Baseline(ctx, db.Pool)
	require.NoError(t, err)

	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.Scheme = "pgx5"
	q := u.Query()
	q.Set("sslmode", "disable")
	q.Set("x-migrations-table", migrations.Table)
	u.RawQuery = q.Encode()
	dir, err := filepath.Abs("../migrations")
	require.NoError(t, err)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, cli, append([]string{"-path", dir, "-database", u.String()}, args...)...).CombinedOutput()
		require.NoError(t, err, "migrate %s: %s", strings.Join(args, " "), out)
		return string(out)
	}
	require.Contains(t, run("version"), strconv.Itoa(copied))
	run("up")
	requireVersion(t, ctx, db.Pool, migrations.Latest)
	run("down", "-all")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'fence'`).Scan(&n))
	require.Zero(t, n)
}
