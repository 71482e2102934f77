package integration

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// errRollback ends a pgx.BeginFunc that got through, so that its writes are
// rolled back.
var errRollback = errors.New("rolled back on purpose")

// TestUpgradeFrom007ToSecondReview: migration 8 on a database in use at
// version 7: a table-wide and a per-row table whose token column is part of a
// foreign key with ON UPDATE CASCADE (the red team's composite key), a
// use_token table, an application role granted usage at version 7, a TTL and
// a session lease. The leases stay valid; the guard functions 007 generated
// get the new bodies in place, so the cascade that presented the rows' own
// token at version 7 (shown first, on the same tables) is refused after the
// upgrade without protecting anything again; the role granted usage before
// reads fence.refusals, which counts the refusal; fence.leases has
// expires_in. The down gives back exactly version 7's catalog, and a second
// upgrade the same version 8.
func TestUpgradeFrom007ToSecondReview(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	db := pgtest.Empty(t)
	app := pgtest.NewRole(t, "app")
	super := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 7))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, db.Pool, app, false))
	appID := pgx.Identifier{app}.Sanitize()
	for _, s := range []string{
		`CREATE TABLE par (id int PRIMARY KEY, tok bigint, UNIQUE (id, tok))`,
		`CREATE TABLE kid (id int PRIMARY KEY, pid int, tok bigint,
		   FOREIGN KEY (pid, tok) REFERENCES par (id, tok) ON UPDATE CASCADE)`,
		`CREATE TABLE job (id int PRIMARY KEY, job int NOT NULL, pid int, tok bigint,
		   FOREIGN KEY (pid, tok) REFERENCES par (id, tok) ON UPDATE CASCADE)`,
		`CREATE TABLE note (id int PRIMARY KEY)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON par, kid, job, note TO ` + appID,
	} {
		super(s)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "kid", "kids", "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, db.Pool, "job", "job", "job:", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, db.Pool, "note", "kids", ""))

	appConn := connect(t, ctx, db.URLAs(app), false)
	acquire := func(res string) int64 {
		t.Helper()
		tok, ok, err := sqlfuncs.Acquire(ctx, appConn, res, "app", time.Hour)
		require.NoError(t, err)
		require.True(t, ok, res)
		return tok
	}
	tk, tj := acquire("kids"), acquire("job:1")
	super(`INSERT INTO par VALUES (1, $1), (2, $2)`, tk, tj)
	super(`INSERT INTO kid VALUES (1, 1, $1)`, tk)
	super(`INSERT INTO job VALUES (1, 1, 2, $1)`, tj)
	su := connect(t, ctx, db.URL, false)
	require.NoError(t, writeWithToken(ctx, su, "kids", tk, `INSERT INTO note VALUES (1)`))
	sess, ok, err := sqlfuncs.AcquireSession(ctx, appConn, "singleton", "app")
	require.NoError(t, err)
	require.True(t, ok)

	// At version 7 the cascade presents the rows' own tokens: the writer
	// names none and the children are rewritten (rolled back here).
	cascade := func() error {
		return pgx.BeginFunc(ctx, appConn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE par SET id = id + 10`); err != nil {
				return err
			}
			return errRollback
		})
	}
	require.ErrorIs(t, cascade(), errRollback, "the hole 008 closes, open at version 7")
	v7 := kitCatalog(t, ctx, db.Pool)

	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
	v, err := sqlfuncs.Version(ctx, appConn)
	require.NoError(t, err)
	require.Equal(t, 8, v)
	v8 := kitCatalog(t, ctx, db.Pool)

	// The leases granted at version 7 are still the latest.
	_, err = appConn.Exec(ctx, `UPDATE job SET tok = $1 WHERE id = 1`, tj)
	require.NoError(t, err)
	_, ok, err = sqlfuncs.Renew(ctx, appConn, "kids", tk, time.Hour)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, writeWithToken(ctx, su, "kids", tk, `INSERT INTO note VALUES (2)`))
	// The guards of 007's tables have the new bodies: the cascade is refused.
	requireSQLState(t, cascade(), "FN002", "the cascade after the upgrade")
	// The role granted usage at version 7 reads the counters, which saw it.
	var refused int64
	require.NoError(t, appConn.QueryRow(ctx, `SELECT count FROM fence.refusals WHERE sqlstate = 'FN002'`).Scan(&refused))
	require.GreaterOrEqual(t, refused, int64(1))
	var left time.Duration
	require.NoError(t, appConn.QueryRow(ctx, `SELECT expires_in FROM fence.leases WHERE resource = 'kids'`).Scan(&left))
	require.Greater(t, left, 59*time.Minute)
	released, err := sqlfuncs.Release(ctx, appConn, "singleton", sess)
	require.NoError(t, err)
	require.True(t, released, "the session lease taken at version 7 is released at version 8")
	a1 := acquire("job:2")
	require.Greater(t, a1, tj)

	// Down: exactly version 7 again; grants go on above.
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 7))
	require.Equal(t, v7, kitCatalog(t, ctx, db.Pool), "the down restores version 7's functions, tables, views, privileges and generated guards")
	a2 := acquire("job:3")
	require.Greater(t, a2, a1)
	require.NoError(t, gofence.MigrateTo(ctx, db.Pool, 8))
	require.Equal(t, v8, kitCatalog(t, ctx, db.Pool), "a second upgrade gives the same schema")
	require.Greater(t, acquire("job:4"), a2)
	requireSQLState(t, cascade(), "FN002", fmt.Sprintf("the cascade after the second upgrade (%s)", "008"))
}
