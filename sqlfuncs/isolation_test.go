package sqlfuncs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// TestOlderSnapshotNeverPassesTheCheck: a transaction W whose snapshot was
// taken before a grant committed never passes fence.check with the
// superseded token, with or without the lease_token_key constraint (of
// migrations 1 and 2 on (resource, token); migration 3 dropped it; migration 9
// put it back on (token), and the test drops it for constraint=false), at every
// isolation level, whether the grant committed before W's check or while W's
// check waited on the gate. Under REPEATABLE READ and SERIALIZABLE the FOR KEY
// SHARE lock of fence.check meets an old row version whose xmax carries
// HEAP_KEYS_UPDATED, and heap_lock_tuple answers TM_Updated (40001). The
// mark comes from the constraint (token is a key column) or, without it,
// from the FOR UPDATE that fence._grant takes before its UPDATE: heap_update
// keeps the stronger mode its own transaction holds, or, when the FOR UPDATE
// ran in a subtransaction (the grant waited for the gate), makes a MultiXact
// whose FOR UPDATE member sets the mark. The "bare update" grant (the gate,
// no FOR UPDATE; not a pgfence path) shows the unsafe outcome this test can
// observe: without the constraint its stale check passes.
func TestOlderSnapshotNeverPassesTheCheck(t *testing.T) {
	t.Parallel()

	type entry struct {
		name string
		run  func(ctx context.Context, tx pgx.Tx, tok int64) error
	}
	entries := []entry{
		{"check", func(ctx context.Context, tx pgx.Tx, tok int64) error {
			return sqlfuncs.Check(ctx, tx, "job", tok)
		}},
		{"use_token+insert", func(ctx context.Context, tx pgx.Tx, tok int64) error {
			if err := sqlfuncs.UseToken(ctx, tx, "job", tok); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO journal (worker, token) VALUES ('W', $1)`, tok)
			return err
		}},
	}
	const (
		before    = "grant commits before the check"
		onGate    = "grant commits while the check waits on the gate"
		firstStmt = "as onGate, the check is W's first statement"
	)
	isolations := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

	for _, constraint := range []bool{true, false} {
		t.Run(fmt.Sprintf("constraint=%v", constraint), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx, db := b.ctx, b.db.Pool
			b.protectedTables(t, "job")
			if !constraint {
				b.exec(t, `ALTER TABLE fence.lease DROP CONSTRAINT lease_token_key`)
			}
			w, g, h := b.db.Conn(t), b.db.Conn(t), b.db.Conn(t)

			type grant struct {
				name string
				run  func(ctx context.Context, tx pgx.Tx, old int64) error
			}
			grants := []grant{
				{"revoke", func(ctx context.Context, tx pgx.Tx, _ int64) error {
					_, err := sqlfuncs.Revoke(ctx, tx, "job")
					return err
				}},
				{"release+acquire", func(ctx context.Context, tx pgx.Tx, old int64) error {
					if _, err := sqlfuncs.Release(ctx, tx, "job", old); err != nil {
						return err
					}
					_, ok, err := sqlfuncs.Acquire(ctx, tx, "job", "B", time.Hour)
					if err == nil && !ok {
						err = errors.New("acquire after release answered busy")
					}
					return err
				}},
				// fence._grant's waiting path: the gate was held, so its FOR UPDATE
				// runs in a subtransaction (the old version's xmax is then a
				// MultiXact of a FOR UPDATE locker and a non-key updater).
				{"revoke after gate wait", func(ctx context.Context, tx pgx.Tx, old int64) error {
					htx, err := h.Begin(ctx)
					require.NoError(t, err)
					defer htx.Rollback(ctx)
					require.NoError(t, sqlfuncs.Check(ctx, htx, "job", old)) // holds the gate
					done := make(chan error, 1)
					go func() {
						_, err := sqlfuncs.Revoke(ctx, tx, "job")
						done <- err
					}()
					waitLockWait(t, ctx, db, g.PgConn().PID())
					require.NoError(t, htx.Commit(ctx))
					return <-done
				}},
				// Not a pgfence path: the gate and the new token, but no FOR UPDATE.
				{"bare update", func(ctx context.Context, tx pgx.Tx, _ int64) error {
					_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(fence._gate_key('job'));
						UPDATE fence.lease SET token = fence._next_token(fence._epoch(), token) WHERE resource = 'job'`)
					return err
				}},
			}

			// outcome runs one case and returns "passed" or the SQLSTATE W
			// failed with.
			outcome := func(t *testing.T, iso pgx.TxIsoLevel, timing string, gr grant, en entry) string {
				_, err := sqlfuncs.Revoke(ctx, db, "job")
				require.NoError(t, err)
				old, ok, err := sqlfuncs.Acquire(ctx, db, "job", "A", time.Hour)
				require.NoError(t, err)
				require.True(t, ok)

				wtx, err := w.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
				require.NoError(t, err)
				defer wtx.Rollback(ctx)
				if timing != firstStmt {
					_, err = wtx.Exec(ctx, `SELECT count(*) FROM journal`) // W's snapshot
					require.NoError(t, err)
				}
				gtx, err := g.Begin(ctx)
				require.NoError(t, err)
				defer gtx.Rollback(ctx)
				require.NoError(t, gr.run(ctx, gtx, old))

				if timing == before {
					require.NoError(t, gtx.Commit(ctx))
					err = en.run(ctx, wtx, old)
				} else {
					done := make(chan error, 1)
					go func() { done <- en.run(ctx, wtx, old) }()
					waitLockWait(t, ctx, db, w.PgConn().PID())
					require.NoError(t, gtx.Commit(ctx))
					err = <-done
				}
				if err == nil {
					err = wtx.Commit(ctx)
				}
				if err == nil {
					return "passed"
				}
				var pgErr *pgconn.PgError
				require.True(t, errors.As(err, &pgErr), "%v", err)
				return pgErr.Code
			}

			for _, iso := range isolations {
				for _, timing := range []string{before, onGate, firstStmt} {
					for _, gr := range grants {
						for _, en := range entries {
							got := outcome(t, iso, timing, gr, en)
							t.Logf("constraint=%v %-15s %-48s grant=%-22s %-16s -> %s", constraint, iso, timing, gr.name, en.name, got)
							want := "40001"
							switch {
							case iso == pgx.ReadCommitted:
								want = "FN001"
							case gr.name == "bare update" && !constraint:
								want = "passed" // the unsafe outcome
							}
							require.Equal(t, want, got, "%s, %s, grant %s, %s", iso, timing, gr.name, en.name)
						}
					}
				}
			}

			// Only the bare update's stale writes (constraint dropped,
			// REPEATABLE READ and SERIALIZABLE, 3 timings each) committed.
			var stale int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM journal WHERE worker = 'W'`).Scan(&stale))
			if constraint {
				require.Zero(t, stale)
			} else {
				require.Equal(t, 6, stale)
			}
		})
	}
}
