package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"runtime/debug"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Version is what pgfence --version prints: the module version (with the
// VCS revision when built from a clone) and the migration version this build
// carries.
func Version() string {
	v, rev, modified := "(devel)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "(devel)" && rev != "" {
		v += " " + rev[:min(len(rev), 12)]
		if modified {
			v += "+modified"
		}
	}
	return fmt.Sprintf("%s, migrations %d", v, migrations.Latest)
}

// kitState is what the catalogs say about the kit and about the role that
// asks, read without writing anything: pgfence migrate version and doctor
// use it instead of golang-migrate, which creates its version table when it
// is missing (and, when that fails, keeps the connection it took).
type kitState struct {
	User, Database string
	Super          bool
	// CanCreateDB: CREATE on the database (for schema fence).
	CanCreateDB bool
	// Schema is where golang-migrate keeps fence_schema_migrations for this
	// role: current_schema(), "" when search_path names no existing schema.
	Schema      string
	SchemaOwner string
	// CanCreateInSchema: CREATE on Schema (for the version table).
	CanCreateInSchema bool
	// VersionTable: Schema.fence_schema_migrations exists; ReadVersionTable:
	// this role may read it.
	VersionTable, ReadVersionTable bool
	// Installed: schema fence exists. KitOwner owns it; IsKitOwner: this
	// role is, or is a member of, KitOwner.
	Installed  bool
	KitOwner   string
	IsKitOwner bool
	// Usage: USAGE on schema fence; CallVersion: this role may call
	// fence.version() (fence.grant_usage grants both).
	Usage, CallVersion bool

	// Version and Dirty as recorded in the version table, or from
	// fence.version() when that table cannot be read (DirtyKnown false).
	// VersionKnown is false when neither can be read.
	Version                  uint
	Dirty                    bool
	VersionKnown, DirtyKnown bool
}

// The catalog reads of readKit (doctor's and migrate's checks; no function of
// the kit can answer them when the kit is missing or unusable by the role).
const (
	kitStateSQL = `WITH s AS (SELECT current_schema() AS schema),
	t AS (SELECT schema, CASE WHEN schema IS NOT NULL THEN pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema, $1::text)) END AS tbl FROM s),
	k AS (SELECT nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'fence')
	SELECT current_user, current_database(),
		(SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
		has_database_privilege(current_database(), 'CREATE'),
		coalesce(t.schema, ''),
		coalesce((SELECT nspowner::regrole::text FROM pg_catalog.pg_namespace WHERE nspname = t.schema), ''),
		coalesce(has_schema_privilege(t.schema, 'CREATE'), false),
		t.tbl IS NOT NULL,
		coalesce(has_table_privilege(t.tbl, 'SELECT'), false),
		EXISTS (SELECT FROM k),
		coalesce((SELECT nspowner::regrole::text FROM k), ''),
		coalesce((SELECT pg_has_role(nspowner, 'USAGE') FROM k), false),
		CASE WHEN EXISTS (SELECT FROM k) THEN has_schema_privilege('fence', 'USAGE') ELSE false END,
		CASE WHEN NOT EXISTS (SELECT FROM k) THEN false
			WHEN has_schema_privilege('fence', 'USAGE') THEN coalesce(has_function_privilege(pg_catalog.to_regprocedure('fence.version()'), 'EXECUTE'), false)
			ELSE false END
	FROM t`
	// kitVersionSQL is golang-migrate's own read of its table (format %s:
	// the quoted schema).
	kitVersionSQL = `SELECT version, dirty FROM %s.fence_schema_migrations LIMIT 1`
	// kitProtectedSQL lists the tables that migrating below version 1 would
	// leave unguarded (001's down file refuses then).
	kitProtectedSQL = `SELECT coalesce(string_agg(DISTINCT tbl::text, ', '), '') FROM fence.protected`
	kitLeasesSQL    = `SELECT EXISTS (SELECT FROM fence.lease)`
	// kitRowsProtectedSQL lists the tables protected per row, which
	// migrating below version 4 would leave unguarded (004's down file
	// refuses then). Only for version 4 and later: older views have no form.
	kitRowsProtectedSQL = `SELECT coalesce(string_agg(DISTINCT tbl::text, ', '), '') FROM fence.protected WHERE form = 'rows'`
)

// readKit reads the kit's state as the pool's role, writing nothing.
func readKit(ctx context.Context, pool *pgxpool.Pool) (kitState, error) {
	var k kitState
	err := pool.QueryRow(ctx, kitStateSQL, migrations.Table).Scan(&k.User, &k.Database, &k.Super, &k.CanCreateDB,
		&k.Schema, &k.SchemaOwner, &k.CanCreateInSchema, &k.VersionTable, &k.ReadVersionTable,
		&k.Installed, &k.KitOwner, &k.IsKitOwner, &k.Usage, &k.CallVersion)
	if err != nil {
		return k, fmt.Errorf("reading the catalogs: %w", err)
	}
	switch {
	case k.VersionTable && k.ReadVersionTable:
		var v int64
		err := pool.QueryRow(ctx, fmt.Sprintf(kitVersionSQL, pgx.Identifier{k.Schema}.Sanitize())).Scan(&v, &k.Dirty)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return k, fmt.Errorf("reading %s.%s: %w", k.Schema, migrations.Table, err)
		}
		if v > 0 {
			k.Version = uint(v)
		}
		k.VersionKnown, k.DirtyKnown = true, true
	case k.Installed && k.CallVersion:
		v, err := sqlfuncs.Version(ctx, pool)
		if err != nil {
			return k, err
		}
		k.Version, k.VersionKnown = uint(v), true
	case !k.Installed && !k.VersionTable:
		k.VersionKnown, k.DirtyKnown = true, true // version 0: never installed
	}
	return k, nil
}

// hasLeases reports whether fence.lease has any row (a resource was ever
// granted).
func hasLeases(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var b bool
	err := pool.QueryRow(ctx, kitLeasesSQL).Scan(&b)
	return b, err
}

// protectedTables lists the tables guarded by the kit, for the kit's owner.
func protectedTables(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var tables string
	err := pool.QueryRow(ctx, kitProtectedSQL).Scan(&tables)
	return tables, err
}

// rowsProtectedTables lists the tables protected per row (fence.protect_rows),
// for the kit's owner at version 4 or later.
func rowsProtectedTables(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var tables string
	err := pool.QueryRow(ctx, kitRowsProtectedSQL).Scan(&tables)
	return tables, err
}

// canMigrate says, before golang-migrate is asked to change anything, why
// this role cannot, with the fix; nil when nothing in the catalogs stands in
// the way. installing: the change starts from version 0.
func (k kitState) canMigrate(installing bool) error {
	if fixes := k.obstacles(installing); len(fixes) > 0 {
		return errors.New(strings.Join(fixes, "; "))
	}
	return nil
}

// obstacles lists what keeps this role from migrating, each with its exact
// fix (the GRANT to run, and as whom).
func (k kitState) obstacles(installing bool) []string {
	if k.Super {
		return nil
	}
	if k.Installed && !k.IsKitOwner {
		return []string{fmt.Sprintf("schema fence belongs to role %s, and only it (or a superuser) can migrate it: run pgfence migrate as %s", k.KitOwner, k.KitOwner)}
	}
	var fixes []string
	switch {
	case k.Schema == "":
		fixes = append(fixes, fmt.Sprintf("role %s's search_path names no existing schema for golang-migrate's version table %s: set one (for example ALTER ROLE %s SET search_path = public)",
			k.User, migrations.Table, quoteIdent(k.User)))
	case !k.VersionTable && !k.CanCreateInSchema:
		who := "role " + k.SchemaOwner + " (the schema's owner)"
		if k.SchemaOwner == "pg_database_owner" {
			who = "the database's owner" // PostgreSQL 15's public
		}
		fixes = append(fixes, fmt.Sprintf("role %s cannot create the version table %s.%s (no CREATE on schema %s): as %s or a superuser, run GRANT CREATE ON SCHEMA %s TO %s",
			k.User, k.Schema, migrations.Table, k.Schema, who, quoteIdent(k.Schema), quoteIdent(k.User)))
	case k.VersionTable && !k.ReadVersionTable:
		fixes = append(fixes, fmt.Sprintf("role %s cannot read the version table %s.%s: run pgfence migrate as the role that created it", k.User, k.Schema, migrations.Table))
	}
	if installing && !k.Installed && !k.CanCreateDB {
		fixes = append(fixes, fmt.Sprintf("role %s cannot create schema fence (no CREATE on database %s): as the database's owner or a superuser, run GRANT CREATE ON DATABASE %s TO %s",
			k.User, k.Database, quoteIdent(k.Database), quoteIdent(k.User)))
	}
	return fixes
}

// plainIdent matches the names SQL accepts without quotes (reserved words
// aside, see quoteIdent).
var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// quoteIdent quotes name for the SQL that a fix tells the user to run, only
// when it needs quotes, so that the fix reads as a person would type it.
func quoteIdent(name string) string {
	switch name {
	case "all", "user", "table", "select", "order", "group", "grant", "current_user", "session_user", "default":
		return pgx.Identifier{name}.Sanitize()
	}
	if plainIdent.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}
