package integration

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestProtectRefusesTheKitsOwnTables: fence.protect run by the kit's owner
// (or a superuser) on fence.lease installs the guard triggers on the kit's
// own table; from then on every grant updates fence.lease, the guard checks
// a token the lease row does not carry for the guard's resource, and every
// fence.acquire fails (FN003) until someone runs fence.unprotect. Found by
// FuzzProtectNames's seed corpus when run as the owner; protect now refuses
// the tables of schema fence.
func TestProtectRefusesTheKitsOwnTables(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	ctx := t.Context()
	err := sqlfuncs.Protect(ctx, db.Pool, "fence.lease", "r", "token")
	require.Error(t, err, "protect must refuse the kit's own lease table")
	_, ok, err := sqlfuncs.Acquire(ctx, db.Pool, "x", "h", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
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
	db := pgtest.Setup(t)
	ctx := t.Context()
	const res = "gate/victim"
	_, err := db.Pool.Exec(ctx, `CREATE TABLE gated (tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "gated", res, "tok"))
	old, ok, err := sqlfuncs.Acquire(ctx, db.Pool, res, "h1", 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool { // the lease expires, by the server's clock
		var live bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT live FROM fence.leases WHERE resource = $1`, res).Scan(&live))
		return !live
	}, 10*time.Second, 10*time.Millisecond)

	stranger := pgtest.NewRole(t, "stranger") // no fence.grant_usage at all
	sc := connect(t, ctx, db.URLAs(stranger), false)
	// The gate key computed from the documented formula with built-ins only.
	var held bool
	require.NoError(t, sc.QueryRow(ctx, `SELECT pg_try_advisory_lock((hashtextextended($1, 0) & 2305843009213693951) | 2305843009213693952)`,
		res).Scan(&held))
	require.True(t, held)

	c := connect(t, ctx, db.URL, false)
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
	require.Equal(t, "55P03", sqlState(err), "a writer waits for the gate and gives up at its lock_timeout; it never writes unchecked")
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
