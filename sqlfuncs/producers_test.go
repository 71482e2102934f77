package sqlfuncs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// producerStory: a per-row job queue (jobs, token column tok) with
// producers allowed, and a producer role with the kit's usage and INSERT
// only.
func producerStory(t *testing.T) (*bundle, *pgx.Conn, string) {
	t.Helper()
	b := setup(t)
	b.exec(t, `CREATE TABLE jobs (id int PRIMARY KEY, payload text, tok bigint)`)
	require.NoError(t, sqlfuncs.ProtectRows(b.ctx, b.db.Pool, "jobs", "id", "job:", "tok"))
	producer := pgtest.NewRole(t, "producer")
	require.NoError(t, sqlfuncs.GrantUsage(b.ctx, b.db.Pool, producer, false))
	b.exec(t, `GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO `+pgx.Identifier{producer}.Sanitize())
	return b, roleConn(t, b, producer), producer
}

// TestProducersAreOffByDefault: without fence.allow_producers an INSERT
// without a token is FN002, as in 008, also for a resource never granted.
func TestProducersAreOffByDefault(t *testing.T) {
	t.Parallel()
	b, p, _ := producerStory(t)
	_, err := p.Exec(b.ctx, `INSERT INTO jobs (id, payload) VALUES (1, 'x')`)
	requireCode(t, err, "FN002")
	var on bool
	require.NoError(t, b.db.Pool.QueryRow(b.ctx,
		`SELECT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'jobs'::regclass AND tgnargs = 4)`).Scan(&on))
	require.False(t, on)
}

// TestProducersCreateRowsOfNeverGrantedResources: with producers allowed,
// a token-less INSERT of a never-granted resource commits (READ COMMITTED),
// and the first holder of that resource then works on the row; a resource
// that is held, or was ever granted, still needs its latest token; the
// other isolation levels refuse the producer; UPDATE and DELETE are not a
// producer's.
func TestProducersCreateRowsOfNeverGrantedResources(t *testing.T) {
	t.Parallel()
	b, p, _ := producerStory(t)
	ctx, db := b.ctx, b.db.Pool
	require.NoError(t, sqlfuncs.AllowProducers(ctx, db, "jobs", true))

	_, err := p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (1, 'enqueued'), (2, 'enqueued')`)
	require.NoError(t, err, "never-granted resources")
	t1 := grant(t, b, "job:1", "worker")
	_, err = db.Exec(ctx, `UPDATE jobs SET payload = 'done', tok = $1 WHERE id = 1`, t1)
	require.NoError(t, err, "the first holder works on the producer's row")

	t.Run("held resource", func(t *testing.T) {
		t3 := grant(t, b, "job:3", "worker")
		_, err := p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (3, 'x')`)
		requireCode(t, err, "FN002")
		_, err = p.Exec(ctx, `INSERT INTO jobs VALUES (3, 'x', $1)`, t3)
		require.NoError(t, err, "the holder's token")
	})
	t.Run("a stale holder cannot re-create the row it lost", func(t *testing.T) {
		old := grant(t, b, "job:4", "A")
		_, err := db.Exec(ctx, `INSERT INTO jobs VALUES (4, 'A', $1)`, old)
		require.NoError(t, err)
		nw := regrant(t, b, "job:4", "B")
		inTx(t, ctx, db, pgx.ReadCommitted, func(tx pgx.Tx) {
			require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job:4", nw))
			_, err := tx.Exec(ctx, `DELETE FROM jobs WHERE id = 4`)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
		})
		_, err = p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (4, 'A again')`)
		requireCode(t, err, "FN002")
		_, err = p.Exec(ctx, `INSERT INTO jobs VALUES (4, 'A again', $1)`, old)
		requireCode(t, err, "FN001")
		// released (not live) is still ever granted
		_, err = sqlfuncs.Release(ctx, db, "job:4", nw)
		require.NoError(t, err)
		_, err = p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (4, 'after release')`)
		requireCode(t, err, "FN002")
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE id = 4`).Scan(&n))
		require.Zero(t, n)
	})
	t.Run("revoked resource", func(t *testing.T) {
		_, err := sqlfuncs.Revoke(ctx, db, "job:5")
		require.NoError(t, err)
		_, err = p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (5, 'x')`)
		requireCode(t, err, "FN002")
	})
	t.Run("only under READ COMMITTED", func(t *testing.T) {
		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			err := attempt(ctx, p, iso, nil, `INSERT INTO jobs (id, payload) VALUES (6, 'x')`)
			requireCode(t, err, "FN002")
		}
	})
	t.Run("UPDATE and DELETE need the token", func(t *testing.T) {
		_, err := p.Exec(ctx, `UPDATE jobs SET payload = 'y' WHERE id = 2`)
		requireCode(t, err, "FN002")
		_, err = p.Exec(ctx, `DELETE FROM jobs WHERE id = 2`)
		requireCode(t, err, "FN002")
		_, err = p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (2, 'y') ON CONFLICT (id) DO UPDATE SET payload = 'y'`)
		requireCode(t, err, "FN002")
	})
	t.Run("at most 64 new resources per transaction", func(t *testing.T) {
		inTx(t, ctx, p, pgx.ReadCommitted, func(tx pgx.Tx) {
			_, err := tx.Exec(ctx, `INSERT INTO jobs (id, payload) SELECT g, 'bulk' FROM generate_series(100, 163) g`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (164, 'one too many')`)
			requireCode(t, err, "FN002")
		})
	})
	t.Run("protect_rows keeps the setting; off again refuses", func(t *testing.T) {
		require.NoError(t, sqlfuncs.ProtectRows(ctx, db, "jobs", "id", "job:", "tok"))
		_, err := p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (7, 'x')`)
		require.NoError(t, err)
		require.NoError(t, sqlfuncs.AllowProducers(ctx, db, "jobs", false))
		_, err = p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (8, 'x')`)
		requireCode(t, err, "FN002")
	})
	t.Run("owner only, per-row tables of migration 9 only", func(t *testing.T) {
		requireCode(t, sqlfuncs.AllowProducers(ctx, p, "jobs", true), "42501")
		b.exec(t, `CREATE TABLE tw (id int PRIMARY KEY, tok bigint)`)
		require.NoError(t, sqlfuncs.Protect(ctx, db, "tw", "tw", "tok"))
		requireCode(t, sqlfuncs.AllowProducers(ctx, db, "tw", true), "55000")
		b.exec(t, `CREATE TABLE bare (id int PRIMARY KEY)`)
		requireCode(t, sqlfuncs.AllowProducers(ctx, db, "bare", true), "55000")
	})
}

// TestProducersOnATableOfAnotherOwner: fence.allow_producers works for a
// table owner that is not the kit's owner and has the kit's usage
// (fence.grant_usage), as fence.protect_rows does. Up to 009 it stopped at
// "permission denied for function _guard_maker" (42501): grant_usage left
// out the owner check it calls, which protect_rows calls with the kit
// owner's rights (migration 10 grants it).
func TestProducersOnATableOfAnotherOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	owner := pgtest.NewRole(t, "tblowner")
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, owner, false))
	b.exec(t, `GRANT CREATE ON SCHEMA public TO `+pgx.Identifier{owner}.Sanitize())
	conn := roleConn(t, b, owner)
	_, err := conn.Exec(ctx, `CREATE TABLE own_jobs (id int PRIMARY KEY, payload text, tok bigint)`)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.ProtectRows(ctx, conn, "own_jobs", "id", "job:", "tok"))
	_, err = conn.Exec(ctx, `INSERT INTO own_jobs (id, payload) VALUES (1, 'x')`)
	requireCode(t, err, "FN002")
	require.NoError(t, sqlfuncs.AllowProducers(ctx, conn, "own_jobs", true))
	_, err = conn.Exec(ctx, `INSERT INTO own_jobs (id, payload) VALUES (1, 'x')`)
	require.NoError(t, err, "a row of a resource never granted")
	tok, ok, err := sqlfuncs.Acquire(ctx, conn, "job:2", "w", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = conn.Exec(ctx, `INSERT INTO own_jobs (id, payload) VALUES (2, 'x')`)
	requireCode(t, err, "FN002")
	_, err = conn.Exec(ctx, `INSERT INTO own_jobs (id, payload, tok) VALUES (2, 'x', $1)`, tok)
	require.NoError(t, err)
	require.NoError(t, sqlfuncs.AllowProducers(ctx, conn, "own_jobs", false))
	_, err = conn.Exec(ctx, `INSERT INTO own_jobs (id, payload) VALUES (3, 'x')`)
	requireCode(t, err, "FN002")
}

// TestProducerRacesTheFirstGrant: a producer's INSERT and the first grant
// of the same resource, on two sessions, in both orders. A producer whose
// transaction is open makes the grant wait (the grant then returns and its
// holder finds the row); a grant whose transaction is open makes the
// producer wait, and once it commits the producer is refused.
func TestProducerRacesTheFirstGrant(t *testing.T) {
	t.Parallel()
	b, p, producer := producerStory(t)
	ctx, db := b.ctx, b.db.Pool
	require.NoError(t, sqlfuncs.AllowProducers(ctx, db, "jobs", true))

	t.Run("producer first", func(t *testing.T) {
		g := b.db.Conn(t)
		_, err := g.Exec(ctx, `SET fence.grant_wait = '30s'`)
		require.NoError(t, err)
		ptx, err := p.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = ptx.Rollback(context.WithoutCancel(ctx)) }()
		_, err = ptx.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (1, 'enqueued')`)
		require.NoError(t, err)
		granted := make(chan int64, 1)
		go func() {
			tok, _, _ := sqlfuncs.Acquire(ctx, g, "job:1", "worker", time.Hour)
			granted <- tok
		}()
		waitLockWait(t, ctx, db, g.PgConn().PID())
		select {
		case tok := <-granted:
			t.Fatalf("granted %d while the producer's row was uncommitted", tok)
		default:
		}
		require.NoError(t, ptx.Commit(ctx))
		var tok int64
		select {
		case tok = <-granted:
		case <-time.After(20 * time.Second):
			t.Fatal("the grant did not return after the producer committed")
		}
		require.Positive(t, tok)
		_, err = g.Exec(ctx, `UPDATE jobs SET payload = 'done', tok = $1 WHERE id = 1`, tok)
		require.NoError(t, err)
	})
	t.Run("grant first", func(t *testing.T) {
		g := b.db.Conn(t)
		gtx, err := g.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = gtx.Rollback(context.WithoutCancel(ctx)) }()
		tok, ok, err := sqlfuncs.Acquire(ctx, gtx, "job:2", "worker", time.Hour)
		require.NoError(t, err)
		require.True(t, ok)
		done := make(chan error, 1)
		go func() {
			_, err := p.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES (2, 'late producer')`)
			done <- err
		}()
		waitLockWait(t, ctx, db, p.PgConn().PID())
		require.NoError(t, gtx.Commit(ctx))
		select {
		case err := <-done:
			requireCode(t, err, "FN002")
		case <-time.After(20 * time.Second):
			t.Fatal("the producer did not return after the grant committed")
		}
		_, err = g.Exec(ctx, `INSERT INTO jobs VALUES (2, 'holder', $1)`, tok)
		require.NoError(t, err)
	})
	t.Run("many producers and grants", func(t *testing.T) {
		// Each resource: a producer and a grant at once; whichever order
		// the server chose, the row exists only if the producer committed
		// before the grant, and the holder can always write it.
		for i := range 10 {
			id := 100 + i
			res := fmt.Sprintf("job:%d", id)
			g := b.db.Conn(t)
			pc := roleConn(t, b, producer)
			perr := make(chan error, 1)
			go func() {
				_, err := pc.Exec(ctx, `INSERT INTO jobs (id, payload) VALUES ($1, 'p')`, id)
				perr <- err
			}()
			tok := acquireWhenFree(t, ctx, g, res, "worker", time.Hour)
			err := <-perr
			var n int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE id = $1`, id).Scan(&n))
			if err == nil {
				require.Equal(t, 1, n)
				_, err = g.Exec(ctx, `UPDATE jobs SET payload = 'done', tok = $2 WHERE id = $1`, id, tok)
			} else {
				requireCode(t, err, "FN002")
				require.Zero(t, n)
				_, err = g.Exec(ctx, `INSERT INTO jobs VALUES ($1, 'holder', $2)`, id, tok)
			}
			require.NoError(t, err)
		}
	})
}

// TestProducersCannotInsertIntoThePerRowTable pins what migration 008 does
// to a producer (issue 28 item 3): a row of a table protected per row
// cannot be created without the latest token of its resource, so a plain
// INSERT of a producer that holds no lease fails with FN002, also as the
// table's owner. docs/clients.md and the README ("A lease per row") show
// the pattern that works: producers fill an unprotected queue table, and
// the table protected per row holds what only the holder of job:N writes.
// Since migration 009 this holds for every table whose owner did not allow
// producers (fence.allow_producers is off by default;
// TestProducersCreateRowsOfNeverGrantedResources for the other case).
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
