package sqlfuncs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The tests in this file cover tables protected per row
// (fence.protect_rows, migration 4): the resource of a row is the prefix
// followed by its resource column, and a write commits only when it
// presented the latest token of the resource of every row it wrote.

// jobs creates table job (id, state, tok) protected per row with prefix
// "job:" and token column tok, and table note (id, body) protected per row
// without a token column, prefix "note:".
func jobs(t *testing.T, b *bundle) {
	t.Helper()
	b.exec(t, `CREATE TABLE job (id int PRIMARY KEY, state text, tok bigint)`)
	b.exec(t, `CREATE TABLE note (id int PRIMARY KEY, body text)`)
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "job", "id", "job:", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "note", "id", "note:", ""))
}

// grant acquires resource for holder (one hour), failing if it is held.
func grant(t *testing.T, b *bundle, resource, holder string) int64 {
	t.Helper()
	tok, ok, err := sqlfuncs.Acquire(b.ctx, b.db.Pool, resource, holder, time.Hour)
	require.NoError(t, err)
	require.True(t, ok, "%s is held", resource)
	return tok
}

// regrant ends resource's lease and grants it anew: the previous token is
// stale from then on.
func regrant(t *testing.T, b *bundle, resource, holder string) int64 {
	t.Helper()
	_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, resource)
	require.NoError(t, err)
	return acquireWhenFree(t, b.ctx, b.db.Pool, resource, holder, time.Hour)
}

// jobRows returns job's rows as "id:state:tok,...".
func (b *bundle) jobRows(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT coalesce(string_agg(format('%s:%s:%s', id, state, tok), ',' ORDER BY id), '') FROM job`).Scan(&s))
	return s
}

// TestPerRowWritesPresentTheirRowsToken: every way of presenting (or not
// presenting) a token, row by row, on a table with and one without a token
// column. A statement with one bad row changes nothing.
func TestPerRowWritesPresentTheirRowsToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs(t, b)
	ctx, db := b.ctx, b.db.Pool
	a1 := grant(t, b, "job:1", "A")
	b2 := grant(t, b, "job:2", "B")
	b.exec(t, `INSERT INTO job VALUES (1, 'new', $1)`, a1)
	b.exec(t, `INSERT INTO job VALUES (2, 'new', $1)`, b2)
	b.exec(t, `UPDATE job SET state = 'both', tok = CASE id WHEN 1 THEN $1::bigint ELSE $2::bigint END`, a1, b2)
	want := fmt.Sprintf("1:both:%d,2:both:%d", a1, b2)
	require.Equal(t, want, b.jobRows(t))

	type write struct {
		name string
		sql  string
		args []any
		code string
	}
	c1 := regrant(t, b, "job:1", "C") // A's token is stale now
	refused := []write{
		{"insert for a resource never granted", `INSERT INTO job VALUES (3, 'x', $1)`, []any{c1}, "FN003"},
		{"insert with another resource's token", `INSERT INTO job VALUES (3, 'x', $1)`, []any{b2}, "FN003"},
		{"update with the stale token", `UPDATE job SET state = 'A' , tok = $1 WHERE id = 1`, []any{a1}, "FN001"},
		{"update with another row's token", `UPDATE job SET state = 'B', tok = $1 WHERE id = 1`, []any{b2}, "FN001"},
		{"update that assigns no token", `UPDATE job SET state = 'x' WHERE id = 2`, nil, "FN002"},
		{"update of both rows, one stale", `UPDATE job SET state = 'x', tok = CASE id WHEN 1 THEN $1::bigint ELSE $2::bigint END`, []any{a1, b2}, "FN001"},
		{"update of both rows with one token", `UPDATE job SET state = 'x', tok = $1`, []any{b2}, "FN001"},
		{"delete without use_token", `DELETE FROM job WHERE id = 2`, nil, "FN002"},
		{"truncate without use_token", `TRUNCATE job`, nil, "FN002"},
		{"upsert whose update assigns no token", `INSERT INTO job VALUES (2, 'up', $1) ON CONFLICT (id) DO UPDATE SET state = excluded.state`, []any{b2}, "FN002"},
		{"upsert with the stale token", `INSERT INTO job VALUES (1, 'up', $1) ON CONFLICT (id) DO UPDATE SET state = excluded.state, tok = excluded.tok`, []any{a1}, "FN001"},
		{"note insert without use_token", `INSERT INTO note VALUES (1, 'x')`, nil, "FN002"},
		{"zero token", `UPDATE job SET tok = 0 WHERE id = 2`, nil, "FN003"},
		{"negative token", `UPDATE job SET tok = -$1::bigint WHERE id = 2`, []any{b2}, "FN003"},
	}
	for _, w := range refused {
		t.Run(w.name, func(t *testing.T) {
			_, err := db.Exec(ctx, w.sql, w.args...)
			requireCode(t, err, w.code)
			require.Equal(t, want, b.jobRows(t), "nothing changed")
		})
	}

	// use_token presents a token for its resource only.
	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:2", b2))
		_, err := tx.Exec(ctx, `UPDATE job SET state = 'x'`)
		requireCode(t, err, "FN002") // row 1 has no token
	})
	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:1", c1))
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:2", b2))
		_, err := tx.Exec(ctx, `UPDATE job SET state = 'used'`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `DELETE FROM job WHERE id = 2`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO note VALUES (1, 'x')`)
		requireCode(t, err, "FN002") // note:1 is another resource
	})
	require.Equal(t, want, b.jobRows(t), "rolled back")

	// A registered token with a NULL token column on INSERT, and TRUNCATE
	// with the tokens of every resource that has rows.
	n1 := grant(t, b, "note:1", "N")
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := sqlfuncs.UseToken(ctx, tx, "note:1", n1); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO note VALUES (1, 'n')`)
		return err
	}))
	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:2", b2))
		_, err := tx.Exec(ctx, `TRUNCATE job`)
		requireCode(t, err, "FN002") // job:1 has a row too
	})
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for res, tok := range map[string]int64{"job:1": c1, "job:2": b2} {
			if err := sqlfuncs.UseToken(ctx, tx, res, tok); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `TRUNCATE job`)
		return err
	}))
	require.Equal(t, "", b.jobRows(t))
}

// TestMovingARowNeedsBothTokens: an UPDATE of the resource column takes a row
// from one resource to another, so it needs the latest token of both: the
// new one by the token column (or use_token), the old one by use_token
// (or by other rows of the same statement presenting it).
func TestMovingARowNeedsBothTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs(t, b)
	ctx, db := b.ctx, b.db.Pool
	t1 := grant(t, b, "job:1", "A")
	t2 := grant(t, b, "job:2", "B")
	b.exec(t, `ALTER TABLE job DROP CONSTRAINT job_pkey`)
	b.exec(t, `INSERT INTO job VALUES (1, 'a', $1), (1, 'b', $1)`, t1)
	want := fmt.Sprintf("1:a:%d,1:b:%d", t1, t1)

	_, err := db.Exec(ctx, `UPDATE job SET id = 2, tok = $1 WHERE state = 'a'`, t2)
	requireCode(t, err, "FN002") // job:1's token is missing
	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:2", t2))
		_, err := tx.Exec(ctx, `UPDATE job SET id = 2 WHERE state = 'a'`)
		requireCode(t, err, "FN002") // still job:1's
	})
	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:1", t1))
		_, err := tx.Exec(ctx, `UPDATE job SET id = 2, tok = $1 WHERE state = 'a'`, t1)
		requireCode(t, err, "FN001") // job:1's token does not present job:2
	})
	require.Equal(t, want, b.jobRows(t))

	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:1", t1))
		_, err := tx.Exec(ctx, `UPDATE job SET id = 2, tok = $1 WHERE state = 'a'`, t2)
		require.NoError(t, err)
	})
	// Both tokens in one statement: row b stays on job:1 presenting t1 by
	// the column, row a moves to job:2 presenting t2. Each row is checked
	// on its own (migration 9), so the row that leaves job:1 needs job:1's
	// token registered: another row's column does not present it.
	_, err = db.Exec(ctx, `UPDATE job SET id = CASE state WHEN 'a' THEN 2 ELSE 1 END,
		tok = CASE state WHEN 'a' THEN $2::bigint ELSE $1::bigint END`, t1, t2)
	requireCode(t, err, "FN002")
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:1", t1))
	_, err = tx.Exec(ctx, `UPDATE job SET id = CASE state WHEN 'a' THEN 2 ELSE 1 END,
		tok = CASE state WHEN 'a' THEN $2::bigint ELSE $1::bigint END`, t1, t2)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var s string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(format('%s:%s:%s', id, state, tok), ',' ORDER BY state) FROM job`).Scan(&s))
	require.Equal(t, fmt.Sprintf("2:a:%d,1:b:%d", t2, t1), s)

	// Moving away the last row of job:1 after job:1 was granted anew.
	t1b := regrant(t, b, "job:1", "C")
	require.Greater(t, t1b, t1)
	inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
		_, err := tx.Exec(ctx, `SELECT set_config('fence.tokens', $1, true)`, fmt.Sprintf(`{"job:1": %d}`, t1))
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `UPDATE job SET id = 2, tok = $1 WHERE state = 'b'`, t2)
		requireCode(t, err, "FN001") // a forged registry with the old token
	})
}

// TestPerRowLeasesExcludeEachOtherOnlyPerRow: two workers write their own rows
// concurrently; a new grant of one row's resource waits for the open
// transaction of that row's old holder (and not for the other worker), and
// once it returned, the old holder's writes are refused while the other
// worker's go on.
func TestPerRowLeasesExcludeEachOtherOnlyPerRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs(t, b)
	ctx := b.ctx
	a1 := grant(t, b, "job:1", "A")
	b2 := grant(t, b, "job:2", "B")
	b.exec(t, `INSERT INTO job VALUES (1, 'a0', $1), (2, 'b0', $2)`, a1, b2)

	aConn, bConn, cConn := b.db.Conn(t), b.db.Conn(t), b.db.Conn(t)
	_, err := cConn.Exec(ctx, `SET fence.grant_wait = '30s'`)
	require.NoError(t, err)

	// A writes row 1 in an open transaction.
	aTx, err := aConn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = aTx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = aTx.Exec(ctx, `UPDATE job SET state = 'a1', tok = $1 WHERE id = 1`, a1)
	require.NoError(t, err)

	// C takes job:1 over: the grant waits for A's transaction.
	granted := make(chan int64, 1)
	go func() {
		_, _ = sqlfuncs.Revoke(ctx, cConn, "job:1")
		tok, _, _ := sqlfuncs.Acquire(ctx, cConn, "job:1", "C", time.Hour)
		granted <- tok
	}()
	waitGrantWait(t, ctx, b.db.Pool, cConn.PgConn().PID())

	// Meanwhile B writes row 2, in transactions that commit at once.
	for i := range 3 {
		_, err := bConn.Exec(ctx, `UPDATE job SET state = $2, tok = $1 WHERE id = 2`, b2, fmt.Sprintf("b%d", i+1))
		require.NoError(t, err, "B is not held up by the grant of job:1")
	}
	select {
	case <-granted:
		t.Fatal("the grant returned while A's write was uncommitted")
	default:
	}
	require.NoError(t, aTx.Commit(ctx)) // A's write was made under the latest token: it commits
	var c1 int64
	select {
	case c1 = <-granted:
	case <-time.After(20 * time.Second):
		t.Fatal("the grant did not return after A committed")
	}
	require.Greater(t, c1, a1)

	_, err = aConn.Exec(ctx, `UPDATE job SET state = 'a2', tok = $1 WHERE id = 1`, a1)
	requireCode(t, err, "FN001")
	_, err = bConn.Exec(ctx, `UPDATE job SET state = 'b4', tok = $1 WHERE id = 2`, b2)
	require.NoError(t, err)
	_, err = cConn.Exec(ctx, `UPDATE job SET state = 'c1', tok = $1 WHERE id = 1`, c1)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("1:c1:%d,2:b4:%d", c1, b2), b.jobRows(t))
}

// TestPerRowCheckAtEveryIsolationLevel: a writer whose transaction began
// before a newer grant of its row's resource committed never commits its
// write with the older token, at any isolation level (READ COMMITTED:
// FN001 on the newest lease row; REPEATABLE READ and SERIALIZABLE: 40001
// when the row lock meets the grant's update, else FN001).
func TestPerRowCheckAtEveryIsolationLevel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs(t, b)
	ctx := b.ctx
	for i, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		res := fmt.Sprintf("job:%d", i+10)
		old := grant(t, b, res, "A")
		b.exec(t, `INSERT INTO job VALUES ($1, 'x', $2)`, i+10, old)
		conn := b.db.Conn(t)
		inTx(t, ctx, conn, iso, func(tx pgx.Tx) {
			var n int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM job`).Scan(&n)) // take the snapshot
			regrant(t, b, res, "C")
			_, err := tx.Exec(ctx, `UPDATE job SET state = 'stale', tok = $1 WHERE id = $2`, old, i+10)
			if iso == pgx.ReadCommitted {
				requireCode(t, err, "FN001")
			} else {
				requireOneOf(t, err, "40001|FN001")
			}
		})
	}
}

// TestLargeStatementsStayInTheLockBudget: one statement writes 100 000 rows
// of 100 000 resources with the default max_locks_per_transaction (64):
// the check locks lease rows, which take no lock-table entries. A stale
// token among them refuses the whole statement.
func TestLargeStatementsStayInTheLockBudget(t *testing.T) {
	pgtest.Long(t, "statements over 100 000 rows")
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	var locks string
	require.NoError(t, db.QueryRow(ctx, `SHOW max_locks_per_transaction`).Scan(&locks))
	require.Equal(t, "64", locks, "the test server runs with the default")
	const n = 100000
	b.exec(t, `CREATE TABLE big (id int PRIMARY KEY, v int NOT NULL DEFAULT 0, tok bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "big", "id", "big:", "tok"))
	// Grants in batches, each its own transaction (every grant takes its
	// resource's gate until its transaction ends).
	for lo := 1; lo <= n; lo += 500 {
		b.exec(t, `SELECT fence.acquire('big:' || g, 'bulk', '1 hour') FROM generate_series($1::int, $2::int) g`, lo, lo+499)
	}
	b.exec(t, `CREATE TABLE toks AS SELECT substr(resource, 5)::int AS id, token FROM fence.lease WHERE resource LIKE 'big:%'`)
	var granted int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM toks`).Scan(&granted))
	require.Equal(t, n, granted)

	b.exec(t, `INSERT INTO big (id, tok) SELECT id, token FROM toks`)
	b.exec(t, `UPDATE big SET v = v + 1, tok = t.token FROM toks t WHERE t.id = big.id`)
	// Without a token the statement needs use_token for 100 000 resources.
	_, err := db.Exec(ctx, `UPDATE big SET v = v + 1`)
	requireCode(t, err, "FN002")

	stale := grant(t, b, "big:extra", "x") // any token that is not big:77777's latest
	b.exec(t, `UPDATE toks SET token = $1 WHERE id = 77777`, stale)
	_, err = db.Exec(ctx, `UPDATE big SET v = v + 1, tok = t.token FROM toks t WHERE t.id = big.id`)
	requireCode(t, err, "FN003")
	var sum int64
	require.NoError(t, db.QueryRow(ctx, `SELECT sum(v) FROM big`).Scan(&sum))
	require.Equal(t, int64(n), sum, "the refused statement changed nothing")
}

// TestPerRowGrantWaitIsBoundedUnderOverlappingWriters is
// TestGrantWaitIsBoundedUnderOverlappingWriters for a per-row table whose
// resource has many rows (a tenant's ledger): writers adding rows to one
// resource in overlapping transactions hold its lease row FOR KEY SHARE
// without a break, and row locks alone would let them hold its grant off
// for as long as they keep coming (a FOR KEY SHARE lock does not queue
// behind a waiting FOR UPDATE). The gates small statements take queue them
// behind the grant.
func TestPerRowGrantWaitIsBoundedUnderOverlappingWriters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `CREATE TABLE ledger (tenant int NOT NULL, amount int, tok bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "ledger", "tenant", "tenant:", "tok"))
	tok := grant(t, b, "tenant:1", "A")
	revokeUnderOverlappingWriters(t, b, "tenant:1", tok, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES (1, 1, $1)`, tok)
		return err
	})
}

// TestProtectRowsRefusesWhatItCannotGuard: columns and tables protect_rows
// refuses, and the partition or inheritance tree PostgreSQL refuses to put
// a per-row table into afterwards (its statement triggers would not fire
// for writes through the parent).
func TestProtectRowsRefusesWhatItCannotGuard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.exec(t, `CREATE TABLE t (id int PRIMARY KEY, n int, f float8 NOT NULL DEFAULT 0, g int GENERATED ALWAYS AS (id * 2) STORED NOT NULL, tok bigint, itok int)`)
	for _, c := range []struct {
		name, col, prefix, tok, code string
	}{
		{"missing column", "nope", "", "", "42703"},
		{"nullable resource column", "n", "", "", "42P16"},
		{"float resource column", "f", "", "", "42804"},
		{"generated resource column", "g", "", "", "42809"},
		{"token column is the resource column", "id", "", "id", "42P16"},
		{"token column not bigint", "id", "", "itok", "42804"},
		{"prefix too long", "id", fmt.Sprintf("%0201d", 0), "", "22001"},
	} {
		t.Run(c.name, func(t *testing.T) {
			requireCode(t, sqlfuncs.ProtectRows(ctx, db, "t", c.col, c.prefix, c.tok), c.code)
		})
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "t", "id", "t:", "tok"))
	// g generated in the parent too: PostgreSQL 16 and later refuse a
	// generated column of a partition whose parent's column is not.
	b.exec(t, `CREATE TABLE parent (id int PRIMARY KEY, n int, f float8 NOT NULL DEFAULT 0, g int GENERATED ALWAYS AS (id * 2) STORED NOT NULL, tok bigint, itok int) PARTITION BY RANGE (id)`)
	// Since migration 9 a per-row table may become a partition or an
	// inheritance child: its row triggers fire for its rows whichever table
	// a statement names (008's statement triggers did not, and 008 refused
	// both with 0A000).
	b.exec(t, `ALTER TABLE parent ATTACH PARTITION t FOR VALUES FROM (0) TO (100)`)
	_, err := db.Exec(ctx, `INSERT INTO parent (id) VALUES (1)`)
	requireCode(t, err, "FN002") // routed to t, whose guard asks for t:1's token
	b.exec(t, `ALTER TABLE parent DETACH PARTITION t`)
	b.exec(t, `CREATE TABLE base (id int)`)
	b.exec(t, `ALTER TABLE t INHERIT base`)
	_, err = db.Exec(ctx, `INSERT INTO t (id) VALUES (1)`)
	requireCode(t, err, "FN002")
	b.exec(t, `ALTER TABLE t NO INHERIT base`)

	var form, col, resource string
	require.NoError(t, db.QueryRow(ctx, `SELECT form, resource_column, resource FROM fence.protected WHERE tbl = 't'::regclass`).Scan(&form, &col, &resource))
	require.Equal(t, []string{"rows", "id", "t:"}, []string{form, col, resource})
	require.NoError(t, sqlfuncs.Unprotect(ctx, db, "t"))
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM fence.protected WHERE tbl = 't'::regclass`).Scan(&n))
	require.Zero(t, n)
	b.exec(t, `ALTER TABLE t INHERIT base`)
}

// TestPerRowTableWithoutUsageCannotBeWritten: a role without the kit's usage
// cannot write a per-row table at all, whatever it sets.
func TestPerRowTableWithoutUsageCannotBeWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs(t, b)
	t1 := grant(t, b, "job:1", "A")
	b.exec(t, `INSERT INTO job VALUES (1, 'a', $1)`, t1)
	other := pgtest.NewRole(t, "nousage")
	b.exec(t, `GRANT ALL ON job, note TO `+pgx.Identifier{other}.Sanitize())
	conn, err := pgx.Connect(b.ctx, b.db.URLAs(other))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(b.ctx)) })
	for _, w := range []string{
		fmt.Sprintf(`INSERT INTO job VALUES (2, 'x', %d)`, t1),
		fmt.Sprintf(`UPDATE job SET state = 'x', tok = %d WHERE id = 1`, t1),
		`DELETE FROM job`,
		`TRUNCATE job`,
		`INSERT INTO note VALUES (1, 'x')`,
	} {
		inTx(t, b.ctx, conn, pgx.ReadCommitted, func(tx pgx.Tx) {
			_, err := tx.Exec(b.ctx, `SELECT set_config('fence.tokens', $1, true)`, fmt.Sprintf(`{"job:1": %d, "note:1": %d}`, t1, t1))
			require.NoError(t, err)
			_, err = tx.Exec(b.ctx, w)
			requireOneOf(t, err, "42501|FN002")
		})
	}
	require.Equal(t, fmt.Sprintf("1:a:%d", t1), b.jobRows(t))
}
