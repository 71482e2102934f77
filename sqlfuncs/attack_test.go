package sqlfuncs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// shadowText makes the unqualified type name "text" mean a type of the
// session's own: a temporary range type pg_temp.text (the temporary schema
// is searched for type names before pg_catalog unless search_path lists it),
// with casts from and to pg_catalog.text and to jsonb. The cast back to
// pg_catalog.text answers `mine` for the string 'res', and the string itself
// for anything else. It needs no privilege beyond TEMP on the database, which
// PUBLIC has by default, and no change of search_path.
// (The lower bound is read through a multirange, PostgreSQL 14+: lower($1)
// would pick lower(text) through the implicit cast below and recurse. On 13
// it is read from the range's text form, exact for plain names like these.)
func shadowText(mine string, version int) []string {
	low := `pg_catalog.lower(pg_catalog.multirange($1))`
	if version < 140000 {
		low = `pg_catalog.split_part(pg_catalog.substr(pg_catalog.textin(pg_catalog.range_out($1)), 2), ',', 1)`
	}
	return []string{
		`CREATE TYPE pg_temp.text AS RANGE (subtype = pg_catalog.text)`,
		`CREATE FUNCTION pg_temp.t_in(pg_catalog.text) RETURNS pg_temp.text LANGUAGE sql IMMUTABLE
		   AS $$ SELECT pg_temp.text($1, $1, '[]') $$`,
		fmt.Sprintf(`CREATE FUNCTION pg_temp.t_out(pg_temp.text) RETURNS pg_catalog.text LANGUAGE sql IMMUTABLE
		   AS $$ SELECT CASE WHEN %s OPERATOR(pg_catalog.=) 'res' THEN '%s' ELSE %s END $$`, low, mine, low),
		fmt.Sprintf(`CREATE FUNCTION pg_temp.t_js(pg_temp.text) RETURNS pg_catalog.jsonb LANGUAGE sql IMMUTABLE
		   AS $$ SELECT %s::pg_catalog.jsonb $$`, low),
		`CREATE CAST (pg_catalog.text AS pg_temp.text) WITH FUNCTION pg_temp.t_in(pg_catalog.text) AS ASSIGNMENT`,
		`CREATE CAST (pg_temp.text AS pg_catalog.text) WITH FUNCTION pg_temp.t_out(pg_temp.text) AS IMPLICIT`,
		`CREATE CAST (pg_temp.text AS pg_catalog.jsonb) WITH FUNCTION pg_temp.t_js(pg_temp.text)`,
	}
}

// TestShadowedTextTypeRedirectsTheGuard: the generated row guards declare
// their variables with the unqualified type name "text" (res, reg), which
// PL/pgSQL resolves through the writer's search_path when it compiles the
// guard in the writer's session. A stale holder with the kit's usage and
// table privileges only (no TRIGGER, not the owner) shadows "text" with a
// temporary type whose cast to pg_catalog.text turns the resource name
// 'res' into another resource it holds itself: the guard then takes that
// resource's gate and compares the presented token with that resource's
// latest grant. The stale holder writes both tables with the token of its
// own, unrelated resource, never presenting res's latest token.
func TestShadowedTextTypeRedirectsTheGuard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, t2 := staleStory(t, b, "res")
	holder := pgtest.NewRole(t, "stale")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, holder, false))
	b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON cols, plain TO `+pgx.Identifier{holder}.Sanitize())
	conn, err := pgx.Connect(b.ctx, b.db.URLAs(holder))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(b.ctx)) })

	// Any role with usage may take a lease on a resource of its own.
	mine := acquireWhenFree(t, b.ctx, conn, "mine", "attacker", time.Hour)
	require.Greater(t, mine, t2)
	for _, s := range shadowText("mine", serverVersion(t, b.ctx, b.db.Pool)) {
		_, err := conn.Exec(b.ctx, s)
		require.NoError(t, err, s)
	}

	// Token-column mode: assigning the token of resource "mine".
	t.Run("token column", func(t *testing.T) {
		_, err := conn.Exec(b.ctx, `UPDATE cols SET val = 'stale', tok = $1 WHERE id = 1`, mine)
		requireCode(t, err, "FN003")
	})

	// use_token mode: fence.use_token of resource "mine".
	t.Run("use_token", func(t *testing.T) {
		err := pgx.BeginFunc(b.ctx, conn, func(tx pgx.Tx) error {
			if err := sqlfuncs.UseToken(b.ctx, tx, "mine", mine); err != nil {
				return err
			}
			_, err := tx.Exec(b.ctx, `UPDATE plain SET val = 'stale' WHERE id = 1`)
			return err
		})
		requireCode(t, err, "FN002")
	})

	require.Equal(t, fmt.Sprintf("1:B:%d,2:B:%d", t2, t2), b.rows(t, "cols"))
	require.Equal(t, "1:B:,2:B:", b.rows(t, "plain"))
}

// TestForeignAdvisoryLockOnAGate: advisory locks are open to every role
// that can connect, and the key of a resource's gate is documented
// (docs/design.md), so a role without any kit privilege can hold a gate.
// That costs liveness only: grants of that resource report busy after
// fence.grant_wait, guarded writers wait, and no stale write gets through;
// when the lock goes, grants work again. docs/security.md says what an
// operator can do about it.
func TestForeignAdvisoryLockOnAGate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db
	const res = "gate/victim"
	_, err := db.Pool.Exec(ctx, `CREATE TABLE gated (tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "gated", res, "tok"))
	old, ok, err := sqlfuncs.Acquire(ctx, db.Pool, res, "h1", 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.EventuallyWithT(t, func(c *assert.CollectT) { // the lease expires, by the server's clock
		var live bool
		if assert.NoError(c, db.Pool.QueryRow(ctx, `SELECT live FROM fence.leases WHERE resource = $1`, res).Scan(&live)) {
			assert.False(c, live)
		}
	}, 10*time.Second, 10*time.Millisecond)

	stranger := pgtest.NewRole(t, "stranger") // no fence.grant_usage at all
	sc, err := pgx.Connect(ctx, db.URLAs(stranger))
	require.NoError(t, err)
	defer sc.Close(ctx)
	// The gate key computed from the documented formula with built-ins only.
	var held bool
	require.NoError(t, sc.QueryRow(ctx, `SELECT pg_try_advisory_lock((hashtextextended($1, 0) & 2305843009213693951) | 2305843009213693952)`,
		res).Scan(&held))
	require.True(t, held)

	c := db.Conn(t)
	_, err = c.Exec(ctx, `SET fence.grant_wait = '100ms'`)
	require.NoError(t, err)
	start := time.Now()
	_, ok, err = sqlfuncs.Acquire(ctx, c, res, "h2", time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "the grant reports the resource busy")
	require.Less(t, time.Since(start), 5*time.Second, "bounded by fence.grant_wait")

	_, err = c.Exec(ctx, `SET lock_timeout = '100ms'`)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `INSERT INTO gated VALUES ($1)`, old)
	// A writer waits for the gate and gives up at its lock_timeout; it never
	// writes unchecked.
	requireCode(t, err, "55P03")
	_, err = c.Exec(ctx, `RESET lock_timeout`)
	require.NoError(t, err)

	_, err = sc.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	tok, ok, err := sqlfuncs.Acquire(ctx, c, res, "h2", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, tok, old)
	_, err = c.Exec(ctx, `INSERT INTO gated VALUES ($1)`, old)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
}
