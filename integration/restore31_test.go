package integration

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// grantBook records every token granted anywhere in a test, with where it
// was granted, and fails the test when one is granted twice: the counter is
// shared by every resource, so no two grants of an install's lineage may
// return the same token, whatever their resources.
type grantBook struct {
	t     *testing.T
	where map[int64]string
	per   *ledger
}

func newGrantBook(t *testing.T) *grantBook {
	return &grantBook{t: t, where: map[int64]string{}, per: newLedger()}
}

// grant revokes res on db (a grant to nobody) and records the token, after
// checking that it exceeds every token recorded before for res and that no
// grant recorded before returned it.
func (b *grantBook) grant(ctx context.Context, db sqlfuncs.DB, res, where string) int64 {
	b.t.Helper()
	tok := mustRevoke(b.t, ctx, db, res)
	if prev, dup := b.where[tok]; dup {
		b.t.Fatalf("%s: token %d (epoch %d, counter %d) of %s was granted before, %s", where, tok, epochOf(tok), counterOf(tok), res, prev)
	}
	requireAbove(b.t, b.per, res, tok, where)
	b.where[tok] = fmt.Sprintf("%s for %s", where, res)
	b.per.add(res, tok)
	return tok
}

// requireMoved checks the counter of a grant after a restart or a
// promotion against the last counter granted before it: moved 2^32 ahead
// or not at all, give or take the 32 values a sequence logs ahead of its
// last value (which a crash or a promotion skips).
func requireMoved(t *testing.T, before, after int64, moved bool, what string) {
	t.Helper()
	lo := before + 1
	if moved {
		lo += 1 << 32
	}
	require.True(t, after >= lo && after <= lo+32,
		"%s: counter %d after %d, want %d..%d (moved 2^32: %v)", what, after, before, lo, lo+32, moved)
}

// TestBaseBackupStartedWithoutRecoveryAfterAPrimaryCrash (issue 31, break
// 2): a base backup (pg_basebackup -X stream) is taken; the primary then
// grants, crashes once (kill: pg_ctl -m immediate), moves its counter 2^32
// ahead at its first grant after the crash and grants on; the primary is
// lost and the backup is started as it is (no recovery.signal: crash
// recovery from its backup_label, timeline 1). On 008 the backup's own
// first grant moved 2^32 ahead from the lower counter of the backup into
// the range the primary had granted from after its crash, and handed out
// the primary's tokens again (and below the primary's latest, for the
// resource both granted). Now the backup finds a backup_label.old that its
// fence.origin row does not name and starts a new epoch: every grant
// exceeds every token of the primary and none repeats one, and the
// primary's tokens are stale there.
func TestBaseBackupStartedWithoutRecoveryAfterAPrimaryCrash(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	p := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	book := newGrantBook(t)
	pc := connect(t, ctx, p.URL(), false)
	for i := range 3 {
		book.grant(ctx, pc, "bb/r", "primary, before the backup")
		book.grant(ctx, pc, fmt.Sprintf("bb/p%d", i), "primary, before the backup")
	}
	backup := p.NewBaseBackup(t)
	for range 5 {
		book.grant(ctx, pc, "bb/r", "primary, after the backup")
	}
	before := book.per.max("bb/r")
	require.NoError(t, pc.Close(ctx))
	p.Restart(t, "immediate") // the crash
	pc = connect(t, ctx, p.URL(), false)
	first := book.grant(ctx, pc, "bb/r", "primary, after its crash")
	require.Equal(t, epochOf(before), epochOf(first), "a crash restart keeps the epoch")
	requireMoved(t, counterOf(before), counterOf(first), true, "the primary's first grant after its crash")
	for i := range 40 {
		book.grant(ctx, pc, fmt.Sprintf("bb/q%d", i), "primary, after its crash")
	}
	book.grant(ctx, pc, "bb/r", "primary, after its crash")
	primaryLatest := book.per.clone()
	require.NoError(t, pc.Close(ctx))
	p.Stop(t, "immediate") // the primary is lost

	backup.StartBackup(t)
	bc := connect(t, ctx, backup.URL(), false)
	var tli int64
	require.NoError(t, bc.QueryRow(ctx, `SELECT timeline_id FROM pg_control_checkpoint()`).Scan(&tli))
	require.Equal(t, int64(1), tli, "the backup runs on the primary's timeline")
	budget, err := sqlfuncs.TokenBudget(ctx, bc)
	require.NoError(t, err)
	require.True(t, budget.ReadsBackupLabel, "the cluster's superuser owns the kit")
	for i := range 60 {
		tok := book.grant(ctx, bc, "bb/r", "the backup")
		if i == 0 {
			require.Greater(t, epochOf(tok), epochOf(first), "the backup's first grant starts a new epoch")
		}
		book.grant(ctx, bc, fmt.Sprintf("bb/q%d", i), "the backup")
	}
	requireStale(t, ctx, bc, primaryLatest, "bb/r")
	t.Logf("primary: last token %d (epoch %d); backup: from epoch %d; %d grants, none twice", primaryLatest.max("bb/r"), epochOf(primaryLatest.max("bb/r")), epochOf(book.per.all("bb/r")[len(primaryLatest.all("bb/r"))]), len(book.where))
}

// TestPromotionDoesNotMoveTheCounter (issue 31, break 2; issue 32): a
// promotion starts a new epoch, above every token of the old one whatever
// the counter, so the promoted standby's first grant takes the next value
// of the counter it replayed, with no move of 2^32 (008 moved it at every
// promotion, because the standby's unlogged cache is empty). A crash of the
// promoted server afterwards moves it as before: the standby's own
// backup_label.old is home from its promotion on.
func TestPromotionDoesNotMoveTheCounter(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	p := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	book := newGrantBook(t)
	pc := connect(t, ctx, p.URL(), false)
	book.grant(ctx, pc, "promo/r", "primary")
	s := p.NewStandby(t)
	for range 3 {
		book.grant(ctx, pc, "promo/r", "primary")
	}
	last := book.per.max("promo/r")
	p.WaitCaughtUp(t, s)
	onStandby, err := sqlfuncs.TokenBudget(ctx, connect(t, ctx, s.URL(), false))
	require.NoError(t, err, "the budget answers on a standby")
	require.Equal(t, epochOf(last), onStandby.Epoch)
	require.True(t, onStandby.Counter >= counterOf(last) && onStandby.Counter <= counterOf(last)+32,
		"a standby's counter %d is the replayed one, at most 32 above the last granted %d", onStandby.Counter, counterOf(last))
	require.NoError(t, pc.Close(ctx))
	p.Stop(t, "immediate")
	s.Promote(t)

	sc := connect(t, ctx, s.URL(), false)
	tok := book.grant(ctx, sc, "promo/r", "promoted standby")
	require.Equal(t, epochOf(last)+1, epochOf(tok), "the promotion moves the epoch one up")
	requireMoved(t, counterOf(last), counterOf(tok), false, "the promoted standby's first grant")
	budget, err := sqlfuncs.TokenBudget(ctx, sc)
	require.NoError(t, err)
	require.Equal(t, epochOf(tok), budget.Epoch)
	require.Equal(t, counterOf(tok), budget.Counter)
	require.EqualValues(t, 2047, budget.CounterMovesLeft, "no move spent")

	require.NoError(t, sc.Close(ctx))
	s.Restart(t, "immediate")
	sc = connect(t, ctx, s.URL(), false)
	tok2 := book.grant(ctx, sc, "promo/r", "promoted standby, after its crash")
	require.Equal(t, epochOf(tok), epochOf(tok2), "a crash restart keeps the epoch")
	requireMoved(t, counterOf(tok), counterOf(tok2), true, "the first grant after the promoted server's crash")
}

// TestDataOnlyReloadIntoTheSameDatabaseStartsANewEpoch (issue 31, break 3):
// a data-only dump of schema fence (pg_dump --data-only -n fence, or COPY of
// its tables and the counter's setval where no pg_dump of the server's
// version exists) is taken; the database grants on; the kit's tables are
// emptied and the dump reloaded into the same database, with triggers on
// and with them disabled (pg_restore --disable-triggers). On 008 the reload
// brought back the fence.origin row that says "home" (and, with triggers
// disabled, the cache row too), the dump's setval put the counter back, and
// the next grant was the token granted after the dump. Now the reloaded
// rows name the loading transaction besides the kit's, are not at home,
// and the next grant starts a new epoch, above every token before.
func TestDataOnlyReloadIntoTheSameDatabaseStartsANewEpoch(t *testing.T) {
	t.Parallel()
	for _, disable := range []bool{false, true} {
		t.Run(fmt.Sprintf("triggers disabled %v", disable), func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			db := pgtest.Setup(t)
			conn := connect(t, ctx, db.URL, false)
			book := newGrantBook(t)
			for range 3 {
				book.grant(ctx, conn, "reload/a", "before the dump")
				book.grant(ctx, conn, "reload/b", "before the dump")
			}
			reload := dumpFenceData(t, ctx, conn, db.URL)
			for range 3 {
				book.grant(ctx, conn, "reload/a", "after the dump")
				book.grant(ctx, conn, "reload/c", "after the dump")
			}
			last := book.per.max("reload/a")
			_, err := conn.Exec(ctx, `TRUNCATE fence.lease, fence.origin, fence.epoch_state, fence.epoch_cache`)
			require.NoError(t, err)
			reload(disable)
			var tok int64
			require.NoError(t, conn.QueryRow(ctx, `SELECT token FROM fence.lease WHERE resource = 'reload/a'`).Scan(&tok))
			require.Less(t, tok, last, "the reload put the dump's lease rows back")
			var epoch int64
			for _, res := range []string{"reload/a", "reload/b", "reload/c"} {
				tok := book.grant(ctx, conn, res, "after the reload")
				require.Greater(t, epochOf(tok), epochOf(last), "%s: the first grants after the reload are in a new epoch", res)
				epoch = epochOf(tok)
			}
			// The rows the kit wrote at that grant are at home: the epoch
			// stays (a row_xact frozen in a cached plan would move it at
			// every grant).
			for range 5 {
				tok := book.grant(ctx, conn, "reload/a", "after the reload")
				require.Equal(t, epoch, epochOf(tok), "the epoch stays after the reload's new epoch")
			}
		})
	}
}

// dumpFenceData takes a data-only dump of schema fence of the database at
// url and returns a function that loads it back into that database, with
// triggers disabled or not: pg_dump --data-only -n fence -Fc and
// pg_restore --data-only where a pg_dump of at least the server's major
// exists; else (said in the log) COPY of every table of schema fence and
// the counter's and the floor's setval, which is what such a dump holds,
// loaded with COPY (under session_replication_role = replica for disabled
// triggers, as pg_restore --disable-triggers does).
func dumpFenceData(t *testing.T, ctx context.Context, conn *pgx.Conn, url string) func(disableTriggers bool) {
	t.Helper()
	if dir, ok := clientToolDir(t, ctx, conn); ok {
		file := filepath.Join(t.TempDir(), "fence-data.dump")
		runTool(t, ctx, dir, "pg_dump", "--data-only", "-n", "fence", "-Fc", "-f", file, "-d", url)
		return func(disable bool) {
			args := []string{"--data-only", "--exit-on-error", "-d", url}
			if disable {
				args = append(args, "--disable-triggers")
			}
			runTool(t, ctx, dir, "pg_restore", append(args, file)...)
		}
	}
	t.Logf("NOTE: no pg_dump >= PostgreSQL %d on this machine: dumping the data of schema fence through the server (COPY, setval)", serverMajor(t, ctx, conn))
	tables := fenceTables(t, ctx, conn)
	data := map[string][]byte{}
	for _, tbl := range tables {
		var buf bytes.Buffer
		_, err := conn.PgConn().CopyTo(ctx, &buf, "COPY fence."+pgx.Identifier{tbl}.Sanitize()+" TO STDOUT")
		require.NoError(t, err)
		data[tbl] = buf.Bytes()
	}
	type seq struct {
		last   int64
		called bool
	}
	seqs := map[string]seq{}
	for _, name := range []string{"fence.token_counter", "fence.epoch_floor"} {
		var s seq
		require.NoError(t, conn.QueryRow(ctx, "SELECT last_value, is_called FROM "+name).Scan(&s.last, &s.called))
		seqs[name] = s
	}
	return func(disable bool) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		if disable {
			_, err = tx.Exec(ctx, "SET LOCAL session_replication_role = replica")
			require.NoError(t, err)
		}
		for _, tbl := range tables {
			_, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data[tbl]), "COPY fence."+pgx.Identifier{tbl}.Sanitize()+" FROM STDIN")
			require.NoError(t, err, "COPY fence.%s FROM STDIN", tbl)
		}
		for name, s := range seqs {
			_, err := tx.Exec(ctx, "SELECT setval($1, $2, $3)", name, s.last, s.called)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit(ctx))
	}
}

// TestBaseBackupOfAnOwnerWithoutPgReadFileTakesTheStep (issue 31, break 2,
// the case the kit cannot see): the kit's owner is not a superuser and may
// not execute pg_read_file, so fence.token_budget() says
// reads_backup_label = false, on the primary and on the backup. The story
// of TestBaseBackupStartedWithoutRecoveryAfterAPrimaryCrash, then the step
// docs/sql.md asks for (DELETE FROM fence.origin as the kit's owner) before
// the backup's first grant: its grants start a new epoch, none repeats a
// token of the primary, and the primary's tokens are stale there.
func TestBaseBackupOfAnOwnerWithoutPgReadFileTakesTheStep(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	p := pgtest.NewCluster(t, pgtest.ClusterOptions{NoMigrate: true})
	admin := connect(t, ctx, p.URL(), false)
	for _, sql := range []string{
		`CREATE ROLE kitowner LOGIN`,
		`GRANT CREATE ON DATABASE ` + pgtest.ClusterDB + ` TO kitowner`,
		`GRANT CREATE ON SCHEMA public TO kitowner`,
	} {
		_, err := admin.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	require.NoError(t, gofence.Migrate(ctx, poolWith(t, p.URLAs("kitowner"), "")))
	book := newGrantBook(t)
	pc := connect(t, ctx, p.URLAs("kitowner"), false)
	budget, err := sqlfuncs.TokenBudget(ctx, pc)
	require.NoError(t, err)
	require.False(t, budget.ReadsBackupLabel, "an owner without pg_read_file cannot read backup_label.old")
	for range 3 {
		book.grant(ctx, pc, "step/r", "primary, before the backup")
	}
	backup := p.NewBaseBackup(t)
	for range 5 {
		book.grant(ctx, pc, "step/r", "primary, after the backup")
	}
	require.NoError(t, pc.Close(ctx))
	p.Restart(t, "immediate")
	pc = connect(t, ctx, p.URLAs("kitowner"), false)
	for i := range 40 {
		book.grant(ctx, pc, fmt.Sprintf("step/q%d", i), "primary, after its crash")
	}
	book.grant(ctx, pc, "step/r", "primary, after its crash")
	primary := book.per.clone()
	require.NoError(t, pc.Close(ctx))
	p.Stop(t, "immediate")

	backup.StartBackup(t)
	bc := connect(t, ctx, backup.URLAs("kitowner"), false)
	budget, err = sqlfuncs.TokenBudget(ctx, bc)
	require.NoError(t, err)
	require.False(t, budget.ReadsBackupLabel)
	_, err = bc.Exec(ctx, `DELETE FROM fence.origin`) // the step
	require.NoError(t, err)
	for i := range 60 {
		tok := book.grant(ctx, bc, "step/r", "the backup, after the step")
		if i == 0 {
			require.Greater(t, epochOf(tok), primary.maxEpoch(), "the step makes the first grant start a new epoch")
		}
		book.grant(ctx, bc, fmt.Sprintf("step/q%d", i), "the backup, after the step")
	}
	requireStale(t, ctx, bc, primary, "step/r")
}
