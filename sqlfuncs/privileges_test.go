package sqlfuncs_test

import (
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// installAsOrdinaryOwner installs the kit the way the README says a
// production database gets it: applied by a role that has CREATE on the
// database and nothing more (no superuser, no pg_read_all_stats). It returns
// a pool connected as that owner.
func installAsOrdinaryOwner(t *testing.T, db *pgtest.DB) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	owner := pgtest.NewRole(t, "owner")
	for _, sql := range []string{
		`GRANT CREATE ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + pgx.Identifier{owner}.Sanitize(),
		`GRANT CREATE ON SCHEMA public TO ` + pgx.Identifier{owner}.Sanitize(),
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	pool, err := pgxpool.New(ctx, db.URLAs(owner))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	require.NoError(t, err)
	require.Len(t, ups, migrations.Latest)
	slices.Sort(ups)
	for _, name := range ups {
		up, err := migrations.FS.ReadFile(name)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(up)) // one simple query, one transaction, like golang-migrate
		require.NoError(t, err, name)
	}
	return pool
}

// TestApplicationRolePrivileges connects as a role that was given only
// fence.grant_usage (plus ordinary table privileges) on a kit owned by an
// ordinary role, and tries to forge, reset and bypass. Each attempt must fail
// with the expected SQLSTATE.
func TestApplicationRolePrivileges(t *testing.T) {
	t.Parallel()
	app := pgtest.NewRole(t, "app")
	db := pgtest.Empty(t)
	owner := installAsOrdinaryOwner(t, db)
	ctx := t.Context()
	ownerExec := func(sql string) {
		t.Helper()
		_, err := owner.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}

	ownerExec(`CREATE TABLE orders (id int PRIMARY KEY, note text, token bigint)`)
	require.NoError(t, sqlfuncs.Protect(ctx, owner, "orders", "orders", "token"))
	ownerExec(`GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON orders TO ` + pgx.Identifier{app}.Sanitize())
	_, err := db.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{app}.Sanitize())
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.GrantUsage(ctx, owner, app, false))

	conn, err := pgx.Connect(ctx, db.URLAs(app))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })

	t.Run("the usage privilege is enough to hold leases and write under tokens", func(t *testing.T) {
		tok, ok, err := sqlfuncs.Acquire(ctx, conn, "orders", "app", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = conn.Exec(ctx, `INSERT INTO orders VALUES (1, 'by app', $1)`, tok)
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			require.NoError(t, sqlfuncs.UseToken(ctx, tx, "orders", tok))
			_, err := tx.Exec(ctx, `DELETE FROM orders WHERE id = 1`)
			return err
		}))
		_, ok, err = sqlfuncs.Renew(ctx, conn, "orders", tok, time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		released, err := sqlfuncs.Release(ctx, conn, "orders", tok)
		require.NoError(t, err)
		require.True(t, released)
		st, ok, err := sqlfuncs.AcquireSession(ctx, conn, "app-session", "app")
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = sqlfuncs.AcquireSession(ctx, conn, "app-session", "app")
		require.NoError(t, err)
		require.False(t, ok, "its own session lease is seen as live")
		require.True(t, live(t, ctx, conn, "app-session"))
		released, err = sqlfuncs.Release(ctx, conn, "app-session", st)
		require.NoError(t, err)
		require.True(t, released)
		var protected string
		require.NoError(t, conn.QueryRow(ctx, `SELECT resource FROM fence.protected WHERE tbl = 'orders'::regclass`).Scan(&protected))
		require.Equal(t, "orders", protected)
		_, err = sqlfuncs.TryLock(ctx, conn, "x")
		require.NoError(t, err)
		var n int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM fence.leases`).Scan(&n))
		require.Positive(t, n)
		_, err = sqlfuncs.Version(ctx, conn)
		require.NoError(t, err)
	})

	t.Run("it can protect and unprotect a table it owns", func(t *testing.T) {
		_, err := conn.Exec(ctx, `CREATE TABLE public.mine (id int, token bigint)`)
		require.NoError(t, err)
		require.NoError(t, sqlfuncs.Protect(ctx, conn, "public.mine", "mine", "token"))
		_, err = conn.Exec(ctx, `INSERT INTO public.mine VALUES (1, NULL)`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
		require.NoError(t, sqlfuncs.Unprotect(ctx, conn, "public.mine"))
	})

	tok, ok, err := sqlfuncs.Acquire(ctx, owner, "orders", "owner", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	attempts := []struct{ name, sql, code string }{
		{"update lease rows", `UPDATE fence.lease SET token = 1`, "42501"},
		{"delete lease rows", `DELETE FROM fence.lease`, "42501"},
		{"insert a lease row", `INSERT INTO fence.lease (resource, token, kind, acquired_at, expires_at) VALUES ('x', 1, 'ttl', now(), now())`, "42501"},
		{"lock lease rows (a grant would wait for it)", `SELECT * FROM fence.lease FOR KEY SHARE`, "42501"},
		{"move the token counter", `SELECT setval('fence.token_counter', 1)`, "42501"},
		{"take a token from the counter", `SELECT nextval('fence.token_counter')`, "42501"},
		{"move the token floor", `SELECT fence._raise_floor(9223372036854775000)`, "42501"},
		{"reset the epoch", `UPDATE fence.epoch_state SET base = 0`, "42501"},
		{"call the internal grant", `SELECT fence._grant('orders', 'app', 'ttl', '1 minute', true, false)`, "42501"},
		{"call the internal epoch", `SELECT fence._epoch()`, "42501"},
		{"revoke without the operator privilege", `SELECT fence.revoke('orders')`, "42501"},
		{"grant itself more", `SELECT fence.grant_usage(current_user, true)`, "42501"},
		{"disable the guard triggers", `ALTER TABLE orders DISABLE TRIGGER ALL`, "42501"},
		{"drop a guard trigger", `DROP TRIGGER "~fence_guard_1_row" ON orders`, "42501"},
		{"unprotect a table it does not own", `SELECT fence.unprotect('orders')`, "42501"},
		{"re-protect a table it does not own", `SELECT fence.protect('orders', 'other')`, "42501"},
		{"replica mode skips triggers", `SET session_replication_role = replica`, "42501"},
		{"truncate without a token", `TRUNCATE orders`, "FN002"},
		{"write under a token made up by hand", `INSERT INTO orders VALUES (2, 'forged', 9223372036854775807)`, "FN003"},
		{"create objects in schema fence", `CREATE FUNCTION fence.acquire(text) RETURNS int LANGUAGE sql AS 'SELECT 1'`, "42501"},
		// Issue 19, item 8: 006 let any role with usage make the kit's
		// owner create a guard function per column name it passed.
		{"make the kit create a guard function for a table it does not own", `SELECT fence._guard_function('orders', 'made up')`, "42501"},
		{"make the kit create a per-row guard function for a table it does not own", `SELECT fence._rows_function('orders', 'made up', NULL)`, "42501"},
		{"make the kit create a guard function for no table (006's signature)", `SELECT fence._guard_function('made up')`, "42883"},
	}
	for _, a := range attempts {
		t.Run("cannot "+a.name, func(t *testing.T) {
			_, err := conn.Exec(ctx, a.sql)
			requireCode(t, err, a.code)
		})
	}

	t.Run("the kit made no function for it", func(t *testing.T) {
		var n int
		require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE pronamespace = 'fence'::regnamespace
			AND proname IN ('_guard_' || md5('made up'), '_rows_' || md5('"made up",'))`).Scan(&n))
		require.Zero(t, n)
	})

	t.Run("a forged fence.tokens setting gains nothing", func(t *testing.T) {
		ownerExec(fmt.Sprintf(`INSERT INTO orders VALUES (10, 'by owner', %d)`, tok))
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT set_config('fence.tokens', '{"orders": 1}', true)`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `DELETE FROM orders`)
			return err
		})
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
	})

	t.Run("functions planted in public cannot hijack the kit", func(t *testing.T) {
		for _, ddl := range []string{
			`CREATE FUNCTION public.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2100-01-01'::timestamptz $$`,
			`CREATE FUNCTION public.pg_try_advisory_xact_lock(bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$`,
			`CREATE FUNCTION public.greatest_token(bigint) RETURNS bigint LANGUAGE sql AS $$ SELECT 1::bigint $$`,
			`CREATE FUNCTION public.char_length(text) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$`,
			`CREATE FUNCTION public.current_setting(text, boolean) RETURNS text LANGUAGE sql AS $$ SELECT '{"orders": 1}' $$`,
		} {
			_, err := conn.Exec(ctx, ddl)
			require.NoError(t, err, ddl)
		}
		_, err := conn.Exec(ctx, `SET search_path = public, pg_catalog`)
		require.NoError(t, err)
		var now time.Time
		require.NoError(t, conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now))
		require.Equal(t, 2100, now.Year(), "the planted function is what this session resolves")

		_, ok, err := sqlfuncs.Acquire(ctx, conn, "orders", "thief", time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "the owner's live lease is still live: the kit used pg_catalog.clock_timestamp")
		err = sqlfuncs.Check(ctx, conn, "orders", tok-1)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken)
		_, err = conn.Exec(ctx, `INSERT INTO orders VALUES (3, 'planted', 1)`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
		_, _, err = sqlfuncs.Acquire(ctx, conn, strings.Repeat("x", 300), "thief", time.Minute)
		requireCode(t, err, "22001") // char_length was not replaced either
	})

	t.Run("code of its own run by a guard does not get the owner's rights", func(t *testing.T) {
		// Migration 2's guard read rows with to_jsonb(NEW), which calls a
		// user-defined cast to json; migration 3's reads the bigint column
		// directly and runs no code of the writer's at all. Either way such
		// code must never run as the kit owner.
		for _, ddl := range []string{
			`CREATE TYPE public.mood AS ENUM ('calm')`,
			`CREATE FUNCTION public.mood_json(public.mood) RETURNS json LANGUAGE plpgsql AS $$
			 BEGIN
			     INSERT INTO fence.lease (resource, token, kind, acquired_at, expires_at)
			     VALUES ('forged', 9000000000000000000, 'ttl', now(), now() + interval '1 hour');
			     RETURN '"calm"'::json;
			 END $$`,
			`CREATE CAST (public.mood AS json) WITH FUNCTION public.mood_json(public.mood)`,
			`CREATE TABLE public.moods (m public.mood, token bigint)`,
		} {
			_, err := conn.Exec(ctx, ddl)
			require.NoError(t, err, ddl)
		}
		require.NoError(t, sqlfuncs.Protect(ctx, conn, "public.moods", "orders", "token"))
		_, err := conn.Exec(ctx, `INSERT INTO public.moods VALUES ('calm', $1)`, tok)
		require.NoError(t, err, "the guard read the token column without the cast")
		var forged int
		require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM fence.lease WHERE resource = 'forged'`).Scan(&forged))
		require.Zero(t, forged)
	})

	t.Run("the kit's sequences (the token counter, the epoch floor, the refusal counters) are the owner's alone", func(t *testing.T) {
		var seqs []string
		rows, err := owner.Query(ctx, `SELECT relname::text FROM pg_class WHERE relkind = 'S' AND relnamespace = 'fence'::regnamespace ORDER BY relname`)
		require.NoError(t, err)
		seqs, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"epoch_floor", "refusals_fn001", "refusals_fn002", "refusals_fn003", "token_counter"}, seqs)
		for _, s := range seqs {
			var usable bool
			require.NoError(t, owner.QueryRow(ctx, `SELECT has_sequence_privilege($1, 'fence.' || $2, 'USAGE') OR has_sequence_privilege($1, 'fence.' || $2, 'UPDATE') OR has_sequence_privilege($1, 'fence.' || $2, 'SELECT')`, app, s).Scan(&usable))
			require.False(t, usable, s)
		}
	})

	t.Run("revoke_usage takes it all back", func(t *testing.T) {
		require.NoError(t, sqlfuncs.RevokeUsage(ctx, owner, app))
		fresh, err := pgx.Connect(ctx, db.URLAs(app))
		require.NoError(t, err)
		defer fresh.Close(ctx)
		_, _, err = sqlfuncs.Acquire(ctx, fresh, "orders", "app", time.Minute)
		requireCode(t, err, "42501")
	})

	t.Run("operator usage adds revoke", func(t *testing.T) {
		require.NoError(t, sqlfuncs.GrantUsage(ctx, owner, app, true))
		fresh, err := pgx.Connect(ctx, db.URLAs(app))
		require.NoError(t, err)
		defer fresh.Close(ctx)
		_, err = sqlfuncs.Revoke(ctx, fresh, "orders")
		require.NoError(t, err)
	})
}

// TestEveryFunctionPinsSearchPath reads the catalog: every entry point of
// the kit (every function without a leading underscore, every trigger
// function, every SECURITY DEFINER function) runs with search_path pinned to
// pg_catalog and pg_temp (last); internal helpers are never SECURITY
// DEFINER (they run inside a pinned entry point and qualify every name),
// except the three of migration 3 that a caller's rights cannot do
// (fence._guard_function creates a guard whose body is a pure function of
// its argument, fence._token_floor reads the token counter,
// fence._raise_floor moves the epoch and is for operators only), the two of
// migration 4 (fence._rows_function as fence._guard_function,
// fence._check_many locks lease rows), the two of migration 9
// (fence._lock_check locks a lease row, fence._rows9_function as
// fence._rows_function), and fence._durable since migration 5
// (a deferred trigger runs as whoever commits, and it calls
// fence._force_durable, which application roles may not call); and
// nothing is executable by PUBLIC. The exceptions to pinning are the row
// guards (migrations 002 and 003): they run with the writer's rights and
// qualify every name and operator themselves, which
// TestGuardsIgnoreAHostileSearchPath checks; and since migration 10 three
// SECURITY DEFINER functions on the hot paths, fence.acquire, fence.release
// and fence._lock_check, which qualify every name and operator too
// (TestGrantIgnoresAHostileSearchPath, TestRowGuardIgnoresAHostileSearchPath).
func TestEveryFunctionPinsSearchPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT p.oid::regprocedure::text
		  FROM pg_proc p
		 WHERE p.pronamespace = 'fence'::regnamespace
		   AND (p.proname NOT LIKE '\_%' OR p.prosecdef OR (p.prorettype = 'trigger'::regtype AND p.proname LIKE '\_guard%'))
		   AND p.oid NOT IN ('fence._guard_row()'::regprocedure, 'fence._guard_use_token()'::regprocedure,
		                     'fence.acquire(text, text, interval, boolean)'::regprocedure, 'fence.release(text, bigint)'::regprocedure,
		                     'fence._lock_check(text, bigint)'::regprocedure)
		   AND p.proname !~ '^_guard_[0-9a-f]{32}$'
		   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)`)
	require.NoError(t, err)
	unpinned, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, unpinned, "entry points without a pinned search_path")

	rows, err = b.db.Pool.Query(b.ctx, `
		SELECT p.oid::regprocedure::text FROM pg_proc p
		 WHERE p.pronamespace = 'fence'::regnamespace AND p.proname LIKE '\_%' AND p.prosecdef
		   AND p.oid NOT IN ('fence._guard_function(regclass, name)'::regprocedure, 'fence._token_floor()'::regprocedure,
		                     'fence._raise_floor(bigint)'::regprocedure, 'fence._rows_function(regclass, name, name)'::regprocedure,
		                     'fence._check_many(text[], bigint[], text, oid)'::regprocedure,
		                     'fence._durable()'::regprocedure, 'fence._refuse(text, text, text, text)'::regprocedure,
		                     'fence._check(text, bigint)'::regprocedure,
		                     'fence._lock_check(text, bigint)'::regprocedure, 'fence._rows9_function(regclass, name, name)'::regprocedure)`)
	require.NoError(t, err)
	definers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, definers, "internal helpers must not be SECURITY DEFINER")

	rows, err = b.db.Pool.Query(b.ctx, `
		SELECT p.oid::regprocedure::text
		  FROM pg_proc p
		 WHERE p.pronamespace = 'fence'::regnamespace
		   AND has_function_privilege('public', p.oid, 'EXECUTE')`)
	require.NoError(t, err)
	public, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, public, "functions executable by PUBLIC")

	var entryDefiners int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT count(*) FROM pg_proc WHERE pronamespace = 'fence'::regnamespace AND prosecdef`).Scan(&entryDefiners))
	require.Positive(t, entryDefiners)
}

// TestGuardsIgnoreAHostileSearchPath: the row guards do not pin search_path
// (migrations 002 and 003), so a writer whose search_path puts its own
// schema before pg_catalog, with operators that answer "equal" and "not
// greater" for everything, must still be refused a stale token, in
// token-column mode and with fence.use_token, also with settings that name
// another pair (migration 2's fence._checked).
func TestGuardsIgnoreAHostileSearchPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `CREATE TABLE hp_col (id int PRIMARY KEY, token bigint)`)
	b.exec(t, `CREATE TABLE hp_tx (id int PRIMARY KEY)`)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "hp_col", "hp", "token"))
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "hp_tx", "hp", ""))
	old := acquireWhenFree(t, b.ctx, b.db.Pool, "hp", "a", 20*time.Millisecond)
	b.exec(t, `INSERT INTO hp_col VALUES (1, $1)`, old)
	_, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, "hp")
	require.NoError(t, err)
	for _, sql := range []string{
		`CREATE SCHEMA evil`,
		`CREATE FUNCTION evil.yes(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION evil.yes(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT true'`,
		`CREATE FUNCTION evil.no(bigint, bigint) RETURNS boolean LANGUAGE sql AS 'SELECT false'`,
		`CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes)`,
		`CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.yes)`,
		`CREATE OPERATOR evil.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.yes)`,
		`CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.no)`,
	} {
		b.exec(t, sql)
	}
	conn, err := pgx.Connect(b.ctx, b.db.URL)
	require.NoError(t, err)
	defer conn.Close(b.ctx)
	_, err = conn.Exec(b.ctx, `SET search_path = evil, pg_catalog, public`)
	require.NoError(t, err)

	_, err = conn.Exec(b.ctx, `UPDATE hp_col SET token = $1 WHERE id = 1`, old)
	requireCode(t, err, "FN001")
	_, err = conn.Exec(b.ctx, `INSERT INTO hp_col VALUES (2, $1)`, old)
	requireCode(t, err, "FN001")

	// A marker of another pair: with the hostile "=" an unqualified compare
	// would take it for this one and skip the check.
	other := fmt.Sprintf(`SELECT set_config('fence._checked', '%d:other', true), set_config('fence.tokens', '{"hp": %d}', true)`, old+1, old)
	for _, write := range []string{fmt.Sprintf(`INSERT INTO hp_col VALUES (3, %d)`, old), `INSERT INTO hp_tx VALUES (3)`} {
		tx, err := conn.Begin(b.ctx)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, other)
		require.NoError(t, err)
		_, err = tx.Exec(b.ctx, write)
		requireCode(t, err, "FN001")
		require.NoError(t, tx.Rollback(b.ctx))
	}
}

// TestGuardFunctionsAreBoundedByTheTriggersThatUseThem is break 5 of the
// third review of 008 (issue 31): a usage role that owns an unprotected
// table renames one of its columns in a loop and calls
// fence._guard_function and fence._rows_function for each name; on 008
// each call left a function owned by the kit's owner (80 for 40 names),
// without bound. Since 009 each call drops the generated functions that no
// trigger uses but its own: at most one is left, and the guards of
// protected tables (used by their triggers) stay.
func TestGuardFunctionsAreBoundedByTheTriggersThatUseThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.exec(t, `CREATE TABLE kept (id int PRIMARY KEY, job int, tok bigint)`)
	b.exec(t, `CREATE TABLE kept_rows (id int PRIMARY KEY, job int NOT NULL, tok bigint)`)
	require.NoError(t, sqlfuncs.Protect(ctx, db, "kept", "kept", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "kept_rows", "job", "job:", "tok"))
	generated := func() int {
		t.Helper()
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_proc
			WHERE pronamespace = 'fence'::regnamespace AND proname ~ '^_(guard|rows)_[0-9a-f]{32}$'`).Scan(&n))
		return n
	}
	protected := generated()

	app := pgtest.NewRole(t, "filler")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db, app, false))
	b.exec(t, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{app}.Sanitize())
	conn := roleConn(t, b, app)
	_, err := conn.Exec(ctx, `CREATE TABLE mine (id int PRIMARY KEY, job int, c0 bigint)`)
	require.NoError(t, err)
	for i := 1; i <= 40; i++ {
		_, err := conn.Exec(ctx, fmt.Sprintf(`ALTER TABLE mine RENAME COLUMN c%d TO c%d`, i-1, i))
		require.NoError(t, err)
		col := fmt.Sprintf("c%d", i)
		_, err = conn.Exec(ctx, `SELECT fence._guard_function('mine', $1)`, col)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `SELECT fence._rows_function('mine', 'job', $1)`, col)
		require.NoError(t, err)
	}
	require.LessOrEqual(t, generated()-protected, 1, "generated functions that no trigger uses")

	// The protected tables' guards were kept and still refuse.
	_, err = db.Exec(ctx, `INSERT INTO kept VALUES (1, 1, NULL)`)
	requireCode(t, err, sqlfuncs.CodeNoToken)
	_, err = db.Exec(ctx, `INSERT INTO kept_rows VALUES (1, 1, NULL)`)
	requireCode(t, err, sqlfuncs.CodeNoToken)
}
