package gofence_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// allowDowngrade is a pool on url whose sessions set fence.allow_downgrade,
// which migration 3's down checks before it steps below 3 with leases.
func allowDowngrade(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["options"] = "-c fence.allow_downgrade=on"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// generatedGuards counts the row guards fence.protect generated.
func generatedGuards(t *testing.T, ctx context.Context, db *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_proc p
		WHERE p.pronamespace = 'fence'::regnamespace AND p.proname ~ '^_guard_[0-9a-f]{32}$'`).Scan(&n))
	return n
}

// catalog is pgtest.KitCatalog without the row guards that fence.protect
// generates per token-column name (migration 3): they are not the
// migrations' own objects; generatedGuards counts them.
func catalog(t *testing.T, ctx context.Context, db *pgxpool.Pool) []string {
	t.Helper()
	return slices.DeleteFunc(pgtest.KitCatalog(t, ctx, db), generatedGuard.MatchString)
}

var generatedGuard = regexp.MustCompile(`^function fence\._guard_[0-9a-f]{32}\(`)

// appObjects creates what an application already has in its database,
// including its own golang-migrate table, and returns a query whose answer
// must not change whatever the kit's migrations do.
func appObjects(t *testing.T, ctx context.Context, db *pgxpool.Pool) string {
	t.Helper()
	for _, sql := range []string{
		`CREATE TABLE public.schema_migrations (version bigint PRIMARY KEY, dirty boolean NOT NULL)`,
		`INSERT INTO public.schema_migrations VALUES (42, false)`,
		`CREATE TABLE public.orders (id int PRIMARY KEY, note text)`,
		`INSERT INTO public.orders VALUES (1, 'keep me'), (2, 'me too')`,
		`CREATE FUNCTION public.app_fn() RETURNS int LANGUAGE sql AS 'SELECT 7'`,
		`CREATE SCHEMA app`,
		`CREATE TABLE app.things (id int)`,
	} {
		_, err := db.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	return `SELECT (SELECT string_agg(version || ':' || dirty, ',') FROM public.schema_migrations)
	            || '|' || (SELECT string_agg(id || note, ',' ORDER BY id) FROM public.orders)
	            || '|' || public.app_fn()
	            || '|' || (SELECT string_agg(c.relnamespace::regnamespace || '.' || c.relname, ',' ORDER BY 1)
	                         FROM pg_class c WHERE c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
	                          AND c.relnamespace::regnamespace::text NOT IN ('fence', 'pg_toast')
	                          AND c.relname NOT LIKE 'fence_schema_migrations%')`
}

func queryString(t *testing.T, ctx context.Context, db *pgxpool.Pool, sql string) string {
	t.Helper()
	var s string
	require.NoError(t, db.QueryRow(ctx, sql).Scan(&s))
	return s
}

func requireVersion(t *testing.T, ctx context.Context, db *pgxpool.Pool, want uint) {
	t.Helper()
	v, dirty, err := gofence.MigrationVersion(ctx, db)
	require.NoError(t, err)
	require.False(t, dirty)
	require.Equal(t, want, v)
}

func TestMigrateUpDownUpLeavesTheApplicationAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	check := appObjects(t, ctx, db.Pool)
	before := queryString(t, ctx, db.Pool, check)

	requireVersion(t, ctx, db.Pool, 0)
	require.NoError(t, gofence.Migrate(ctx, db.Pool))
	requireVersion(t, ctx, db.Pool, migrations.Latest)
	installed := catalog(t, ctx, db.Pool)
	require.Equal(t, before, queryString(t, ctx, db.Pool, check))

	require.NoError(t, gofence.Migrate(ctx, db.Pool), "a second up is a no-op")
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 0))
	requireVersion(t, ctx, db.Pool, 0)
	var fenceObjects int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'fence'`).Scan(&fenceObjects))
	require.Zero(t, fenceObjects, "down removes schema fence")
	require.Equal(t, before, queryString(t, ctx, db.Pool, check))

	require.NoError(t, gofence.Migrate(ctx, db.Pool))
	require.Equal(t, installed, catalog(t, ctx, db.Pool), "up after down installs the same kit")
	require.Equal(t, before, queryString(t, ctx, db.Pool, check))
	require.NoError(t, db.Pool.Ping(ctx), "the caller's pool is still open")
}

// TestEveryMigrationStepsDownToThePreviousSchema: each down migration gives
// back exactly the catalog its up migration started from (functions with
// their bodies, settings and privileges, constraints, triggers), also with a
// protected table whose guard keeps working at every version.
func TestEveryMigrationStepsDownToThePreviousSchema(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	at := map[uint][]string{}
	for v := uint(1); v <= migrations.Latest; v++ {
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, v))
		at[v] = catalog(t, ctx, db.Pool)
	}
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, token bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "orders", "orders", "token"))
	require.Equal(t, 1, generatedGuards(t, ctx, db.Pool), "protect generated the guard of token column \"token\"")
	tok, ok, err := sqlfuncs.Acquire(ctx, db.Pool, "orders", "t", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	// Below version 3 a lease row would be forgotten by a further step to 0:
	// migration 3's down refuses unless the session allows it
	// (TestMigrateDownRefusesWhileLeasesExist).
	down := allowDowngrade(t, db.URL)
	for v := uint(migrations.Latest); v >= 1; v-- {
		require.NoError(t, gofence.MigrateTo(ctx, down, v))
		requireVersion(t, ctx, db.Pool, v)
		require.Equal(t, at[v], catalog(t, ctx, db.Pool), "catalog at version %d", v)
		if v < 3 {
			require.Zero(t, generatedGuards(t, ctx, db.Pool), "version %d keeps no generated guard", v)
		}
		_, err = db.Pool.Exec(ctx, `INSERT INTO orders VALUES ($1, $2)`, v, tok-1)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken, "version %d", v)
		_, err = db.Pool.Exec(ctx, `INSERT INTO orders VALUES ($1, $2)`, v, tok)
		require.NoError(t, err, "version %d", v)
	}
	require.NoError(t, sqlfuncs.Unprotect(ctx, db.Pool, "orders"))
}

func TestMigrateAsAnOrdinaryRoleWithCreateOnTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	migrator := pgtest.NewRole(t, "migrator")
	app := pgtest.NewRole(t, "app")
	db := pgtest.Empty(t)
	for _, sql := range []string{
		`GRANT CREATE ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + pgx.Identifier{migrator}.Sanitize(),
		`GRANT CREATE ON SCHEMA public TO ` + pgx.Identifier{migrator}.Sanitize(), // for fence_schema_migrations
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	pool, err := pgxpool.New(ctx, db.URLAs(migrator))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var super bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super))
	require.False(t, super)

	require.NoError(t, gofence.Migrate(ctx, pool))
	requireVersion(t, ctx, pool, migrations.Latest)
	require.NoError(t, sqlfuncs.GrantUsage(ctx, pool, app, false))
	appPool, err := pgxpool.New(ctx, db.URLAs(app))
	require.NoError(t, err)
	t.Cleanup(appPool.Close)
	tok, ok, err := sqlfuncs.Acquire(ctx, appPool, "r", "app", time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.Positive(t, tok)
}

func TestMigrateDownRefusesWhileTablesAreProtected(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	require.NoError(t, gofence.Migrate(ctx, db.Pool))
	_, err := db.Pool.Exec(ctx, `CREATE TABLE orders (id int, token bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "orders", "orders", "token"))

	err = gofence.MigrateTo(ctx, db.Pool, 0)
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the PgError stays reachable: %v", err)
	require.Equal(t, "2BP01", pgErr.Code)
	require.Contains(t, pgErr.Message, "orders")
	require.Contains(t, pgErr.Hint, "fence.unprotect")

	// Nothing was removed: the guard still works.
	_, err = db.Pool.Exec(ctx, `INSERT INTO orders VALUES (1, NULL)`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)

	// The documented way out: force the version back, unprotect, migrate down.
	_, dirty, err := gofence.MigrationVersion(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, dirty)
	require.NoError(t, gofence.ForceMigrationVersion(ctx, db.Pool, 1))
	require.NoError(t, sqlfuncs.Unprotect(ctx, db.Pool, "orders"))
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 0))
	requireVersion(t, ctx, db.Pool, 0)
	_, err = db.Pool.Exec(ctx, `INSERT INTO orders VALUES (1, NULL)`)
	require.NoError(t, err, "no trigger is left calling a missing function")
}

// TestMigrateDownRefusesWhileLeasesExist: below version 3, a further step
// down to 0 drops the lease rows that keep every resource's latest token, so
// migration 3's down refuses while any exists, changes nothing, and says how
// to go on; with fence.allow_downgrade = on it steps down.
func TestMigrateDownRefusesWhileLeasesExist(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 3)) // the down of 3 is the one that refuses
	before := catalog(t, ctx, db.Pool)
	_, ok, err := sqlfuncs.Acquire(ctx, db.Pool, "r", "t", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	err = gofence.MigrateTo(ctx, db.Pool, 2)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the PgError stays reachable: %v", err)
	require.Equal(t, "55000", pgErr.Code)
	require.Contains(t, pgErr.Hint, "fence.allow_downgrade")
	require.NoError(t, gofence.ForceMigrationVersion(ctx, db.Pool, 3))
	require.Equal(t, before, catalog(t, ctx, db.Pool), "the refused down changed nothing")

	down := allowDowngrade(t, db.URL)
	require.NoError(t, gofence.MigrateTo(ctx, down, 2))
	requireVersion(t, ctx, db.Pool, 2)
}

func TestConcurrentMigratorsSerialize(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		pool, err := pgxpool.New(ctx, db.URL)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		wg.Go(func() { errs[i] = gofence.Migrate(ctx, pool) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	requireVersion(t, ctx, db.Pool, migrations.Latest)
	var rows int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM fence_schema_migrations`).Scan(&rows))
	require.Equal(t, 1, rows)
}

// migrateCLI finds the upstream golang-migrate CLI (built with the pgx5
// driver): $PGFENCE_MIGRATE_CLI, else `migrate` on PATH. .ci/run installs it.
func migrateCLI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PGFENCE_MIGRATE_CLI"); p != "" {
		return p
	}
	if p, err := exec.LookPath("migrate"); err == nil {
		return p
	}
	msg := "the upstream migrate CLI is not installed: go install -tags pgx5 github.com/golang-migrate/migrate/v4/cmd/migrate@v4.20.1"
	if os.Getenv("PGFENCE_TEST_REQUIRE_MIGRATE_CLI") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func TestUpstreamMigrateCLIGivesTheSameSchema(t *testing.T) {
	t.Parallel()
	cli := migrateCLI(t)
	ctx := t.Context()
	viaCLI, viaGo := pgtest.Empty(t), pgtest.Empty(t)
	check := appObjects(t, ctx, viaCLI.Pool)
	before := queryString(t, ctx, viaCLI.Pool, check)

	u, err := url.Parse(viaCLI.URL)
	require.NoError(t, err)
	u.Scheme = "pgx5"
	q := u.Query()
	q.Set("sslmode", "disable")
	q.Set("x-migrations-table", "fence_schema_migrations")
	u.RawQuery = q.Encode()
	dir, err := filepath.Abs("../migrations")
	require.NoError(t, err)
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, cli, append([]string{"-path", dir, "-database", u.String()}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "migrate %s: %s", strings.Join(args, " "), out)
	}

	run("up")
	require.NoError(t, gofence.Migrate(ctx, viaGo.Pool))
	require.Equal(t, catalog(t, ctx, viaGo.Pool), catalog(t, ctx, viaCLI.Pool))
	require.Equal(t, before, queryString(t, ctx, viaCLI.Pool, check), "the application's schema_migrations and objects are untouched")
	requireVersion(t, ctx, viaCLI.Pool, migrations.Latest) // the Go runner reads what the CLI wrote

	run("down", "-all")
	require.Equal(t, before, queryString(t, ctx, viaCLI.Pool, check))
	var n int
	require.NoError(t, viaCLI.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'fence'`).Scan(&n))
	require.Zero(t, n)
}

// limitedPool opens a pool of at most two connections on db as role, the
// size at which one connection kept by a failed call shows up at once.
func limitedPool(t *testing.T, db *pgtest.DB, role string) *pgxpool.Pool {
	t.Helper()
	return closingPool(t, db.URLAs(role), 2)
}

// closingPool opens a pool of maxConns connections on url whose cleanup
// reports a Close that waits for a connection never handed back, instead of
// hanging the test binary.
func closingPool(t *testing.T, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		closed := make(chan struct{})
		go func() { pool.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Errorf("pool.Close still waits after 10s for a connection that was never handed back: %+v", pool.Stat())
		}
	})
	return pool
}

// returns runs call and fails the test if it is still running well after
// ctx ended (a call that ignores its context would otherwise hang the test
// binary instead of failing the test).
func returns(t *testing.T, ctx context.Context, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("the call is still blocked 10s after its context ended (%v)", context.Cause(ctx))
		return nil
	}
}

// requireAllConnsFree checks that the pool can still lend every one of its
// connections at once: nothing kept one. (A broken connection handed back is
// closed by the pool in the background; Acquire waits for its slot.)
func requireAllConnsFree(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err, "a connection is still checked out: %+v", pool.Stat())
		conns = append(conns, c)
	}
}

func versionTableExists(t *testing.T, ctx context.Context, db *pgtest.DB) bool {
	t.Helper()
	var exists bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_regclass('public.fence_schema_migrations') IS NOT NULL`).Scan(&exists))
	return exists
}

// TestMigrationCallsAsLimitedRolesHandEveryConnectionBack: golang-migrate
// keeps a connection when WithInstance fails (here: no CREATE on schema
// public for its version table). With two connections in the pool, a third
// call used to wait for a connection forever, past its context.
func TestMigrationCallsAsLimitedRolesHandEveryConnectionBack(t *testing.T) {
	t.Parallel()

	t.Run("owner with CREATE on the database but not on schema public", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		owner := pgtest.NewRole(t, "owner")
		db := pgtest.Empty(t)
		for _, sql := range []string{
			`GRANT CREATE ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + pgx.Identifier{owner}.Sanitize(),
			`REVOKE CREATE ON SCHEMA public FROM PUBLIC`, // the default before PostgreSQL 15
		} {
			_, err := db.Pool.Exec(ctx, sql)
			require.NoError(t, err)
		}
		pool := limitedPool(t, db, owner)

		for range 4 {
			err := returns(t, ctx, func() error {
				v, dirty, err := gofence.MigrationVersion(ctx, pool)
				require.Zero(t, v)
				require.False(t, dirty)
				return err
			})
			require.NoError(t, err)
		}
		for range 3 {
			err := returns(t, ctx, func() error { return gofence.Migrate(ctx, pool) })
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "%v", err)
			require.Equal(t, "42501", pgErr.Code, "no CREATE on schema public: %v", err)
		}
		requireAllConnsFree(t, pool)
		require.False(t, versionTableExists(t, ctx, db))
	})

	t.Run("application role on an installed kit", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		app := pgtest.NewRole(t, "app")
		db := pgtest.Setup(t)
		require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
		pool := limitedPool(t, db, app)

		for range 4 {
			err := returns(t, ctx, func() error {
				v, dirty, err := gofence.MigrationVersion(ctx, pool)
				require.Equal(t, uint(migrations.Latest), v)
				require.False(t, dirty)
				return err
			})
			require.NoError(t, err)
		}
		// Issue 27 item 11: the README's first example calls Migrate with
		// the application's pool. On an up-to-date kit there is nothing to
		// do, so nothing to be refused (it failed with "permission denied
		// for schema public", golang-migrate creating its table).
		for range 3 {
			err := returns(t, ctx, func() error { return gofence.Migrate(ctx, pool) })
			require.NoError(t, err, "an up-to-date kit needs nothing of an application role")
		}
		requireAllConnsFree(t, pool)
	})

	t.Run("application role on an older kit", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		app := pgtest.NewRole(t, "app")
		db := pgtest.Empty(t)
		require.NoError(t, gofence.MigrateTo(ctx, db.Pool, migrations.Latest-1))
		require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
		_, err := db.Pool.Exec(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`) // the default before PostgreSQL 15
		require.NoError(t, err)
		pool := limitedPool(t, db, app)
		for range 3 {
			err := returns(t, ctx, func() error { return gofence.Migrate(ctx, pool) })
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr), "an application role cannot migrate: %v", err)
			require.Equal(t, "42501", pgErr.Code, "%v", err)
			require.NotContains(t, err.Error(), ": :", "no empty segment in the message")
		}
		requireAllConnsFree(t, pool)
		requireVersion(t, ctx, db.Pool, migrations.Latest-1)
	})
}

// TestMigrationCallsEndWithTheirContext: golang-migrate waits for its
// advisory lock with context.Background(); a call must still return when its
// own context ends, and give its connection back.
func TestMigrationCallsEndWithTheirContext(t *testing.T) {
	t.Parallel()
	for name, call := range map[string]func(context.Context, *pgxpool.Pool) error{
		"MigrationVersion": func(ctx context.Context, p *pgxpool.Pool) error {
			_, _, err := gofence.MigrationVersion(ctx, p)
			return err
		},
		"Migrate": gofence.Migrate,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := pgtest.Setup(t)
			pool := closingPool(t, db.URL, 2)
			holder := db.Conn(t)
			id, err := database.GenerateAdvisoryLockId(db.Name, "public", migrations.Table)
			require.NoError(t, err)
			_, err = holder.Exec(t.Context(), `SELECT pg_advisory_lock($1)`, id)
			require.NoError(t, err)

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- call(ctx, pool) }()
			waitForQuery(t, db, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'advisory')`)
			cancel()
			wctx, wcancel := context.WithTimeout(t.Context(), time.Minute)
			defer wcancel()
			err = returns(t, wctx, func() error { return <-done })
			require.ErrorIs(t, err, context.Canceled)
			requireAllConnsFree(t, pool)
		})
	}
}

// waitForQuery polls query (a boolean) until it answers true.
func waitForQuery(t *testing.T, db *pgtest.DB, query string) {
	t.Helper()
	for {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(t.Context(), query).Scan(&ok))
		if ok {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("never true: %s", query)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestMigrationVersionOnlyReads: reading the version of a database that
// never had the kit leaves it without fence_schema_migrations.
func TestMigrationVersionOnlyReads(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	requireVersion(t, ctx, db.Pool, 0)
	require.False(t, versionTableExists(t, ctx, db))
}
