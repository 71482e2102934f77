package sqlfuncs_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestRefusalsCountEveryRefusedWrite (issue 22, item 3): an application role
// that was granted usage, and nothing on the kit's sequences, reads
// fence.refusals through Refusals; each refused write of its own (FN001,
// FN002, FN003), rolled back as a refusal always is, adds one to its
// SQLSTATE's count and to no other, and an accepted write adds nothing.
func TestRefusalsCountEveryRefusedWrite(t *testing.T) {
	t.Parallel()
	b, _, conn := refusalsFixture(t)
	ctx := b.ctx
	counts := func() map[string]int64 { t.Helper(); return refusalCounts(t, ctx, conn) }
	// write runs sql in a transaction of its own as the application role and
	// returns its error; a refused one is rolled back.
	write := func(sql string, args ...any) error {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // after a commit: nothing to do
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return sqlfuncs.Translate(err)
		}
		return tx.Commit(ctx)
	}

	stale, ok, err := sqlfuncs.Acquire(ctx, conn, "orders", "app", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, write(`INSERT INTO orders VALUES (1, 'accepted', $1)`, stale))
	before := counts()
	latest, err := sqlfuncs.Revoke(ctx, b.db.Pool, "orders") // the operator's; stale is stale now
	require.NoError(t, err)
	require.Equal(t, before, counts(), "an accepted write and a grant count nothing")

	steps := []struct {
		code, sql string
		token     any
		sentinel  error
	}{
		{sqlfuncs.CodeStaleToken, `UPDATE orders SET note = 'stale', fence_token = $1`, stale, sqlfuncs.ErrStaleToken},
		{sqlfuncs.CodeNoToken, `INSERT INTO orders (id, note) SELECT 2, $1::text`, "no token", sqlfuncs.ErrNoToken},
		{sqlfuncs.CodeUnknownToken, `INSERT INTO orders VALUES (3, 'forged', $1)`, latest + 1000, sqlfuncs.ErrUnknownToken},
	}
	want := before
	for _, s := range steps {
		require.ErrorIs(t, write(s.sql, s.token), s.sentinel, s.code)
		want[s.code]++
		require.Equal(t, want, counts(), "after a refusal with %s", s.code)
	}
	var rows int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&rows))
	require.Equal(t, 1, rows, "the refused writes were rolled back; their counts were not")
}

// TestRefusalsCountWritesThatTurnedReadOnlyOn is break 4 of the third
// review of 008 (issue 31): a usage role's stale or token-less write whose
// WHERE clause turns transaction_read_only on is refused, and 008 did not
// count it (fence._refuse skipped the count whenever the setting was on).
// Since 009 such a refusal is counted through an index scan of
// fence.refusal_marks, which reaches fence.refusals once the writer's
// backend reports its statistics: the test closes the writer's connection
// and waits (bounded) for the counts. Each refusal adds one to its own
// SQLSTATE only, in READ COMMITTED (FN001, FN002) and REPEATABLE READ
// (FN002: a check there fails closed first with 25006 for a token).
func TestRefusalsCountWritesThatTurnedReadOnlyOn(t *testing.T) {
	t.Parallel()
	b, app, conn := refusalsFixture(t)
	ctx := b.ctx
	counts := func() map[string]int64 { t.Helper(); return refusalCounts(t, ctx, conn) }
	stale, ok, err := sqlfuncs.Acquire(ctx, conn, "orders", "app", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = sqlfuncs.Revoke(ctx, b.db.Pool, "orders")
	require.NoError(t, err)
	before := counts()

	const ro = `pg_catalog.set_config('transaction_read_only', 'on', true) = 'on'`
	steps := []struct {
		code, iso, sql string
		args           []any
	}{
		{sqlfuncs.CodeStaleToken, "READ COMMITTED", `INSERT INTO orders SELECT 1, 'stale', $1::bigint WHERE ` + ro, []any{stale}},
		{sqlfuncs.CodeNoToken, "READ COMMITTED", `INSERT INTO orders (id, note) SELECT 2, 'none' WHERE ` + ro, nil},
		{sqlfuncs.CodeNoToken, "REPEATABLE READ", `INSERT INTO orders (id, note) SELECT 3, 'none' WHERE ` + ro, nil},
	}
	want := before
	for _, s := range steps {
		w := roleConn(t, b, app)
		tx, err := w.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(s.iso)})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, s.sql, s.args...)
		requireCode(t, err, s.code)
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, w.Close(ctx)) // the backend reports its statistics as it exits
		want[s.code]++
		deadline := time.Now().Add(15 * time.Second)
		got := counts()
		for !maps.Equal(got, want) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			got = counts()
		}
		require.Equal(t, want, got, "after a refusal with %s in a transaction turned read-only (%s)", s.code, s.iso)
	}
}

// refusalsFixture is a fresh database with table orders protected
// table-wide (resource orders, token column fence_token) and an
// application role granted usage and writes on it, with its connection.
func refusalsFixture(t *testing.T) (*bundle, string, *pgx.Conn) {
	t.Helper()
	b := setup(t)
	b.exec(t, `CREATE TABLE orders (id int, note text, fence_token bigint)`)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "orders", "orders", "fence_token"))
	app := pgtest.NewRole(t, "app")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, app, false))
	b.exec(t, `GRANT SELECT, INSERT, UPDATE ON orders TO `+pgx.Identifier{app}.Sanitize())
	return b, app, roleConn(t, b, app)
}

// refusalCounts reads fence.refusals through Refusals as a map by
// SQLSTATE, failing unless its rows are the three documented ones.
func refusalCounts(t *testing.T, ctx context.Context, conn *pgx.Conn) map[string]int64 {
	t.Helper()
	rs, err := sqlfuncs.Refusals(ctx, conn)
	require.NoError(t, err)
	m := map[string]int64{}
	var codes []string
	for _, r := range rs {
		m[r.SQLState] = r.Count
		codes = append(codes, r.SQLState+" "+r.Reason)
	}
	require.Equal(t, []string{"FN001 stale token", "FN002 no token", "FN003 token never granted"}, codes)
	return m
}
