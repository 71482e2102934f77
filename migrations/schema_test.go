package migrations_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

var update = flag.Bool("update", false, "rewrite schema.sql from a database migrated to the latest version")

func TestMain(m *testing.M) { pgtest.Main(m) }

// schemaFile is the generated description of schema fence as the latest
// migration leaves it.
const schemaFile = "schema.sql"

// TestSchemaFileIsCurrent reads schema fence from a database that the
// migrations brought to the latest version and compares it with
// schema.sql; with -update it rewrites the file instead. A migration that
// changes an object without the file changing in the same commit fails
// here, so that a reviewer reads the new definitions next to the
// migration.
//
// The file holds what PostgreSQL 13 to 15 print, which is the same on
// each. From 16 on, pg_get_viewdef leaves out the table's name before the
// columns of a view over one table (l.resource becomes resource), and
// nothing else differs; there the test compares everything but the bodies
// of the views, and -update refuses (run it on 13 to 15: Debian's 15, or
// PGFENCE_TEST_PG_BINDIR=$PWD/.ci/pg/13/bin after .ci/pg-fetch 13).
func TestSchemaFileIsCurrent(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	got := dumpSchema(t, db)
	var versionNum int
	if err := db.Pool.QueryRow(t.Context(), `SELECT current_setting('server_version_num')::int`).Scan(&versionNum); err != nil {
		t.Fatal(err)
	}
	canonical := versionNum < 160000
	if *update {
		if !canonical {
			t.Fatalf("-update writes the views as PostgreSQL 13 to 15 print them; this server is %d: run it on 13, 14 or 15", versionNum/10000)
		}
		if err := os.WriteFile(schemaFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", schemaFile)
		return
	}
	raw, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./migrations -run TestSchemaFileIsCurrent -update)", err)
	}
	want := string(raw)
	if !canonical {
		t.Logf("NOTE: TestSchemaFileIsCurrent on PostgreSQL %d compares %s without the bodies of its views (16 and later print them unqualified)", versionNum/10000, schemaFile)
		want, got = withoutViewBodies(want), withoutViewBodies(got)
	}
	if d := firstDifference(want, got); d != "" {
		t.Fatalf("%s does not show the schema the migrations give (database %s); rewrite it with\n"+
			"\tgo test ./migrations -run TestSchemaFileIsCurrent -update\n"+
			"and read git diff migrations/%s before committing it with the migration.\n%s", schemaFile, db.URL, schemaFile, d)
	}
}

// withoutViewBodies replaces the body of every CREATE VIEW of a dump (up
// to the line that ends it with a semicolon) by one line.
func withoutViewBodies(dump string) string {
	var out []string
	inView := false
	for _, line := range strings.Split(dump, "\n") {
		switch {
		case strings.HasPrefix(line, "CREATE VIEW ") && strings.HasSuffix(line, " AS"):
			out = append(out, line, "    (the body, as this version prints it)")
			inView = true
		case inView:
			inView = !strings.HasSuffix(line, ";")
		default:
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestSchemaFileSeesAChangedFunction: a function body changed after the
// migrations (as a new migration would change it) shows in the dump, in
// that function's definition and nowhere else.
func TestSchemaFileSeesAChangedFunction(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	before := dumpSchema(t, db)
	_, err := db.Pool.Exec(t.Context(), fmt.Sprintf(`CREATE OR REPLACE FUNCTION fence.version() RETURNS integer
		LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS 'SELECT %d'`, migrations.Latest+1))
	if err != nil {
		t.Fatal(err)
	}
	after := dumpSchema(t, db)
	d := firstDifference(before, after)
	if d == "" {
		t.Fatal("the dump did not change with fence.version()'s body")
	}
	if !strings.Contains(d, fmt.Sprintf("SELECT %d", migrations.Latest+1)) {
		t.Fatalf("the first difference is not the changed body:\n%s", d)
	}
	if strings.Count(before, "\n") != strings.Count(after, "\n") {
		t.Fatalf("a one-line change of one body changed the dump's length")
	}
}

// TestSchemaFileLeavesOutTablesOfTheApplication: protecting tables (both
// forms) creates guard functions in schema fence named after the tables'
// columns, and writing makes rows; none of that is the kit's schema, so the
// dump stays the same.
func TestSchemaFileLeavesOutTablesOfTheApplication(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	before := dumpSchema(t, db)
	for _, sql := range []string{
		`CREATE TABLE orders (id int PRIMARY KEY, tok bigint)`,
		`CREATE TABLE invoice (id int PRIMARY KEY, tok bigint)`,
		`SELECT fence.protect('orders', 'orders', 'tok')`,
		`SELECT fence.protect_rows('invoice', 'id', 'invoice:', 'tok')`,
		`SELECT fence.acquire('orders', 'me', '1 minute')`,
	} {
		if _, err := db.Pool.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	var generated int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_proc
		WHERE pronamespace = 'fence'::regnamespace AND proname ~ '^_(guard|rows)_[0-9a-f]{32}$'`).Scan(&generated); err != nil {
		t.Fatal(err)
	}
	if generated == 0 {
		t.Fatal("protect made no generated guard function: the test no longer shows what it is about")
	}
	if d := firstDifference(before, dumpSchema(t, db)); d != "" {
		t.Fatalf("the dump changed with the application's tables:\n%s", d)
	}
}

// firstDifference describes where two texts first differ, line by line,
// with a few lines of context; "" when they are equal.
func firstDifference(want, got string) string {
	if want == got {
		return ""
	}
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "first difference at line %d (file %d lines, database %d):\n", i+1, len(w), len(g))
	from := max(i-3, 0)
	for j := from; j < i; j++ {
		fmt.Fprintf(&b, "   %s\n", w[j])
	}
	for j := i; j < min(i+5, len(w)); j++ {
		fmt.Fprintf(&b, " - %s\n", w[j])
	}
	for j := i; j < min(i+5, len(g)); j++ {
		fmt.Fprintf(&b, " + %s\n", g[j])
	}
	return b.String()
}

// dumpSchema describes schema fence of db as SQL text, every object in a
// fixed order (by kind, then by name in the C collation) and every name
// qualified, so that the text depends only on what the migrations made.
func dumpSchema(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	ctx := t.Context()
	conn := db.Conn(t)
	// Names outside pg_catalog are printed qualified, whatever the role's
	// search_path says.
	if _, err := conn.Exec(ctx, `SET search_path = pg_catalog`); err != nil {
		t.Fatal(err)
	}
	// The harness migrates as a superuser whose current schema is public,
	// where golang-migrate keeps its version table.
	var version int
	if err := conn.QueryRow(ctx, `SELECT version FROM public.`+migrations.Table).Scan(&version); err != nil {
		t.Fatalf("read the migration version: %v", err)
	}
	if unknown := queryLines(t, ctx, conn, unhandledObjectsQuery); len(unknown) > 0 {
		t.Fatalf("schema fence holds objects the dump does not describe yet (add them to dumpSchema): %s", strings.Join(unknown, "; "))
	}

	var b strings.Builder
	fmt.Fprintf(&b, header, version)
	section := func(title, query, none string) {
		parts := queryLines(t, ctx, conn, query)
		if len(parts) == 0 && none == "" {
			return
		}
		fmt.Fprintf(&b, "\n-- %s\n-- %s\n\n", strings.Repeat("-", 73), title)
		if len(parts) == 0 {
			fmt.Fprintf(&b, "-- %s\n", none)
		}
		for i, p := range parts {
			if i > 0 && strings.Contains(p, "\n") {
				b.WriteString("\n")
			}
			b.WriteString(p)
			b.WriteString("\n")
		}
	}
	section("Schema", schemaQuery, "")
	section("Types", typesQuery, "")
	section("Tables", tablesQuery, "")
	section("Sequences", sequencesQuery, "")
	section("Functions", functionsQuery, "")
	section("Views", viewsQuery, "")
	section("Triggers", triggersQuery, "")
	section("Privileges of roles other than the owner", privilegesQuery,
		"none: nothing is granted to PUBLIC or to any role; fence.grant_usage grants usage at run time")
	return b.String()
}

func queryLines(t *testing.T, ctx context.Context, conn *pgx.Conn, query string) []string {
	t.Helper()
	rows, err := conn.Query(ctx, query)
	if err != nil {
		t.Fatalf("read schema fence: %v\n%s", err, query)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read schema fence: %v\n%s", err, query)
	}
	return lines
}

const header = `-- Schema fence as the migrations leave it at version %d: every object, in a
-- fixed order, read from a migrated database. The migrations are the
-- history; this is the present. GENERATED by TestSchemaFileIsCurrent
-- (migrations/schema_test.go), which fails when this file and the
-- migrations disagree: do not edit it, run
--
--   go test ./migrations -run TestSchemaFileIsCurrent -update
--
-- and commit it with the migration that changed it. It is for reading, not
-- for installing (the migrations install the kit; this file is not
-- embedded). Left out: the owner (the role that migrated owns everything),
-- the rows the migrations write, and the guard functions that
-- fence.protect and fence.protect_rows generate for an application's
-- tables (fence._guard_<md5>, fence._rows_<md5>).
`

// kit is the schema; generated are the functions the guards of an
// application's tables are made of (fence._guard_function,
// fence._rows_function), which depend on those tables.
const (
	kit       = `'fence'::regnamespace`
	generated = `'^_(guard|rows)_[0-9a-f]{32}$'`
)

// unhandledObjectsQuery lists the objects of schema fence that no section
// of dumpSchema describes, so that a migration adding a new kind of object
// fails the test instead of vanishing from the file.
const unhandledObjectsQuery = `
SELECT 'relation ' || c.relname || ' of kind ' || c.relkind::text FROM pg_class c
 WHERE c.relnamespace = ` + kit + ` AND c.relkind NOT IN ('r', 'p', 'v', 'S', 'i', 'I')
UNION ALL
SELECT 'type ' || t.typname || ' of kind ' || t.typtype::text FROM pg_type t
 WHERE t.typnamespace = ` + kit + ` AND t.typtype NOT IN ('c', 'd', 'e')
   AND NOT (t.typcategory = 'A' AND t.typelem <> 0)
UNION ALL
SELECT 'routine ' || p.oid::regprocedure || ' of kind ' || p.prokind::text FROM pg_proc p
 WHERE p.pronamespace = ` + kit + ` AND p.prokind NOT IN ('f', 'p')
UNION ALL
SELECT 'operator ' || oprname FROM pg_operator WHERE oprnamespace = ` + kit + `
UNION ALL
SELECT 'collation ' || collname FROM pg_collation WHERE collnamespace = ` + kit + `
UNION ALL
SELECT 'conversion ' || conname FROM pg_conversion WHERE connamespace = ` + kit + `
UNION ALL
SELECT 'operator family ' || opfname FROM pg_opfamily WHERE opfnamespace = ` + kit + `
UNION ALL
SELECT 'text search configuration ' || cfgname FROM pg_ts_config WHERE cfgnamespace = ` + kit + `
UNION ALL
SELECT 'statistics object ' || stxname FROM pg_statistic_ext WHERE stxnamespace = ` + kit + `
UNION ALL
SELECT 'rule ' || r.rulename || ' on ' || r.ev_class::regclass FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
 WHERE c.relnamespace = ` + kit + ` AND r.rulename <> '_RETURN'
UNION ALL
SELECT 'object owned by ' || o.rolname || ', not the schema''s owner: ' || c.oid::regclass FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_roles o ON o.oid = c.relowner
 WHERE c.relnamespace = ` + kit + ` AND c.relowner <> n.nspowner
UNION ALL
SELECT 'function owned by ' || o.rolname || ', not the schema''s owner: ' || p.oid::regprocedure FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_roles o ON o.oid = p.proowner
 WHERE p.pronamespace = ` + kit + ` AND p.proowner <> n.nspowner
UNION ALL
SELECT 'event trigger ' || e.evtname || ' calling ' || e.evtfoid::regproc FROM pg_event_trigger e JOIN pg_proc p ON p.oid = e.evtfoid
 WHERE p.pronamespace = ` + kit

const schemaQuery = `
SELECT 'CREATE SCHEMA fence;'
       || coalesce(E'\nCOMMENT ON SCHEMA fence IS ' || quote_literal(obj_description(` + kit + `, 'pg_namespace')) || ';', '')`

// typesQuery: domains and enums (the row types of tables and views come
// with them; array types with their element).
const typesQuery = `
SELECT CASE t.typtype
         WHEN 'd' THEN 'CREATE DOMAIN ' || t.oid::regtype || ' AS ' || format_type(t.typbasetype, t.typtypmod)
              || CASE WHEN t.typnotnull THEN ' NOT NULL' ELSE '' END
              || coalesce(' DEFAULT ' || t.typdefault, '')
              || coalesce((SELECT string_agg(E'\n    CONSTRAINT ' || quote_ident(c.conname) || ' ' || pg_get_constraintdef(c.oid), '' ORDER BY c.conname COLLATE "C")
                             FROM pg_constraint c WHERE c.contypid = t.oid), '') || ';'
         WHEN 'e' THEN 'CREATE TYPE ' || t.oid::regtype || ' AS ENUM ('
              || (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid) || ');'
         ELSE 'CREATE TYPE ' || t.oid::regtype || ' AS ('
              || (SELECT string_agg(E'\n    ' || quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod), ',' ORDER BY a.attnum)
                    FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) || E'\n);'
       END
       || coalesce(E'\nCOMMENT ON TYPE ' || t.oid::regtype || ' IS ' || quote_literal(obj_description(t.oid, 'pg_type')) || ';', '')
  FROM pg_type t
 WHERE t.typnamespace = ` + kit + `
   AND (t.typtype IN ('d', 'e') OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'))
 ORDER BY t.typname COLLATE "C"`

// tablesQuery: columns (NOT NULL from the column, which is how every
// version shows it; PostgreSQL 18 also names it as a constraint), the
// other constraints by name, storage options, row security, indexes that
// back no constraint, comments.
const tablesQuery = `
SELECT 'CREATE ' || CASE c.relpersistence WHEN 'u' THEN 'UNLOGGED ' ELSE '' END || 'TABLE ' || c.oid::regclass || ' ('
       || coalesce(E'\n' || nullif(concat_ws(E',\n',
            (SELECT string_agg('    ' || quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod)
                 || CASE WHEN a.attcollation <> 0 AND a.attcollation <> ty.typcollation
                         THEN ' COLLATE ' || (SELECT CASE WHEN co.collnamespace = 'pg_catalog'::regnamespace THEN quote_ident(co.collname)
                                                          ELSE co.collnamespace::regnamespace || '.' || quote_ident(co.collname) END
                                                FROM pg_collation co WHERE co.oid = a.attcollation)
                         ELSE '' END
                 || CASE WHEN a.attidentity = 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                         WHEN a.attidentity = 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY'
                         WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ') STORED'
                         WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid)
                         ELSE '' END
                 || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
                 E',\n' ORDER BY a.attnum)
               FROM pg_attribute a
               JOIN pg_type ty ON ty.oid = a.atttypid
               LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
            (SELECT string_agg('    CONSTRAINT ' || quote_ident(k.conname) || ' ' || pg_get_constraintdef(k.oid), E',\n' ORDER BY k.conname COLLATE "C")
               FROM pg_constraint k WHERE k.conrelid = c.oid AND k.contype IN ('c', 'f', 'p', 'u', 'x'))), '') || E'\n', '')
       || ')'
       || coalesce(' WITH (' || array_to_string(c.reloptions, ', ') || ')', '') || ';'
       || CASE WHEN c.relrowsecurity THEN E'\nALTER TABLE ' || c.oid::regclass || ' ENABLE ROW LEVEL SECURITY;' ELSE '' END
       || CASE WHEN c.relforcerowsecurity THEN E'\nALTER TABLE ' || c.oid::regclass || ' FORCE ROW LEVEL SECURITY;' ELSE '' END
       || CASE c.relreplident WHEN 'n' THEN E'\nALTER TABLE ' || c.oid::regclass || ' REPLICA IDENTITY NOTHING;'
                              WHEN 'f' THEN E'\nALTER TABLE ' || c.oid::regclass || ' REPLICA IDENTITY FULL;' ELSE '' END
       || coalesce((SELECT string_agg(E'\nCREATE POLICY ' || quote_ident(p.polname) || ' ON ' || c.oid::regclass
                          || CASE WHEN p.polpermissive THEN '' ELSE ' AS RESTRICTIVE' END
                          || ' FOR ' || CASE p.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END
                          || ' TO ' || (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE r::regrole::text END, ', ' ORDER BY r::regrole::text COLLATE "C") FROM unnest(p.polroles) r)
                          || coalesce(' USING (' || pg_get_expr(p.polqual, p.polrelid) || ')', '')
                          || coalesce(' WITH CHECK (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')', '') || ';',
                          '' ORDER BY p.polname COLLATE "C")
                     FROM pg_policy p WHERE p.polrelid = c.oid), '')
       || coalesce((SELECT string_agg(E'\n' || pg_get_indexdef(i.indexrelid) || ';', '' ORDER BY i.indexrelid::regclass::text COLLATE "C")
                     FROM pg_index i
                    WHERE i.indrelid = c.oid
                      AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = c.oid AND k.contype IN ('p', 'u', 'x'))), '')
       || coalesce(E'\nCOMMENT ON TABLE ' || c.oid::regclass || ' IS ' || quote_literal(obj_description(c.oid, 'pg_class')) || ';', '')
       || coalesce((SELECT string_agg(E'\nCOMMENT ON COLUMN ' || c.oid::regclass || '.' || quote_ident(a.attname) || ' IS ' || quote_literal(ds.description) || ';', '' ORDER BY a.attnum)
                     FROM pg_attribute a JOIN pg_description ds ON ds.classoid = 'pg_class'::regclass AND ds.objoid = c.oid AND ds.objsubid = a.attnum
                    WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '')
  FROM pg_class c
 WHERE c.relnamespace = ` + kit + ` AND c.relkind IN ('r', 'p')
 ORDER BY c.relname COLLATE "C"`

const sequencesQuery = `
SELECT 'CREATE SEQUENCE ' || c.oid::regclass || ' AS ' || format_type(s.seqtypid, NULL)
       || ' START WITH ' || s.seqstart || ' INCREMENT BY ' || s.seqincrement
       || ' MINVALUE ' || s.seqmin || ' MAXVALUE ' || s.seqmax || ' CACHE ' || s.seqcache
       || CASE WHEN s.seqcycle THEN ' CYCLE' ELSE ' NO CYCLE' END
       || coalesce((SELECT ' OWNED BY ' || d.refobjid::regclass || '.' || quote_ident(a.attname)
                      FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                     WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '')
       || ';'
       || coalesce(E'\nCOMMENT ON SEQUENCE ' || c.oid::regclass || ' IS ' || quote_literal(obj_description(c.oid, 'pg_class')) || ';', '')
  FROM pg_class c JOIN pg_sequence s ON s.seqrelid = c.oid
 WHERE c.relnamespace = ` + kit + ` AND c.relkind = 'S'
 ORDER BY c.relname COLLATE "C"`

// functionsQuery: pg_get_functiondef, which gives the body as the
// migration wrote it and every attribute (language, volatility, security,
// settings), by name and then by argument types.
const functionsQuery = `
SELECT rtrim(pg_get_functiondef(p.oid), E'\n') || ';'
       || coalesce(E'\nCOMMENT ON ' || CASE p.prokind WHEN 'p' THEN 'PROCEDURE ' ELSE 'FUNCTION ' END || p.oid::regprocedure
                   || ' IS ' || quote_literal(obj_description(p.oid, 'pg_proc')) || ';', '')
  FROM pg_proc p
 WHERE p.pronamespace = ` + kit + ` AND p.proname !~ ` + generated + `
 ORDER BY p.proname COLLATE "C", pg_get_function_identity_arguments(p.oid) COLLATE "C"`

const viewsQuery = `
SELECT 'CREATE VIEW ' || c.oid::regclass
       || coalesce(' WITH (' || array_to_string(c.reloptions, ', ') || ')', '')
       || E' AS\n' || rtrim(pg_get_viewdef(c.oid, true), E'\n')
       || coalesce(E'\nCOMMENT ON VIEW ' || c.oid::regclass || ' IS ' || quote_literal(obj_description(c.oid, 'pg_class')) || ';', '')
       || coalesce((SELECT string_agg(E'\nCOMMENT ON COLUMN ' || c.oid::regclass || '.' || quote_ident(a.attname) || ' IS ' || quote_literal(ds.description) || ';', '' ORDER BY a.attnum)
                     FROM pg_attribute a JOIN pg_description ds ON ds.classoid = 'pg_class'::regclass AND ds.objoid = c.oid AND ds.objsubid = a.attnum
                    WHERE a.attrelid = c.oid AND a.attnum > 0), '')
  FROM pg_class c
 WHERE c.relnamespace = ` + kit + ` AND c.relkind = 'v'
 ORDER BY c.relname COLLATE "C"`

// triggersQuery: the triggers on the kit's own tables (the guards on an
// application's tables belong to those tables), with their firing mode
// when it is not the default.
const triggersQuery = `
SELECT pg_get_triggerdef(t.oid) || ';'
       || CASE t.tgenabled WHEN 'D' THEN E'\nALTER TABLE ' || t.tgrelid::regclass || ' DISABLE TRIGGER ' || quote_ident(t.tgname) || ';'
                           WHEN 'R' THEN E'\nALTER TABLE ' || t.tgrelid::regclass || ' ENABLE REPLICA TRIGGER ' || quote_ident(t.tgname) || ';'
                           WHEN 'A' THEN E'\nALTER TABLE ' || t.tgrelid::regclass || ' ENABLE ALWAYS TRIGGER ' || quote_ident(t.tgname) || ';'
                           ELSE '' END
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = ` + kit + ` AND NOT t.tgisinternal
 ORDER BY c.relname COLLATE "C", t.tgname COLLATE "C"`

// privilegesQuery: what the catalogs grant to roles other than the owner,
// PUBLIC included (a function nobody revoked from PUBLIC shows here with
// the EXECUTE every role has on it by default); the owner's own
// privileges, which vary by version (MAINTAIN from PostgreSQL 17 on), are
// left out.
const privilegesQuery = `
WITH objects (kind, name, sortkey, acl, owner, defaultkind) AS (
    SELECT 'SCHEMA', 'fence', '0', n.nspacl, n.nspowner, 'n' FROM pg_namespace n WHERE n.oid = ` + kit + `
    UNION ALL
    SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, c.oid::regclass::text, '1' || c.relname, c.relacl, c.relowner,
           CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END
      FROM pg_class c WHERE c.relnamespace = ` + kit + ` AND c.relkind IN ('r', 'p', 'v', 'S')
    UNION ALL
    SELECT CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, p.oid::regprocedure::text,
           '2' || p.proname || '(' || pg_get_function_identity_arguments(p.oid), p.proacl, p.proowner, 'f'
      FROM pg_proc p WHERE p.pronamespace = ` + kit + ` AND p.proname !~ ` + generated + `
), grants AS (
    SELECT o.kind, o.name, o.sortkey, x.grantee, x.privilege_type, x.is_grantable
      FROM objects o, aclexplode(coalesce(o.acl, acldefault(o.defaultkind::"char", o.owner))) x
     WHERE x.grantee <> o.owner
)
SELECT 'GRANT ' || string_agg(privilege_type, ', ' ORDER BY privilege_type COLLATE "C") || ' ON ' || kind || ' ' || name
       || ' TO ' || CASE WHEN grantee = 0 THEN 'PUBLIC' ELSE grantee::regrole::text END
       || CASE WHEN bool_or(is_grantable) THEN ' WITH GRANT OPTION' ELSE '' END || ';'
  FROM grants
 GROUP BY kind, name, sortkey, grantee
 ORDER BY sortkey COLLATE "C", CASE WHEN grantee = 0 THEN 'PUBLIC' ELSE grantee::regrole::text END COLLATE "C"`
