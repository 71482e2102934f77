package sqlfuncs_test

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// grantedBy reads what role holds in schema fence: its SELECT tables and
// EXECUTE functions (regprocedure, without quotes and spaces), leaving out
// the generated guards, which the docs name as a pattern.
func grantedBy(t *testing.T, b *bundle, role string) (tables, functions []string) {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT c.oid::regclass::text FROM pg_class c, aclexplode(c.relacl) a
		WHERE c.relnamespace = 'fence'::regnamespace AND a.grantee = $1::regrole AND a.privilege_type = 'SELECT' ORDER BY 1`, role)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		tables = append(tables, s)
	}
	require.NoError(t, rows.Err())
	rows, err = b.db.Pool.Query(b.ctx, `SELECT replace(replace(p.oid::regprocedure::text, '"', ''), ' ', '') FROM pg_proc p, aclexplode(p.proacl) a
		WHERE p.pronamespace = 'fence'::regnamespace AND a.grantee = $1::regrole AND a.privilege_type = 'EXECUTE'
		  AND p.proname !~ '^_(guard|rows)_[0-9a-f]{32}$' ORDER BY 1`, role)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		functions = append(functions, s)
	}
	require.NoError(t, rows.Err())
	return tables, functions
}

// docGrants parses the GRANT statements of a sql block of docs/sql.md.
func docGrants(block string) (tables, functions []string) {
	if m := regexp.MustCompile(`GRANT SELECT ON ([^;]*?) TO app;`).FindStringSubmatch(block); m != nil {
		for _, s := range strings.Split(m[1], ",") {
			tables = append(tables, strings.TrimSpace(s))
		}
	}
	for _, m := range regexp.MustCompile(`(?s)GRANT EXECUTE ON FUNCTION(.*?)TO app;`).FindAllStringSubmatch(block, -1) {
		for _, f := range regexp.MustCompile(`fence\.\w+\([^)]*\)`).FindAllString(m[1], -1) {
			functions = append(functions, strings.ReplaceAll(f, " ", ""))
		}
	}
	slices.Sort(tables)
	slices.Sort(functions)
	return tables, functions
}

// TestSQLDocGrantListIsWhatGrantUsageGrants: docs/sql.md §7 says what
// fence.grant_usage grants "exactly", and its overview which version
// fence.version() returns; both fell behind the migrations (issue 28 item
// 6: version 6, a list without fence.refusals). This compares them with a
// migrated database.
func TestSQLDocGrantListIsWhatGrantUsageGrants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	raw, err := os.ReadFile("../docs/sql.md")
	require.NoError(t, err)
	doc := string(raw)

	for _, want := range []string{
		"`fence.version()` = " + strconv.Itoa(migrations.Latest) + ".",                              // the introduction
		"The migration version of the installed schema: `" + strconv.Itoa(migrations.Latest) + "`.", // fence.version
	} {
		require.True(t, strings.Contains(doc, want), "docs/sql.md does not say %q", want)
	}
	for v := 1; v <= migrations.Latest; v++ {
		intro := doc[:strings.Index(doc, "## 1. Overview")]
		require.True(t, regexp.MustCompile("`"+strconv.Itoa(1000 + v)[1:]+"_[a-z_]+`").MatchString(intro), "the introduction of docs/sql.md names no migration %d", v)
	}

	sec := doc[strings.Index(doc, "**`fence.grant_usage(role)`** grants exactly"):]
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(sec, 2)
	require.Len(t, blocks, 2, "the usage block and the operator block")
	require.Contains(t, blocks[0][1], "GRANT USAGE ON SCHEMA fence TO app;")

	app, op := pgtest.NewRole(t, "app"), pgtest.NewRole(t, "op")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, app, false))
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, op, true))

	tables, functions := grantedBy(t, b, app)
	docTables, docFunctions := docGrants(blocks[0][1])
	require.Equal(t, tables, docTables, "GRANT SELECT in docs/sql.md §7")
	require.Equal(t, functions, docFunctions, "GRANT EXECUTE in docs/sql.md §7")

	opTables, opFunctions := grantedBy(t, b, op)
	require.Equal(t, tables, opTables, "an operator reads what an application reads")
	_, docOp := docGrants(blocks[1][1])
	var extra []string
	for _, f := range opFunctions {
		if !slices.Contains(functions, f) {
			extra = append(extra, f)
		}
	}
	require.Equal(t, extra, docOp, "the operator's GRANT EXECUTE in docs/sql.md §7")
}
