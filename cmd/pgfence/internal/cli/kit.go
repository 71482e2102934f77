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

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Version is what pgfence --version prints: the module version Go stamped
// into the binary and the migration version this build carries. A build of
// a release tag says the tag (v0.3.0); a build from a clone says Go's
// pseudo-version of the commit (v0.0.0-20261201220928-5acbc3d3c055, with
// +dirty when the tree has changes that git does not ignore); a build
// without version control information (-buildvcs=false, a copy of the
// source without .git) says (devel).
func Version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return fmt.Sprintf("%s, migrations %d", v, migrations.Latest)
}

// kitState is what the catalogs say about the kit and about the role that
// asks (catalog.KitCatalog), and the kit's version, read without writing
// anything: pgfence migrate version and doctor use it instead of
// golang-migrate, which creates its version table when it is missing (and,
// when that fails, keeps the connection it took).
type kitState struct {
	catalog.KitCatalog

	// Version and Dirty as recorded in the version table, or from
	// fence.version() when that table cannot be read (DirtyKnown false).
	// VersionKnown is false when neither can be read.
	Version                  uint
	Dirty                    bool
	VersionKnown, DirtyKnown bool

	// Unrecorded: schema fence is installed, the asking role owns it (or is
	// a superuser), and the version table does not exist where
	// golang-migrate looks for it: the kit's files were applied without
	// golang-migrate (psql, another migration tool). Version is then
	// fence.version(), and pgfence migrate baseline records it.
	Unrecorded bool

	// SchemaVersion is fence.version() when this role may call it (0 otherwise):
	// after a failed migration (each file is one transaction) the version
	// the schema is really at, which a dirty record's fix names.
	SchemaVersion uint
}

// forceFix is the command that repairs a dirty record: migrate force with
// the version fence.version() reports when it can be read, else VERSION.
func (k kitState) forceFix() string {
	if k.SchemaVersion > 0 {
		return fmt.Sprintf("pgfence migrate force %d (fence.version() says the schema is at %d)", k.SchemaVersion, k.SchemaVersion)
	}
	return "pgfence migrate force VERSION (the version the database is really at)"
}

// readKit reads the kit's state as the pool's role, writing nothing.
func readKit(ctx context.Context, pool *pgxpool.Pool) (kitState, error) {
	var k kitState
	var err error
	k.KitCatalog, err = catalog.ReadKitCatalog(ctx, pool, migrations.Table)
	if err != nil {
		return k, fmt.Errorf("reading the catalogs: %w", err)
	}
	switch {
	case k.VersionTable && k.ReadVersionTable:
		v, dirty, _, err := catalog.MigrationVersion(ctx, pool, k.Schema, migrations.Table)
		if err != nil {
			return k, fmt.Errorf("reading %s.%s: %w", k.Schema, migrations.Table, err)
		}
		if v > 0 {
			k.Version = uint(v)
		}
		k.Dirty = dirty
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
	if k.Installed && k.CallVersion && k.Dirty {
		if v, err := sqlfuncs.Version(ctx, pool); err == nil && v > 0 {
			k.SchemaVersion = uint(v)
		}
	}
	// Another role's version table may live in another schema (its own
	// search_path); for the owner, this is where golang-migrate would look.
	k.Unrecorded = k.Installed && !k.VersionTable && (k.IsKitOwner || k.Super) && k.VersionKnown
	return k, nil
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
