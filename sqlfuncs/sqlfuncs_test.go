package sqlfuncs_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// bundle is what most tests need: a fresh migrated database.
type bundle struct {
	ctx context.Context
	db  *pgtest.DB
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{ctx: t.Context(), db: pgtest.Setup(t)}
}

// exec runs SQL that belongs to the test itself (tables, rows), failing the
// test on error.
func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(b.ctx, sql, args...)
	require.NoError(t, err, sql)
}

// requireCode asserts that err carries a PostgreSQL error with SQLSTATE code.
func requireCode(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.Error(t, err)
	require.True(t, errors.As(err, &pgErr), "want SQLSTATE %s, got non-PostgreSQL error %v", code, err)
	require.Equal(t, code, pgErr.Code, "message: %s", pgErr.Message)
}

// live reports whether the server counts resource's lease live now (view
// fence.leases, by the server's clock).
func live(t *testing.T, ctx context.Context, db sqlfuncs.DB, resource string) bool {
	t.Helper()
	l, ok, err := sqlfuncs.GetLease(ctx, db, resource)
	require.NoError(t, err)
	return ok && l.Live
}

// waitNotLive waits until resource's lease has ended by the server's clock.
func waitNotLive(t *testing.T, ctx context.Context, db sqlfuncs.DB, resource string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		l, ok, err := sqlfuncs.GetLease(ctx, db, resource)
		if assert.NoError(c, err) {
			assert.False(c, ok && l.Live, "%s is still live", resource)
		}
	}, 10*time.Second, 10*time.Millisecond)
}

// acquireWhenFree polls fence.acquire until the server grants it (the previous
// lease has expired by the server's clock) or the deadline passes.
func acquireWhenFree(t *testing.T, ctx context.Context, db sqlfuncs.DB, resource, holder string, ttl time.Duration) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		tok, ok, err := sqlfuncs.Acquire(ctx, db, resource, holder, ttl)
		require.NoError(t, err)
		if ok {
			return tok
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s was not granted %s within 10s", holder, resource)
	return 0
}

func TestEveryFunctionHasABinding(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// The bindings of this package, by SQL function name. Adding a function to
	// schema fence without a binding (or removing one) fails this test.
	bindings := map[string]any{
		"acquire":         sqlfuncs.Acquire, // and AcquireWaiting: the same function with waiting => true
		"acquire_session": sqlfuncs.AcquireSession,
		"renew":           sqlfuncs.Renew,
		"release":         sqlfuncs.Release,
		"revoke":          sqlfuncs.Revoke,
		"check":           sqlfuncs.Check,
		"use_token":       sqlfuncs.UseToken, // and UseTokens, BeginWithToken(s): the same function for several resources, or with BEGIN
		"protect":         sqlfuncs.Protect,
		"protect_rows":    sqlfuncs.ProtectRows,
		"unprotect":       sqlfuncs.Unprotect,
		"fire_always":     sqlfuncs.FireAlways,
		"allow_producers": sqlfuncs.AllowProducers,
		"lock_key":        sqlfuncs.LockKey,
		"try_lock":        sqlfuncs.TryLock,
		"unlock":          sqlfuncs.Unlock,
		"try_xact_lock":   sqlfuncs.TryXactLock,
		"version":         sqlfuncs.Version,
		"grant_usage":     sqlfuncs.GrantUsage,
		"revoke_usage":    sqlfuncs.RevokeUsage,
		"token_budget":    sqlfuncs.TokenBudget,
	}
	// Internal helpers start with an underscore and trigger functions cannot
	// be called; everything else is public surface.
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		 WHERE n.nspname = 'fence' AND p.proname NOT LIKE '\_%' AND p.prorettype <> 'trigger'::regtype
		 ORDER BY 1`)
	require.NoError(t, err)
	catalog, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)

	var bound []string
	for name := range bindings {
		bound = append(bound, name)
	}
	slices.Sort(bound)
	require.Equal(t, catalog, bound, "schema fence and package sqlfuncs have drifted apart")
}

func TestLeaseLifecycle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, db := b.ctx, b.db.Pool

	t1, ok, err := sqlfuncs.Acquire(ctx, db, "job", "A", 30*time.Second)
	require.NoError(t, err)
	require.True(t, ok)
	require.Positive(t, t1)

	t.Run("a live lease is not granted twice", func(t *testing.T) {
		_, ok, err := sqlfuncs.Acquire(ctx, db, "job", "B", 30*time.Second)
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("renew moves the expiry by the server clock", func(t *testing.T) {
		var before time.Time
		require.NoError(t, db.QueryRow(ctx, `SELECT expires_at FROM fence.leases WHERE resource = 'job'`).Scan(&before))
		exp, ok, err := sqlfuncs.Renew(ctx, db, "job", t1, time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, exp.After(before), "renewed expiry %v not after %v", exp, before)

		_, ok, err = sqlfuncs.Renew(ctx, db, "job", t1+1, time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "renew with a token that is not the live lease")
	})

	t.Run("release is idempotent and wakes waiters", func(t *testing.T) {
		listener := b.db.Conn(t)
		_, err := listener.Exec(ctx, `LISTEN fence_release`)
		require.NoError(t, err)
		_, ok, err := sqlfuncs.AcquireWaiting(ctx, db, "job", "W", time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "held: the waiter asks for a notification")

		released, err := sqlfuncs.Release(ctx, db, "job", t1)
		require.NoError(t, err)
		require.True(t, released)
		released, err = sqlfuncs.Release(ctx, db, "job", t1)
		require.NoError(t, err)
		require.False(t, released, "second release")

		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		require.NoError(t, err)
		require.Equal(t, "fence_release", n.Channel)
		require.Equal(t, "job", n.Payload)

		// A release nobody waits for sends no notification (NOTIFY
		// serializes commits cluster-wide).
		quiet, ok, err := sqlfuncs.Acquire(ctx, db, "unwatched", "A", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		released, err = sqlfuncs.Release(ctx, db, "unwatched", quiet)
		require.NoError(t, err)
		require.True(t, released)
		qctx, qcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer qcancel()
		_, err = listener.WaitForNotification(qctx)
		require.ErrorIs(t, err, context.DeadlineExceeded, "no NOTIFY for an unwatched release")

		_, ok, err = sqlfuncs.Renew(ctx, db, "job", t1, time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "renew after release")
	})

	t.Run("a retried release never touches a newer lease", func(t *testing.T) {
		t2, ok, err := sqlfuncs.Acquire(ctx, db, "job", "B", 30*time.Second)
		require.NoError(t, err)
		require.True(t, ok)
		require.Greater(t, t2, t1)
		released, err := sqlfuncs.Release(ctx, db, "job", t1)
		require.NoError(t, err)
		require.False(t, released)
		var live bool
		var holder string
		require.NoError(t, db.QueryRow(ctx, `SELECT live, holder FROM fence.leases WHERE resource = 'job'`).Scan(&live, &holder))
		require.True(t, live)
		require.Equal(t, "B", holder)
	})

	t.Run("revoke makes every outstanding token stale", func(t *testing.T) {
		var latest int64
		require.NoError(t, db.QueryRow(ctx, `SELECT token FROM fence.leases WHERE resource = 'job'`).Scan(&latest))
		t3, err := sqlfuncs.Revoke(ctx, db, "job")
		require.NoError(t, err)
		require.Greater(t, t3, latest)
		require.ErrorIs(t, sqlfuncs.Check(ctx, db, "job", latest), sqlfuncs.ErrStaleToken)
		var live bool
		var holder *string
		require.NoError(t, db.QueryRow(ctx, `SELECT live, holder FROM fence.leases WHERE resource = 'job'`).Scan(&live, &holder))
		require.False(t, live)
		require.Nil(t, holder)
		t4, ok, err := sqlfuncs.Acquire(ctx, db, "job", "C", time.Second)
		require.NoError(t, err)
		require.True(t, ok, "a revoked resource is free")
		require.Greater(t, t4, t3)
	})
}

// TestTokenLayout: on a database migrated in place, the first grant has
// epoch base 0 + the current timeline and counter 1 (docs/design.md, "Token
// layout"). The databases of setup are copies of a migrated template
// (CREATE DATABASE ... TEMPLATE), and a copy starts a new epoch at its
// first grant (issue 19, item 5): one timeline above.
func TestTokenLayout(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	timeline := func(db sqlfuncs.DB) int64 {
		var tli int64
		require.NoError(t, db.QueryRow(ctx,
			`SELECT ('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint`).Scan(&tli))
		return tli
	}
	t.Run("migrated in place", func(t *testing.T) {
		db := pgtest.Empty(t)
		require.NoError(t, gofence.Migrate(ctx, db.Pool))
		tok, ok, err := sqlfuncs.Acquire(ctx, db.Pool, "layout", "A", time.Second)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, timeline(db.Pool), tok>>43, "epoch (high bits) is base 0 + the current timeline")
		require.Equal(t, int64(1), tok&(1<<43-1), "the first grant of an install has counter 1")
	})
	t.Run("a copy of a migrated template", func(t *testing.T) {
		b := setup(t)
		tok, ok, err := sqlfuncs.Acquire(ctx, b.db.Pool, "layout", "A", time.Second)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, 2*timeline(b.db.Pool), tok>>43, "a copy moves one timeline above the template's epoch")
		require.Equal(t, int64(1), tok&(1<<43-1), "the copy keeps the template's counter")
	})
}

func TestLockKeyMatchesDocumentedMapping(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, name := range []string{"a", "nightly-report", "ünïcødé", `quote'"\`, string(make([]byte, 255))[:0] + "x"} {
		got, err := sqlfuncs.LockKey(b.ctx, b.db.Pool, name)
		require.NoError(t, err)
		require.Equal(t, documentedLockKey(name), got, "lock_key(%q)", name)
		require.Negative(t, got, "keys are negative, never in golang-migrate's [0, 2^32)")
	}

	conn1, conn2 := b.db.Conn(t), b.db.Conn(t)
	ok, err := sqlfuncs.TryLock(b.ctx, conn1, "cron")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = sqlfuncs.TryLock(b.ctx, conn2, "cron")
	require.NoError(t, err)
	require.False(t, ok, "second session")
	ok, err = sqlfuncs.Unlock(b.ctx, conn2, "cron")
	require.NoError(t, err)
	require.False(t, ok, "unlock by a session that does not hold it")
	ok, err = sqlfuncs.Unlock(b.ctx, conn1, "cron")
	require.NoError(t, err)
	require.True(t, ok)

	tx, err := conn1.Begin(b.ctx)
	require.NoError(t, err)
	ok, err = sqlfuncs.TryXactLock(b.ctx, tx, "cron")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = sqlfuncs.TryLock(b.ctx, conn2, "cron")
	require.NoError(t, err)
	require.False(t, ok, "held by the open transaction")
	require.NoError(t, tx.Commit(b.ctx))
	ok, err = sqlfuncs.TryLock(b.ctx, conn2, "cron")
	require.NoError(t, err)
	require.True(t, ok, "released at commit")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	v, err := sqlfuncs.Version(b.ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest, v)

	empty := pgtest.Empty(t)
	_, err = sqlfuncs.Version(b.ctx, empty.Pool)
	require.ErrorIs(t, err, sqlfuncs.ErrNotInstalled)
	require.Contains(t, err.Error(), "pgfence migrate up")
	requireCode(t, err, "3F000")
}

// TestBackendPID: on a direct connection the backend that runs the
// statement is the one announced at connect (gofence's pooler check tells a
// pooler by the difference).
func TestBackendPID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := b.db.Conn(t)
	pid, err := sqlfuncs.BackendPID(b.ctx, conn)
	require.NoError(t, err)
	require.Equal(t, conn.PgConn().PID(), pid)
}

// TestSideEffectFreeHelpersAreInlined: the grant's SQL helpers cost no
// function call because the planner inlines them (docs/design.md, "How the
// grant is put together"). A SET clause, SECURITY DEFINER, a change of
// language or of volatility class would stop that silently; this test
// reads the plan and fails instead.
func TestSideEffectFreeHelpersAreInlined(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, q := range []string{
		`SELECT fence._force_durable()`,
		`SELECT fence._cache_epoch(c) FROM fence.epoch_cache c`,
		`SELECT fence._grant_wait()`,
		`SELECT fence._acting_role()`,
	} {
		rows, err := b.db.Pool.Query(b.ctx, `EXPLAIN (VERBOSE, COSTS OFF) `+q)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "_force_durable", q)
		require.NotContains(t, plan, "_cache_epoch", q)
		require.NotContains(t, plan, "_acting_role", q)
		require.NotContains(t, plan, "_grant_wait", q)
		require.NotContains(t, plan, "_system_identifier", q,
			"fence._system_identifier() is evaluated when the plan is made, and no setting takes its place")
		require.NotContains(t, plan, "_database_oid", q, "fence._database_oid() too")
		require.Contains(t, plan, "CASE WHEN", "%s: the helper's body is in the plan", q)
	}
}

// TestEveryConstraintHasAMigrationsName: every constraint in schema fence
// has the name a migration gave it (docs/sql.md §5, after the views), so
// that a later migration can name what it changes. NOT NULL constraints are
// left out: PostgreSQL 18 lists them in pg_constraint with generated names,
// earlier versions keep them as column properties only, so a migration that
// runs on both changes them by column (ALTER COLUMN ... DROP NOT NULL), never
// by name.
func TestEveryConstraintHasAMigrationsName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.db.Pool.Query(b.ctx, `
		SELECT c.conrelid::regclass::text || ' ' || c.conname FROM pg_constraint c
		 WHERE c.connamespace = 'fence'::regnamespace AND c.contype <> 'n' ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{
		"fence.epoch_state epoch_state_one_row",
		"fence.epoch_state epoch_state_pkey",
		"fence.lease lease_durable",
		"fence.lease lease_durable_update",
		"fence.lease lease_pkey",
		"fence.lease lease_token_key",
	}, names)
}
