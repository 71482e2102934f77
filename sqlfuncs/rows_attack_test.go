package sqlfuncs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The tests in this file are a red-team review of the per-row guard of
// migration 004 (fence.protect_rows). The story: A held resource job:1
// (token t1) and lost it; B was granted t2 and wrote the rows of job:1.
// A, which still holds job:2 (token ta2) legitimately, tries to change B's
// rows, insert rows for job:1, delete them, or move rows into or out of
// job:1, with t1 or with no token, as a role with the kit's usage and table
// privileges but not the table's owner. A role without the kit's usage
// ("N") tries the same. Every attempt must be refused, and B's rows must be
// unchanged.
//
// Tests whose comment starts with "Was a bypass" got a stale or token-less
// write through the first draft of migration 004 (the review that wrote
// this file found them before it landed); 004 now refuses them, and the
// tests still say "BYPASS" when a write gets through.

// rowsFix is the per-row story: tables items (token column tok) and pitems
// (fence.use_token only), both protect_rows(job, prefix 'job:'), rows
// 1 and 4 of job:1 (B's, t2), row 2 of job:2 (A's, ta2), row 3 of job:3
// (B's, t3). Roles: a (usage, table privileges, a schema of its own named
// like the role), n (table privileges only).
type rowsFix struct {
	b                *bundle
	t1, t2, ta2, t3  int64
	a, n             string
	aPool, nPool     *pgxpool.Pool
	tokens           *strings.Replacer
	aSchema, nSchema string
}

func rowsStory(t *testing.T) *rowsFix {
	t.Helper()
	b := setup(t)
	f := &rowsFix{b: b}
	b.exec(t, `CREATE TABLE items (id int PRIMARY KEY, job int NOT NULL, val text, tok bigint)`)
	b.exec(t, `CREATE TABLE pitems (id int PRIMARY KEY, job int NOT NULL, val text)`)
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "items", "job", "job:", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "pitems", "job", "job:", ""))
	f.t1 = acquireWhenFree(t, b.ctx, b.db.Pool, "job:1", "A", time.Hour)
	_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, "job:1") // A's lease ends
	require.NoError(t, err)
	f.t2 = acquireWhenFree(t, b.ctx, b.db.Pool, "job:1", "B", time.Hour)
	f.ta2 = acquireWhenFree(t, b.ctx, b.db.Pool, "job:2", "A", time.Hour)
	f.t3 = acquireWhenFree(t, b.ctx, b.db.Pool, "job:3", "B", time.Hour)
	require.Less(t, f.t1, f.t2)
	require.Less(t, f.t2, f.ta2)
	require.Less(t, f.ta2, f.t3)
	b.exec(t, `INSERT INTO items VALUES (1, 1, 'B', $1), (2, 2, 'A', $2), (3, 3, 'B', $3), (4, 1, 'B', $1)`, f.t2, f.ta2, f.t3)
	require.NoError(t, pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		for res, tok := range map[string]int64{"job:1": f.t2, "job:2": f.ta2, "job:3": f.t3} {
			if err := sqlfuncs.UseToken(b.ctx, tx, res, tok); err != nil {
				return err
			}
		}
		_, err := tx.Exec(b.ctx, `INSERT INTO pitems VALUES (1, 1, 'B'), (2, 2, 'A'), (3, 3, 'B'), (4, 1, 'B')`)
		return err
	}))
	f.tokens = strings.NewReplacer("{t1}", fmt.Sprint(f.t1), "{t2}", fmt.Sprint(f.t2), "{ta2}", fmt.Sprint(f.ta2), "{t3}", fmt.Sprint(f.t3))

	f.a, f.n = pgtest.NewRole(t, "rowsa"), pgtest.NewRole(t, "rowsn")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, f.a, false))
	for _, r := range []string{f.a, f.n} {
		id := pgx.Identifier{r}.Sanitize()
		b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON items, pitems TO `+id)
		// A schema of its own, first on its default search_path ("$user"):
		// the objects an application role could make anywhere it has CREATE.
		b.exec(t, `CREATE SCHEMA `+id+` AUTHORIZATION `+id)
	}
	f.aSchema, f.nSchema = pgx.Identifier{f.a}.Sanitize(), pgx.Identifier{f.n}.Sanitize()
	f.aPool, f.nPool = rolePool(t, b, f.a), rolePool(t, b, f.n)
	return f
}

// rolePool is a pool of connections as role.
func rolePool(t *testing.T, b *bundle, role string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(b.ctx, b.db.URLAs(role))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// roleConn is one session as role.
func roleConn(t *testing.T, b *bundle, role string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(b.ctx, b.db.URLAs(role))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.WithoutCancel(b.ctx)) })
	return c
}

// sql fills in the story's tokens ({t1}, {t2}, {ta2}, {t3}).
func (f *rowsFix) sql(s string) string { return f.tokens.Replace(s) }

// guarded is every row of both tables that B wrote or that belongs to
// job:1 or job:3 now: what no attempt may change (A's own row 2 and rows A
// adds to its own job:2 are left out, so that A's legitimate writes in the
// same transaction do not count).
func (f *rowsFix) guarded(t *testing.T) string {
	t.Helper()
	var s string
	require.NoError(t, f.b.db.Pool.QueryRow(f.b.ctx, `SELECT
		(SELECT coalesce(string_agg(format('%s:%s:%s:%s', id, job, val, tok), ',' ORDER BY id), '') FROM items WHERE job <> 2 OR id <> 2)
		|| ' | ' ||
		(SELECT coalesce(string_agg(format('%s:%s:%s', id, job, val), ',' ORDER BY id), '') FROM pitems WHERE job <> 2 OR id <> 2)`).Scan(&s))
	return s
}

// attempt runs pre and then sql in one transaction of db at isolation level
// iso and commits when every statement succeeded; it returns the first
// error. A refused attempt therefore leaves nothing behind, and an attempt
// that gets through really commits.
func attempt(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}, iso pgx.TxIsoLevel, pre []string, sql string) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range append(append([]string{}, pre...), sql) {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// outsideReadCommitted adds 0A000 to codes for a TRUNCATE outside READ
// COMMITTED: the per-row TRUNCATE guard refuses those before anything else
// (its snapshot could miss rows; TestRowsTruncateUnderSnapshotIsolation).
func outsideReadCommitted(sql string, iso pgx.TxIsoLevel, codes string) string {
	if strings.Contains(sql, "TRUNCATE") && iso != pgx.ReadCommitted {
		return codes + "|0A000"
	}
	return codes
}

// requireOneOf asserts that err carries one of the SQLSTATEs in codes
// ("FN001|FN002").
func requireOneOf(t *testing.T, err error, codes string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.Error(t, err, "want SQLSTATE %s, the write went through", codes)
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got non-PostgreSQL error %v", codes, err)
	require.Contains(t, strings.Split(codes, "|"), pgErr.Code, "message: %s", pgErr.Message)
}

// attemptRolledBack runs pre and then sql in a transaction of db that it
// always rolls back, and returns what read returns inside the transaction
// right after sql (when sql got through) and sql's error. The tests of
// bypasses use it: a write that gets through shows in read and is then
// undone, so that every attempt starts from the same rows.
func attemptRolledBack(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}, iso pgx.TxIsoLevel, pre []string, sql, read string) (string, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range pre {
		if _, err := tx.Exec(ctx, s); err != nil {
			return "", fmt.Errorf("%s: %w", s, err)
		}
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return "", err
	}
	var seen string
	if err := tx.QueryRow(ctx, read).Scan(&seen); err != nil {
		return "", fmt.Errorf("%s: %w", read, err)
	}
	return seen, nil
}

// requireRefusedRolledBack runs at as a subtest: under READ COMMITTED, in a
// transaction of db that is rolled back, it must fail with one of at.code;
// when it gets through, the subtest says BYPASS and what read saw of rows
// (what the attempt aimed at).
func requireRefusedRolledBack(t *testing.T, ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}, at rowsAttempt, read, rows string) {
	t.Helper()
	t.Run(at.name, func(t *testing.T) {
		seen, err := attemptRolledBack(ctx, db, pgx.ReadCommitted, at.pre, at.sql, read)
		if err == nil {
			t.Errorf("BYPASS: went through; %s became: %s", rows, seen)
			return
		}
		requireOneOf(t, err, at.code)
	})
}

var isoLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// rowsAttempt is one write A tries: pre runs first in the same transaction
// (and must succeed), code lists the acceptable refusals, min is the first
// server version that has the syntax (0: every supported version).
type rowsAttempt struct {
	name string
	pre  []string
	sql  string
	code string
	min  int
}

// TestRowsStaleWritesAreRefused: every SQL idiom A can use to write B's rows
// of job:1, with t1 or no token, at every isolation level.
func TestRowsStaleWritesAreRefused(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	ver := serverVersion(t, ctx, f.b.db.Pool)
	before := f.guarded(t)
	useA2 := []string{f.sql(`SELECT fence.use_token('job:2', {ta2})`)}

	// Objects of A's own (views, rules, triggers on its own tables) that
	// write items or pitems on its behalf.
	for _, s := range []string{
		`CREATE VIEW av AS SELECT * FROM public.items`,
		`CREATE VIEW pav AS SELECT * FROM public.pitems`,
		`CREATE VIEW av_io AS SELECT id, job, val FROM public.items`,
		`CREATE FUNCTION av_io() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN UPDATE public.items SET val = NEW.val, job = NEW.job WHERE id = OLD.id; RETURN NEW; END $$`,
		`CREATE TRIGGER av_io INSTEAD OF UPDATE ON av_io FOR EACH ROW EXECUTE FUNCTION av_io()`,
		`CREATE TABLE feeder (id int)`,
		`CREATE RULE feed AS ON INSERT TO feeder DO INSTEAD DELETE FROM public.items WHERE id = NEW.id`,
		`CREATE TABLE feeder2 (id int)`,
		`CREATE RULE feed2 AS ON INSERT TO feeder2 DO ALSO UPDATE public.items SET val = 'stale' WHERE id = NEW.id`,
		`CREATE TABLE feeder3 (id int)`,
		`CREATE FUNCTION feed3() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN UPDATE public.pitems SET val = 'stale' WHERE id = NEW.id; RETURN NEW; END $$`,
		`CREATE TRIGGER feed3 AFTER INSERT ON feeder3 FOR EACH ROW EXECUTE FUNCTION feed3()`,
		`CREATE FUNCTION sneak(i int) RETURNS void LANGUAGE plpgsql SECURITY DEFINER AS $$
			BEGIN UPDATE public.items SET val = 'stale' WHERE id = i; END $$`,
	} {
		_, err := f.aPool.Exec(ctx, s)
		require.NoError(t, err, s)
	}

	attempts := []rowsAttempt{
		// UPDATE
		{name: "UPDATE of another column", sql: `UPDATE items SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "UPDATE of every row", sql: `UPDATE items SET val = 'stale'`, code: "FN002"},
		{name: "UPDATE with t1", sql: `UPDATE items SET val = 'stale', tok = {t1} WHERE id = 1`, code: "FN001"},
		{name: "UPDATE assigning NULL", sql: `UPDATE items SET val = 'stale', tok = NULL WHERE id = 1`, code: "FN002"},
		{name: "UPDATE assigning minus the latest token", sql: `UPDATE items SET val = 'stale', tok = -{t2} WHERE id = 1`, code: "FN003"},
		{name: "UPDATE assigning 0", sql: `UPDATE items SET val = 'stale', tok = 0 WHERE id = 1`, code: "FN003"},
		{name: "UPDATE assigning max int64", sql: `UPDATE items SET val = 'stale', tok = 9223372036854775807 WHERE id = 1`, code: "FN003"},
		{name: "UPDATE with A's token of job:2", sql: `UPDATE items SET val = 'stale', tok = {ta2} WHERE id = 1`, code: "FN003"},
		{name: "UPDATE with A's token of job:2 registered", pre: useA2, sql: `UPDATE items SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "UPDATE (multi-assign) with t1", sql: `UPDATE items SET (val, tok) = (SELECT 'stale', {t1}) WHERE id = 1`, code: "FN001"},
		{name: "UPDATE ... FROM unnest, one stale row", sql: `UPDATE items t SET val = 'x', tok = u.tok FROM unnest('{2,1}'::int[], '{{ta2},{t1}}'::bigint[]) u(id, tok) WHERE t.id = u.id`, code: "FN001"},
		{name: "UPDATE of rows of many resources, one stale", sql: `UPDATE items SET val = 'x', tok = CASE job WHEN 2 THEN {ta2} ELSE {t1} END WHERE id IN (1, 2)`, code: "FN001"},
		{name: "UPDATE of two rows of job:1 with different tokens", sql: `UPDATE items SET val = 'x', tok = CASE id WHEN 1 THEN {t2} ELSE {t1} END WHERE id IN (1, 4)`, code: "FN001"},
		{name: "UPDATE WHERE CURRENT OF", pre: []string{`DECLARE c CURSOR FOR SELECT * FROM items WHERE id = 1 FOR UPDATE`, `FETCH c`}, sql: `UPDATE items SET val = 'stale' WHERE CURRENT OF c`, code: "FN002"},
		{name: "UPDATE of job:1 and job:2 with only job:2 registered", pre: useA2, sql: `UPDATE items SET val = 'x' WHERE id IN (1, 2)`, code: "FN002"},
		{name: "use_token table: UPDATE", sql: `UPDATE pitems SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "use_token table: UPDATE of job:1 and job:2 with job:2 registered", pre: useA2, sql: `UPDATE pitems SET val = 'x' WHERE id IN (1, 2)`, code: "FN002"},
		{name: "use_token table: UPDATE with t1 registered by hand", pre: []string{`SELECT set_config('fence.tokens', '{"job:1": {t1}, "job:2": {ta2}}', true)`}, sql: `UPDATE pitems SET val = 'x' WHERE id IN (1, 2)`, code: "FN001"},

		// moving rows between resources
		{name: "move B's row into job:2 with ta2", sql: `UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`, code: "FN002"},
		{name: "move B's row into job:2 with job:2 registered", pre: useA2, sql: `UPDATE items SET job = 2 WHERE id = 1`, code: "FN002"},
		{name: "move B's row into job:2, t1 registered by hand for job:1", pre: []string{`SELECT set_config('fence.tokens', '{"job:1": {t1}}', true)`}, sql: `UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`, code: "FN001"},
		{name: "move B's row into job:2, job:1 'presented' by another row with t1", sql: `UPDATE items SET job = CASE id WHEN 1 THEN 2 ELSE job END, tok = CASE id WHEN 1 THEN {ta2} ELSE {t1} END WHERE id IN (1, 4)`, code: "FN001|FN002"}, // per row since 009: row 1 may come first
		{name: "move A's row into job:1 with t1", sql: `UPDATE items SET job = 1, tok = {t1} WHERE id = 2`, code: "FN001"},
		{name: "move A's row into job:1 with ta2", sql: `UPDATE items SET job = 1, tok = {ta2} WHERE id = 2`, code: "FN003"},
		{name: "move A's row into job:1, no token", pre: useA2, sql: `UPDATE items SET job = 1 WHERE id = 2`, code: "FN002"},
		{name: "swap the resources of A's and B's rows", sql: `UPDATE items SET job = 3 - job, tok = CASE id WHEN 1 THEN {ta2} ELSE {t1} END WHERE id IN (1, 2)`, code: "FN001|FN002"},
		{name: "move B's row to a never-granted resource", pre: useA2, sql: `UPDATE items SET job = 99 WHERE id = 1`, code: "FN002"},
		{name: "use_token table: move B's row into job:2", pre: useA2, sql: `UPDATE pitems SET job = 2 WHERE id = 1`, code: "FN002"},
		{name: "use_token table: move A's row into job:1", pre: useA2, sql: `UPDATE pitems SET job = 1 WHERE id = 2`, code: "FN002"},

		// INSERT
		{name: "INSERT for job:1 with t1", sql: `INSERT INTO items VALUES (9, 1, 'stale', {t1})`, code: "FN001"},
		{name: "INSERT for job:1 without token", sql: `INSERT INTO items (id, job, val) VALUES (9, 1, 'stale')`, code: "FN002"},
		{name: "INSERT for job:1 with ta2", sql: `INSERT INTO items VALUES (9, 1, 'stale', {ta2})`, code: "FN003"},
		{name: "INSERT for job:1 with job:2 registered", pre: useA2, sql: `INSERT INTO items (id, job, val) VALUES (9, 1, 'stale')`, code: "FN002"},
		{name: "INSERT for a never-granted resource", sql: `INSERT INTO items VALUES (9, 99, 'stale', {ta2})`, code: "FN003"},
		{name: "INSERT of two rows of job:1 with different tokens", sql: `INSERT INTO items VALUES (9, 1, 'x', {t2}), (10, 1, 'x', {t1})`, code: "FN001"},
		{name: "INSERT of rows of many resources, one stale", sql: `INSERT INTO items VALUES (9, 2, 'x', {ta2}), (10, 1, 'x', {t1}), (11, 2, 'x', {ta2})`, code: "FN001"},
		{name: "INSERT ... SELECT copying B's row with t1", sql: `INSERT INTO items SELECT id + 100, job, 'stale', {t1} FROM items WHERE id = 1`, code: "FN001"},
		{name: "INSERT with a NULL resource", sql: `INSERT INTO items VALUES (9, NULL, 'x', {ta2})`, code: "23502"},
		{name: "INSERT with a NULL resource, no token", pre: useA2, sql: `INSERT INTO items (id, job, val) VALUES (9, NULL, 'x')`, code: "FN002|23502"},
		{name: "UPDATE to a NULL resource", pre: useA2, sql: `UPDATE items SET job = NULL WHERE id = 2`, code: "FN002|23502"},
		{name: "UPDATE to a NULL resource with a token", sql: `UPDATE items SET job = NULL, tok = {ta2} WHERE id = 2`, code: "23502"},
		{name: "use_token table: INSERT", sql: `INSERT INTO pitems VALUES (9, 1, 'stale')`, code: "FN002"},
		{name: "use_token table: INSERT with job:2 registered", pre: useA2, sql: `INSERT INTO pitems VALUES (9, 2, 'x'), (10, 1, 'stale')`, code: "FN002"},

		// upserts
		{name: "upsert DO UPDATE without the token column", sql: `INSERT INTO items VALUES (1, 1, 'stale', {t1}) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, code: "FN001|FN002"}, // 009 checks the proposed row too
		{name: "upsert DO UPDATE with t1", sql: `INSERT INTO items VALUES (1, 1, 'stale', {t1}) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val, tok = EXCLUDED.tok`, code: "FN001"},
		{name: "upsert omitting the token column", sql: `INSERT INTO items (id, job, val) VALUES (1, 1, 'stale') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, code: "FN002"},
		{name: "upsert with job:2 registered", pre: useA2, sql: `INSERT INTO items (id, job, val) VALUES (1, 2, 'stale') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, code: "FN002"},
		{name: "upsert moving B's row into job:2", sql: `INSERT INTO items VALUES (1, 2, 'stale', {ta2}) ON CONFLICT (id) DO UPDATE SET job = EXCLUDED.job, tok = EXCLUDED.tok`, code: "FN002"},
		{name: "upsert inserting job:2 and updating B's row", sql: `INSERT INTO items VALUES (9, 2, 'x', {ta2}), (1, 2, 'stale', {ta2}) ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val, tok = EXCLUDED.tok`, code: "FN003"},
		{name: "use_token table: upsert", pre: useA2, sql: `INSERT INTO pitems VALUES (1, 2, 'stale') ON CONFLICT (id) DO UPDATE SET val = EXCLUDED.val`, code: "FN002"},
		{name: "use_token table: upsert moving B's row", pre: useA2, sql: `INSERT INTO pitems VALUES (1, 2, 'stale') ON CONFLICT (id) DO UPDATE SET job = EXCLUDED.job`, code: "FN002"},

		// DELETE
		{name: "DELETE", sql: `DELETE FROM items WHERE id = 1`, code: "FN002"},
		{name: "DELETE with job:2 registered", pre: useA2, sql: `DELETE FROM items WHERE id IN (1, 2)`, code: "FN002"},
		{name: "DELETE with t1 registered by hand", pre: []string{`SELECT set_config('fence.tokens', '{"job:1": {t1}}', true)`}, sql: `DELETE FROM items WHERE id = 1`, code: "FN001"},
		{name: "DELETE ... USING", pre: useA2, sql: `DELETE FROM items t USING (VALUES (1), (2)) v(id) WHERE t.id = v.id`, code: "FN002"},
		{name: "DELETE ... RETURNING", sql: `DELETE FROM items WHERE id = 1 RETURNING *`, code: "FN002"},
		{name: "use_token table: DELETE", pre: useA2, sql: `DELETE FROM pitems`, code: "FN002"},

		// TRUNCATE (READ COMMITTED is what the guard is built for; see
		// TestRowsTruncateUnderSnapshotIsolation for the others)
		{name: "TRUNCATE", sql: `TRUNCATE items`, code: "FN002"},
		{name: "TRUNCATE with job:2 registered", pre: useA2, sql: `TRUNCATE items`, code: "FN002"},
		{name: "TRUNCATE with t1 registered by hand", pre: []string{`SELECT set_config('fence.tokens', '{"job:1": {t1}, "job:2": {ta2}, "job:3": {t3}}', true)`}, sql: `TRUNCATE items`, code: "FN001"},
		{name: "TRUNCATE ONLY, RESTART IDENTITY", pre: useA2, sql: `TRUNCATE ONLY pitems RESTART IDENTITY`, code: "FN002"},
		{name: "TRUNCATE of both tables", pre: useA2, sql: `TRUNCATE items, pitems`, code: "FN002"},

		// writable CTEs
		{name: "wCTE: update own row, insert a stale one", sql: `WITH a AS (UPDATE items SET val = 'x', tok = {ta2} WHERE id = 2 RETURNING 1) INSERT INTO items VALUES (9, 1, 'stale', {t1})`, code: "FN001"},
		{name: "wCTE: two UPDATEs, own with a token, B's without", sql: `WITH a AS (UPDATE items SET val = 'x', tok = {ta2} WHERE id = 2 RETURNING 1) UPDATE items SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "wCTE: two UPDATEs, own with a token, B's moved", sql: `WITH a AS (UPDATE items SET val = 'x', tok = {ta2} WHERE id = 2 RETURNING 1) UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`, code: "FN002"},
		{name: "wCTE: two UPDATEs, B's moved out, job:1 'presented' with t1", sql: `WITH a AS (UPDATE items SET val = 'x', tok = {t1} WHERE id = 4 RETURNING 1) UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`, code: "FN001|FN002"},
		{name: "wCTE: update own row, delete B's", pre: useA2, sql: `WITH a AS (UPDATE items SET val = 'x' WHERE id = 2 RETURNING 1) DELETE FROM items WHERE id = 1`, code: "FN002"},
		{name: "wCTE: delete B's row and insert it again with t1", sql: `WITH d AS (DELETE FROM items WHERE id = 1 RETURNING *) INSERT INTO items SELECT id, job, 'stale', {t1} FROM d`, code: "FN001|FN002"},
		{name: "wCTE: delete B's row and insert it again into job:2", sql: `WITH d AS (DELETE FROM items WHERE id = 1 RETURNING *) INSERT INTO items SELECT id, 2, 'stale', {ta2} FROM d`, code: "FN002"},
		{name: "wCTE: update own row, upsert B's", sql: `WITH a AS (UPDATE items SET val = 'x', tok = {ta2} WHERE id = 2 RETURNING 1) INSERT INTO items VALUES (1, 1, 'stale', {ta2}) ON CONFLICT (id) DO UPDATE SET val = 'stale'`, code: "FN002|FN003"}, // 009 checks the proposed row too
		{name: "wCTE: use_token table, insert own and move B's", pre: useA2, sql: `WITH a AS (INSERT INTO pitems VALUES (9, 2, 'x') RETURNING 1) UPDATE pitems SET job = 2 WHERE id = 1`, code: "FN002"},
		{name: "wCTE: set fence.tokens in the same statement", sql: `WITH s AS (SELECT set_config('fence.tokens', '{"job:1": {t1}}', true)) UPDATE items SET val = 'stale' FROM s WHERE id = 1`, code: "FN001|FN002"},

		// MERGE (PostgreSQL 15+)
		{name: "MERGE UPDATE without the token column", min: 150000, sql: `MERGE INTO items c USING (VALUES (1)) s(id) ON c.id = s.id WHEN MATCHED THEN UPDATE SET val = 'stale'`, code: "FN002"},
		{name: "MERGE UPDATE with t1", min: 150000, sql: `MERGE INTO items c USING (VALUES (1)) s(id) ON c.id = s.id WHEN MATCHED THEN UPDATE SET val = 'stale', tok = {t1}`, code: "FN001"},
		{name: "MERGE: update own, insert stale", min: 150000, sql: `MERGE INTO items c USING (VALUES (2, 2), (9, 1)) s(id, job) ON c.id = s.id
			WHEN MATCHED THEN UPDATE SET val = 'x', tok = {ta2} WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.job, 'stale', {t1})`, code: "FN001"},
		{name: "MERGE: update own, insert without token", min: 150000, sql: `MERGE INTO items c USING (VALUES (2, 2), (9, 1)) s(id, job) ON c.id = s.id
			WHEN MATCHED THEN UPDATE SET val = 'x', tok = {ta2} WHEN NOT MATCHED THEN INSERT (id, job, val) VALUES (s.id, s.job, 'stale')`, code: "FN002"},
		{name: "MERGE: update own, delete B's", min: 150000, pre: useA2, sql: `MERGE INTO items c USING (VALUES (2), (1)) s(id) ON c.id = s.id
			WHEN MATCHED AND c.id = 2 THEN UPDATE SET val = 'x' WHEN MATCHED THEN DELETE`, code: "FN002"},
		{name: "MERGE: update own, move B's into job:2", min: 150000, sql: `MERGE INTO items c USING (VALUES (2), (1)) s(id) ON c.id = s.id
			WHEN MATCHED AND c.id = 2 THEN UPDATE SET val = 'x', tok = {ta2} WHEN MATCHED THEN UPDATE SET job = 2, tok = {ta2}`, code: "FN002"},
		{name: "MERGE: DO NOTHING, then DELETE", min: 150000, sql: `MERGE INTO items c USING (VALUES (1)) s(id) ON c.id = s.id
			WHEN MATCHED AND false THEN DO NOTHING WHEN MATCHED THEN DELETE`, code: "FN002"},
		{name: "MERGE: insert own, update B's, delete, all actions", min: 150000, pre: useA2, sql: `MERGE INTO items c USING (VALUES (1), (4), (9)) s(id) ON c.id = s.id
			WHEN MATCHED AND c.id = 1 THEN UPDATE SET val = 'stale' WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (id, job, val) VALUES (s.id, 2, 'x')`, code: "FN002"},
		{name: "MERGE: use_token table", min: 150000, pre: useA2, sql: `MERGE INTO pitems c USING (VALUES (1), (2), (9)) s(id) ON c.id = s.id
			WHEN MATCHED AND c.id = 2 THEN UPDATE SET val = 'x' WHEN MATCHED THEN UPDATE SET job = 2 WHEN NOT MATCHED THEN INSERT VALUES (s.id, 2, 'x')`, code: "FN002"},
		{name: "MERGE: NOT MATCHED BY SOURCE deletes B's rows", min: 170000, pre: useA2, sql: `MERGE INTO items c USING (VALUES (2)) s(id) ON c.id = s.id
			WHEN MATCHED THEN UPDATE SET val = 'x' WHEN NOT MATCHED BY SOURCE THEN DELETE`, code: "FN002"},
		{name: "MERGE into A's view", min: 170000, sql: `MERGE INTO av c USING (VALUES (1)) s(id) ON c.id = s.id WHEN MATCHED THEN UPDATE SET val = 'stale'`, code: "FN002"},

		// views, rules, triggers and functions of A's own
		{name: "through A's auto-updatable view", sql: `UPDATE av SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "through A's view, with t1", sql: `UPDATE av SET val = 'stale', tok = {t1} WHERE id = 1`, code: "FN001"},
		{name: "through A's view, INSERT", sql: `INSERT INTO av VALUES (9, 1, 'stale', {t1})`, code: "FN001"},
		{name: "through A's view of the use_token table", pre: useA2, sql: `DELETE FROM pav WHERE id IN (1, 2)`, code: "FN002"},
		{name: "through A's INSTEAD OF trigger", sql: `UPDATE av_io SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "through A's DO INSTEAD rule", pre: useA2, sql: `INSERT INTO feeder VALUES (1)`, code: "FN002"},
		{name: "through A's DO ALSO rule", sql: `INSERT INTO feeder2 VALUES (1)`, code: "FN002"},
		{name: "through A's trigger on its own table", pre: useA2, sql: `INSERT INTO feeder3 VALUES (1)`, code: "FN002"},
		{name: "through A's SECURITY DEFINER function", sql: `SELECT sneak(1)`, code: "FN002"},
		{name: "in a DO block that swallows errors, then again", sql: `DO $$ BEGIN
			BEGIN UPDATE public.items SET val = 'stale' WHERE id = 1; EXCEPTION WHEN OTHERS THEN NULL; END;
			UPDATE public.items SET val = 'stale', tok = {t1} WHERE id = 1; END $$`, code: "FN001"},
	}
	for _, at := range attempts {
		t.Run(at.name, func(t *testing.T) {
			if at.min > 0 && ver < at.min {
				t.Logf("PostgreSQL %d lacks the syntax; nothing to guard", ver)
				return
			}
			pre := make([]string, len(at.pre))
			for i, p := range at.pre {
				pre[i] = f.sql(p)
			}
			for _, iso := range isoLevels {
				err := attempt(ctx, f.aPool, iso, pre, f.sql(at.sql))
				requireOneOf(t, err, outsideReadCommitted(at.sql, iso, at.code))
			}
			require.Equal(t, before, f.guarded(t), "B's rows are unchanged")
		})
	}

	t.Run("COPY", func(t *testing.T) {
		for _, tc := range []struct {
			table string
			cols  []string
			row   []any
			code  string
		}{
			{"items", []string{"id", "job", "val"}, []any{9, 1, "stale"}, "FN002"},
			{"items", []string{"id", "job", "val", "tok"}, []any{9, 1, "stale", f.t1}, "FN001"},
			{"items", []string{"id", "job", "val", "tok"}, []any{9, 1, "stale", f.ta2}, "FN003"},
			{"pitems", []string{"id", "job", "val"}, []any{9, 1, "stale"}, "FN002"},
		} {
			for _, iso := range isoLevels {
				inTx(t, ctx, f.aPool, iso, func(tx pgx.Tx) {
					_, err := tx.CopyFrom(ctx, pgx.Identifier{tc.table}, tc.cols, pgx.CopyFromRows([][]any{tc.row}))
					requireCode(t, err, tc.code)
				})
				// rows of job:2 (A's) and job:1 in one COPY
				inTx(t, ctx, f.aPool, iso, func(tx pgx.Tx) {
					_, err := tx.Exec(ctx, f.sql(`SELECT fence.use_token('job:2', {ta2})`))
					require.NoError(t, err)
					_, err = tx.CopyFrom(ctx, pgx.Identifier{tc.table}, []string{"id", "job", "val"}, pgx.CopyFromRows([][]any{{10, 2, "x"}, {11, 1, "stale"}}))
					requireCode(t, err, "FN002")
				})
			}
		}
		require.Equal(t, before, f.guarded(t))
	})

	t.Run("savepoints and ROLLBACK TO", func(t *testing.T) {
		for _, iso := range isoLevels {
			tx, err := f.aPool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a failed step must not keep the connection
			step := func(sql, code string) {
				t.Helper()
				_, err := tx.Exec(ctx, `SAVEPOINT s`)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, f.sql(sql))
				if code == "" {
					require.NoError(t, err, sql)
					_, err = tx.Exec(ctx, `RELEASE SAVEPOINT s`)
				} else {
					requireOneOf(t, err, code)
					_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT s`)
				}
				require.NoError(t, err)
			}
			step(`UPDATE items SET val = 'x', tok = {ta2} WHERE id = 2`, "") // A's own write
			step(`UPDATE items SET val = 'stale' WHERE id = 1`, "FN002")
			step(`SELECT fence.use_token('job:1', {t1})`, "FN001")
			step(`UPDATE items SET val = 'stale' WHERE id = 1`, "FN002")
			step(`SELECT set_config('fence.tokens', '{"job:1": {t1}}', true)`, "")
			step(`UPDATE items SET val = 'stale' WHERE id = 1`, "FN001")
			step(`DELETE FROM pitems WHERE id = 1`, "FN001")
			step(`UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`, "FN001")
			step(`TRUNCATE pitems`, outsideReadCommitted("TRUNCATE", iso, "FN001|FN002"))
			require.NoError(t, tx.Commit(ctx))
		}
		require.Equal(t, before, f.guarded(t))
	})

	t.Run("statements over many resources, one stale", func(t *testing.T) {
		ids, toks := make([]int32, 0, 101), make([]int64, 0, 101)
		for i := range 100 {
			res := fmt.Sprintf("job:%d", 1000+i)
			tok := acquireWhenFree(t, ctx, f.aPool, res, "A", time.Hour)
			ids, toks = append(ids, int32(1000+i)), append(toks, tok)
		}
		ids, toks = append(ids, 1), append(toks, f.t1)
		for _, iso := range isoLevels {
			inTx(t, ctx, f.aPool, iso, func(tx pgx.Tx) {
				_, err := tx.Exec(ctx, `INSERT INTO items SELECT 100000 + u.job, u.job, 'bulk', u.tok FROM unnest($1::int[], $2::bigint[]) u(job, tok)`, ids, toks)
				requireCode(t, err, "FN001")
			})
			inTx(t, ctx, f.aPool, iso, func(tx pgx.Tx) {
				_, err := tx.Exec(ctx, `INSERT INTO items SELECT 100000 + u.job, u.job, 'bulk', u.tok FROM unnest($1::int[], $2::bigint[]) u(job, tok)`, ids[:100], toks[:100])
				require.NoError(t, err, "A's own resources")
				_, err = tx.Exec(ctx, `UPDATE items t SET job = CASE WHEN t.job = 1000 THEN 1 ELSE t.job END, tok = u.tok
					FROM unnest($1::int[], $2::bigint[]) u(job, tok) WHERE t.id = 100000 + u.job`, ids[:100], toks[:100])
				requireOneOf(t, err, "FN003|FN002") // job:1000's row moved into job:1 with job:1000's token
			})
		}
		require.Equal(t, before, f.guarded(t))
	})
}

// TestRowsForgedTokensSetting: whatever A writes into fence.tokens, the
// guard compares it with the latest grant (or fails on it).
func TestRowsForgedTokensSetting(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	before := f.guarded(t)
	writes := []string{
		`UPDATE items SET val = 'stale' WHERE id = 1`,
		`DELETE FROM items WHERE id = 1`,
		`UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`,
		`INSERT INTO items (id, job, val) VALUES (9, 1, 'stale')`,
		`UPDATE pitems SET val = 'stale' WHERE id = 1`,
		`INSERT INTO pitems VALUES (9, 1, 'stale')`,
		`DELETE FROM pitems WHERE id = 1`,
		`TRUNCATE pitems`,
	}
	for _, tc := range []struct{ value, code string }{
		{`not json`, "22P02"},
		{`{"job:1": 99999999999999999999}`, "22003"},
		{`{"job:1": -5}`, "FN003"},
		{`{"job:1": 0}`, "FN003"},
		{`{"job:1": null}`, "FN002"},
		{`{"job:1": {t1}}`, "FN001"},
		{`{"job:1": "{t1}"}`, "FN001"},
		{`{"job:\u0031": {t1}}`, "FN001"},
		{`{"job:1": {t2}, "job:1": {t1}}`, "FN001"},
		{`{"JOB:1": {t2}, "job:1 ": {t2}}`, "FN002"},
		{`[{t2}]`, "FN002"},
		{`"{t2}"`, "FN002"},
		{`{"job:1": 1.5}`, "22P02"},
		{`{"job:1": {"job:1": {t2}}}`, "22P02"},
		{`{"job:1": 9223372036854775807}`, "FN003"},
		{`{"job:1": {ta2}}`, "FN003"},
		{`{"job:1": "` + strings.Repeat("9", 100000) + `"}`, "22003"},
	} {
		for _, w := range writes {
			for _, set := range []string{
				`SELECT set_config('fence.tokens', $$` + f.sql(tc.value) + `$$, true)`,
				`SET LOCAL fence.tokens = $$` + f.sql(tc.value) + `$$`,
			} {
				err := attempt(ctx, f.aPool, pgx.ReadCommitted, []string{set}, f.sql(w))
				if err == nil {
					t.Errorf("fence.tokens = %.60s: %s went through", tc.value, w)
					continue
				}
				requireOneOf(t, err, tc.code)
			}
		}
	}
	require.Equal(t, before, f.guarded(t))
}

// shadowFor is shadowText (attack_test.go) for any victim resource name: a
// temporary type named "text" whose cast back to pg_catalog.text turns
// victim into mine.
func shadowFor(victim, mine string, version int) []string {
	s := shadowText(mine, version)
	for i := range s {
		s[i] = strings.ReplaceAll(s[i], `'res'`, `'`+victim+`'`)
	}
	return s
}

// TestRowsShadowedTypesAndOperators: A shadows text (as the attack on
// migration 003 did), int4, int8 and jsonb with temporary types, and puts
// operators ||, =, <> and ->> of its own first on its search_path, then
// writes B's rows with the token of a resource of its own. The per-row guard
// qualifies every type and operator: nothing of A's runs.
func TestRowsShadowedTypesAndOperators(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	before := f.guarded(t)
	ver := serverVersion(t, ctx, f.b.db.Pool)
	conn := roleConn(t, f.b, f.a)
	mine := acquireWhenFree(t, ctx, conn, "mine", "A", time.Hour)
	setup := shadowFor("job:1", "mine", ver)
	setup = append(setup,
		`CREATE TYPE pg_temp.int8 AS RANGE (subtype = pg_catalog.int8)`,
		`CREATE TYPE pg_temp.int4 AS RANGE (subtype = pg_catalog.int4)`,
		`CREATE TYPE pg_temp.jsonb AS RANGE (subtype = pg_catalog.text)`,
		`CREATE TYPE pg_temp.bigint AS RANGE (subtype = pg_catalog.int8)`,
		`CREATE FUNCTION cat(pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.text LANGUAGE sql AS $$ SELECT 'mine' $$`,
		`CREATE OPERATOR || (leftarg = pg_catalog.text, rightarg = pg_catalog.text, function = cat)`,
		`CREATE FUNCTION yes(pg_catalog.text, pg_catalog.text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$`,
		`CREATE OPERATOR = (leftarg = pg_catalog.text, rightarg = pg_catalog.text, function = yes)`,
		`CREATE FUNCTION no8(pg_catalog.int8, pg_catalog.int8) RETURNS boolean LANGUAGE sql AS $$ SELECT false $$`,
		`CREATE OPERATOR <> (leftarg = pg_catalog.int8, rightarg = pg_catalog.int8, function = no8)`,
		`CREATE FUNCTION no4(pg_catalog.int8, pg_catalog.int4) RETURNS boolean LANGUAGE sql AS $$ SELECT false $$`,
		`CREATE OPERATOR <= (leftarg = pg_catalog.int8, rightarg = pg_catalog.int4, function = no4)`,
		`CREATE OPERATOR < (leftarg = pg_catalog.int8, rightarg = pg_catalog.int4, function = no4)`,
		fmt.Sprintf(`CREATE FUNCTION get(pg_catalog.jsonb, pg_catalog.text) RETURNS pg_catalog.text LANGUAGE sql AS $$ SELECT '%d' $$`, mine),
		`CREATE OPERATOR ->> (leftarg = pg_catalog.jsonb, rightarg = pg_catalog.text, function = get)`,
		`SET search_path = `+f.aSchema+`, pg_catalog, public`, // pg_temp stays first for types
	)
	for _, s := range setup {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	useMine := []string{fmt.Sprintf(`SELECT fence.use_token('mine', %d)`, mine)}
	for _, tc := range []rowsAttempt{
		{name: "token column with mine", sql: fmt.Sprintf(`UPDATE items SET val = 'stale', tok = %d WHERE id = 1`, mine), code: "FN003"},
		{name: "token column, mine registered", pre: useMine, sql: `UPDATE items SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "INSERT with mine", sql: fmt.Sprintf(`INSERT INTO items VALUES (9, 1, 'stale', %d)`, mine), code: "FN003"},
		{name: "move with mine", pre: useMine, sql: f.sql(`UPDATE items SET job = 2, tok = {ta2} WHERE id = 1`), code: "FN002"},
		{name: "DELETE, mine registered", pre: useMine, sql: `DELETE FROM items WHERE id = 1`, code: "FN002"},
		{name: "use_token table UPDATE, mine registered", pre: useMine, sql: `UPDATE pitems SET val = 'stale' WHERE id = 1`, code: "FN002"},
		{name: "use_token table INSERT, mine registered", pre: useMine, sql: `INSERT INTO pitems VALUES (9, 1, 'stale')`, code: "FN002"},
		{name: "TRUNCATE, mine registered", pre: useMine, sql: `TRUNCATE pitems`, code: "FN002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, iso := range isoLevels {
				requireOneOf(t, attempt(ctx, conn, iso, tc.pre, tc.sql), outsideReadCommitted(tc.sql, iso, tc.code))
			}
		})
	}
	require.Equal(t, before, f.guarded(t))
}

// TestRowsOddResourceValues: a text resource column names resources by
// bytes: values that look like a resource A holds, or like B's, are other
// resources (never granted: FN003), or B's exactly (t1: FN001).
func TestRowsOddResourceValues(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	f.b.exec(t, `CREATE TABLE named (id int PRIMARY KEY, name text NOT NULL, tok bigint)`)
	f.b.exec(t, `CREATE TABLE vnamed (id int PRIMARY KEY, name varchar(300) NOT NULL, tok bigint)`)
	f.b.exec(t, `CREATE TABLE unamed (id int PRIMARY KEY, name uuid NOT NULL, tok bigint)`)
	for _, tbl := range []string{"named", "vnamed"} {
		require.NoError(t, sqlfuncs.ProtectRows(ctx, f.b.db.Pool, tbl, "name", "job:", "tok"))
		f.b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON `+tbl+` TO `+f.aSchema)
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, f.b.db.Pool, "unamed", "name", "job:", "tok"))
	f.b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON unamed TO `+f.aSchema)
	f.b.exec(t, `INSERT INTO named VALUES (1, '1', $1)`, f.t2)
	for _, tbl := range []string{"named", "vnamed"} {
		for _, tc := range []struct{ name, code string }{
			{"1", "FN001"},
			{"01", "FN003"},
			{" 1", "FN003"},
			{"1 ", "FN003"},
			{"1\t", "FN003"},
			{"1\u200b", "FN003"},
			{"\uff11", "FN003"}, // fullwidth digit one
			{"", "FN003"},
			{"2 ", "FN003"},
			{"2\n", "FN003"},
			{strings.Repeat("2", 300), "FN003|22001"}, // over 255 characters: fence.check refuses the name
		} {
			_, err := f.aPool.Exec(ctx, `INSERT INTO `+tbl+` VALUES (9, $1, $2)`, tc.name, f.t1)
			requireOneOf(t, err, tc.code)
			_, err = f.aPool.Exec(ctx, `INSERT INTO `+tbl+` VALUES (9, $1, $2)`, tc.name, f.ta2)
			requireOneOf(t, err, strings.Replace(tc.code, "FN001", "FN003", 1)) // ta2 is job:2's, newer than job:1's latest
		}
	}
	_, err := f.aPool.Exec(ctx, `UPDATE named SET tok = $1 WHERE id = 1`, f.t1)
	requireCode(t, err, "FN001")
	_, err = f.aPool.Exec(ctx, `UPDATE named SET name = '2', tok = $1 WHERE id = 1`, f.ta2)
	requireCode(t, err, "FN002")
	_, err = f.aPool.Exec(ctx, `INSERT INTO unamed VALUES (9, gen_random_uuid(), $1)`, f.ta2)
	requireCode(t, err, "FN003")
	var s string
	require.NoError(t, f.b.db.Pool.QueryRow(ctx, `SELECT string_agg(format('%s:%s:%s', id, name, tok), ',') FROM named`).Scan(&s))
	require.Equal(t, fmt.Sprintf("1:1:%d", f.t2), s)
}

// TestRowsCascades: foreign-key actions of a parent A may write (the
// resource column is the foreign key) move or delete B's rows on A's behalf;
// they present no token of job:1.
func TestRowsCascades(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx, b := f.b.ctx, f.b
	for _, s := range []string{
		`CREATE TABLE jobs_c (id int PRIMARY KEY)`,
		`CREATE TABLE jobs_d (id int PRIMARY KEY)`,
		`CREATE TABLE jobs_n (id int PRIMARY KEY)`,
		`CREATE TABLE jobs_p (id int PRIMARY KEY)`,
		`INSERT INTO jobs_c VALUES (1), (2), (3)`,
		`INSERT INTO jobs_d VALUES (1), (2), (3)`,
		`INSERT INTO jobs_n VALUES (1), (2), (3)`,
		`INSERT INTO jobs_p VALUES (1), (2), (3)`,
		`CREATE TABLE kids_c (id int PRIMARY KEY, job int NOT NULL REFERENCES jobs_c ON UPDATE CASCADE ON DELETE CASCADE, tok bigint)`,
		`CREATE TABLE kids_d (id int PRIMARY KEY, job int NOT NULL DEFAULT 2 REFERENCES jobs_d ON UPDATE SET DEFAULT ON DELETE SET DEFAULT, tok bigint)`,
		`CREATE TABLE kids_n (id int PRIMARY KEY, job int NOT NULL REFERENCES jobs_n ON UPDATE SET NULL ON DELETE SET NULL, tok bigint)`,
		`CREATE TABLE kids_p (id int PRIMARY KEY, job int NOT NULL REFERENCES jobs_p ON UPDATE CASCADE ON DELETE CASCADE)`,
	} {
		b.exec(t, s)
	}
	for _, k := range []string{"kids_c", "kids_d", "kids_n"} {
		require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, k, "job", "job:", "tok"))
		b.exec(t, `INSERT INTO `+k+` VALUES (1, 1, $1), (2, 2, $2)`, f.t2, f.ta2)
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "kids_p", "job", "job:", ""))
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:1", f.t2))
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:2", f.ta2))
		_, err := tx.Exec(ctx, `INSERT INTO kids_p VALUES (1, 1), (2, 2)`)
		return err
	}))
	b.exec(t, `GRANT SELECT, UPDATE, DELETE, TRUNCATE ON jobs_c, jobs_d, jobs_n, jobs_p, kids_c, kids_d, kids_n, kids_p TO `+f.aSchema)
	kids := func() string {
		var s string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT concat_ws(' | ',
			(SELECT string_agg(format('%s:%s:%s', id, job, tok), ',' ORDER BY id) FROM kids_c),
			(SELECT string_agg(format('%s:%s:%s', id, job, tok), ',' ORDER BY id) FROM kids_d),
			(SELECT string_agg(format('%s:%s:%s', id, job, tok), ',' ORDER BY id) FROM kids_n),
			(SELECT string_agg(format('%s:%s', id, job), ',' ORDER BY id) FROM kids_p))`).Scan(&s))
		return s
	}
	before := kids()
	useA2 := []string{f.sql(`SELECT fence.use_token('job:2', {ta2})`)}
	for _, tc := range []rowsAttempt{
		{name: "ON UPDATE CASCADE of the resource column", sql: `UPDATE jobs_c SET id = 9 WHERE id = 1`, code: "FN002"},
		{name: "ON UPDATE CASCADE, job:2 registered", pre: useA2, sql: `UPDATE jobs_c SET id = 9 WHERE id = 1`, code: "FN002"},
		{name: "ON DELETE CASCADE", pre: useA2, sql: `DELETE FROM jobs_c WHERE id IN (1, 2)`, code: "FN002"},
		{name: "ON DELETE CASCADE, t1 registered by hand", pre: []string{`SELECT set_config('fence.tokens', '{"job:1": {t1}}', true)`}, sql: `DELETE FROM jobs_c WHERE id = 1`, code: "FN001"},
		{name: "ON DELETE SET DEFAULT moves B's row into job:2", pre: useA2, sql: `DELETE FROM jobs_d WHERE id = 1`, code: "FN002"},
		{name: "ON UPDATE SET DEFAULT moves B's row into job:2", pre: useA2, sql: `UPDATE jobs_d SET id = 8 WHERE id = 1`, code: "FN002"},
		{name: "ON DELETE SET NULL on the NOT NULL resource column", pre: useA2, sql: `DELETE FROM jobs_n WHERE id = 1`, code: "FN002|23502"},
		{name: "ON UPDATE SET NULL", pre: useA2, sql: `UPDATE jobs_n SET id = 8 WHERE id = 1`, code: "FN002|23502"},
		{name: "use_token table: ON UPDATE CASCADE", pre: useA2, sql: `UPDATE jobs_p SET id = 9 WHERE id = 1`, code: "FN002"},
		{name: "use_token table: ON DELETE CASCADE", pre: useA2, sql: `DELETE FROM jobs_p`, code: "FN002"},
		{name: "TRUNCATE ... CASCADE", pre: useA2, sql: `TRUNCATE jobs_c CASCADE`, code: "FN002"},
		{name: "TRUNCATE ... CASCADE, use_token table", pre: useA2, sql: `TRUNCATE jobs_p CASCADE`, code: "FN002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, iso := range isoLevels {
				pre := make([]string, len(tc.pre))
				for i, p := range tc.pre {
					pre[i] = f.sql(p)
				}
				requireOneOf(t, attempt(ctx, f.aPool, iso, pre, f.sql(tc.sql)), outsideReadCommitted(tc.sql, iso, tc.code))
			}
			require.Equal(t, before, kids())
		})
	}
}

// TestRowsRoleWithoutUsage: N has every table privilege it needs but not
// the kit's usage: it writes nothing of a per-row table that has rows,
// whatever it sets (42501).
func TestRowsRoleWithoutUsage(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	before := f.guarded(t)
	settings := [][]string{
		nil,
		{f.sql(`SELECT set_config('fence.tokens', '{"job:1": {t2}, "job:2": {ta2}, "job:3": {t3}}', true)`)},
		{`SELECT set_config('fence._checked', '1', true)`},
		{`SET LOCAL search_path = ` + f.nSchema + `, pg_catalog, public`},
	}
	writes := []string{
		`INSERT INTO items VALUES (9, 1, 'x', {t2})`,
		`INSERT INTO items (id, job, val) VALUES (9, 1, 'x')`,
		`UPDATE items SET val = 'x', tok = {t2} WHERE id = 1`,
		`UPDATE items SET val = 'x' WHERE id = 1`,
		`UPDATE items SET val = 'x', tok = tok WHERE id = 1`,
		`DELETE FROM items WHERE id = 1`,
		`TRUNCATE items`,
		`INSERT INTO pitems VALUES (9, 1, 'x')`,
		`UPDATE pitems SET val = 'x'`,
		`DELETE FROM pitems`,
		`TRUNCATE pitems`,
		`SELECT fence.use_token('job:1', {t2})`,
	}
	for _, set := range settings {
		for _, w := range writes {
			for _, iso := range isoLevels {
				requireOneOf(t, attempt(ctx, f.nPool, iso, set, f.sql(w)), outsideReadCommitted(w, iso, "42501"))
			}
		}
	}
	inTx(t, ctx, f.nPool, pgx.ReadCommitted, func(tx pgx.Tx) {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "job", "val", "tok"}, pgx.CopyFromRows([][]any{{9, 1, "x", f.t2}}))
		requireCode(t, err, "42501")
	})
	require.Equal(t, before, f.guarded(t))
}

// TestRowsNonOwnerCannotChangeTheTable: what A could do to the table itself
// to get rid of the guard (it has usage and SELECT, INSERT, UPDATE, DELETE,
// TRUNCATE, not TRIGGER, not ownership), and settings that would skip
// triggers: all 42501. The owner cannot make the table a partition or an
// inheritance child either (0A000, the pin).
func TestRowsNonOwnerCannotChangeTheTable(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	before := f.guarded(t)
	for _, s := range []string{
		`CREATE TABLE par (id int, job int NOT NULL, val text, tok bigint)`,
		`CREATE TABLE pp (id int, job int NOT NULL, val text, tok bigint) PARTITION BY LIST (job)`,
		`CREATE FUNCTION rewrite() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.tok := OLD.tok; RETURN NEW; END $$`,
	} {
		_, err := f.aPool.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	for _, s := range []string{
		`ALTER TABLE items DISABLE TRIGGER ALL`,
		`ALTER TABLE items DISABLE TRIGGER USER`,
		`ALTER TABLE items DISABLE TRIGGER "~fence_guard_1_row"`,
		`ALTER TABLE items ENABLE REPLICA TRIGGER "~fence_guard_1_row"`,
		`DROP TRIGGER "~fence_guard_1_row" ON items`,
		`ALTER TRIGGER "~fence_guard_1_row" ON items RENAME TO x`,
		`ALTER TABLE items DISABLE TRIGGER "~fence_rows_2_kids"`,
		`ALTER TABLE items ALTER COLUMN job DROP NOT NULL`,
		`ALTER TABLE items ALTER COLUMN job TYPE text`,
		`ALTER TABLE items RENAME COLUMN job TO job2`,
		`ALTER TABLE items RENAME COLUMN tok TO tok2`,
		`ALTER TABLE items ADD COLUMN pre text`,
		`ALTER TABLE items ALTER COLUMN tok SET DEFAULT {t2}`,
		`ALTER TABLE items OWNER TO CURRENT_USER`,
		`ALTER TABLE items ENABLE ROW LEVEL SECURITY`,
		`ALTER TABLE items REPLICA IDENTITY FULL`,
		`ALTER TABLE items INHERIT par`,
		`ALTER TABLE pp ATTACH PARTITION public.items FOR VALUES IN (1)`,
		`CREATE TABLE kid () INHERITS (public.items)`,
		`CREATE TRIGGER "~~rewrite" BEFORE UPDATE ON public.items FOR EACH ROW EXECUTE FUNCTION rewrite()`,
		`CREATE RULE r AS ON UPDATE TO public.items DO INSTEAD NOTHING`,
		`CREATE POLICY p ON public.items USING (true)`,
		`CREATE INDEX ON public.items (val)`,
		`SELECT fence.unprotect('public.items')`,
		`SELECT fence.protect_rows('public.items', 'id', 'job:', 'tok')`,
		`SELECT fence.protect_rows('public.items', 'job', 'other:', 'tok')`,
		`SELECT fence.protect_rows('public.items', 'job', 'job:', NULL)`,
		`SELECT fence.protect('public.items', 'job:2', 'tok')`,
		`SET session_replication_role = replica`,
		`SELECT set_config('session_replication_role', 'replica', true)`,
		`SET plpgsql.variable_conflict = use_column`,
	} {
		var pre []string
		if strings.HasPrefix(s, "SET plpgsql") {
			pre = []string{`DO $$ BEGIN END $$`} // loads plpgsql: the setting is then known, and superuser-only
		}
		err := attempt(ctx, f.aPool, pgx.ReadCommitted, pre, f.sql(s))
		if err == nil {
			t.Errorf("%s went through", s)
			continue
		}
		requireCode(t, err, "42501")
	}
	var n int
	require.NoError(t, f.b.db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM pg_trigger WHERE tgrelid = 'items'::regclass AND tgenabled = 'O'`).Scan(&n))
	require.Equal(t, 5, n, "every guard trigger is still there and enabled")
	// (Since migration 9 the owner may attach the table under a parent:
	// its row triggers fire for its rows whatever table a statement names;
	// TestProtectRowsRefusesWhatItCannotGuard.)
	require.Equal(t, before, f.guarded(t))
}

// TestRowsTriggerRoleIsListed: a role with TRIGGER on a per-row table can
// add a BEFORE trigger that sorts after the guard's and rewrites the token
// column back to the row's latest token, so that the statement check passes
// for a write that presented t1: the documented bypass of such roles
// (docs/security.md). fence.protected lists the role in trigger_roles.
func TestRowsTriggerRoleIsListed(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	f.b.exec(t, `GRANT TRIGGER ON items TO `+f.aSchema)
	var roles []string
	var form string
	require.NoError(t, f.b.db.Pool.QueryRow(ctx,
		`SELECT coalesce(trigger_roles::text[], '{}'), form FROM fence.protected WHERE tbl = 'items'::regclass`).Scan(&roles, &form))
	require.Equal(t, "rows", form)
	require.Equal(t, []string{f.a}, roles)
	// Since migration 9 the guard checks each row in a BEFORE row trigger,
	// so the trigger that comes after it moves the row: A inserts a row of
	// its own job:2, which the guard accepts, and the trigger files it under
	// B's job:1.
	for _, s := range []string{
		`CREATE FUNCTION rewrite() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.job := 1; RETURN NEW; END $$`,
		`CREATE TRIGGER "~~rewrite" BEFORE INSERT ON public.items FOR EACH ROW EXECUTE FUNCTION rewrite()`,
	} {
		_, err := f.aPool.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	_, err := f.aPool.Exec(ctx, f.sql(`INSERT INTO items VALUES (99, 2, 'stale', {ta2})`))
	require.NoError(t, err, "documented: a role with TRIGGER is not fenced")
}

// TestRowsConcurrentGrant interleaves a write and a grant of job:1 on
// separate sessions: a write under the token that was the latest when it
// started either commits before the grant returns, or fails.
func TestRowsConcurrentGrant(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx, db := f.b.ctx, f.b.db.Pool
	latest := func() int64 {
		var tok int64
		require.NoError(t, db.QueryRow(ctx, `SELECT token FROM fence.lease WHERE resource = 'job:1'`).Scan(&tok))
		return tok
	}

	t.Run("a grant in progress makes the write wait, then fail", func(t *testing.T) {
		for _, iso := range isoLevels {
			for _, w := range []string{
				`UPDATE items SET val = 'late', tok = $1 WHERE id = 1`,
				`UPDATE items SET val = 'late', tok = CASE job WHEN 1 THEN $1 ELSE tok END WHERE id IN (1, 2, 3)`,
				`INSERT INTO items VALUES (9, 1, 'late', $1)`,
				`WITH a AS (UPDATE items SET val = 'x', tok = ` + fmt.Sprint(f.ta2) + ` WHERE id = 2 RETURNING 1) INSERT INTO items VALUES (8, 1, 'late', $1)`,
			} {
				cur := latest()
				grant := f.b.db.Conn(t)
				writer := roleConn(t, f.b, f.a)
				gtx, err := grant.Begin(ctx)
				require.NoError(t, err)
				var next int64
				require.NoError(t, gtx.QueryRow(ctx, `SELECT fence.revoke('job:1')`).Scan(&next))
				done := make(chan error, 1)
				go func() {
					done <- attempt(ctx, writer, iso, nil, strings.Replace(w, "$1", fmt.Sprint(cur), -1))
				}()
				waitGrantWait(t, ctx, db, writer.PgConn().PID())
				require.NoError(t, gtx.Commit(ctx))
				err = <-done
				if iso == pgx.ReadCommitted {
					requireOneOf(t, err, "FN001")
				} else {
					requireOneOf(t, err, "40001")
				}
				require.Greater(t, next, cur)
			}
		}
	})

	t.Run("the write's transaction makes the grant wait", func(t *testing.T) {
		for i, iso := range isoLevels {
			cur := latest()
			writer := roleConn(t, f.b, f.a)
			grant := f.b.db.Conn(t)
			_, err := grant.Exec(ctx, `SET fence.grant_wait = '60s'`)
			require.NoError(t, err)
			wtx, err := writer.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			_, err = wtx.Exec(ctx, `UPDATE items SET val = 'holder', tok = $1 WHERE id = 1`, cur)
			require.NoError(t, err)
			type res struct {
				tok int64
				err error
			}
			done := make(chan res, 1)
			go func() {
				tok, err := sqlfuncs.Revoke(ctx, grant, "job:1")
				done <- res{tok, err}
			}()
			waitGrantWait(t, ctx, db, grant.PgConn().PID())
			select {
			case r := <-done:
				t.Fatalf("the grant returned %v while a write under %d was open", r, cur)
			default:
			}
			_, err = wtx.Exec(ctx, `INSERT INTO items VALUES ($1, 1, 'holder', $2)`, 20+i, cur)
			require.NoError(t, err, "the token is still the latest")
			require.NoError(t, wtx.Commit(ctx))
			r := <-done
			require.NoError(t, r.err)
			require.Greater(t, r.tok, cur)
			err = attempt(ctx, writer, iso, nil, fmt.Sprintf(`UPDATE items SET val = 'late', tok = %d WHERE id = 1`, cur))
			requireCode(t, err, "FN001")
		}
	})

	t.Run("a snapshot older than the grant", func(t *testing.T) {
		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			cur := latest()
			writer := roleConn(t, f.b, f.a)
			wtx, err := writer.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			_, err = wtx.Exec(ctx, `SELECT count(*) FROM fence.lease`)
			require.NoError(t, err)
			_, err = sqlfuncs.Revoke(ctx, db, "job:1")
			require.NoError(t, err)
			_, err = wtx.Exec(ctx, `UPDATE items SET val = 'late', tok = $1 WHERE id = 1`, cur)
			requireCode(t, err, "40001")
			require.NoError(t, wtx.Rollback(ctx))
		}
	})
}

// TestRowsTruncateUnderSnapshotIsolation: Was a bypass; 004 now refuses
// TRUNCATE of a per-row table outside READ COMMITTED (0A000).
// fence._rows_truncate collects the resources that have rows with a SELECT
// run under the transaction's snapshot, but TRUNCATE removes every row of
// the table, also rows committed after that snapshot. Under REPEATABLE READ
// or SERIALIZABLE a transaction whose snapshot predates B's write therefore
// truncates B's row of job:1 without any token of job:1: with the token of
// A's own job:2 only, or, when the snapshot saw the table empty, with no
// token at all and even without the kit's usage ("an empty table truncates
// freely"). Under READ COMMITTED the SELECT takes a new snapshot after
// TRUNCATE's ACCESS EXCLUSIVE lock and sees B's row.
func TestRowsTruncateUnderSnapshotIsolation(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	for i, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		for j, tc := range []struct {
			name  string
			pool  *pgxpool.Pool
			own   bool // the table holds a row of A's job:2 too, A registers ta2
			codes string
		}{
			{"empty table, role with usage and no token", f.aPool, false, "FN002|40001|0A000"},
			{"A's row of job:2, job:2 registered", f.aPool, true, "FN002|40001|0A000"},
			{"empty table, role without usage", f.nPool, false, "42501|40001|0A000"},
		} {
			t.Run(fmt.Sprintf("%s, %s", iso, tc.name), func(t *testing.T) {
				tbl := fmt.Sprintf("tr_%d_%d", i, j)
				f.b.exec(t, `CREATE TABLE `+tbl+` (id int PRIMARY KEY, job int NOT NULL, tok bigint)`)
				require.NoError(t, sqlfuncs.ProtectRows(ctx, f.b.db.Pool, tbl, "job", "job:", "tok"))
				f.b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON `+tbl+` TO `+f.aSchema+`, `+f.nSchema)
				if tc.own {
					f.b.exec(t, `INSERT INTO `+tbl+` VALUES (2, 2, $1)`, f.ta2)
				}
				tx, err := tc.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
				if tc.own {
					require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:2", f.ta2))
				}
				_, err = tx.Exec(ctx, `SELECT count(*) FROM `+tbl) // the snapshot
				require.NoError(t, err)
				f.b.exec(t, `INSERT INTO `+tbl+` VALUES (1, 1, $1)`, f.t2) // B writes job:1 and commits
				_, err = tx.Exec(ctx, `TRUNCATE `+tbl)
				if err == nil {
					err = tx.Commit(ctx)
				}
				var n int
				require.NoError(t, f.b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl+` WHERE id = 1`).Scan(&n))
				require.Equal(t, 1, n, "B's row of job:1 survives")
				requireOneOf(t, err, tc.codes)
			})
		}
	}
}

// TestRowsNondeterministicCollation: Was a bypass; the guard now compares
// resource names with COLLATE "C", as fence.lease does.
// fence.protect_rows accepts a text or varchar resource column with a
// nondeterministic collation (here case-insensitive ICU). The generated
// guard compares and de-duplicates resource names (SELECT DISTINCT, the
// NOT EXISTS that decides which old resources the statement's new rows
// cover, and array_agg(DISTINCT ...) of fence._rows_truncate) under that
// collation, while the kit's resources are distinct byte strings:
// 'user:Alice' and 'user:alice' are two leases. A, holding only user:alice,
// moves B's row out of user:Alice, deletes it, truncates it, or writes it
// with its own token alongside its own row.
func TestRowsNondeterministicCollation(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx, db := f.b.ctx, f.b.db.Pool
	var icu bool
	require.NoError(t, db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_collation WHERE collprovider = 'i')`).Scan(&icu))
	if !icu {
		t.Log("this server has no ICU: no nondeterministic collation to test")
		return
	}
	f.b.exec(t, `CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`)
	f.b.exec(t, `CREATE TABLE citems (id int PRIMARY KEY, owner text COLLATE ci NOT NULL, val text, tok bigint)`)
	f.b.exec(t, `CREATE TABLE pcitems (id int PRIMARY KEY, owner varchar(50) COLLATE ci NOT NULL, val text)`)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "citems", "owner", "user:", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "pcitems", "owner", "user:", ""))
	f.b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON citems, pcitems TO `+f.aSchema)
	tb := acquireWhenFree(t, ctx, db, "user:Alice", "B", time.Hour)
	ta := acquireWhenFree(t, ctx, db, "user:alice", "A", time.Hour)
	// A's row first: the de-duplications keep the first of two names that
	// the collation calls equal
	f.b.exec(t, `INSERT INTO citems VALUES (2, 'alice', 'A', $1)`, ta)
	f.b.exec(t, `INSERT INTO citems VALUES (1, 'Alice', 'B', $1)`, tb)
	require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "user:Alice", tb))
		require.NoError(t, sqlfuncs.UseToken(ctx, tx, "user:alice", ta))
		if _, err := tx.Exec(ctx, `INSERT INTO pcitems VALUES (2, 'alice', 'A')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO pcitems VALUES (1, 'Alice', 'B')`)
		return err
	}))
	const read = `SELECT coalesce((SELECT string_agg(format('%s:%s:%s:%s', id, owner, val, tok), ',' ORDER BY id) FROM citems WHERE id <> 2), 'gone') || ' | ' ||
		coalesce((SELECT string_agg(format('%s:%s:%s', id, owner, val), ',' ORDER BY id) FROM pcitems WHERE id <> 2), 'gone')`
	var before string
	require.NoError(t, db.QueryRow(ctx, read).Scan(&before))
	useMine := []string{fmt.Sprintf(`SELECT fence.use_token('user:alice', %d)`, ta)}
	for _, tc := range []rowsAttempt{
		{name: "move B's row into user:alice with A's token", sql: fmt.Sprintf(`UPDATE citems SET owner = 'alice', tok = %d WHERE id = 1`, ta), code: "FN002"},
		{name: "write B's row and A's row with A's token", sql: fmt.Sprintf(`UPDATE citems SET val = 'stale', tok = %d`, ta), code: "FN003"},
		{name: "DELETE both rows with user:alice registered", pre: useMine, sql: `DELETE FROM citems`, code: "FN002"},
		{name: "TRUNCATE with user:alice registered", pre: useMine, sql: `TRUNCATE citems`, code: "FN002"},
		{name: "INSERT for user:ALICE (never granted) next to A's own", sql: fmt.Sprintf(`INSERT INTO citems VALUES (5, 'alice', 'A', %[1]d), (6, 'ALICE', 'stale', %[1]d)`, ta), code: "FN003"},
		{name: "use_token table: INSERT for user:Alice next to A's own", pre: useMine, sql: `INSERT INTO pcitems VALUES (5, 'alice', 'A'), (6, 'Alice', 'stale')`, code: "FN002"},
		{name: "use_token table: move B's row into user:alice", pre: useMine, sql: `UPDATE pcitems SET owner = 'alice' WHERE id = 1`, code: "FN002"},
		{name: "use_token table: DELETE both rows", pre: useMine, sql: `DELETE FROM pcitems`, code: "FN002"},
		{name: "use_token table: TRUNCATE", pre: useMine, sql: `TRUNCATE pcitems`, code: "FN002"},
	} {
		requireRefusedRolledBack(t, ctx, f.aPool, tc, read, "B's row of user:Alice (before: "+before+")")
	}
}

// TestRowsChildTableCreatedLater: Was a bypass given an owner's schema
// change; the statement triggers now refuse every write (42809) while the
// table has inheritance children. The pin keeps a per-row table from becoming a
// partition or inheritance child, but nothing keeps its owner from creating
// a child of it afterwards (CREATE TABLE ... INHERITS, which fence.protect_rows
// refuses only at protect time), and the child cannot be protected (it has
// a parent). The row triggers of the parent do not fire for rows of the
// child, while its statement triggers see them in the transition tables, so
// an UPDATE through the parent that does not assign the token column keeps
// the child row's token, the latest, and passes the statement check: A's
// token-less UPDATE of B's row commits (A needs privileges on the parent
// only). With a token column assigned, or in use_token mode, or for DELETE,
// the statement check still refuses.
func TestRowsChildTableCreatedLater(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx, db := f.b.ctx, f.b.db.Pool
	f.b.exec(t, `CREATE TABLE items_kid () INHERITS (items)`)
	f.b.exec(t, `CREATE TABLE pitems_kid () INHERITS (pitems)`)
	f.b.exec(t, `INSERT INTO items_kid VALUES (21, 1, 'B', $1)`, f.t2)
	f.b.exec(t, `INSERT INTO pitems_kid VALUES (21, 1, 'B')`)
	const read = `SELECT coalesce((SELECT format('%s:%s:%s', job, val, tok) FROM items WHERE id = 21), 'gone') || ' | ' ||
		coalesce((SELECT format('%s:%s', job, val) FROM pitems WHERE id = 21), 'gone')`
	var before string
	require.NoError(t, db.QueryRow(ctx, read).Scan(&before))
	for _, tc := range []rowsAttempt{
		{name: "UPDATE with t1 through the parent", sql: `UPDATE items SET val = 'stale', tok = {t1} WHERE id = 21`, code: "42809"},
		{name: "DELETE through the parent", sql: `DELETE FROM items WHERE id = 21`, code: "42809"},
		{name: "use_token table: UPDATE through the parent", sql: `UPDATE pitems SET val = 'stale' WHERE id = 21`, code: "42809"},
		{name: "token-less UPDATE through the parent", sql: `UPDATE items SET val = 'stale' WHERE id = 21`, code: "42809"},
	} {
		tc.sql = f.sql(tc.sql)
		requireRefusedRolledBack(t, ctx, f.aPool, tc, read, "B's row in the child (before: "+before+")")
	}
}

// TestRowsMergeWithSeveralUpdateActions pins down the documented MERGE
// exception (docs/sql.md, TestMergeWithSeveralUpdateActions) for per-row
// tables, where it reaches across resources: A assigns the token of its own
// job:2 in one UPDATE action, and the rows of B's job:1 that another UPDATE
// action (which assigns nothing) changes present the token they carry, t2,
// the latest: the MERGE commits. This is not counted as a bypass (the
// documented rule is the server's), but it lets a stale writer's sloppy
// MERGE overwrite another holder's rows.
func TestRowsMergeWithSeveralUpdateActions(t *testing.T) {
	t.Parallel()
	f := rowsStory(t)
	ctx := f.b.ctx
	if serverVersion(t, ctx, f.b.db.Pool) < 150000 {
		t.Log("PostgreSQL before 15 has no MERGE; nothing to test")
		return
	}
	merge := f.sql(`MERGE INTO items c USING (VALUES (1), (2)) s(id) ON c.id = s.id
		WHEN MATCHED AND c.job = 2 THEN UPDATE SET val = 'A', tok = {ta2}
		WHEN MATCHED THEN UPDATE SET val = 'stale'`)
	_, err := f.aPool.Exec(ctx, merge)
	require.NoError(t, err, "documented: row 1 presents the t2 it carries")
	var val string
	require.NoError(t, f.b.db.Pool.QueryRow(ctx, `SELECT val FROM items WHERE id = 1`).Scan(&val))
	require.Equal(t, "stale", val)
}

// TestRowsTruncateUnderRowSecurity (issue 19, item 3): TRUNCATE removes
// every row whatever row-level security says, but 006's per-row TRUNCATE
// guard found the resources to check with a SELECT that row security
// filtered: a tenant holding only tenant:alice truncated bob's rows while
// bob's lease was live, and a role without the kit's usage that sees no row
// truncated freely. fence.protect_rows read the token column's maximum the
// same way, so rows a FORCE'd policy hid from the owner did not raise the
// token floor. Now both read with row_security = off: a policy that would
// hide rows fails them (42501) instead.
func TestRowsTruncateUnderRowSecurity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	alice, nobody := pgtest.NewRole(t, "alice"), pgtest.NewRole(t, "nobody")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, alice, false))
	ta := acquireWhenFree(t, ctx, b.db.Pool, "tenant:alice", "alice", time.Hour)
	tb := acquireWhenFree(t, ctx, b.db.Pool, "tenant:bob", "bob", time.Hour)
	for _, s := range []string{
		`CREATE TABLE ledger (id int PRIMARY KEY, tenant text NOT NULL, amount int, tok bigint)`,
		`INSERT INTO ledger VALUES (1, 'alice', 10, ` + fmt.Sprint(ta) + `), (2, 'bob', 20, ` + fmt.Sprint(tb) + `)`,
		`ALTER TABLE ledger ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY own_tenant ON ledger USING (tenant = current_setting('app.tenant', true))`,
		`GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ledger TO ` + pgx.Identifier{alice}.Sanitize() + `, ` + pgx.Identifier{nobody}.Sanitize(),
	} {
		b.exec(t, s)
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "ledger", "tenant", "tenant:", "tok"))
	count := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n))
		return n
	}
	t.Run("a tenant truncates the other tenant's rows", func(t *testing.T) {
		err := attempt(ctx, rolePool(t, b, alice), pgx.ReadCommitted, []string{
			`SET LOCAL app.tenant = 'alice'`,
			fmt.Sprintf(`SELECT fence.use_token('tenant:alice', %d)`, ta),
		}, `TRUNCATE ledger`)
		requireOneOf(t, err, "42501")
		require.Equal(t, 2, count())
	})
	t.Run("a role without usage that sees no row", func(t *testing.T) {
		err := attempt(ctx, rolePool(t, b, nobody), pgx.ReadCommitted, nil, `TRUNCATE ledger`)
		requireOneOf(t, err, "42501")
		require.Equal(t, 2, count())
	})
	t.Run("the owner truncates with every row's token", func(t *testing.T) {
		err := attempt(ctx, b.db.Pool, pgx.ReadCommitted, []string{fmt.Sprintf(`SELECT fence.use_token('tenant:alice', %d)`, ta)}, `TRUNCATE ledger`)
		requireOneOf(t, err, "FN002") // bob's resource has rows too
		require.NoError(t, attempt(ctx, b.db.Pool, pgx.ReadCommitted, []string{
			fmt.Sprintf(`SELECT fence.use_token('tenant:alice', %d)`, ta),
			fmt.Sprintf(`SELECT fence.use_token('tenant:bob', %d)`, tb),
		}, `TRUNCATE ledger`))
		require.Equal(t, 0, count())
	})

	t.Run("protect reads the token of every row", func(t *testing.T) {
		owner := pgtest.NewRole(t, "ledgerowner")
		require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, owner, true)) // may raise the floor
		// Rows from an earlier install, with a token far above every grant,
		// hidden from the owner by a FORCE'd policy.
		high := tb + 10<<43
		for _, s := range []string{
			`CREATE TABLE ledger2 (id int PRIMARY KEY, tenant text NOT NULL, tok bigint)`,
			`INSERT INTO ledger2 VALUES (1, 'alice', ` + fmt.Sprint(ta) + `), (2, 'hidden', ` + fmt.Sprint(high) + `)`,
			`ALTER TABLE ledger2 OWNER TO ` + pgx.Identifier{owner}.Sanitize(),
			`ALTER TABLE ledger2 ENABLE ROW LEVEL SECURITY`,
			`ALTER TABLE ledger2 FORCE ROW LEVEL SECURITY`,
			`CREATE POLICY visible ON ledger2 USING (tenant <> 'hidden')`,
		} {
			b.exec(t, s)
		}
		oc := roleConn(t, b, owner)
		err := sqlfuncs.ProtectRows(ctx, oc, "ledger2", "tenant", "tenant:", "tok")
		requireCode(t, err, "42501")
		b.exec(t, `ALTER TABLE ledger2 NO FORCE ROW LEVEL SECURITY`)
		require.NoError(t, sqlfuncs.ProtectRows(ctx, oc, "ledger2", "tenant", "tenant:", "tok"))
		next := acquireWhenFree(t, ctx, b.db.Pool, "tenant:carol", "carol", time.Hour)
		require.Greater(t, next, high, "the next grant exceeds every token the rows carry")
	})
}
