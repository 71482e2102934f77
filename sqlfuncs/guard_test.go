package sqlfuncs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The tests in this file try every way SQL can change a row of a protected
// table without presenting the latest token of the table's resource
// (docs/sql.md, "Guards": a write presents a token by assigning the token
// column in that statement, or by fence.use_token earlier in the
// transaction). The story is always the same: A was granted t1, then B was
// granted t2, and B wrote the rows, so every row already carries the latest
// token; A, still holding only t1, tries to write.

// staleStory sets up that story on two fresh protected tables, "cols"
// (token column "tok") and "plain" (fence.use_token), both under resource
// res, and returns A's and B's tokens.
func staleStory(t *testing.T, b *bundle, res string) (t1, t2 int64) {
	t.Helper()
	b.exec(t, `CREATE TABLE cols (id int PRIMARY KEY, val text, tok bigint)`)
	b.exec(t, `CREATE TABLE plain (id int PRIMARY KEY, val text)`)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "cols", res, "tok"))
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "plain", res, ""))
	t1 = acquireWhenFree(t, b.ctx, b.db.Pool, res, "A", time.Hour)
	_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, res) // A's lease ends
	require.NoError(t, err)
	t2 = acquireWhenFree(t, b.ctx, b.db.Pool, res, "B", time.Hour)
	require.Greater(t, t2, t1)
	b.exec(t, `INSERT INTO cols VALUES (1, 'B', $1), (2, 'B', $1)`, t2)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		if err := sqlfuncs.UseToken(b.ctx, tx, res, t2); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `INSERT INTO plain VALUES (1, 'B'), (2, 'B')`)
		return err
	}))
	return t1, t2
}

// rows returns the table's rows as "id:val:tok" (tok empty for plain).
func (b *bundle) rows(t *testing.T, table string) string {
	t.Helper()
	col := "''"
	if table == "cols" {
		col = "tok::text"
	}
	var s string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		fmt.Sprintf(`SELECT coalesce(string_agg(format('%%s:%%s:%%s', id, val, %s), ',' ORDER BY id), '') FROM %s`, col, table)).Scan(&s))
	return s
}

// inTx runs fn in a transaction of db at isolation level iso and always
// rolls it back, also when fn stops the test: a failed assertion must not
// leave a transaction (and its locks) open for the rest of the test.
func inTx(t *testing.T, ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}, iso pgx.TxIsoLevel, fn func(tx pgx.Tx)) {
	t.Helper()
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fn(tx)
}

// serverVersion is the server's version number (150004 for 15.4).
func serverVersion(t *testing.T, ctx context.Context, db sqlfuncs.DB) int {
	t.Helper()
	var v int
	require.NoError(t, db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v))
	return v
}

// TestWritesThatPresentNoTokenFail: every write idiom that does not assign
// the token column and comes without fence.use_token fails with FN002,
// although the rows carry the latest token (issue 10, items 1 and 2).
func TestWritesThatPresentNoTokenFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t1, t2 := staleStory(t, b, "res")
	before := b.rows(t, "cols") + "|" + b.rows(t, "plain")

	for _, tc := range []struct {
		name, sql string
		code      string
	}{
		{"UPDATE of other columns", `UPDATE cols SET val = 'stale' WHERE id = 1`, "FN002"},
		{"UPDATE of every row", `UPDATE cols SET val = 'stale'`, "FN002"},
		{"UPDATE that assigns NULL to the token column", `UPDATE cols SET val = 'stale', tok = NULL WHERE id = 1`, "FN002"},
		{"upsert presenting the old token in VALUES", fmt.Sprintf(`INSERT INTO cols VALUES (1, 'stale', %d) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, t1), "FN001"},
		{"upsert with the latest token in VALUES only", fmt.Sprintf(`INSERT INTO cols VALUES (1, 'stale', %d) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, t2), "FN002"},
		{"upsert that omits the token column", `INSERT INTO cols (id, val) VALUES (1, 'stale') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, "FN002"},
		{"INSERT without the token column", `INSERT INTO cols (id, val) VALUES (9, 'stale')`, "FN002"},
		{"DELETE", `DELETE FROM cols WHERE id = 1`, "FN002"},
		{"TRUNCATE", `TRUNCATE cols`, "FN002"},
		{"use_token table: UPDATE", `UPDATE plain SET val = 'stale' WHERE id = 1`, "FN002"},
		{"use_token table: upsert", `INSERT INTO plain VALUES (1, 'stale') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, "FN002"},
		{"use_token table: DELETE", `DELETE FROM plain`, "FN002"},
		{"through a view", `UPDATE cols_view SET val = 'stale' WHERE id = 1`, "FN002"},
		{"through a rule of another table", `INSERT INTO feeder VALUES (1)`, "FN002"},
		{"through a trigger of another table", `INSERT INTO feeder2 VALUES (1)`, "FN002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch tc.name {
			case "through a view":
				b.exec(t, `CREATE VIEW cols_view AS SELECT * FROM cols`)
			case "through a rule of another table":
				b.exec(t, `CREATE TABLE feeder (id int)`)
				b.exec(t, `CREATE RULE feed AS ON INSERT TO feeder DO ALSO UPDATE cols SET val = 'stale' WHERE id = NEW.id`)
			case "through a trigger of another table":
				b.exec(t, `CREATE TABLE feeder2 (id int)`)
				b.exec(t, `CREATE FUNCTION feed2() RETURNS trigger LANGUAGE plpgsql AS $$
					BEGIN UPDATE cols SET val = 'stale' WHERE id = NEW.id; RETURN NEW; END $$`)
				b.exec(t, `CREATE TRIGGER feed2 AFTER INSERT ON feeder2 FOR EACH ROW EXECUTE FUNCTION feed2()`)
			}
			_, err := b.db.Pool.Exec(b.ctx, tc.sql)
			requireCode(t, err, tc.code)
		})
	}

	t.Run("MERGE whose UPDATE action does not assign the token column", func(t *testing.T) {
		_, err := b.db.Pool.Exec(b.ctx, `MERGE INTO cols c USING (VALUES (1), (2)) s(id) ON c.id = s.id
			WHEN MATCHED THEN UPDATE SET val = 'stale'`)
		if serverVersion(t, b.ctx, b.db.Pool) < 150000 {
			requireCode(t, err, "42601") // no MERGE before PostgreSQL 15: nothing to guard
			return
		}
		requireCode(t, err, "FN002")
		_, err = b.db.Pool.Exec(b.ctx, fmt.Sprintf(`MERGE INTO cols c USING (VALUES (1)) s(id) ON c.id = s.id
			WHEN MATCHED THEN UPDATE SET val = 'stale', tok = %d`, t1))
		requireCode(t, err, "FN001")
		_, err = b.db.Pool.Exec(b.ctx, `MERGE INTO cols c USING (VALUES (1)) s(id) ON c.id = s.id WHEN MATCHED THEN DELETE`)
		requireCode(t, err, "FN002")
		_, err = b.db.Pool.Exec(b.ctx, fmt.Sprintf(`MERGE INTO cols c USING (VALUES (7)) s(id) ON c.id = s.id
			WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'stale', %d)`, t1))
		requireCode(t, err, "FN001")
	})

	t.Run("COPY", func(t *testing.T) {
		_, err := b.db.Pool.CopyFrom(b.ctx, pgx.Identifier{"cols"}, []string{"id", "val"}, pgx.CopyFromRows([][]any{{8, "stale"}}))
		requireCode(t, err, "FN002")
		_, err = b.db.Pool.CopyFrom(b.ctx, pgx.Identifier{"cols"}, []string{"id", "val", "tok"}, pgx.CopyFromRows([][]any{{8, "stale", t1}}))
		requireCode(t, err, "FN001")
	})

	t.Run("in a savepoint, at every isolation level", func(t *testing.T) {
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
			inTx(t, b.ctx, b.db.Pool, iso, func(tx pgx.Tx) {
				_, err := tx.Exec(b.ctx, `SAVEPOINT s`)
				require.NoError(t, err)
				_, err = tx.Exec(b.ctx, `UPDATE cols SET val = 'stale' WHERE id = 1`)
				requireCode(t, err, "FN002")
				_, err = tx.Exec(b.ctx, `ROLLBACK TO SAVEPOINT s`)
				require.NoError(t, err)
				_, err = tx.Exec(b.ctx, fmt.Sprintf(`UPDATE cols SET val = 'stale', tok = %d WHERE id = 1`, t1))
				requireCode(t, err, "FN001")
			})
		}
	})

	require.Equal(t, before, b.rows(t, "cols")+"|"+b.rows(t, "plain"), "B's rows are intact")

	t.Run("the holder's own writes go through", func(t *testing.T) {
		b.exec(t, `UPDATE cols SET val = 'B2', tok = $1 WHERE id = 1`, t2)
		b.exec(t, `UPDATE cols SET val = 'B3', tok = $1 WHERE id = 1`, t2) // the same token again
		b.exec(t, `INSERT INTO cols VALUES (2, 'B4', $1) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val, tok = EXCLUDED.tok`, t2)
		b.exec(t, `UPDATE cols SET val = 'B5', tok = tok WHERE id = 2`) // re-assigning the row's (latest) token presents it
		require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
			require.NoError(t, sqlfuncs.UseToken(b.ctx, tx, "res", t2))
			for _, sql := range []string{
				`UPDATE cols SET val = 'B6' WHERE id = 1`,
				`INSERT INTO cols (id, val) VALUES (3, 'B7')`,
				`UPDATE plain SET val = 'B8'`,
				`DELETE FROM plain WHERE id = 2`,
			} {
				if _, err := tx.Exec(b.ctx, sql); err != nil {
					return fmt.Errorf("%s: %w", sql, err)
				}
			}
			return nil
		}))
		require.Equal(t, fmt.Sprintf("1:B6:%[1]d,2:B5:%[1]d,3:B7:%[1]d", t2), b.rows(t, "cols"),
			"a write through fence.use_token stores the token it presented")
		require.Equal(t, "1:B8:", b.rows(t, "plain"))
	})
}

// TestMergeWithSeveralUpdateActions pins down the one place where the server
// answers "assigned" for a row whose action did not assign the token column:
// PostgreSQL counts a column as assigned for every UPDATE action of a MERGE
// when any one of them assigns it (the statement's column set, which UPDATE
// OF triggers and column privileges use too). The rows of the other actions
// then present the token they already carry: refused when it is not the
// latest, accepted when it is. docs/sql.md documents this.
func TestMergeWithSeveralUpdateActions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if serverVersion(t, b.ctx, b.db.Pool) < 150000 {
		t.Log("PostgreSQL before 15 has no MERGE; nothing to test")
		return
	}
	t1, _ := staleStory(t, b, "res")
	merge := fmt.Sprintf(`MERGE INTO cols c USING (VALUES (1), (2)) s(id) ON c.id = s.id
		WHEN MATCHED AND s.id = 1 THEN UPDATE SET val = 'stale', tok = %d
		WHEN MATCHED THEN UPDATE SET val = 'stale'`, t1)
	_, err := b.db.Pool.Exec(b.ctx, merge)
	requireCode(t, err, "FN001") // row 1 presents t1
	_, err = b.db.Pool.Exec(b.ctx, strings.Replace(merge, "AND s.id = 1", "AND s.id = 0", 1))
	require.NoError(t, err, "row 2's action assigns nothing, yet the server counts the column as assigned: it presents the row's latest token")
	_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "res")
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(b.ctx, strings.Replace(merge, "AND s.id = 1", "AND s.id = 0", 1))
	requireCode(t, err, "FN001") // once the row's token is not the latest, the same MERGE fails
}

// TestCascadesNeedATokenOfTheirOwn: foreign-key actions rewrite or delete
// protected child rows on behalf of a role that writes only the parent
// (issue 10, item 3): they present no token, so they fail unless the
// transaction that fires them called fence.use_token.
func TestCascadesNeedATokenOfTheirOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `CREATE TABLE parent (id int PRIMARY KEY)`)
	b.exec(t, `CREATE TABLE child_upd (id int PRIMARY KEY, parent int REFERENCES parent ON UPDATE CASCADE, tok bigint)`)
	b.exec(t, `CREATE TABLE child_null (id int PRIMARY KEY, parent int REFERENCES parent ON DELETE SET NULL, tok bigint)`)
	b.exec(t, `CREATE TABLE child_del (id int PRIMARY KEY, parent int REFERENCES parent ON DELETE CASCADE)`)
	for _, tbl := range []string{"child_upd", "child_null"} {
		require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, tbl, "kids", "tok"))
	}
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "child_del", "kids", ""))
	tok := acquireWhenFree(t, b.ctx, b.db.Pool, "kids", "B", time.Hour)
	b.exec(t, `INSERT INTO parent VALUES (1), (2), (3)`)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		require.NoError(t, sqlfuncs.UseToken(b.ctx, tx, "kids", tok))
		_, err := tx.Exec(b.ctx, fmt.Sprintf(`INSERT INTO child_upd VALUES (1, 1, %[1]d); INSERT INTO child_null VALUES (1, 2, %[1]d);
			INSERT INTO child_del VALUES (1, 3)`, tok))
		return err
	}))

	// A role that holds no lease at all writes the parent.
	_, err := b.db.Pool.Exec(b.ctx, `UPDATE parent SET id = 10 WHERE id = 1`)
	requireCode(t, err, "FN002")
	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM parent WHERE id = 2`)
	requireCode(t, err, "FN002")
	_, err = b.db.Pool.Exec(b.ctx, `DELETE FROM parent WHERE id = 3`)
	requireCode(t, err, "FN002")

	// With the token registered in the transaction that fires them, they go through.
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		require.NoError(t, sqlfuncs.UseToken(b.ctx, tx, "kids", tok))
		_, err := tx.Exec(b.ctx, `UPDATE parent SET id = 10 WHERE id = 1; DELETE FROM parent WHERE id IN (2, 3)`)
		return err
	}))
	var s string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT format('%s/%s/%s', (SELECT parent FROM child_upd), (SELECT parent FROM child_null), (SELECT count(*) FROM child_del))`).Scan(&s))
	require.Equal(t, "10//0", s)
}

// TestRoleWithoutUsageCannotWrite: a role with every table privilege but not
// the kit's usage cannot write to a protected table in either mode, whatever
// settings it sets (issue 10, item 4: the "checked" setting of migration 2
// let it through): 42501, because the guard reads fence.lease with the
// writer's rights.
func TestRoleWithoutUsageCannotWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, t2 := staleStory(t, b, "res")
	other := pgtest.NewRole(t, "nousage")
	b.exec(t, `GRANT ALL ON cols, plain TO `+pgx.Identifier{other}.Sanitize())
	conn, err := pgx.Connect(b.ctx, b.db.URLAs(other))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(b.ctx)) })

	settings := []string{
		``,
		fmt.Sprintf(`SELECT set_config('fence._checked', '%d:res', true)`, t2),
		fmt.Sprintf(`SELECT set_config('fence.tokens', '{"res": %d}', true)`, t2),
		fmt.Sprintf(`SELECT set_config('fence._checked', '%d:res', true), set_config('fence.tokens', '{"res": %d}', true)`, t2, t2),
		`SELECT set_config('fence._checked', '9223372036854775807:res', true), set_config('fence.tokens', '{"res": 9223372036854775807}', true)`,
		`SET LOCAL search_path = public, pg_catalog`,
	}
	writes := []string{
		fmt.Sprintf(`INSERT INTO cols VALUES (5, 'x', %d)`, t2),
		`INSERT INTO cols VALUES (6, 'x', 9223372036854775807)`,
		fmt.Sprintf(`UPDATE cols SET val = 'x', tok = %d WHERE id = 1`, t2),
		`UPDATE cols SET val = 'x' WHERE id = 1`,
		`DELETE FROM cols WHERE id = 1`,
		`INSERT INTO plain VALUES (5, 'x')`,
		`UPDATE plain SET val = 'x'`,
		`DELETE FROM plain`,
		`TRUNCATE plain`,
	}
	for _, set := range settings {
		for _, w := range writes {
			inTx(t, b.ctx, conn, pgx.ReadCommitted, func(tx pgx.Tx) {
				if set != "" {
					_, err := tx.Exec(b.ctx, set)
					require.NoError(t, err)
				}
				_, err := tx.Exec(b.ctx, w)
				requireCode(t, err, "42501")
			})
		}
	}
}

// TestGrantInTheSameTransactionIsSeen: a token registered with
// fence.use_token stops being accepted as soon as the same transaction makes
// a newer grant of the resource (issue 10, item 5: migration 2 trusted the
// pair it had checked earlier in the transaction).
func TestGrantInTheSameTransactionIsSeen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, t2 := staleStory(t, b, "res")
	for _, regrant := range []string{
		`SELECT fence.revoke('res')`,
		fmt.Sprintf(`SELECT fence.release('res', %d), fence.acquire('res', 'B again', '1 hour')`, t2),
	} {
		for _, write := range []string{
			`UPDATE cols SET val = 'x' WHERE id = 1`,
			fmt.Sprintf(`UPDATE cols SET val = 'x', tok = %d WHERE id = 1`, t2),
			fmt.Sprintf(`INSERT INTO cols VALUES (7, 'x', %d)`, t2),
			`INSERT INTO plain VALUES (7, 'x')`,
			`DELETE FROM plain WHERE id = 1`,
		} {
			inTx(t, b.ctx, b.db.Pool, pgx.ReadCommitted, func(tx pgx.Tx) {
				require.NoError(t, sqlfuncs.UseToken(b.ctx, tx, "res", t2))
				_, err := tx.Exec(b.ctx, `UPDATE cols SET val = 'before' WHERE id = 1`)
				require.NoError(t, err, "the registered token is the latest so far")
				_, err = tx.Exec(b.ctx, regrant)
				require.NoError(t, err)
				_, err = tx.Exec(b.ctx, write)
				requireCode(t, err, "FN001")
			})
		}
	}
}

// TestTokenOfAnotherResourceIsRefused: tokens are unique across resources
// (one counter for all), so a token granted for one resource never equals
// the latest token of another (issue 10, item 6: the first grants of two
// resources used to be the same number).
func TestTokenOfAnotherResourceIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `CREATE TABLE b_rows (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "b_rows", "b", "tok"))
	seen := map[int64]string{}
	for i := range 20 {
		for _, res := range []string{"a", "b", fmt.Sprint("r", i)} {
			tok, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, res)
			require.NoError(t, err)
			require.NotContains(t, seen, tok, "token %d of %s was granted to %s too", tok, res, seen[tok])
			seen[tok] = res
		}
	}
	ta := acquireWhenFree(t, b.ctx, b.db.Pool, "fresh-a", "A", time.Hour)
	tb := acquireWhenFree(t, b.ctx, b.db.Pool, "fresh-b", "B", time.Hour)
	require.NotEqual(t, ta, tb, "first grants of two resources differ")
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "b_rows", "fresh-b", "tok"))
	_, err := b.db.Pool.Exec(b.ctx, `INSERT INTO b_rows VALUES (1, $1)`, ta)
	require.Error(t, err, "A's token is refused for B's table")
	_, err = b.db.Pool.Exec(b.ctx, `INSERT INTO b_rows VALUES (1, $1)`, tb)
	require.NoError(t, err)
}

// TestProtectRaisesTheTokenFloor: the next grant of a resource exceeds every
// token its protected rows already carry, also after the kit was removed and
// installed again (issue 10, item 7), and only the kit's owner or an
// operator may move the floor.
func TestProtectRaisesTheTokenFloor(t *testing.T) {
	t.Parallel()
	db := pgtest.Empty(t)
	owner := installAsOrdinaryOwner(t, db)
	ctx := t.Context()
	app := pgtest.NewRole(t, "app")
	for _, sql := range []string{
		`CREATE TABLE orders (id int PRIMARY KEY, tok bigint)`,
		`CREATE TABLE mine (id int PRIMARY KEY, tok bigint)`,
		`ALTER TABLE mine OWNER TO ` + pgx.Identifier{app}.Sanitize(),
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	_, err := db.Pool.Exec(ctx, `ALTER TABLE orders OWNER TO `+pgx.Identifier{mustUser(t, ctx, owner)}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.GrantUsage(ctx, owner, app, false))

	// Rows written under tokens of an earlier install (or restored from a
	// dump): far above anything this install granted.
	stale := int64(5)<<43 | 77
	_, err = db.Pool.Exec(ctx, `INSERT INTO orders VALUES (1, $1)`, stale)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO mine VALUES (1, $1)`, stale)
	require.NoError(t, err)

	appConn, err := pgx.Connect(ctx, db.URLAs(app))
	require.NoError(t, err)
	t.Cleanup(func() { _ = appConn.Close(context.WithoutCancel(ctx)) })
	err = sqlfuncs.Protect(ctx, appConn, "mine", "mine", "tok")
	requireCode(t, err, "42501")
	require.Contains(t, err.Error(), "above every token granted so far")

	require.NoError(t, sqlfuncs.Protect(ctx, owner, "orders", "orders", "tok"))
	tok, ok, err := sqlfuncs.Acquire(ctx, owner, "orders", "B", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, tok, stale, "the first grant after protect exceeds the rows' tokens")
	_, err = owner.Exec(ctx, `UPDATE orders SET tok = $1 WHERE id = 1`, tok)
	require.NoError(t, err, "the legitimate holder can write the restored row")
	other, ok, err := sqlfuncs.Acquire(ctx, owner, "unrelated", "C", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, other, stale, "the floor is the epoch's: every resource moves past it")

	// Protecting again changes nothing when the rows are below the floor.
	require.NoError(t, sqlfuncs.Protect(ctx, owner, "orders", "orders", "tok"))
	tok2, err := sqlfuncs.Revoke(ctx, owner, "orders")
	require.NoError(t, err)
	require.Equal(t, tok>>43, tok2>>43, "no epoch was spent")

	// Values that no epoch can exceed are refused with advice.
	_, err = db.Pool.Exec(ctx, `INSERT INTO orders VALUES (2, 9223372036854775807)`)
	requireCode(t, err, "FN003")
	_, err = db.Pool.Exec(ctx, `ALTER TABLE orders DISABLE TRIGGER USER; INSERT INTO orders VALUES (2, 9223372036854775807); ALTER TABLE orders ENABLE TRIGGER USER`)
	require.NoError(t, err)
	err = sqlfuncs.Protect(ctx, owner, "orders", "orders", "tok")
	requireCode(t, err, "54000")
}

// mustUser is the role a pool connects as.
func mustUser(t *testing.T, ctx context.Context, db *pgxpool.Pool) string {
	t.Helper()
	var u string
	require.NoError(t, db.QueryRow(ctx, `SELECT current_user`).Scan(&u))
	return u
}

// TestProtectedNamesTriggerRoles: fence.protected lists the roles other
// than the owner that hold TRIGGER on a protected table, since such a role
// can add a trigger that rewrites rows after the guard (issue 10, item 10).
func TestProtectedNamesTriggerRoles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `CREATE TABLE t (id int, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "t", "r", "tok"))
	var roles []string
	read := func() {
		t.Helper()
		require.NoError(t, b.db.Pool.QueryRow(b.ctx,
			`SELECT coalesce(trigger_roles::text[], '{}') FROM fence.protected WHERE tbl = 't'::regclass`).Scan(&roles))
	}
	read()
	require.Empty(t, roles)
	r1, r2 := pgtest.NewRole(t, "trig"), pgtest.NewRole(t, "all")
	b.exec(t, `GRANT TRIGGER ON t TO `+pgx.Identifier{r1}.Sanitize())
	b.exec(t, `GRANT ALL ON t TO `+pgx.Identifier{r2}.Sanitize())
	read()
	require.ElementsMatch(t, []string{r1, r2}, roles)
}

// A protected table attached later as a partition stays guarded: writes
// routed through the parent meet its guard.
func TestProtectedTableAttachedLaterStaysGuarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.exec(t, `CREATE TABLE part_1 (id int, v int)`)
	require.NoError(t, sqlfuncs.Protect(ctx, db, "part_1", "parts", ""))
	b.exec(t, `CREATE TABLE parts (id int, v int) PARTITION BY RANGE (id)`)
	b.exec(t, `ALTER TABLE parts ATTACH PARTITION part_1 FOR VALUES FROM (0) TO (100)`)

	_, err := db.Exec(ctx, `INSERT INTO parts VALUES (1, 1)`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "an insert routed through the parent meets the guard")
	tok, ok, err := sqlfuncs.Acquire(ctx, db, "parts", "h", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "parts", tok))
		_, err := tx.Exec(ctx, `INSERT INTO parts VALUES (1, 1)`)
		return err
	}))
	_, err = db.Exec(ctx, `UPDATE parts SET v = 2`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
	_, err = db.Exec(ctx, `DELETE FROM parts`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
}

// TestProtectRefusesTheKitsOwnTables: fence.protect refuses the tables of
// schema fence, also for the kit's owner or a superuser. (On fence.lease it
// used to install the guard triggers on the kit's own table; from then on
// every grant updated fence.lease, the guard checked a token the lease row
// does not carry for the guard's resource, and every fence.acquire failed,
// FN003, until someone ran fence.unprotect. Found by FuzzProtectNames's seed
// corpus run as the owner.)
func TestProtectRefusesTheKitsOwnTables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	err := sqlfuncs.Protect(ctx, db, "fence.lease", "r", "token")
	require.Error(t, err, "protect must refuse the kit's own lease table")
	_, ok, err := sqlfuncs.Acquire(ctx, db, "x", "h", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
}
