package integration

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestUpgradeFrom004ToSmallPieces: migration 5 rebuilds fence._grant over
// small helpers, sends fence.renew and the commit-time fence._durable through
// one synchronous_commit helper and names the last constraint PostgreSQL had
// named. On a database in use at version 4 (an application role with usage
// that runs with synchronous_commit = off, a table protected per row, a TTL
// lease and a session lease) the leases stay valid across the upgrade and
// later grants go above them; the application role grants, renews and
// releases (its commits run fence._durable, which now calls a helper the
// role has no EXECUTE on); and the down gives back exactly version 4's
// functions, privileges and constraint names, after which the role still
// grants and a second upgrade applies. Migration 6 then replaces two pieces
// under the same session, and its down gives back version 5.
func TestUpgradeFrom004ToSmallPieces(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	app := pgtest.NewRole(t, "app")
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 4))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	_, err := db.Pool.Exec(ctx, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{app}.Sanitize())
	require.NoError(t, err)
	appConn := connect(t, ctx, db.URLAs(app), true)
	acquire := func(res string) int64 {
		t.Helper()
		tok, ok, err := sqlfuncs.Acquire(ctx, appConn, res, "app", time.Hour)
		require.NoError(t, err)
		require.True(t, ok, res)
		return tok
	}

	_, err = appConn.Exec(ctx, `CREATE TABLE job (id int PRIMARY KEY, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, appConn, "job", "id", "job:", "tok"))
	j1 := acquire("job:1")
	_, err = appConn.Exec(ctx, `INSERT INTO job VALUES (1, $1)`, j1)
	require.NoError(t, err)
	sess, ok, err := sqlfuncs.AcquireSession(ctx, appConn, "singleton", "app")
	require.NoError(t, err)
	require.True(t, ok)
	v4 := kitCatalog(t, ctx, db.Pool)
	require.Contains(t, v4, "constraint epoch_state_one_check CHECK (one)", "the name PostgreSQL gave in 001")

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 5))
	v, err := sqlfuncs.Version(ctx, appConn)
	require.NoError(t, err)
	require.Equal(t, 5, v)
	v5 := kitCatalog(t, ctx, db.Pool)
	require.Contains(t, v5, "constraint epoch_state_one_row CHECK (one)")
	require.NotContains(t, v5, "epoch_state_one_check")

	// The leases granted at version 4 are still the latest.
	_, err = appConn.Exec(ctx, `UPDATE job SET tok = $1 WHERE id = 1`, j1)
	require.NoError(t, err)
	_, ok, err = sqlfuncs.Renew(ctx, appConn, "job:1", j1, time.Hour)
	require.NoError(t, err)
	require.True(t, ok, "the TTL lease renews across the upgrade")
	// A grant as the application role commits (fence._durable ran) and is
	// above every earlier token.
	j2 := acquire("job:2")
	require.Greater(t, j2, max(j1, sess))
	_, err = appConn.Exec(ctx, `INSERT INTO job VALUES (2, $1)`, j2)
	require.NoError(t, err)
	_, err = appConn.Exec(ctx, `UPDATE job SET tok = $1 WHERE id = 2`, j1)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken, "job:1's token is stale for job:2")
	// A grant inside the application's own transaction, with synchronous
	// commit turned off after it, commits too.
	require.NoError(t, pgx.BeginFunc(ctx, appConn, func(tx pgx.Tx) error {
		_, ok, err := sqlfuncs.Acquire(ctx, tx, "job:3", "app", time.Hour)
		require.True(t, ok)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
		return err
	}))
	released, err := sqlfuncs.Release(ctx, appConn, "singleton", sess)
	require.NoError(t, err)
	require.True(t, released, "the session lease taken at version 4 is released at version 5")

	// Down: exactly version 4 again.
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 4))
	require.Equal(t, v4, kitCatalog(t, ctx, db.Pool), "the down restores version 4's functions, privileges and constraint names")
	j4 := acquire("job:4")
	require.Greater(t, j4, j2)

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 5))
	require.Equal(t, v5, kitCatalog(t, ctx, db.Pool), "a second upgrade gives the same schema")
	j5 := acquire("job:5")
	require.Greater(t, j5, j4)

	// Migration 6 replaces two of the pieces (fence._system_identifier and
	// fence._state_epoch) under the same open session, whose cached plans
	// inlined the old fence._state_epoch: grants go on above, and its down
	// gives back version 5.
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 6))
	j6 := acquire("job:6")
	require.Greater(t, j6, j5)
	require.Equal(t, epochOf(j5), epochOf(j6), "no restore here: the epoch stays")
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 5))
	require.Equal(t, v5, kitCatalog(t, ctx, db.Pool), "the down of 6 restores version 5")
	require.Greater(t, acquire("job:7"), j6)
}
