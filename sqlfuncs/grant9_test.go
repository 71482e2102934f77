package sqlfuncs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestAcquireFastPathAtTheCounterEnd: since 009 fence.acquire grants a
// lease whose row exists and is not live in one UPDATE that takes the next
// counter value itself. At the counter's last value that value would run
// into the token's epoch bits: the grant fails with 54000 as
// fence._next_token fails, and the lease row keeps its token.
func TestAcquireFastPathAtTheCounterEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	first := mustGrant(t, b, "x") // a revoked row: not live
	b.exec(t, `SELECT setval('fence.token_counter', $1)`, int64(maxCounter))
	_, _, err := sqlfuncs.Acquire(ctx, db, "x", "A", time.Minute)
	requireSQLState(t, err, "54000", "acquire past the counter's last value")
	var tok int64
	require.NoError(t, db.QueryRow(ctx, `SELECT token FROM fence.lease WHERE resource = 'x'`).Scan(&tok))
	require.Equal(t, first, tok)

	// One value below the end the fast path grants it.
	b.exec(t, `SELECT setval('fence.token_counter', $1)`, int64(maxCounter-1))
	got, ok, err := sqlfuncs.Acquire(ctx, db, "x", "A", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, int64(maxCounter), got&maxCounter)
	require.Equal(t, first>>43, got>>43)
}
