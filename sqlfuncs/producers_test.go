package sqlfuncs_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestProducersCannotInsertIntoThePerRowTable pins what migration 008 does
// to a producer (issue 28 item 3): a row of a table protected per row
// cannot be created without the latest token of its resource, so a plain
// INSERT of a producer that holds no lease fails with FN002, also as the
// table's owner. docs/clients.md and the README ("A lease per row") show
// the pattern that works: producers fill an unprotected queue table, and
// the table protected per row holds what only the holder of job:N writes.
// (A per-row producer path is planned in migration 009; this test changes
// with it.)
func TestProducersCannotInsertIntoThePerRowTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, `CREATE TABLE jobs (id bigserial PRIMARY KEY, payload text NOT NULL, fence_token bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "jobs", "id", "job:", "fence_token"))
	app := pgtest.NewRole(t, "producer")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, app, false))
	b.exec(t, `GRANT INSERT ON jobs TO `+app)
	b.exec(t, `GRANT USAGE ON SEQUENCE jobs_id_seq TO `+app)
	producer, err := pgx.Connect(b.ctx, b.db.URLAs(app))
	require.NoError(t, err)
	t.Cleanup(func() { producer.Close(b.ctx) })

	for who, db := range map[string]sqlfuncs.DB{"the owner": b.db.Pool, "a producer": producer} {
		_, err := db.Exec(b.ctx, `INSERT INTO jobs (payload) VALUES ('work')`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "%s: a plain INSERT", who)
	}
	var n int
	require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	require.Zero(t, n)
}
