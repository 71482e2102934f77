package sqlfuncs_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestBadInput calls every function with every kind of bad argument, through
// plain SQL so that NULLs can be passed, and asserts the SQLSTATE. Each error
// must also carry a hint that says what to do.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.exec(t, `CREATE TABLE t (id int, tok bigint, small int, label text)`)
	b.exec(t, `CREATE VIEW v AS SELECT * FROM t`)
	b.exec(t, `CREATE TABLE parted (id int, tok bigint) PARTITION BY RANGE (id)`)
	b.exec(t, `CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100)`)
	b.exec(t, `CREATE TABLE parent (id int, tok bigint)`)
	b.exec(t, `CREATE TABLE child () INHERITS (parent)`)
	tok, ok, err := sqlfuncs.Acquire(ctx, db, "r", "h", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	long := strings.Repeat("é", 256)
	max := strings.Repeat("é", 255)
	cases := []struct {
		name, sql string
		args      []any
		code      string
	}{
		{"acquire: NULL resource", `SELECT fence.acquire(NULL, 'h', '1s')`, nil, "22004"},
		{"acquire: empty resource", `SELECT fence.acquire('', 'h', '1s')`, nil, "22023"},
		{"acquire: resource over 255 characters", `SELECT fence.acquire($1, 'h', '1s')`, []any{long}, "22001"},
		{"acquire: NULL holder", `SELECT fence.acquire('x', NULL, '1s')`, nil, "22004"},
		{"acquire: empty holder", `SELECT fence.acquire('x', '', '1s')`, nil, "22023"},
		{"acquire: holder over 255 characters", `SELECT fence.acquire('x', $1, '1s')`, []any{long}, "22001"},
		{"acquire: NULL ttl", `SELECT fence.acquire('x', 'h', NULL)`, nil, "22004"},
		{"acquire: zero ttl", `SELECT fence.acquire('x', 'h', '0s')`, nil, "22023"},
		{"acquire: negative ttl", `SELECT fence.acquire('x', 'h', '-5s')`, nil, "22023"},
		{"acquire: ttl below 10ms", `SELECT fence.acquire('x', 'h', '9 milliseconds')`, nil, "22023"},
		{"acquire: ttl over a day", `SELECT fence.acquire('x', 'h', '1 day 1 second')`, nil, "22023"},
		{"acquire: ttl of a month", `SELECT fence.acquire('x', 'h', '1 month')`, nil, "22023"},
		{"acquire: ttl of 1000 months less 29999 days (436 days)", `SELECT fence.acquire('x', 'h', '1000 months -29999 days')`, nil, "22023"},
		{"acquire: ttl of -1000 months plus 30001 days (negative)", `SELECT fence.acquire('x', 'h', '-1000 months 30001 days')`, nil, "22023"},
		{"acquire: fence.grant_wait of zero", `SELECT set_config('fence.grant_wait', '0', true), fence.acquire('gw', 'h', '1s')`, nil, "22023"},
		{"acquire: fence.grant_wait that is no interval", `SELECT set_config('fence.grant_wait', 'soon', true), fence.acquire('gw', 'h', '1s')`, nil, "22023"},
		{"acquire_session: NULL resource", `SELECT fence.acquire_session(NULL, 'h')`, nil, "22004"},
		{"acquire_session: empty holder", `SELECT fence.acquire_session('x', '')`, nil, "22023"},
		{"renew: NULL token", `SELECT fence.renew('r', NULL, '1s')`, nil, "22004"},
		{"renew: zero token", `SELECT fence.renew('r', 0, '1s')`, nil, "22023"},
		{"renew: negative token", `SELECT fence.renew('r', -1, '1s')`, nil, "22023"},
		{"renew: absurd ttl", `SELECT fence.renew('r', $1, '10 years')`, []any{tok}, "22023"},
		{"renew: NULL resource", `SELECT fence.renew(NULL, $1, '1s')`, []any{tok}, "22004"},
		{"release: NULL token", `SELECT fence.release('r', NULL)`, nil, "22004"},
		{"release: negative token", `SELECT fence.release('r', -9223372036854775808)`, nil, "22023"},
		{"release: empty resource", `SELECT fence.release('', 1)`, nil, "22023"},
		{"revoke: NULL resource", `SELECT fence.revoke(NULL)`, nil, "22004"},
		{"revoke: resource over 255 characters", `SELECT fence.revoke($1)`, []any{long}, "22001"},
		{"check: NULL resource", `SELECT fence.check(NULL, 1)`, nil, "22004"},
		{"check: NULL token", `SELECT fence.check('r', NULL)`, nil, "FN002"},
		{"check: zero token", `SELECT fence.check('r', 0)`, nil, "FN003"},
		{"check: max token", `SELECT fence.check('r', 9223372036854775807)`, nil, "FN003"},
		{"use_token: NULL token", `SELECT fence.use_token('r', NULL)`, nil, "FN002"},
		{"use_token: empty resource", `SELECT fence.use_token('', 1)`, nil, "22023"},
		{"protect: NULL table", `SELECT fence.protect(NULL, 'r')`, nil, "22004"},
		{"protect: unknown table", `SELECT fence.protect('nope', 'r')`, nil, "42P01"},
		{"protect: unknown table OID", `SELECT fence.protect(987654321::oid::regclass, 'r')`, nil, "42P01"},
		{"protect: a view", `SELECT fence.protect('v', 'r')`, nil, "42809"},
		{"protect: a partitioned table", `SELECT fence.protect('parted', 'r', 'tok')`, nil, "42809"},
		{"protect: a partition (writes through the parent would skip its statement guard)", `SELECT fence.protect('parted_1', 'r')`, nil, "42809"},
		{"protect: an inheritance parent", `SELECT fence.protect('parent', 'r')`, nil, "42809"},
		{"protect: an inheritance child", `SELECT fence.protect('child', 'r', 'tok')`, nil, "42809"},
		{"protect: NULL resource", `SELECT fence.protect('t', NULL)`, nil, "22004"},
		{"protect: empty resource", `SELECT fence.protect('t', '')`, nil, "22023"},
		{"protect: unknown column", `SELECT fence.protect('t', 'r', 'nope')`, nil, "42703"},
		{"protect: text token column", `SELECT fence.protect('t', 'r', 'label')`, nil, "42804"},
		{"protect: integer token column (too small for tokens)", `SELECT fence.protect('t', 'r', 'small')`, nil, "42804"},
		{"protect: system column", `SELECT fence.protect('t', 'r', 'xmin')`, nil, "42703"},
		{"protect: injection in the table name", `SELECT fence.protect('t; DROP TABLE t', 'r')`, nil, "42602"},
		{"unprotect: NULL table", `SELECT fence.unprotect(NULL)`, nil, "22004"},
		{"unprotect: unknown table", `SELECT fence.unprotect('nope')`, nil, "42P01"},
		{"unprotect: unknown table OID", `SELECT fence.unprotect(987654321::oid::regclass)`, nil, "42P01"},
		{"lock_key: NULL", `SELECT fence.lock_key(NULL)`, nil, "22004"},
		{"lock_key: empty", `SELECT fence.lock_key('')`, nil, "22023"},
		{"try_lock: over 255 characters", `SELECT fence.try_lock($1)`, []any{long}, "22001"},
		{"unlock: NULL", `SELECT fence.unlock(NULL)`, nil, "22004"},
		{"try_xact_lock: empty", `SELECT fence.try_xact_lock('')`, nil, "22023"},
		{"grant_usage: NULL role", `SELECT fence.grant_usage(NULL)`, nil, "22004"},
		{"grant_usage: unknown role", `SELECT fence.grant_usage('no_such_role_pgfence')`, nil, "42704"},
		{"revoke_usage: NULL role", `SELECT fence.revoke_usage(NULL)`, nil, "22004"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := db.Exec(ctx, c.sql, c.args...)
			requireCode(t, err, c.code)
		})
	}

	t.Run("the limits themselves are accepted", func(t *testing.T) {
		_, ok, err := sqlfuncs.Acquire(ctx, db, max, max, 10*time.Millisecond)
		require.NoError(t, err)
		require.True(t, ok)
		_, ok, err = sqlfuncs.Acquire(ctx, db, "day", "h", 24*time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
	})
	t.Run("bad input changed nothing", func(t *testing.T) {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM fence.leases WHERE resource NOT IN ('r', 'day', $1)`, max).Scan(&n))
		require.Zero(t, n)
		var triggers int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = 't'::regclass`).Scan(&triggers))
		require.Zero(t, triggers)
	})
	t.Run("errors say what to do", func(t *testing.T) {
		_, _, err := sqlfuncs.Acquire(ctx, db, "", "h", time.Second)
		require.ErrorContains(t, err, "resource must not be empty")
		requireHint(t, err)
		err = sqlfuncs.Check(ctx, db, "r", tok-1)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken)
		require.ErrorContains(t, err, "acquire the lease again")
		require.ErrorContains(t, err, "latest=")
	})
}

// requireHint asserts that err is a PostgreSQL error with a HINT.
func requireHint(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "not a PostgreSQL error: %v", err)
	require.NotEmpty(t, pgErr.Hint, "no hint on %q", pgErr.Message)
}
