package catalog_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type bundle struct {
	ctx context.Context
	db  *pgtest.DB
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{ctx: t.Context(), db: pgtest.Setup(t)}
}

// exec runs SQL that belongs to the test itself (tables, grants), failing
// the test on error.
func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, sql, args...)
	require.NoError(t, err, sql)
}

// TestCatalogReadsOnAMigratedDatabase runs every catalog read
// on a database at the latest migration and checks each answer against what
// the test set up or against PostgreSQL's own view of the same thing.
func TestCatalogReadsOnAMigratedDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, pool := b.ctx, b.db.Pool

	k, err := catalog.ReadKitCatalog(ctx, pool, migrations.Table)
	require.NoError(t, err)
	var user, schema string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_user, current_schema()`).Scan(&user, &schema))
	require.Equal(t, user, k.User)
	require.Equal(t, b.db.Name, k.Database)
	require.Equal(t, schema, k.Schema)
	require.True(t, k.Installed, "%+v", k)
	require.True(t, k.VersionTable && k.ReadVersionTable, "%+v", k)
	require.True(t, k.Usage && k.CallVersion, "%+v", k)
	require.True(t, k.IsKitOwner, "%+v", k)
	require.NotEmpty(t, k.KitOwner)

	v, dirty, ok, err := catalog.MigrationVersion(ctx, pool, k.Schema, migrations.Table)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, dirty)
	require.EqualValues(t, migrations.Latest, v)
	_, _, _, err = catalog.MigrationVersion(ctx, pool, k.Schema, "no_such_table")
	require.Error(t, err, "a missing version table is an error, not version 0")

	srv, err := catalog.ReadServerInfo(ctx, pool)
	require.NoError(t, err)
	require.GreaterOrEqual(t, srv.VersionNum, 130000)
	require.Equal(t, strconv.Itoa(srv.VersionNum/10000), regexp.MustCompile(`^\d+`).FindString(srv.Version))
	require.False(t, srv.InRecovery)
	require.Equal(t, user, srv.User)
	require.WithinDuration(t, time.Now(), srv.Now, time.Hour, "the same machine's clock")

	inRecovery, err := catalog.InRecovery(ctx, pool)
	require.NoError(t, err)
	require.False(t, inRecovery)

	conn := b.db.Conn(t)
	sysid, err := catalog.SystemIdentifier(ctx, pool)
	require.NoError(t, err)
	require.Regexp(t, `^[0-9]+$`, sysid)
	lsn, err := catalog.CurrentWALLSN(ctx, pool)
	require.NoError(t, err)
	require.Regexp(t, `^[0-9A-F]+/[0-9A-F]+$`, lsn)
	tli, err := catalog.WALTimelineHex(ctx, pool)
	require.NoError(t, err)
	require.Regexp(t, `^[0-9A-F]{8}$`, tli)

	p, err := catalog.ReadPromotionSetup(ctx, pool)
	require.NoError(t, err)
	require.False(t, p.InRecovery)
	want, err := strconv.ParseInt(tli, 16, 64)
	require.NoError(t, err)
	require.EqualValues(t, want, p.Timeline, "both read the timeline of the current WAL file")
	require.Contains(t, []string{"off", "on", "always"}, p.ArchiveMode)
	var targetTimeline string
	require.NoError(t, pool.QueryRow(ctx, `SHOW recovery_target_timeline`).Scan(&targetTimeline))
	require.Equal(t, targetTimeline, p.RecoveryTargetTimeline)
	require.GreaterOrEqual(t, p.Standbys, 0)

	d, err := catalog.ReadDurabilitySettings(ctx, pool)
	require.NoError(t, err)
	var syncCommit string
	require.NoError(t, pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit))
	require.Equal(t, syncCommit, d.SynchronousCommit)
	require.NotEmpty(t, d.IdleInTransactionSessionTimeout)
	require.GreaterOrEqual(t, d.Standbys, d.AsyncStandbys)
	require.GreaterOrEqual(t, d.AsyncStandbys, 0)

	priv, err := catalog.ReadKitPrivileges(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, catalog.KitPrivileges{Usage: true, Acquire: true, Check: true, Revoke: true}, priv, "the kit's owner")

	prefixes, err := catalog.ManagedServicePrefixes(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, prefixes, "a plain PostgreSQL server")
	// A SET of such a name makes only a placeholder, which pg_settings does
	// not list: the prefixes come from the extensions a service loads, and
	// no stock server has one to show here.
	_, err = conn.Exec(ctx, `SET neon.x = 'on'`)
	require.NoError(t, err)
	prefixes, err = catalog.ManagedServicePrefixes(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, prefixes)
}

// TestLeasesAndProtectedTables: HasLeases and the reads of fence.protected
// follow what the kit's functions did, and ProtectedTables gives the form,
// the resource column and the prefix of a per-row table.
func TestLeasesAndProtectedTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, pool := b.ctx, b.db.Pool

	has, err := catalog.HasLeases(ctx, pool)
	require.NoError(t, err)
	require.False(t, has)
	tok, ok, err := sqlfuncs.Acquire(ctx, pool, "r", "me", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	has, err = catalog.HasLeases(ctx, pool)
	require.NoError(t, err)
	require.True(t, has)
	released, err := sqlfuncs.Release(ctx, pool, "r", tok)
	require.NoError(t, err)
	require.True(t, released)
	has, err = catalog.HasLeases(ctx, pool)
	require.NoError(t, err)
	require.True(t, has, "fence.lease keeps the latest token of an ended lease")

	names, err := catalog.ProtectedTableNames(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, names)
	tables, err := catalog.ProtectedTables(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, tables)

	b.exec(t, `CREATE TABLE orders (id int PRIMARY KEY, tok bigint)`)
	b.exec(t, `CREATE TABLE invoice (id int PRIMARY KEY, tok bigint)`)
	b.exec(t, `CREATE TABLE "Notes" (id int PRIMARY KEY)`)
	require.NoError(t, sqlfuncs.Protect(ctx, pool, "orders", "orders", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, pool, "invoice", "id", "invoice:", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, pool, `"Notes"`, "notes", ""))

	names, err = catalog.ProtectedTableNames(ctx, pool)
	require.NoError(t, err)
	var sorted []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(n ORDER BY n) FROM unnest(ARRAY['orders', 'invoice', '"Notes"']) n`).Scan(&sorted))
	require.Equal(t, sorted, names, "sorted as the database sorts text")
	names, err = catalog.RowsProtectedTableNames(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, []string{"invoice"}, names)

	role := pgtest.NewRole(t, "trig")
	b.exec(t, `GRANT TRIGGER ON orders TO `+pgx.Identifier{role}.Sanitize())
	b.exec(t, `ALTER TABLE "Notes" DISABLE TRIGGER USER`)

	tables, err = catalog.ProtectedTables(ctx, pool)
	require.NoError(t, err)
	byName := map[string]catalog.ProtectedTable{}
	for _, p := range tables {
		byName[p.Table] = p
	}
	require.Len(t, byName, 3, "%+v", tables)
	require.Equal(t, catalog.ProtectedTable{Table: "invoice", Resource: "invoice:", TokenColumn: "tok", Form: "rows", ResourceColumn: "id", TriggerRoles: []string{}, UnprotectedSiblings: []string{}},
		byName["invoice"])
	require.Equal(t, catalog.ProtectedTable{Table: "orders", Resource: "orders", TokenColumn: "tok", Form: "table", TriggerRoles: []string{role}, UnprotectedSiblings: []string{}},
		byName["orders"])
	require.Equal(t, catalog.ProtectedTable{Table: `"Notes"`, Resource: "notes", Form: "table", TriggerRoles: []string{}, GuardDisabled: true, UnprotectedSiblings: []string{}},
		byName[`"Notes"`])
	var order []string
	for _, p := range tables {
		order = append(order, p.Table)
	}
	require.Equal(t, sorted, order, "ordered by name")

	require.NoError(t, sqlfuncs.Unprotect(ctx, pool, "invoice"))
	names, err = catalog.RowsProtectedTableNames(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, names)
}

// TestProtectedTablesAtVersion3: the view of migration 3 has no form and no
// resource_column; ProtectedTables still reads it (form "table"), and
// RowsProtectedTableNames, documented for version 4 on, fails instead of
// answering "none".
func TestProtectedTablesAtVersion3(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := t.Context()
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 3))
	k, err := catalog.ReadKitCatalog(ctx, db.Pool, migrations.Table)
	require.NoError(t, err)
	v, dirty, ok, err := catalog.MigrationVersion(ctx, db.Pool, k.Schema, migrations.Table)
	require.NoError(t, err)
	require.True(t, ok && !dirty)
	require.EqualValues(t, 3, v)
	_, err = db.Pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "orders", "orders", "tok"))

	tables, err := catalog.ProtectedTables(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []catalog.ProtectedTable{{Table: "orders", Resource: "orders", TokenColumn: "tok", Form: "table", TriggerRoles: []string{}, UnprotectedSiblings: []string{}}}, tables)
	names, err := catalog.ProtectedTableNames(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{"orders"}, names)
	_, err = catalog.RowsProtectedTableNames(ctx, db.Pool)
	require.Error(t, err)
}

// TestCatalogReadsWithoutTheKit: on a database where the kit was never
// installed, as a role with no privileges, the catalog reads answer (kit
// missing, no version table, cannot create) and leave the database as they
// found it; the reads of the kit's views fail.
func TestCatalogReadsWithoutTheKit(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	ctx := t.Context()
	role := pgtest.NewRole(t, "plain")
	_, err := db.Pool.Exec(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC`)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, db.URLAs(role))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	objects := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_class) + (SELECT count(*) FROM pg_namespace)`).Scan(&n))
		return n
	}
	before := objects()

	k, err := catalog.ReadKitCatalog(ctx, pool, migrations.Table)
	require.NoError(t, err)
	require.Equal(t, role, k.User)
	require.False(t, k.Super)
	require.False(t, k.Installed)
	require.False(t, k.VersionTable)
	require.False(t, k.CanCreateInSchema, "CREATE on public was revoked from PUBLIC")
	require.False(t, k.Usage || k.CallVersion || k.IsKitOwner)
	require.Empty(t, k.KitOwner)

	// Each read, and whether it needs the kit (or the version table).
	for _, r := range []struct {
		name     string
		needsKit bool
		read     func() error
	}{
		{"MigrationVersion", true, func() error {
			_, _, _, err := catalog.MigrationVersion(ctx, pool, k.Schema, migrations.Table)
			return err
		}},
		{"HasLeases", true, func() error { _, err := catalog.HasLeases(ctx, pool); return err }},
		{"ProtectedTableNames", true, func() error { _, err := catalog.ProtectedTableNames(ctx, pool); return err }},
		{"ProtectedTables", true, func() error { _, err := catalog.ProtectedTables(ctx, pool); return err }},
		{"ReadKitPrivileges", true, func() error { _, err := catalog.ReadKitPrivileges(ctx, pool); return err }},
		{"ReadServerInfo", false, func() error { _, err := catalog.ReadServerInfo(ctx, pool); return err }},
		{"ReadDurabilitySettings", false, func() error { _, err := catalog.ReadDurabilitySettings(ctx, pool); return err }},
		{"ReadPromotionSetup", false, func() error { _, err := catalog.ReadPromotionSetup(ctx, pool); return err }},
		{"ManagedServicePrefixes", false, func() error { _, err := catalog.ManagedServicePrefixes(ctx, pool); return err }},
	} {
		if err := r.read(); r.needsKit {
			require.Error(t, err, r.name)
		} else {
			require.NoError(t, err, r.name)
		}
	}

	require.Equal(t, before, objects(), "the reads created nothing")
}

// TestKitPrivilegesFollowGrantUsage: ReadKitPrivileges sees what
// fence.grant_usage gave a role, with and without operator.
func TestKitPrivilegesFollowGrantUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	role := pgtest.NewRole(t, "app")
	pool, err := pgxpool.New(ctx, b.db.URLAs(role))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	k, err := catalog.ReadKitCatalog(ctx, pool, migrations.Table)
	require.NoError(t, err)
	require.True(t, k.Installed)
	require.False(t, k.Usage || k.CallVersion || k.IsKitOwner)

	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, role, false))
	p, err := catalog.ReadKitPrivileges(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, catalog.KitPrivileges{Usage: true, Acquire: true, Check: true}, p)
	k, err = catalog.ReadKitCatalog(ctx, pool, migrations.Table)
	require.NoError(t, err)
	require.True(t, k.Usage && k.CallVersion)

	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, role, true))
	p, err = catalog.ReadKitPrivileges(ctx, pool)
	require.NoError(t, err)
	require.Equal(t, catalog.KitPrivileges{Usage: true, Acquire: true, Check: true, Revoke: true}, p)
}
