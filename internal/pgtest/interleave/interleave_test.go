package interleave_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/pgtest/interleave"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func tx(name string, steps ...interleave.Step) interleave.Session {
	return interleave.Session{Name: name, Role: "S", Steps: append(append([]interleave.Step{{Name: "begin", SQL: "BEGIN", Kind: interleave.Begin}}, steps...),
		interleave.Step{Name: "commit", SQL: "COMMIT", Kind: interleave.Commit})}
}

// TestCount: two sessions of 3 and 2 steps have C(5,2) = 10 orders; with
// BEGIN as each session's first step, the orders that only move a BEGIN
// behind a step of a session with a higher index are not run.
func TestCount(t *testing.T) {
	t.Parallel()
	s := func(name string, n int) interleave.Session {
		ses := interleave.Session{Name: name}
		for i := 0; i < n; i++ {
			ses.Steps = append(ses.Steps, interleave.Step{Name: "x"})
		}
		return ses
	}
	e, c := interleave.Count(interleave.Spec{Sessions: []interleave.Session{s("A", 3), s("B", 2)}})
	require.Equal(t, 10, e)
	require.Equal(t, 0, c)
	e, c = interleave.Count(interleave.Spec{Sessions: []interleave.Session{tx("A"), tx("B", interleave.Step{Name: "x"})}})
	require.Equal(t, 10, e) // 2 + 3 steps
	// A's commit before B's x, between x and B's commit, or after it:
	// three executions, and the other 7 orders only move a BEGIN.
	require.Equal(t, 7, c)
}

// target makes a database with a table that fence.protect guards and one
// it does not, and a runner on it as the superuser (role S).
func target(t *testing.T) (*interleave.Runner, *pgtest.DB) {
	t.Helper()
	db := pgtest.Setup(t)
	ctx := t.Context()
	for _, s := range []string{
		`CREATE TABLE guarded (tok bigint, tx text)`,
		`CREATE TABLE unguarded (tok bigint, tx text)`,
		`CREATE TABLE counter (id int PRIMARY KEY, v int NOT NULL)`,
		`SELECT fence.protect('guarded', 'r', 'tok')`,
	} {
		_, err := db.Pool.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	r, err := interleave.NewRunner(ctx, interleave.Target{
		URLs:  map[string]string{"S": db.URL},
		Admin: db.URL,
		Reset: `BEGIN; SET LOCAL session_replication_role = replica;
			DELETE FROM guarded; DELETE FROM unguarded; DELETE FROM counter; DELETE FROM fence.lease;
			INSERT INTO counter VALUES (1, 0); COMMIT`,
		Setup:  `SELECT 'T1', 'r', fence.acquire('r', 'h', '1h')`,
		Rows:   `SELECT 'r', tok, tx FROM guarded UNION ALL SELECT 'r', tok, tx FROM unguarded`,
		Leases: `SELECT resource, token FROM fence.lease`,
	})
	require.NoError(t, err)
	t.Cleanup(r.Close)
	return r, db
}

var revoke = tx("G", interleave.Step{Name: "revoke", SQL: `SELECT fence.revoke('r')`, Kind: interleave.Grant, Resource: "r", Save: "T2"})

// TestUnguardedWriteBreaksGuaranteeThree: the check is not vacuous. A
// write under T1 to a table without a guard commits after the revoke in
// some orders, and those orders fail guarantee 3; the same writer on a
// guarded table fails in none.
func TestUnguardedWriteBreaksGuaranteeThree(t *testing.T) {
	t.Parallel()
	r, _ := target(t)
	for _, table := range []string{"unguarded", "guarded"} {
		st, fails, err := r.Run(context.Background(), interleave.Spec{
			Name: table,
			Sessions: []interleave.Session{
				revoke,
				tx("W", interleave.Step{Name: "write", SQL: `INSERT INTO ` + table + ` (tok, tx) VALUES ({T1}, {tx})`}),
			},
		})
		require.NoError(t, err)
		require.Equal(t, st.Enumerated, st.Run+st.Pruned+st.Commuted)
		if table == "unguarded" {
			require.NotEmpty(t, fails)
			require.Contains(t, fails[0].Report, "guarantee 3")
			require.Equal(t, len(fails), st.Failed)
		} else {
			for _, f := range fails {
				t.Errorf("%s: %s\n%s", f.Spec, f.Order, f.Report)
			}
		}
	}
}

// TestBlockedStepPrunesTheOrdersThatNeedItsSession: two sessions update
// one row; the second blocks until the first commits, so every order in
// which it must go on before that is pruned, and the others run.
func TestBlockedStepPrunesTheOrdersThatNeedItsSession(t *testing.T) {
	t.Parallel()
	r, _ := target(t)
	upd := interleave.Step{Name: "update", SQL: `UPDATE counter SET v = v + 1 WHERE id = 1`}
	st, fails, err := r.Run(context.Background(), interleave.Spec{
		Name:     "counter",
		Sessions: []interleave.Session{tx("A", upd), tx("B", upd)},
	})
	require.NoError(t, err)
	require.Empty(t, fails)
	// 20 orders; 10 move only B's BEGIN; of the other 10 (B:begin first,
	// or right after another... B's BEGIN opens them), those with A's
	// update, then B's update, then B's commit before A's commit, and
	// the mirror image, are pruned.
	require.Equal(t, 20, st.Enumerated)
	require.Positive(t, st.Pruned)
	require.Positive(t, st.Run)
	require.Equal(t, st.Enumerated, st.Run+st.Pruned+st.Commuted)
}

// TestPreparedWriterCommitsWhenCommitPrepared: a writer's transaction
// prepared and committed by another session counts as committed at COMMIT
// PREPARED: an unguarded write under T1 committed that way after a revoke
// (run outside a transaction block: it commits when it returns) fails
// guarantee 3.
func TestPreparedWriterCommitsWhenCommitPrepared(t *testing.T) {
	t.Parallel()
	r, db := target(t)
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT current_setting('max_prepared_transactions')::int`).Scan(&n))
	if n == 0 {
		t.Skip("max_prepared_transactions = 0 on this server")
	}
	w := interleave.Session{Name: "W", Role: "S", Steps: []interleave.Step{
		{Name: "begin", SQL: "BEGIN", Kind: interleave.Begin},
		{Name: "write", SQL: `INSERT INTO unguarded (tok, tx) VALUES ({T1}, {tx})`},
		{Name: "prepare", SQL: `PREPARE TRANSACTION {gid}`, Kind: interleave.Prepare},
	}}
	g := interleave.Session{Name: "G", Role: "S", Steps: []interleave.Step{
		{Name: "revoke", SQL: `SELECT fence.revoke('r')`, Kind: interleave.Grant, Resource: "r", Save: "T2"},
		{Name: "commit_prepared", SQL: `COMMIT PREPARED {gid:W}`, Kind: interleave.CommitPrepared, Of: "W"},
	}}
	st, fails, err := r.Run(context.Background(), interleave.Spec{Name: "prepared", Sessions: []interleave.Session{w, g}})
	require.NoError(t, err)
	require.Positive(t, st.Run)
	found := false
	for _, f := range fails {
		found = found || strings.HasPrefix(f.Order, "W:begin W:write W:prepare G:revoke G:commit_prepared")
	}
	require.True(t, found, "the order that commits the prepared write after the revoke must fail: %+v", fails)
}
