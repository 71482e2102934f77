package sqlfuncs_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

const (
	maxCounter  = 1<<43 - 1
	maxEpoch    = 1<<20 - 1
	counterMove = 1 << 32
)

// requireSQLState fails unless err carries SQLSTATE code.
func requireSQLState(t *testing.T, err error, code, what string) *pgconn.PgError {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%s: want SQLSTATE %s, got %v", what, code, err)
	require.Equal(t, code, pgErr.Code, "%s: %v", what, err)
	return pgErr
}

// TestTokenBudgetSaysWhatIsLeft (issue 32, the counter's budget): a role
// with usage reads fence.token_budget() through TokenBudget; after each
// grant its figures are those of the token just granted (epoch, counter)
// and of the layout (epochs, grants and moves of 2^32 left).
func TestTokenBudgetSaysWhatIsLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	app := pgtest.NewRole(t, "app")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, app, false))
	conn := roleConn(t, b, app)
	for i := range 3 {
		tok, ok, err := sqlfuncs.Acquire(ctx, conn, fmt.Sprintf("budget/%d", i), "app", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		got, err := sqlfuncs.TokenBudget(ctx, conn)
		require.NoError(t, err)
		epoch, counter := tok>>43, tok&maxCounter
		require.Equal(t, sqlfuncs.Budget{
			Epoch: epoch, EpochsLeft: maxEpoch - epoch,
			Counter: counter, GrantsLeft: maxCounter - counter,
			CounterMovesLeft: (maxCounter - 1 - counter) / counterMove,
			ReadsBackupLabel: true, // the harness migrates as a superuser
		}, got, "after token %d", tok)
		require.EqualValues(t, 2047, got.CounterMovesLeft, "a fresh install has room for 2047 crash restarts")
	}
}

// TestExhaustedTokenSpaceIsAnError (issue 31, break 2; issue 32): where the
// counter has no room left for a move past a crash restart, the first grant
// after the restart (here: the cache's file emptied as crash recovery
// empties it) fails with SQLSTATE 54000 and moves nothing; a counter at its
// last value fails the next grant the same way; and an epoch past the last
// fails a restore's first grant. Never a wrapped or repeated token.
func TestExhaustedTokenSpaceIsAnError(t *testing.T) {
	t.Parallel()
	t.Run("no room for a move past a crash", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, db := b.ctx, b.db.Pool
		first := mustGrant(t, b, "x") // settles the epoch (the database is a template copy)
		near := int64(maxCounter - counterMove)
		b.exec(t, `SELECT setval('fence.token_counter', $1)`, near)
		got, err := sqlfuncs.TokenBudget(ctx, db)
		require.NoError(t, err)
		require.Zero(t, got.CounterMovesLeft)
		require.Equal(t, int64(counterMove), got.GrantsLeft)
		b.exec(t, `TRUNCATE fence.epoch_cache`) // an empty file, as after crash recovery
		_, err = sqlfuncs.Revoke(ctx, db, "x")
		pgErr := requireSQLState(t, err, "54000", "grant after a crash without room for the move")
		require.Contains(t, pgErr.Message, "token counter is exhausted")
		var last int64
		require.NoError(t, db.QueryRow(ctx, `SELECT last_value FROM fence.token_counter`).Scan(&last))
		require.Equal(t, near, last, "the failed grant moved nothing")
		var tok int64
		require.NoError(t, db.QueryRow(ctx, `SELECT token FROM fence.lease WHERE resource = 'x'`).Scan(&tok))
		require.Equal(t, first, tok)
	})
	t.Run("the counter's last value", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mustGrant(t, b, "x")
		b.exec(t, `SELECT setval('fence.token_counter', $1)`, int64(maxCounter))
		got, err := sqlfuncs.TokenBudget(b.ctx, b.db.Pool)
		require.NoError(t, err)
		require.Zero(t, got.GrantsLeft)
		_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "x")
		requireSQLState(t, err, "54000", "grant past the counter's last value")
	})
	t.Run("the last epoch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mustGrant(t, b, "x")
		b.exec(t, `UPDATE fence.epoch_state SET base = $1 - timeline`, int64(maxEpoch))
		got, err := sqlfuncs.TokenBudget(b.ctx, b.db.Pool)
		require.NoError(t, err)
		require.Equal(t, sqlfuncs.Budget{Epoch: maxEpoch, EpochsLeft: 0, Counter: got.Counter,
			GrantsLeft: got.GrantsLeft, CounterMovesLeft: got.CounterMovesLeft, ReadsBackupLabel: true}, got)
		b.exec(t, `DELETE FROM fence.origin`) // the documented step after a restore: a new epoch
		_, err = sqlfuncs.Revoke(b.ctx, b.db.Pool, "x")
		pgErr := requireSQLState(t, err, "54000", "grant past the last epoch")
		require.Contains(t, pgErr.Message, "epochs are exhausted")
	})
}

func mustGrant(t *testing.T, b *bundle, res string) int64 {
	t.Helper()
	tok, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, res)
	require.NoError(t, err)
	require.Positive(t, tok)
	return tok
}

// TestTokenBudgetSaysWhetherTheOwnerReadsTheBackupLabel: a kit installed by
// an owner that is not a superuser cannot read backup_label.old
// (reads_backup_label false: a base backup started without recovery then
// needs DELETE FROM fence.origin, docs/sql.md "Epoch"); once a superuser
// grants that owner EXECUTE on pg_read_file it can.
func TestTokenBudgetSaysWhetherTheOwnerReadsTheBackupLabel(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Empty(t)
	owner := pgtest.NewRole(t, "kitowner")
	ownerID := pgx.Identifier{owner}.Sanitize()
	for _, sql := range []string{
		`GRANT CREATE ON DATABASE ` + pgx.Identifier{db.Name}.Sanitize() + ` TO ` + ownerID,
		`GRANT CREATE ON SCHEMA public TO ` + ownerID,
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	own, err := pgxpool.New(ctx, db.URLAs(owner))
	require.NoError(t, err)
	t.Cleanup(own.Close)
	require.NoError(t, gofence.Migrate(ctx, own))
	got, err := sqlfuncs.TokenBudget(ctx, own)
	require.NoError(t, err)
	require.False(t, got.ReadsBackupLabel)
	_, err = db.Pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION pg_read_file(text, bigint, bigint, boolean) TO `+ownerID)
	require.NoError(t, err)
	got, err = sqlfuncs.TokenBudget(ctx, own)
	require.NoError(t, err)
	require.True(t, got.ReadsBackupLabel)
}
