package integration

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// Token layout (migrations/001_init.up.sql, fence._epoch):
// token = epoch << 43 | counter.
const epochShift = 43

func epochOf(tok int64) int64   { return tok >> epochShift }
func counterOf(tok int64) int64 { return tok & (1<<epochShift - 1) }

// testTimeout bounds one fault test; a wedged server fails the test instead
// of hanging the binary.
const testTimeout = 3 * time.Minute

// leaseTTL is long enough that no lease of a test expires by itself.
const leaseTTL = time.Minute

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// ledger records, per resource, every token that a grant returned to a
// client successfully. It is what the invariants are checked against.
type ledger struct {
	mu     sync.Mutex
	tokens map[string][]int64
}

func newLedger() *ledger { return &ledger{tokens: map[string][]int64{}} }

func (l *ledger) add(res string, tok int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tokens[res] = append(l.tokens[res], tok)
}

// addAll merges other into l.
func (l *ledger) addAll(other *ledger) {
	for _, res := range other.resources() {
		for _, tok := range other.all(res) {
			l.add(res, tok)
		}
	}
}

// clone returns an independent copy (a snapshot of what was granted so far).
func (l *ledger) clone() *ledger {
	c := newLedger()
	c.addAll(l)
	return c
}

func (l *ledger) all(res string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.tokens[res])
}

// max is the largest token granted for res (0 when none).
func (l *ledger) max(res string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m int64
	for _, tok := range l.tokens[res] {
		m = max(m, tok)
	}
	return m
}

// maxEpoch is the largest epoch of any token of any resource.
func (l *ledger) maxEpoch() int64 {
	var m int64
	for _, res := range l.resources() {
		m = max(m, epochOf(l.max(res)))
	}
	return m
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, toks := range l.tokens {
		n += len(toks)
	}
	return n
}

func (l *ledger) resources() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.tokens))
}

// requireAbove is guarantee 1: tok, granted now for res, is strictly larger
// than every token granted for res before (as recorded in before).
func requireAbove(t *testing.T, before *ledger, res string, tok int64, what string) {
	t.Helper()
	require.Positive(t, tok, "%s: token of %s must be positive", what, res)
	for _, old := range before.all(res) {
		require.Greater(t, tok, old,
			"%s: new token %d (epoch %d, counter %d) of %s does not exceed earlier token %d (epoch %d, counter %d)",
			what, tok, epochOf(tok), counterOf(tok), res, old, epochOf(old), counterOf(old))
	}
}

// requireStale checks that fence.check refuses every token of res recorded
// in old as stale (FN001), now that a newer grant exists.
func requireStale(t *testing.T, ctx context.Context, db sqlfuncs.DB, old *ledger, res string) {
	t.Helper()
	toks := old.all(res)
	require.NotEmpty(t, toks, "no earlier tokens of %s to check", res)
	for _, tok := range toks {
		err := sqlfuncs.Check(ctx, db, res, tok)
		require.ErrorIs(t, err, sqlfuncs.ErrStaleToken, "fence.check(%s, %d) must refuse an old token as stale", res, tok)
	}
}

// grantAfterFault grants res twice on db after a fault: fence.revoke, which
// grants whatever state the lease was left in (a lease live at the fault is
// still live), then fence.acquire, which must now succeed. Both tokens must
// exceed everything in before, and the second the first. It returns both.
func grantAfterFault(t *testing.T, ctx context.Context, db sqlfuncs.DB, before *ledger, res, what string) (revoked, acquired int64) {
	t.Helper()
	revoked, err := sqlfuncs.Revoke(ctx, db, res)
	require.NoError(t, err, "%s: revoke %s", what, res)
	requireAbove(t, before, res, revoked, what+" (revoke)")
	acquired = mustAcquire(t, ctx, db, res, "after-fault")
	requireAbove(t, before, res, acquired, what+" (acquire)")
	require.Greater(t, acquired, revoked, "%s: acquire after revoke of %s", what, res)
	return revoked, acquired
}

func mustAcquire(t *testing.T, ctx context.Context, db sqlfuncs.DB, res, holder string) int64 {
	t.Helper()
	tok, ok, err := sqlfuncs.Acquire(ctx, db, res, holder, leaseTTL)
	require.NoError(t, err, "acquire %s", res)
	require.True(t, ok, "acquire %s: no live lease should exist", res)
	require.Positive(t, tok)
	return tok
}

func mustRevoke(t *testing.T, ctx context.Context, db sqlfuncs.DB, res string) int64 {
	t.Helper()
	tok, err := sqlfuncs.Revoke(ctx, db, res)
	require.NoError(t, err, "revoke %s", res)
	require.Positive(t, tok)
	return tok
}

func mustRelease(t *testing.T, ctx context.Context, db sqlfuncs.DB, res string, tok int64) {
	t.Helper()
	ok, err := sqlfuncs.Release(ctx, db, res, tok)
	require.NoError(t, err, "release %s %d", res, tok)
	require.True(t, ok, "release %s %d: it was the live lease", res, tok)
}

// connect opens a dedicated session, closed when the test ends. With
// syncOff the session runs with synchronous_commit = off, as an application
// that trades durability for latency would: the kit must still make its
// grants durable.
func connect(t *testing.T, ctx context.Context, url string, syncOff bool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err, "connect")
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx) // the server may be gone: that is fine
	})
	if syncOff {
		_, err := conn.Exec(ctx, "SET synchronous_commit = off")
		require.NoError(t, err)
	}
	return conn
}

// leaseTokens reads the latest token of every resource from fence.lease.
func leaseTokens(t *testing.T, ctx context.Context, conn *pgx.Conn) map[string]int64 {
	t.Helper()
	rows, err := conn.Query(ctx, "SELECT resource, token FROM fence.lease")
	require.NoError(t, err)
	m := map[string]int64{}
	for rows.Next() {
		var res string
		var tok int64
		require.NoError(t, rows.Scan(&res, &tok))
		m[res] = tok
	}
	require.NoError(t, rows.Err())
	return m
}

func queryInt(t *testing.T, ctx context.Context, db sqlfuncs.DB, sql string, args ...any) int64 {
	t.Helper()
	var v int64
	require.NoError(t, db.QueryRow(ctx, sql, args...).Scan(&v), "%s", sql)
	return v
}

// timeline is the server's current WAL timeline, as the kit computes it.
func timeline(t *testing.T, ctx context.Context, db sqlfuncs.DB) int64 {
	t.Helper()
	return queryInt(t, ctx, db, "SELECT fence._timeline()")
}

// currentEpoch is the epoch a grant made now would use.
func currentEpoch(t *testing.T, ctx context.Context, db sqlfuncs.DB) int64 {
	t.Helper()
	return queryInt(t, ctx, db, "SELECT fence._epoch()")
}

func systemIdentifier(t *testing.T, ctx context.Context, db sqlfuncs.DB) int64 {
	t.Helper()
	return queryInt(t, ctx, db, "SELECT (pg_control_system()).system_identifier")
}

// epochState is the row of fence.epoch_state.
type epochState struct{ sysid, timeline, base int64 }

func readEpochState(t *testing.T, ctx context.Context, db sqlfuncs.DB) epochState {
	t.Helper()
	var s epochState
	require.NoError(t, db.QueryRow(ctx, "SELECT system_identifier, timeline, base FROM fence.epoch_state").
		Scan(&s.sysid, &s.timeline, &s.base))
	return s
}

// isConnError tells a lost connection (what clients see when the server
// crashes) from an error PostgreSQL answered to a statement.
func isConnError(err error) bool {
	if err == nil {
		return false
	}
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		// 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now
		return strings.HasPrefix(pgErr.SQLState(), "57P") || strings.HasPrefix(pgErr.SQLState(), "08")
	}
	return true // no SQLSTATE: a network-level failure
}
