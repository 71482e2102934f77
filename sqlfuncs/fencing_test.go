package sqlfuncs_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// documentedLockKey is the mapping docs/sql.md documents for fence.lock_key.
func documentedLockKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]) | 1<<63)
}

// protectedTables creates the two kinds of guarded table of the story:
// "results" carries its token in a column, "journal" relies on use_token.
func (b *bundle) protectedTables(t *testing.T, resource string) {
	t.Helper()
	b.exec(t, `CREATE TABLE results (id int PRIMARY KEY, worker text NOT NULL, token bigint)`)
	b.exec(t, `CREATE TABLE journal (id serial PRIMARY KEY, worker text NOT NULL, token bigint)`)
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "results", resource, "token"))
	require.NoError(t, sqlfuncs.Protect(b.ctx, b.db.Pool, "journal", resource, ""))
}

// journal writes one row to the use_token table in its own transaction.
func journal(ctx context.Context, db *pgxpool.Pool, resource, worker string, token int64) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := sqlfuncs.UseToken(ctx, tx, resource, token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO journal (worker, token) VALUES ($1, $2)`, worker, token)
		return sqlfuncs.Translate(err)
	})
}

func TestStaleWorkerIsFencedOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.protectedTables(t, "job")

	// A acquires with a short TTL and writes under its token.
	t1, ok, err := sqlfuncs.Acquire(ctx, db, "job", "A", time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	b.exec(t, `INSERT INTO results VALUES (1, 'A', $1)`, t1)
	require.NoError(t, journal(ctx, db, "job", "A", t1))

	// A pauses; its lease expires by the server's clock; B is granted a larger token.
	t2 := acquireWhenFree(t, ctx, db, "job", "B", 30*time.Second)
	require.Greater(t, t2, t1)
	b.exec(t, `UPDATE results SET worker = 'B', token = $1 WHERE id = 1`, t2)
	require.NoError(t, journal(ctx, db, "job", "B", t2))

	// A wakes and writes with its old token: the database refuses.
	t.Run("token column: insert with the old token", func(t *testing.T) {
		_, err := db.Exec(ctx, `INSERT INTO results VALUES (2, 'A', $1)`, t1)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
		requireCode(t, err, "FN001")
	})
	t.Run("token column: update with the old token", func(t *testing.T) {
		_, err := db.Exec(ctx, `UPDATE results SET worker = 'A', token = $1 WHERE id = 1`, t1)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
	})
	t.Run("token column: update that does not assign the token column", func(t *testing.T) {
		// The row carries B's token, the latest: that proves nothing about
		// the writer, so an UPDATE that presents no token fails.
		b.exec(t, `INSERT INTO results VALUES (3, 'B', $1)`, t2)
		_, err := db.Exec(ctx, `UPDATE results SET worker = 'A' WHERE id = 3`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
		requireCode(t, err, "FN002")
		_, err = sqlfuncs.Revoke(ctx, db, "job") // B's token is stale now too
		require.NoError(t, err)
		_, err = db.Exec(ctx, `UPDATE results SET worker = 'A', token = token WHERE id = 3`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken, "re-assigning the row's own token presents it")
		t2 = acquireWhenFree(t, ctx, db, "job", "B", 30*time.Second) // B again, newer token
		b.exec(t, `UPDATE results SET token = $1 WHERE id IN (1, 3)`, t2)
	})
	t.Run("use_token: the old token", func(t *testing.T) {
		err := journal(ctx, db, "job", "A", t1)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken)
		requireCode(t, err, "FN001")
	})
	t.Run("no token", func(t *testing.T) {
		_, err := db.Exec(ctx, `INSERT INTO journal (worker) VALUES ('A')`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
		requireCode(t, err, "FN002")
		_, err = db.Exec(ctx, `INSERT INTO results VALUES (4, 'A', NULL)`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
		_, err = db.Exec(ctx, `DELETE FROM results`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "DELETE needs use_token even with a token column")
		_, err = db.Exec(ctx, `TRUNCATE journal`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
		_, err = db.CopyFrom(ctx, pgx.Identifier{"journal"}, []string{"worker"}, pgx.CopyFromRows([][]any{{"A"}}))
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken, "COPY is guarded")
		_, err = db.CopyFrom(ctx, pgx.Identifier{"results"}, []string{"id", "worker", "token"}, pgx.CopyFromRows([][]any{{6, "A", t1}}))
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken, "COPY checks the token column")
	})
	t.Run("made-up token", func(t *testing.T) {
		_, err := db.Exec(ctx, `INSERT INTO results VALUES (5, 'A', $1)`, t2+1000)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrUnknownToken)
		requireCode(t, err, "FN003")
		err = journal(ctx, db, "job", "A", t2+1)
		require.ErrorIs(t, err, sqlfuncs.ErrUnknownToken)
		err = sqlfuncs.Check(ctx, db, "never-granted", 1)
		require.ErrorIs(t, err, sqlfuncs.ErrUnknownToken)
	})
	t.Run("the guard checks the row as written, after the table's BEFORE triggers", func(t *testing.T) {
		// A trigger of the owner's, named to sort late, changes the token:
		// the guard's triggers sort after it ('~') and check what it wrote.
		b.exec(t, `CREATE FUNCTION lower_token() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN NEW.token := NEW.token - 1; RETURN NEW; END $$`)
		b.exec(t, `CREATE TRIGGER zzzz_lower BEFORE UPDATE ON results FOR EACH ROW EXECUTE FUNCTION lower_token()`)
		_, err := db.Exec(ctx, `UPDATE results SET worker = 'B', token = $1 WHERE id = 1`, t2)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken, "the lowered token is checked")
		// A positive value written by a trigger into an UPDATE that did not
		// assign the column is no presentation.
		_, err = db.Exec(ctx, `UPDATE results SET worker = 'B' WHERE id = 1`)
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
		b.exec(t, `DROP TRIGGER zzzz_lower ON results`)
	})
	t.Run("the holder can still write, delete and truncate", func(t *testing.T) {
		require.NoError(t, pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			require.NoError(t, sqlfuncs.UseToken(ctx, tx, "job", t2))
			_, err := tx.Exec(ctx, `DELETE FROM results WHERE id = 3`)
			return err
		}))
	})

	var rows []string
	r, err := db.Query(ctx, `SELECT format('%s:%s', id, worker) FROM results ORDER BY id`)
	require.NoError(t, err)
	rows, err = pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"1:B"}, rows, "B's result is intact and A's stale writes are absent")
	var aRows int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM journal WHERE worker = 'A' AND token = $1`, t1).Scan(&aRows))
	require.Equal(t, 1, aRows, "only A's write from before B's grant")
}

// waitLockWait waits until the backend pid is blocked on a heavyweight lock:
// the observable condition for "the grant is waiting", instead of a sleep.
func waitLockWait(t *testing.T, ctx context.Context, db *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		require.NoError(t, db.QueryRow(ctx,
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("backend %d never waited for a lock", pid)
}

// waitGrantWait waits until backend pid waits for a lock or sleeps in a
// grant's poll of a lease row locked by a writer (fence._lock_lease loops
// on FOR UPDATE SKIP LOCKED with pg_sleep): the per-row guard of migration
// 9 locks the lease row and takes no gate, so a grant waiting for a
// per-row writer shows no lock wait.
func waitGrantWait(t *testing.T, ctx context.Context, db *pgxpool.Pool, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		require.NoError(t, db.QueryRow(ctx,
			`SELECT coalesce(wait_event_type = 'Lock' OR wait_event = 'PgSleep', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting))
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("backend %d never waited for a lock or a lease row", pid)
}

func TestGrantWaitsForOpenGuardedTransaction(t *testing.T) {
	t.Parallel()

	t.Run("the grant waits and the old holder's write is ordered first", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, db := b.ctx, b.db.Pool
		b.protectedTables(t, "job")
		a, bConn := b.db.Conn(t), b.db.Conn(t)

		t1, ok, err := sqlfuncs.Acquire(ctx, a, "job", "A", 200*time.Millisecond)
		require.NoError(t, err)
		require.True(t, ok)
		txA, err := a.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, sqlfuncs.UseToken(ctx, txA, "job", t1))
		_, err = txA.Exec(ctx, `INSERT INTO journal (worker, token) VALUES ('A', $1)`, t1)
		require.NoError(t, err)

		// A pauses past its TTL with the transaction open.
		waitNotLive(t, ctx, db, "job")

		_, err = bConn.Exec(ctx, `SET fence.grant_wait = '30s'`)
		require.NoError(t, err)
		type grant struct {
			tok int64
			ok  bool
			err error
		}
		done := make(chan grant, 1)
		go func() {
			tok, ok, err := sqlfuncs.Acquire(ctx, bConn, "job", "B", 30*time.Second)
			done <- grant{tok, ok, err}
		}()
		waitLockWait(t, ctx, db, bConn.PgConn().PID())
		select {
		case g := <-done:
			t.Fatalf("B was granted %v while A's guarded transaction was open", g)
		default:
		}

		// A's last act before committing records the server time.
		var aLast time.Time
		require.NoError(t, txA.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&aLast))
		require.NoError(t, txA.Commit(ctx))

		g := <-done
		require.NoError(t, g.err)
		require.True(t, g.ok)
		require.Greater(t, g.tok, t1)
		var acquired time.Time
		require.NoError(t, db.QueryRow(ctx, `SELECT acquired_at FROM fence.leases WHERE resource = 'job'`).Scan(&acquired))
		require.True(t, acquired.After(aLast), "grant at %v is not after A's commit at %v", acquired, aLast)
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM journal WHERE worker = 'A'`).Scan(&n))
		require.Equal(t, 1, n, "A's write committed before the grant")
	})

	t.Run("a grant that came first makes the old holder's write fail", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, db := b.ctx, b.db.Pool
		b.protectedTables(t, "job")
		a := b.db.Conn(t)

		t1, ok, err := sqlfuncs.Acquire(ctx, a, "job", "A", 50*time.Millisecond)
		require.NoError(t, err)
		require.True(t, ok)
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
			// A's transaction starts (and takes its snapshot) before B's grant.
			txA, err := a.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			_, err = txA.Exec(ctx, `SELECT count(*) FROM journal`)
			require.NoError(t, err)
			t2 := acquireWhenFree(t, ctx, db, "job", "B", 50*time.Millisecond)
			require.Greater(t, t2, t1)
			err = sqlfuncs.UseToken(ctx, txA, "job", t1)
			require.Error(t, err, "isolation %s", iso)
			if iso == pgx.ReadCommitted {
				require.ErrorIs(t, err, sqlfuncs.ErrStaleToken)
			} else {
				requireCode(t, err, "40001") // the lease row changed after A's snapshot
			}
			require.NoError(t, txA.Rollback(ctx))
			t1 = t2
		}
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM journal`).Scan(&n))
		require.Zero(t, n)
	})

	t.Run("the wait is bounded by fence.grant_wait", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, db := b.ctx, b.db.Pool
		a, bConn := b.db.Conn(t), b.db.Conn(t)
		t1, ok, err := sqlfuncs.Acquire(ctx, a, "job", "A", 20*time.Millisecond)
		require.NoError(t, err)
		require.True(t, ok)
		txA, err := a.Begin(ctx)
		require.NoError(t, err)
		defer txA.Rollback(ctx)
		require.NoError(t, sqlfuncs.Check(ctx, txA, "job", t1))
		waitNotLive(t, ctx, db, "job")

		_, err = bConn.Exec(ctx, `SET fence.grant_wait = '200ms'`)
		require.NoError(t, err)
		_, ok, err = sqlfuncs.Acquire(ctx, bConn, "job", "B", time.Second)
		require.NoError(t, err)
		require.False(t, ok, "busy: answered NULL instead of hanging")
		_, err = sqlfuncs.Revoke(ctx, bConn, "job")
		require.ErrorIs(t, err, sqlfuncs.ErrBusy)
		requireCode(t, err, "FN004")
		var lockTimeout string
		require.NoError(t, bConn.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lockTimeout))
		require.Equal(t, "0", lockTimeout, "the caller's lock_timeout is left as it was")
	})
}

// TestGrantWaitIsBoundedUnderOverlappingWriters: writers whose guarded
// transactions overlap so that some writer always holds the lease row must
// not hold a grant off past fence.grant_wait. Row locks alone let each new
// FOR KEY SHARE join ahead of a waiting FOR UPDATE (a revoke once waited
// 23 s with grant_wait 2 s); the gate lock queues them fairly.
func TestGrantWaitIsBoundedUnderOverlappingWriters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok, err := sqlfuncs.Revoke(b.ctx, b.db.Pool, "starve")
	require.NoError(t, err)
	revokeUnderOverlappingWriters(t, b, "starve", tok, func(ctx context.Context, tx pgx.Tx) error {
		return sqlfuncs.Check(ctx, tx, "starve", tok)
	})
}

// revokeUnderOverlappingWriters runs three writers whose transactions
// (write, then 0.3 s of sleep) overlap without a break, revokes resource
// (whose latest token is tok) with fence.grant_wait = 500ms meanwhile, and
// requires the revoke to return, granted or busy, long before the writers
// stop: a grant may wait for the writers that were already in, not for the
// stream of them.
func revokeUnderOverlappingWriters(t *testing.T, b *bundle, resource string, tok int64, write func(context.Context, pgx.Tx) error) {
	t.Helper()
	ctx := b.ctx
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writers []int64
	for i := range 3 {
		conn := b.db.Conn(t)
		writers = append(writers, int64(conn.PgConn().PID()))
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond) // staggered, so that their transactions overlap
			for wctx.Err() == nil {
				_ = pgx.BeginFunc(wctx, conn, func(tx pgx.Tx) error {
					if err := write(wctx, tx); err != nil {
						return err
					}
					_, err := tx.Exec(wctx, `SELECT pg_sleep(0.3)`)
					return err
				})
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	granter := b.db.Conn(t)
	_, err := granter.Exec(ctx, `SET fence.grant_wait = '500ms'`)
	require.NoError(t, err)
	// The stream is on once all three writers are inside a transaction at
	// the same time.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var in int
		if assert.NoError(c, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[]) AND xact_start IS NOT NULL`, writers).Scan(&in)) {
			assert.Equal(c, len(writers), in, "writers inside a transaction")
		}
	}, 10*time.Second, 10*time.Millisecond)
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // without a fair gate it would wait for the writers forever
	defer cancel()
	newTok, err := sqlfuncs.Revoke(rctx, granter, resource)
	took := time.Since(start)
	// The revoke either got in (after the writers that were already in) or
	// gave up as busy; it must not wait for the stream of writers to end.
	if err != nil {
		require.ErrorIs(t, err, sqlfuncs.ErrBusy)
	} else {
		require.Greater(t, newTok, tok)
	}
	require.Less(t, took, 5*time.Second, "the grant waited %s with fence.grant_wait = 500ms", took)
	t.Logf("revoke under overlapping writers returned after %s (err=%v)", took, err)
}

// TestLinearizableFencingUnderConcurrency races guarded writers against a
// granter on real sessions. Right after each grant of token T returns, the
// granter counts the rows written under tokens older than T; at the end that
// count must be unchanged: no write under an older token committed after the
// grant (guarantee 3). Writers deliberately use stale tokens too.
func TestLinearizableFencingUnderConcurrency(t *testing.T) {
	pgtest.Long(t, "3 s of randomized writers racing grants")
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool
	b.exec(t, `CREATE TABLE writes (id bigserial PRIMARY KEY, token bigint NOT NULL, note text, at timestamptz default clock_timestamp())`)
	require.NoError(t, sqlfuncs.Protect(ctx, db, "writes", "race", "token"))
	first, ok, err := sqlfuncs.Acquire(ctx, db, "race", "init", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)

	type observation struct{ token, olderRows int64 }
	var (
		mu       sync.Mutex
		grants   []observation
		latest   atomic.Int64
		accepted atomic.Int64
		refused  atomic.Int64
	)
	latest.Store(first)
	runCtx, stop := context.WithTimeout(ctx, 3*time.Second)
	defer stop()

	var wg sync.WaitGroup
	for w := range 4 {
		conn := b.db.Conn(t)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for runCtx.Err() == nil {
				tok := latest.Load()
				if rng.IntN(4) == 0 {
					tok -= int64(rng.IntN(3)) // sometimes an older token on purpose
				}
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					for range 1 + rng.IntN(3) {
						if _, err := tx.Exec(ctx, `INSERT INTO writes (token, note) VALUES ($1, $2)`, tok, fmt.Sprint(w)); err != nil {
							return err
						}
					}
					if rng.IntN(2) == 0 {
						time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // hold the transaction open
					}
					return nil
				})
				if err != nil {
					refused.Add(1)
				} else {
					accepted.Add(1)
				}
			}
		})
	}
	granter := b.db.Conn(t)
	var granterErr error // the granter's goroutine must not end the test
	wg.Go(func() {
		for runCtx.Err() == nil {
			tok, err := sqlfuncs.Revoke(ctx, granter, "race")
			if errors.Is(err, sqlfuncs.ErrBusy) {
				continue
			}
			var older int64
			if err == nil {
				err = granter.QueryRow(ctx, `SELECT count(*) FROM writes WHERE token < $1`, tok).Scan(&older)
			}
			if err != nil {
				granterErr = err
				return
			}
			mu.Lock()
			grants = append(grants, observation{tok, older})
			mu.Unlock()
			latest.Store(tok)
			time.Sleep(2 * time.Millisecond)
		}
	})
	wg.Wait()
	require.NoError(t, granterErr)

	require.NotEmpty(t, grants)
	require.Positive(t, accepted.Load())
	require.Positive(t, refused.Load())
	for i, g := range grants {
		if i > 0 {
			require.Greater(t, g.token, grants[i-1].token, "tokens strictly increase in grant order")
		}
		var older int64
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM writes WHERE token < $1`, g.token).Scan(&older))
		if g.olderRows != older {
			r, _ := db.Query(ctx, `SELECT format('id=%s tok=%s note=%s xmin=%s at=%s', id, token, note, xmin, at) FROM writes WHERE token < $1 ORDER BY id DESC LIMIT 20`, g.token)
			lines, _ := pgx.CollectRows(r, pgx.RowTo[string])
			t.Logf("rows under tokens older than grant %d: %v", g.token, lines)
		}
		require.Equal(t, g.olderRows, older, "a write under a token older than %d committed after its grant", g.token)
	}
	t.Logf("%d grants, %d transactions accepted, %d refused", len(grants), accepted.Load(), refused.Load())
}

func TestConcurrentGrantsAreUniqueAndIncreasing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	var tokens []int64
	var wg sync.WaitGroup
	sessions := make([][]int64, 6)
	errs := make([]error, len(sessions)) // the goroutines must not end the test
	for w := range sessions {
		conn := b.db.Conn(t)
		wg.Go(func() {
			for range 60 {
				tok, ok, err := sqlfuncs.Acquire(ctx, conn, "hot", fmt.Sprint("w", w), time.Minute)
				if err != nil {
					errs[w] = err
					return
				}
				if !ok {
					continue
				}
				released, err := sqlfuncs.Release(ctx, conn, "hot", tok)
				if err == nil && !released {
					err = fmt.Errorf("the release of token %d by its own holder ended nothing", tok)
				}
				if err != nil {
					errs[w] = err
					return
				}
				sessions[w] = append(sessions[w], tok)
			}
		})
	}
	wg.Wait()
	for w, mine := range sessions {
		require.NoError(t, errs[w], "session %d", w)
		for i := 1; i < len(mine); i++ {
			require.Greater(t, mine[i], mine[i-1], "one session sees its grants increase")
		}
		tokens = append(tokens, mine...)
	}
	seen := map[int64]bool{}
	for _, tok := range tokens {
		require.False(t, seen[tok], "token %d granted twice", tok)
		seen[tok] = true
	}
	var latest int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT token FROM fence.leases WHERE resource = 'hot'`).Scan(&latest))
	require.Equal(t, int64(len(tokens)), latest&(1<<43-1), "every grant used the next counter value: none lost, none repeated")
}

// TestGateIsHeldUntilTheWritingTransactionEnds: the share lock on a
// resource's gate that a guarded write takes lasts until its transaction
// ends, whatever it writes afterwards, and goes away with a savepoint that
// is rolled back. (Migration 2 skipped the check for a pair already checked
// in the transaction and relied on this; migration 3 checks every row, and
// guarantee 3 still rests on the gate.)
func TestGateIsHeldUntilTheWritingTransactionEnds(t *testing.T) {
	t.Parallel()

	t.Run("a grant waits for the transaction's later writes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := b.ctx
		b.protectedTables(t, "ck")
		a, g := b.db.Conn(t), b.db.Conn(t)
		tok := acquireWhenFree(t, ctx, a, "ck", "A", time.Minute)
		txA, err := a.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, sqlfuncs.UseToken(ctx, txA, "ck", tok))
		_, err = txA.Exec(ctx, `INSERT INTO journal (worker, token) VALUES ('A', $1)`, tok)
		require.NoError(t, err)

		var gpid uint32
		require.NoError(t, g.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&gpid))
		revoked := make(chan error, 1)
		go func() { _, err := sqlfuncs.Revoke(ctx, g, "ck"); revoked <- err }()
		waitLockWait(t, ctx, b.db.Pool, gpid)
		for i := range 3 { // the revoke keeps waiting for the whole transaction
			_, err = txA.Exec(ctx, `INSERT INTO journal (worker, token) VALUES ($1, $2)`, fmt.Sprint("A", i), tok)
			require.NoError(t, err)
			_, err = txA.Exec(ctx, `INSERT INTO results (id, worker, token) VALUES ($1, 'A', $2)`, 100+i, tok)
			require.NoError(t, err)
		}
		select {
		case err := <-revoked:
			t.Fatalf("the revoke finished while A's transaction was open: %v", err)
		default:
		}
		require.NoError(t, txA.Commit(ctx))
		require.NoError(t, <-revoked)
		require.ErrorIs(t, journal(ctx, b.db.Pool, "ck", "A", tok), sqlfuncs.ErrStaleToken)
	})

	t.Run("a rolled-back check takes its gate along", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx := b.ctx
		b.protectedTables(t, "ck")
		a, g := b.db.Conn(t), b.db.Conn(t)
		tok := acquireWhenFree(t, ctx, a, "ck", "A", time.Minute)
		for _, firstWrite := range []string{
			`SELECT fence.use_token('ck', %d)`,
			`INSERT INTO results (id, worker, token) VALUES (1, 'A', %d)`,
		} {
			txA, err := a.Begin(ctx)
			require.NoError(t, err)
			_, err = txA.Exec(ctx, `SELECT set_config('fence.tokens', format('{"ck": %s}', $1::bigint), true)`, tok)
			require.NoError(t, err)
			_, err = txA.Exec(ctx, `SAVEPOINT s`)
			require.NoError(t, err)
			_, err = txA.Exec(ctx, fmt.Sprintf(firstWrite, tok))
			require.NoError(t, err, firstWrite)
			_, err = txA.Exec(ctx, `ROLLBACK TO SAVEPOINT s`)
			require.NoError(t, err)

			newTok, err := sqlfuncs.Revoke(ctx, g, "ck") // must not wait: the gate went with the savepoint
			require.NoError(t, err)
			require.Greater(t, newTok, tok)

			_, err = txA.Exec(ctx, `INSERT INTO journal (worker, token) VALUES ('A', $1)`, tok)
			requireCode(t, err, "FN001")
			require.NoError(t, txA.Rollback(ctx))
			tok = acquireWhenFree(t, ctx, a, "ck", "A", time.Minute)
		}
	})
}
