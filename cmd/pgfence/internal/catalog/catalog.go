// Package catalog holds the read-only catalog reads with which pgfence
// doctor and pgfence migrate inspect the kit, the role's privileges and the
// server before they act: whether the kit is installed, at which version,
// what this role may do, and what the server's setup means for tokens.
//
// They are the CLI's, not the library's: package sqlfuncs binds the kit's
// SQL functions, one Go function each, and gofence builds on those. No
// function of schema fence can answer these questions when the kit is
// missing or unusable by the role, so they are plain SELECTs on
// PostgreSQL's catalogs, settings and statistics views (and the kit's
// views). Each sends one statement, writes nothing and creates nothing (not
// even golang-migrate's version table), so they are safe for any role,
// before or after installing.
//
// Their errors are returned as pgx gives them: none of them raises a
// fencing outcome, and the callers print PostgreSQL's message as it is.
package catalog

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// DB is the part of pgx that the single-row reads use; *pgx.Conn, pgx.Tx
// and *pgxpool.Pool all satisfy it.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Querier is what the multi-row reads use.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// KitCatalog is what the catalogs say about the kit and about the role that
// asks (ReadKitCatalog).
type KitCatalog struct {
	// User and Database are current_user and current_database().
	User, Database string
	// Super: the role is a superuser.
	Super bool
	// CanCreateDB: CREATE on the database (for schema fence).
	CanCreateDB bool
	// Schema is where golang-migrate keeps its version table for this role:
	// current_schema(), "" when search_path names no existing schema.
	// SchemaOwner is that schema's owner.
	Schema, SchemaOwner string
	// CanCreateInSchema: CREATE on Schema (for the version table).
	CanCreateInSchema bool
	// VersionTable: the version table exists in Schema; ReadVersionTable:
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
}

const kitCatalogSQL = `WITH s AS (SELECT current_schema() AS schema),
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

// ReadKitCatalog reads the kit's state from the catalogs as db's role;
// versionTable is the name of golang-migrate's version table
// (migrations.Table), looked up in current_schema().
func ReadKitCatalog(ctx context.Context, db DB, versionTable string) (KitCatalog, error) {
	var k KitCatalog
	err := db.QueryRow(ctx, kitCatalogSQL, versionTable).Scan(&k.User, &k.Database, &k.Super, &k.CanCreateDB,
		&k.Schema, &k.SchemaOwner, &k.CanCreateInSchema, &k.VersionTable, &k.ReadVersionTable,
		&k.Installed, &k.KitOwner, &k.IsKitOwner, &k.Usage, &k.CallVersion)
	return k, err
}

// MigrationVersion reads golang-migrate's own record from its version table
// schema.table: the version and whether it is dirty. ok is false when the
// table has no row (nothing was ever applied, or everything was migrated
// down); a missing table is an error.
func MigrationVersion(ctx context.Context, db DB, schema, table string) (version int64, dirty, ok bool, err error) {
	err = db.QueryRow(ctx, `SELECT version, dirty FROM `+pgx.Identifier{schema, table}.Sanitize()+` LIMIT 1`).Scan(&version, &dirty)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, false, nil
	}
	return version, dirty, err == nil, err
}

// HasLeases reports whether fence.lease has any row, that is whether any
// resource was ever granted (the table keeps every resource's latest token).
func HasLeases(ctx context.Context, db DB) (bool, error) {
	var b bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM fence.lease)`).Scan(&b)
	return b, err
}

// ProtectedTableNames lists the tables of the view fence.protected (every
// table the kit guards, in either form), sorted, each once: the tables that
// removing the kit would leave unguarded.
func ProtectedTableNames(ctx context.Context, db DB) ([]string, error) {
	var names []string
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT tbl::text), '{}') FROM fence.protected`).Scan(&names)
	return names, err
}

// RowsProtectedTableNames lists the tables protected per row
// (fence.protect_rows), sorted, each once: the tables that migrating below
// version 4 would leave unguarded. It needs migration 4 or later (older
// views have no column form).
func RowsProtectedTableNames(ctx context.Context, db DB) ([]string, error) {
	var names []string
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT tbl::text), '{}') FROM fence.protected WHERE form = 'rows'`).Scan(&names)
	return names, err
}

// ProtectedTable is one row of fence.protected, with what the catalogs say
// about its guard triggers (ProtectedTables).
type ProtectedTable struct {
	// Table is the table's name as regclass prints it.
	Table string
	// Resource is the table's resource (form "table") or the resource
	// prefix (form "rows").
	Resource string
	// TokenColumn is the token column; "" when writes use fence.use_token.
	TokenColumn string
	// Form is "table" (fence.protect) or "rows" (fence.protect_rows); always
	// "table" before migration 4.
	Form string
	// ResourceColumn is the column that names a row's resource (form
	// "rows"); "" for form "table".
	ResourceColumn string
	// TriggerRoles are the roles other than the owner (and superusers) that
	// can create triggers on the table, sorted.
	TriggerRoles []string
	// LegacyGuard: the table still has the guard trigger of migration 2
	// (zz_fence_guard_row).
	LegacyGuard bool
	// GuardDisabled: a trigger of the table whose function is in schema
	// fence is disabled (ALTER TABLE ... DISABLE TRIGGER).
	GuardDisabled bool
	// GuardReplicaOnly: such a trigger fires in replica mode only (ALTER
	// TABLE ... ENABLE REPLICA TRIGGER), so ordinary sessions skip it.
	// fence.protected counted it as enabled up to migration 7 (doctor reads
	// pg_trigger, for every version).
	GuardReplicaOnly bool
	// FiresAlways: every guard trigger fires in replica mode too
	// (fence.fire_always, migration 7); false before migration 7.
	FiresAlways bool
	// UnprotectedSiblings: when the table is a partition, the other
	// partitions of its parent that are not protected, sorted. A row moved
	// from one of them into this table is an INSERT here, which presents
	// the token the row carries (docs/security.md, "Known limits").
	UnprotectedSiblings []string
}

// protectedTablesSQL reads form and resource_column through to_jsonb, so
// that it runs on the views of migrations 3 (which have neither column) and
// 4 alike.
const protectedTablesSQL = `SELECT p.tbl::text, p.resource, coalesce(p.token_column::text, ''),
		coalesce(to_jsonb(p)->>'form', 'table'), coalesce(to_jsonb(p)->>'resource_column', ''),
		coalesce(p.trigger_roles::text[], '{}'),
		EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = p.tbl AND t.tgname = 'zz_fence_guard_row'),
		EXISTS (SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc f ON f.oid = t.tgfoid
		         WHERE t.tgrelid = p.tbl AND f.pronamespace = 'fence'::pg_catalog.regnamespace AND t.tgenabled = 'D'),
		EXISTS (SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc f ON f.oid = t.tgfoid
		         WHERE t.tgrelid = p.tbl AND f.pronamespace = 'fence'::pg_catalog.regnamespace AND t.tgenabled = 'R'),
		coalesce((to_jsonb(p)->>'fires_always')::boolean, false),
		coalesce((SELECT array_agg(s.inhrelid::pg_catalog.regclass::text ORDER BY s.inhrelid::pg_catalog.regclass::text)
		  FROM pg_catalog.pg_inherits i
		  JOIN pg_catalog.pg_class par ON par.oid = i.inhparent AND par.relkind = 'p'
		  JOIN pg_catalog.pg_inherits s ON s.inhparent = i.inhparent AND s.inhrelid <> i.inhrelid
		 WHERE i.inhrelid = p.tbl::oid
		   AND NOT EXISTS (SELECT FROM fence.protected q WHERE q.tbl::oid = s.inhrelid)), '{}')
		FROM fence.protected p ORDER BY 1`

// ProtectedTables reads every row of fence.protected, ordered by table
// name, with its guard triggers' state. It needs migration 3 or later
// (fence.protected has trigger_roles from 3 on).
func ProtectedTables(ctx context.Context, db Querier) ([]ProtectedTable, error) {
	rows, err := db.Query(ctx, protectedTablesSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ProtectedTable, error) {
		var p ProtectedTable
		err := r.Scan(&p.Table, &p.Resource, &p.TokenColumn, &p.Form, &p.ResourceColumn, &p.TriggerRoles, &p.LegacyGuard, &p.GuardDisabled, &p.GuardReplicaOnly, &p.FiresAlways, &p.UnprotectedSiblings)
		return p, err
	})
}

// ReplicaModeSetters lists the roles other than superusers that were
// granted SET on session_replication_role (PUBLIC when it was granted to
// everyone), sorted: in replica mode their sessions skip every guard trigger
// that does not fire always. Parameter privileges exist from PostgreSQL 15
// on (serverVersionNum, server_version_num); before, only superusers can set
// it, the list is empty and nothing is sent.
func ReplicaModeSetters(ctx context.Context, db DB, serverVersionNum int) ([]string, error) {
	if serverVersionNum < 150000 {
		return nil, nil
	}
	var roles []string
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE r.rolname::text END), '{}')
		  FROM pg_catalog.pg_parameter_acl a, pg_catalog.aclexplode(a.paracl) x
		  LEFT JOIN pg_catalog.pg_roles r ON r.oid = x.grantee
		 WHERE a.parname = 'session_replication_role' AND x.privilege_type = 'SET' AND NOT coalesce(r.rolsuper, false)`).Scan(&roles)
	return roles, err
}

// ServerInfo is what ReadServerInfo reads about the server and the session.
type ServerInfo struct {
	// Version is the setting server_version ("15.4"), VersionNum
	// server_version_num (150004).
	Version    string
	VersionNum int
	// InRecovery: the server is a standby (pg_is_in_recovery()).
	InRecovery bool
	// User is current_user.
	User string
	// Now is the server's clock_timestamp().
	Now time.Time
}

// ReadServerInfo reads the server's version, whether it is in recovery, the
// session's role and the server's clock, in one statement.
func ReadServerInfo(ctx context.Context, db DB) (ServerInfo, error) {
	var s ServerInfo
	err := db.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')::int,
		pg_is_in_recovery(), current_user, clock_timestamp()`).Scan(&s.Version, &s.VersionNum, &s.InRecovery, &s.User, &s.Now)
	return s, err
}

// KitPrivileges is what this role may do with the kit (ReadKitPrivileges).
type KitPrivileges struct {
	// Usage: USAGE on schema fence.
	Usage bool
	// Acquire, Check, Revoke: EXECUTE on fence.acquire (the signature of
	// migration 2 on), fence.check and fence.revoke.
	Acquire, Check, Revoke bool
}

// ReadKitPrivileges reads the current role's privileges on the kit. Schema
// fence and those functions must exist (else an error).
func ReadKitPrivileges(ctx context.Context, db DB) (KitPrivileges, error) {
	var p KitPrivileges
	err := db.QueryRow(ctx, `SELECT has_schema_privilege('fence', 'USAGE'),
		has_function_privilege('fence.acquire(text, text, interval, boolean)', 'EXECUTE'),
		has_function_privilege('fence.check(text, bigint)', 'EXECUTE'),
		has_function_privilege('fence.revoke(text)', 'EXECUTE')`).Scan(&p.Usage, &p.Acquire, &p.Check, &p.Revoke)
	return p, err
}

// DurabilitySettings is what ReadDurabilitySettings reads: the settings and
// replication state that decide what a crash or a failover loses.
type DurabilitySettings struct {
	// SynchronousCommit and IdleInTransactionSessionTimeout are the
	// session's values of those settings.
	SynchronousCommit, IdleInTransactionSessionTimeout string
	// AsyncStandbys counts the rows of pg_stat_replication whose sync_state
	// is neither sync nor quorum (asynchronous, or unreadable without
	// pg_read_all_stats); Standbys counts all its rows.
	AsyncStandbys, Standbys int
}

// ReadDurabilitySettings reads synchronous_commit,
// idle_in_transaction_session_timeout and the standbys connected to this
// server.
func ReadDurabilitySettings(ctx context.Context, db DB) (DurabilitySettings, error) {
	var s DurabilitySettings
	err := db.QueryRow(ctx, `SELECT current_setting('synchronous_commit'),
		current_setting('idle_in_transaction_session_timeout'),
		(SELECT count(*) FROM pg_stat_replication WHERE sync_state IS DISTINCT FROM 'sync' AND sync_state IS DISTINCT FROM 'quorum'),
		(SELECT count(*) FROM pg_stat_replication)`).Scan(&s.SynchronousCommit, &s.IdleInTransactionSessionTimeout, &s.AsyncStandbys, &s.Standbys)
	return s, err
}

// PromotionSetup is what decides whether two promotions can land on one
// timeline (docs/design.md, "Two promotions from one timeline"), as
// ReadPromotionSetup reads it.
type PromotionSetup struct {
	// InRecovery: the server is a standby.
	InRecovery bool
	// Timeline is the server's current WAL timeline; 0 on a standby.
	Timeline int
	// ArchiveMode is archive_mode; Archiver is archive_library, or
	// archive_command when that is empty or unknown (before PostgreSQL 15).
	ArchiveMode, Archiver string
	// RestoreCommand and RecoveryTargetTimeline are those settings.
	RestoreCommand, RecoveryTargetTimeline string
	// Standbys counts the rows of pg_stat_replication.
	Standbys int
	// ArchiverFailing: pg_stat_archiver's last failure is newer than its
	// last success.
	ArchiverFailing bool
}

// ReadPromotionSetup reads the WAL archive, recovery and replication
// settings that decide whether a promotion can repeat a timeline.
func ReadPromotionSetup(ctx context.Context, db DB) (PromotionSetup, error) {
	var s PromotionSetup
	err := db.QueryRow(ctx, `SELECT pg_is_in_recovery(),
		CASE WHEN pg_is_in_recovery() THEN 0
		     ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
		current_setting('archive_mode'),
		coalesce(nullif(current_setting('archive_library', true), ''), current_setting('archive_command')),
		current_setting('restore_command'),
		current_setting('recovery_target_timeline'),
		(SELECT count(*) FROM pg_stat_replication),
		coalesce((SELECT a.last_failed_time > coalesce(a.last_archived_time, '-infinity') FROM pg_stat_archiver a), false)`).Scan(
		&s.InRecovery, &s.Timeline, &s.ArchiveMode, &s.Archiver, &s.RestoreCommand, &s.RecoveryTargetTimeline, &s.Standbys, &s.ArchiverFailing)
	return s, err
}

// InRecovery calls pg_is_in_recovery(): true on a standby.
func InRecovery(ctx context.Context, db DB) (bool, error) {
	var b bool
	err := db.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&b)
	return b, err
}

// The three reads below are those of the functions fence._epoch and
// fence._timeline run on every grant (as the kit's owner, SECURITY
// DEFINER); run as the current role they show whether a managed service
// refuses them (docs/platforms.md).

// SystemIdentifier reads (pg_control_system()).system_identifier, as text.
func SystemIdentifier(ctx context.Context, db DB) (string, error) {
	var s string
	err := db.QueryRow(ctx, `SELECT (pg_control_system()).system_identifier::text`).Scan(&s)
	return s, err
}

// CurrentWALLSN calls pg_current_wal_lsn(), as text ("0/16B3748"); it fails
// on a standby.
func CurrentWALLSN(ctx context.Context, db DB) (string, error) {
	var s string
	err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s)
	return s, err
}

// WALTimelineHex reads the current WAL timeline the way fence._timeline
// does: the first 8 hexadecimal digits of
// pg_walfile_name(pg_current_wal_lsn()) ("00000001"); it fails on a standby.
func WALTimelineHex(ctx context.Context, db DB) (string, error) {
	var s string
	err := db.QueryRow(ctx, `SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)`).Scan(&s)
	return s, err
}

// ManagedServicePrefixes lists, sorted and each once, the prefixes of the
// defined settings that name a managed service's extensions (rds, aurora,
// apg_plan_mgmt, cloudsql, alloydb, google_columnar_engine, azure, neon,
// supautils); empty on a server of none of them. A heuristic, see
// docs/platforms.md.
func ManagedServicePrefixes(ctx context.Context, db DB) ([]string, error) {
	var p []string
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT split_part(name, '.', 1) ORDER BY split_part(name, '.', 1)), '{}')
		FROM pg_settings WHERE name ~ '^(rds|aurora|apg_plan_mgmt|cloudsql|alloydb|google_columnar_engine|azure|neon|supautils)[._]'`).Scan(&p)
	return p, err
}
