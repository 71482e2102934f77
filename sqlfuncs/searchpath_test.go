package sqlfuncs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Since migration 10, fence.acquire, fence.release and fence._lock_check
// (the per-row guard's lock) are SECURITY DEFINER functions without a pinned
// search_path: their queries are planned with the caller's search_path, so
// anything in them looked up by name would be the caller's, run with the
// kit owner's rights. These tests give an application role a schema first
// on its search_path with a twin of every pg_catalog operator between the
// types the kit uses (same name, same argument types, so that a lookup by
// name takes the twin) whose function raises an error naming the operator
// and the role it ran as, and then use every path of those functions. A
// single unqualified operator in them, or in a SQL function they inline,
// fails the test with that error instead of the expected answer.

// hostileTypes are the argument types of the twins.
var hostileTypes = []string{
	"text", "name", "bigint", "integer", "smallint", "oid", "boolean", "numeric", "double precision",
	"timestamp with time zone", "interval", "tid", "jsonb", `"char"`, "bit",
}

// hostileSession makes schema evil with the twins (owned by role, which
// plants them) and returns a session of role whose search_path puts evil
// before pg_catalog.
func hostileSession(t *testing.T, b *bundle, role string) *pgx.Conn {
	t.Helper()
	quoted := make([]string, len(hostileTypes))
	for i, ty := range hostileTypes {
		quoted[i] = "'" + strings.ReplaceAll(ty, "'", "''") + "'::regtype"
	}
	b.exec(t, `CREATE SCHEMA evil AUTHORIZATION `+pgx.Identifier{role}.Sanitize())
	conn := roleConn(t, b, role)
	_, err := conn.Exec(b.ctx, fmt.Sprintf(`DO $$
DECLARE
    o record;
    n integer := 0;
BEGIN
    FOR o IN SELECT p.oprname, p.oprkind, p.oprleft::regtype AS l, p.oprright::regtype AS r, p.oprresult::regtype AS res
               FROM pg_catalog.pg_operator p
              WHERE p.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::regnamespace
                AND (p.oprleft OPERATOR(pg_catalog.=) 0 OR p.oprleft OPERATOR(pg_catalog.=) ANY (ARRAY[%[1]s]::oid[]))
                AND p.oprright OPERATOR(pg_catalog.=) ANY (ARRAY[%[1]s]::oid[]) LOOP
        n := n OPERATOR(pg_catalog.+) 1;
        IF o.oprkind OPERATOR(pg_catalog.=) 'l' THEN
            EXECUTE pg_catalog.format('CREATE FUNCTION evil.op%%s(%%s) RETURNS %%s LANGUAGE plpgsql AS %%L', n, o.r, o.res,
                pg_catalog.format('BEGIN RAISE EXCEPTION ''evil operator %%%% (%%s) ran as %%%%'', %%L, current_user; END', o.r, o.oprname));
            EXECUTE pg_catalog.format('CREATE OPERATOR evil.%%s (RIGHTARG = %%s, FUNCTION = evil.op%%s)', o.oprname, o.r, n);
        ELSE
            EXECUTE pg_catalog.format('CREATE FUNCTION evil.op%%s(%%s, %%s) RETURNS %%s LANGUAGE plpgsql AS %%L', n, o.l, o.r, o.res,
                pg_catalog.format('BEGIN RAISE EXCEPTION ''evil operator %%%% (%%s, %%s) ran as %%%%'', %%L, current_user; END', o.l, o.r, o.oprname));
            EXECUTE pg_catalog.format('CREATE OPERATOR evil.%%s (LEFTARG = %%s, RIGHTARG = %%s, FUNCTION = evil.op%%s)', o.oprname, o.l, o.r, n);
        END IF;
    END LOOP;
END
$$`, strings.Join(quoted, ", ")))
	require.NoError(t, err)
	var twins int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_operator WHERE oprnamespace OPERATOR(pg_catalog.=) 'evil'::regnamespace`).Scan(&twins))
	require.Greater(t, twins, 150, "twins of pg_catalog's operators")
	_, err = conn.Exec(b.ctx, `SET search_path = evil, pg_catalog, public`)
	require.NoError(t, err)
	// The twins are in force for this session: an unqualified operator runs one.
	_, err = conn.Exec(b.ctx, `SELECT 1::bigint = 1::bigint`)
	require.ErrorContains(t, err, "evil operator = (bigint, bigint) ran as")
	return conn
}

// requireNoEvil fails when err came from one of the twins.
func requireNoEvil(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "evil operator") {
		t.Fatalf("%s ran a caller's operator: %v", what, err)
	}
}

// TestGrantIgnoresAHostileSearchPath: every path of fence.acquire and
// fence.release under a hostile search_path gives the answer it gives
// without one: the first grant (fence._grant), a grant of a released lease
// (the fast path), a busy lease, a waiting caller, a TTL out of range and an
// empty name (the errors), a live session lease of another session
// (fence._session_alive), the release of a session lease and of a lease
// with waiters.
func TestGrantIgnoresAHostileSearchPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	app := pgtest.NewRole(t, "hostile")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, app, false))
	conn := hostileSession(t, b, app)
	ctx := b.ctx

	first, ok, err := sqlfuncs.Acquire(ctx, conn, "hp:a", "app", time.Minute)
	requireNoEvil(t, err, "first grant")
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = sqlfuncs.Acquire(ctx, conn, "hp:a", "other", time.Minute)
	requireNoEvil(t, err, "busy")
	require.NoError(t, err)
	require.False(t, ok, "busy")
	_, ok, err = sqlfuncs.AcquireWaiting(ctx, conn, "hp:a", "other", time.Minute)
	requireNoEvil(t, err, "waiting")
	require.NoError(t, err)
	require.False(t, ok, "busy, a waiter now")
	released, err := sqlfuncs.Release(ctx, conn, "hp:a", first)
	requireNoEvil(t, err, "release with a waiter")
	require.NoError(t, err)
	require.True(t, released)
	released, err = sqlfuncs.Release(ctx, conn, "hp:a", first)
	requireNoEvil(t, err, "release again")
	require.NoError(t, err)
	require.False(t, released)
	second, ok, err := sqlfuncs.Acquire(ctx, conn, "hp:a", "app", time.Minute)
	requireNoEvil(t, err, "fast path")
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, second, first)
	released, err = sqlfuncs.Release(ctx, conn, "hp:a", second)
	require.NoError(t, err)
	require.True(t, released)

	_, _, err = sqlfuncs.Acquire(ctx, conn, "hp:a", "app", time.Hour*48)
	requireNoEvil(t, err, "TTL out of range")
	requireCode(t, err, "22023")
	_, _, err = sqlfuncs.Acquire(ctx, conn, "", "app", time.Minute)
	requireNoEvil(t, err, "empty name")
	requireCode(t, err, "22023")
	_, err = sqlfuncs.Release(ctx, conn, "hp:a", 0)
	requireNoEvil(t, err, "token 0")
	requireCode(t, err, "22023")

	// A session lease of another session: acquire asks fence._session_alive.
	holder := roleConn(t, b, app)
	st, ok, err := sqlfuncs.AcquireSession(ctx, holder, "hp:s", "holder")
	require.NoError(t, err)
	require.True(t, ok)
	_, ok, err = sqlfuncs.Acquire(ctx, conn, "hp:s", "app", time.Minute)
	requireNoEvil(t, err, "a live session lease")
	require.NoError(t, err)
	require.False(t, ok)
	// This session's own session lease, released here (its lock unlocked).
	own, ok, err := sqlfuncs.AcquireSession(ctx, conn, "hp:own", "app")
	requireNoEvil(t, err, "session lease")
	require.NoError(t, err)
	require.True(t, ok)
	released, err = sqlfuncs.Release(ctx, conn, "hp:own", own)
	requireNoEvil(t, err, "release of a session lease")
	require.NoError(t, err)
	require.True(t, released)
	var locks int
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks
		WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()`).Scan(&locks))
	require.Zero(t, locks, "the session lease's lock went with its release")
	released, err = sqlfuncs.Release(ctx, holder, "hp:s", st)
	require.NoError(t, err)
	require.True(t, released)
}

// TestRowGuardIgnoresAHostileSearchPath: the per-row guard, whose lock
// (fence._lock_check) runs as the kit's owner, refuses a stale token and a
// missing one and accepts the current one under a hostile search_path, for
// INSERT, UPDATE (also one that moves a row to another resource) and
// DELETE, with a token column and with fence.use_token.
func TestRowGuardIgnoresAHostileSearchPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	app := pgtest.NewRole(t, "hostile")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, app, false))
	b.exec(t, `CREATE TABLE hr_col (id int PRIMARY KEY, job int NOT NULL, tok bigint)`)
	b.exec(t, `CREATE TABLE hr_reg (id int PRIMARY KEY, job int NOT NULL)`)
	b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON hr_col, hr_reg TO `+pgx.Identifier{app}.Sanitize())
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "hr_col", "job", "hr:", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "hr_reg", "job", "hr:", ""))
	old1, ok, err := sqlfuncs.Acquire(ctx, b.db.Pool, "hr:1", "app", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	old2, ok, err := sqlfuncs.Acquire(ctx, b.db.Pool, "hr:2", "app", time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	b.exec(t, `INSERT INTO hr_col VALUES (1, 1, $1), (2, 1, $1), (3, 1, $1)`, old1)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.UseToken(ctx, tx, "hr:1", old1))
	_, err = tx.Exec(ctx, `INSERT INTO hr_reg VALUES (1, 1), (2, 1), (3, 1)`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	new1, err := sqlfuncs.Revoke(ctx, b.db.Pool, "hr:1")
	require.NoError(t, err)
	conn := hostileSession(t, b, app)

	// write runs sql on the hostile session in a statement of its own.
	write := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	// registered sets fence.tokens by hand (as fence.use_token would, without
	// its check) and runs sql in one transaction, rolled back.
	registered := func(tokens map[string]int64, sql string, args ...any) error {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		var parts []string
		for r, tok := range tokens {
			parts = append(parts, fmt.Sprintf("%q: %d", r, tok))
		}
		_, err = tx.Exec(ctx, `SELECT pg_catalog.set_config('fence.tokens', $1, true)`, "{"+strings.Join(parts, ", ")+"}")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, sql, args...)
		return err
	}
	for _, c := range []struct {
		what string
		err  error
		code string
	}{
		{"UPDATE, stale token", write(`UPDATE hr_col SET tok = $1 WHERE id OPERATOR(pg_catalog.=) 1`, old1), sqlfuncs.CodeStaleToken},
		{"INSERT, stale token", write(`INSERT INTO hr_col VALUES (4, 1, $1)`, old1), sqlfuncs.CodeStaleToken},
		{"UPDATE, no token", write(`UPDATE hr_col SET id = 5 WHERE id OPERATOR(pg_catalog.=) 2`), sqlfuncs.CodeNoToken},
		{"DELETE, stale registered token", registered(map[string]int64{"hr:1": old1}, `DELETE FROM hr_col WHERE id OPERATOR(pg_catalog.=) 3`), sqlfuncs.CodeStaleToken},
		{"DELETE, use_token table, stale", registered(map[string]int64{"hr:1": old1}, `DELETE FROM hr_reg WHERE id OPERATOR(pg_catalog.=) 3`), sqlfuncs.CodeStaleToken},
		{"INSERT, use_token table, stale", registered(map[string]int64{"hr:1": old1}, `INSERT INTO hr_reg VALUES (4, 1)`), sqlfuncs.CodeStaleToken},
		{"UPDATE moving a row off a stale resource", registered(map[string]int64{"hr:1": old1, "hr:2": old2}, `UPDATE hr_reg SET job = 2 WHERE id OPERATOR(pg_catalog.=) 1`), sqlfuncs.CodeStaleToken},
		{"UPDATE moving a row with its token column", registered(map[string]int64{"hr:1": old1}, `UPDATE hr_col SET job = 2, tok = $1 WHERE id OPERATOR(pg_catalog.=) 1`, old2), sqlfuncs.CodeStaleToken},
	} {
		requireNoEvil(t, c.err, c.what)
		requireCode(t, c.err, c.code)
	}
	for what, err := range map[string]error{
		"UPDATE, current token":             write(`UPDATE hr_col SET tok = $1 WHERE id OPERATOR(pg_catalog.=) 1`, new1),
		"INSERT, current token":             write(`INSERT INTO hr_col VALUES (4, 1, $1)`, new1),
		"DELETE, current registered token":  registered(map[string]int64{"hr:1": new1}, `DELETE FROM hr_col WHERE id OPERATOR(pg_catalog.=) 3`),
		"UPDATE moving a row, both current": registered(map[string]int64{"hr:1": new1, "hr:2": old2}, `UPDATE hr_reg SET job = 2 WHERE id OPERATOR(pg_catalog.=) 1`),
		"INSERT, use_token table, current":  registered(map[string]int64{"hr:1": new1}, `INSERT INTO hr_reg VALUES (4, 1)`),
	} {
		requireNoEvil(t, err, what)
		require.NoError(t, err, what)
	}
}
