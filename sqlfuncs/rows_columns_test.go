package sqlfuncs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestRowsHostileColumnNames (issue 19, item 6): any legal identifier works
// as the resource column and as the token column of fence.protect_rows, and
// as the token column of fence.protect. 006 built the generated guard's body
// by replacing placeholders one after another, so a resource column named
// job@T@ had its @T@ replaced by the token column's name: the guard read
// another column (job, or jobtok) than the one fence.protected names, and a
// writer holding p:2 committed rows of p:1. Now the body is one format()
// with %I: for each pair of names, a writer holding p:2 is refused rows of
// p:1, whatever it names, and writes its own.
func TestRowsHostileColumnNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t1 := acquireWhenFree(t, b.ctx, b.db.Pool, "p:1", "B", time.Hour)
	t2 := acquireWhenFree(t, b.ctx, b.db.Pool, "p:2", "A", time.Hour)
	long := strings.Repeat("é", 31) + "x" // 63 bytes, the longest identifier
	names := []string{`job@T@`, `@R@`, `@NT@`, `%1$I`, `%s`, `a"b`, `$$`, `$s$`, `'`, `naïve ünïcode`, long, `select`, `tok tok`}
	type pair struct{ rc, tc string }
	pairs := []pair{{`job@T@`, `tok`}} // the review's case: 006 read column jobtok
	for i, rc := range names {
		pairs = append(pairs, pair{rc, names[(i+1)%len(names)]})
	}
	for i, p := range pairs {
		rc, tc := p.rc, p.tc
		t.Run(fmt.Sprintf("%s and %s", rc, tc), func(t *testing.T) {
			tbl := fmt.Sprintf("odd_%d", i)
			qrc, qtc := pgx.Identifier{rc}.Sanitize(), pgx.Identifier{tc}.Sanitize()
			// Decoy columns: what a wrong substitution would read instead.
			decoys := ""
			for _, d := range []string{"job", "jobtok", "tok"} {
				if d != rc && d != tc {
					decoys += fmt.Sprintf(", %s bigint DEFAULT 2", d)
				}
			}
			b.exec(t, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, %s int NOT NULL, %s bigint%s)`, tbl, qrc, qtc, decoys))
			require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, tbl, rc, "p:", tc))
			var rcol, tcol string
			require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT resource_column, token_column FROM fence.protected WHERE tbl = $1::regclass`, tbl).Scan(&rcol, &tcol))
			require.Equal(t, rc, rcol)
			require.Equal(t, tc, tcol)
			b.exec(t, fmt.Sprintf(`INSERT INTO %s (id, %s, %s) VALUES (1, 1, $1), (2, 2, $2)`, tbl, qrc, qtc), t1, t2)
			// A holds p:2 only.
			for _, w := range []string{
				fmt.Sprintf(`UPDATE %s SET %s = $1 WHERE id = 1`, tbl, qtc),
				fmt.Sprintf(`INSERT INTO %s (id, %s, %s) VALUES (3, 1, $1)`, tbl, qrc, qtc),
				fmt.Sprintf(`UPDATE %s SET %s = 1, %s = $1 WHERE id = 2`, tbl, qrc, qtc),
			} {
				err := attempt(b.ctx, b.db.Pool, pgx.ReadCommitted, nil, strings.ReplaceAll(w, "$1", fmt.Sprint(t2)))
				requireOneOf(t, err, "FN002|FN003|FN001")
			}
			require.NoError(t, attempt(b.ctx, b.db.Pool, pgx.ReadCommitted, nil,
				fmt.Sprintf(`UPDATE %s SET %s = %d WHERE id = 2`, tbl, qtc, t2)), "A writes its own row")
			var s string
			require.NoError(t, b.db.Pool.QueryRow(b.ctx, fmt.Sprintf(`SELECT string_agg(format('%%s:%%s:%%s', id, %s, %s), ',' ORDER BY id) FROM %s`, qrc, qtc, tbl)).Scan(&s))
			require.Equal(t, fmt.Sprintf("1:1:%d,2:2:%d", t1, t2), s)
		})
	}
	t.Run("table-wide token column", func(t *testing.T) {
		for i, tc := range names {
			tbl := fmt.Sprintf("odd_tw_%d", i)
			b.exec(t, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, %s bigint, tok bigint)`, tbl, pgx.Identifier{tc}.Sanitize()))
			require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, tbl, "p:1", tc))
			err := attempt(b.ctx, b.db.Pool, pgx.ReadCommitted, nil, fmt.Sprintf(`INSERT INTO %s (id, %s, tok) VALUES (1, %d, %d)`, tbl, pgx.Identifier{tc}.Sanitize(), t2, t1))
			requireOneOf(t, err, "FN003")
			require.NoError(t, attempt(b.ctx, b.db.Pool, pgx.ReadCommitted, nil, fmt.Sprintf(`INSERT INTO %s (id, %s) VALUES (1, %d)`, tbl, pgx.Identifier{tc}.Sanitize(), t1)), tc)
		}
	})
}

// TestRowsResourceColumnCannotBeRetyped (issue 19, item 7): the resource
// of a row is its resource column as text, and the text form of a
// timestamptz follows the writer's TimeZone. On 006 the owner could retype
// the column after fence.protect_rows (the type was checked at protect time
// only), and then one row had a resource name per time zone: A, holding the
// Tokyo spelling, overwrote the row whose UTC spelling B held. Now the pin
// trigger's WHEN names both columns, so PostgreSQL refuses to retype them.
func TestRowsResourceColumnCannotBeRetyped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []string{"tok", ""} {
		tbl := "retype_" + map[string]string{"tok": "col", "": "use"}[tc]
		b.exec(t, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, at timestamp NOT NULL, tok bigint)`)
		b.exec(t, `ALTER TABLE `+tbl+` ALTER COLUMN at TYPE text USING at::text`)
		require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, tbl, "at", "t:", tc))
		for _, alter := range []string{
			`ALTER TABLE ` + tbl + ` ALTER COLUMN at TYPE timestamptz USING at::timestamptz`,
			`ALTER TABLE ` + tbl + ` ALTER COLUMN at TYPE varchar(20)`,
		} {
			_, err := b.db.Pool.Exec(b.ctx, alter)
			requireCode(t, err, "0A000") // cannot alter type of a column used in a trigger definition
		}
		if tc != "" {
			_, err := b.db.Pool.Exec(b.ctx, `ALTER TABLE `+tbl+` ALTER COLUMN tok TYPE numeric`)
			requireCode(t, err, "0A000")
		}
		// After fence.unprotect the owner may change the table again.
		require.NoError(t, sqlfuncs.Unprotect(b.ctx, b.db.Pool, tbl))
		b.exec(t, `ALTER TABLE `+tbl+` ALTER COLUMN at TYPE varchar(40)`)
	}
}
