package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The randomized workload. K workers (goroutines, each with its own
// session, through its own freezable TCP proxy) loop over M resources:
// acquire or wait, guarded writes in one or more transactions (a table with
// a token column and a table guarded through fence.use_token), pauses
// longer than the TTL (also inside an open transaction), renewals, release
// or vanishing without releasing, and writing on after the lease was lost.
// A fault injector terminates worker sessions, freezes their proxies,
// pauses them, revokes resources as an operator would, and crashes and
// restarts the server. checkHistory (checker_test.go) judges the result.
//
// Replay: every run prints its seed; PGFENCE_CHECK_SEED=<seed> runs the
// same decisions again (which worker does what, which fault when). Timing is
// the machine's, so a replay follows the same script, not the same
// interleaving.
//
// Long run: PGFENCE_CHECK_DURATION=10m go test ./integration -run
// TestRandomizedHistory -v -timeout 0 (runs of PGFENCE_CHECK_RUN each,
// default 30s, on one cluster; figures are logged at the end).

const (
	envCheckSeed     = "PGFENCE_CHECK_SEED"
	envCheckDuration = "PGFENCE_CHECK_DURATION"
	envCheckRun      = "PGFENCE_CHECK_RUN"
)

// workload describes one run.
type workload struct {
	seed      uint64
	run       int // names the run's schema h<run> and resources h<run>/r<j>
	workers   int
	resources int
	duration  time.Duration
	ttl       time.Duration
	faults    bool
	// crash crashes and restarts the server; nil when the target cannot.
	crash func()
	// unguarded is the deliberately broken variant: the tables are not
	// protected, so stale writes commit and the checker must say so.
	unguarded bool
	// rows is the per-row variant (history_rows_test.go): the resources are
	// rows of two tables protected with fence.protect_rows, and a worker may
	// hold two leases at once.
	rows bool
	// large is the per-row variant with many resources
	// (history_large_test.go): a worker holds up to 300 leases at once and
	// writes them with statements over up to all of them. rows is true too.
	large bool
}

func (w workload) schema() string { return fmt.Sprintf("h%d", w.run) }

// resource names resource j: h<run>/r<j>, or h<run>/row:<j+1> in a per-row
// run, where it is the resource of the rows whose resource id is j+1.
func (w workload) resource(j int) string {
	if w.rows {
		return fmt.Sprintf("%s%d", w.rowPrefix(), j+1)
	}
	return fmt.Sprintf("h%d/r%d", w.run, j)
}
func (w workload) table(kind string, j int) string {
	return fmt.Sprintf("%s.%s_%d", w.schema(), kind, j)
}

// figures are the counters of one or more runs.
type figures struct {
	runs, ops                                       int
	grants, busy, revokes                           int
	writesCommitted, writesLost                     int
	staleRefused, staleRefusedMidTx, staleCommitted int
	renewed, renewLost, released, vanished          int
	reconnects, zombieWrites                        int
	blindTried, blindRefused, blindCommitted        int
	// per-row runs: writes presenting another resource's token, and the
	// guarded statements by kind
	foreignTried, foreignRefused, foreignCommitted int
	deadlocks                                      int // guarded transactions refused with 40P01
	stmts                                          map[string]stmtFigures
	// per-row runs: the guarded statements by the number of resources they
	// were to write, the guarded transactions by isolation level (and those
	// whose statements of at most 16 resources named more than 64 in all),
	// and the SQLSTATEs of the refused ones
	sizes, txKinds map[string]stmtFigures
	refusals       map[string]int
	// large runs: the most locks in the server's lock table (pg_locks) at
	// one sample, the fault injector's, of every run
	maxLocks       int
	faults         map[string]int
	exclusionPairs int
	violations     []string
	unexpected     []string
}

func (f *figures) add(o figures) {
	f.runs += o.runs
	f.ops += o.ops
	f.grants += o.grants
	f.busy += o.busy
	f.revokes += o.revokes
	f.writesCommitted += o.writesCommitted
	f.writesLost += o.writesLost
	f.staleRefused += o.staleRefused
	f.staleRefusedMidTx += o.staleRefusedMidTx
	f.staleCommitted += o.staleCommitted
	f.renewed += o.renewed
	f.renewLost += o.renewLost
	f.released += o.released
	f.vanished += o.vanished
	f.reconnects += o.reconnects
	f.zombieWrites += o.zombieWrites
	f.blindTried += o.blindTried
	f.blindRefused += o.blindRefused
	f.blindCommitted += o.blindCommitted
	f.foreignTried += o.foreignTried
	f.foreignRefused += o.foreignRefused
	f.foreignCommitted += o.foreignCommitted
	f.deadlocks += o.deadlocks
	f.exclusionPairs += o.exclusionPairs
	f.maxLocks = max(f.maxLocks, o.maxLocks)
	if f.faults == nil {
		f.faults = map[string]int{}
	}
	for k, n := range o.faults {
		f.faults[k] += n
	}
	f.stmts = addStmtFigures(f.stmts, o.stmts)
	f.sizes = addStmtFigures(f.sizes, o.sizes)
	f.txKinds = addStmtFigures(f.txKinds, o.txKinds)
	if f.refusals == nil {
		f.refusals = map[string]int{}
	}
	for k, n := range o.refusals {
		f.refusals[k] += n
	}
	f.violations = append(f.violations, o.violations...)
	f.unexpected = append(f.unexpected, o.unexpected...)
}

func (f *figures) log(t *testing.T, what string) {
	t.Helper()
	kinds := slices.Sorted(func(yield func(string) bool) {
		for k := range f.faults {
			if !yield(k) {
				return
			}
		}
	})
	var fs []string
	total := 0
	for _, k := range kinds {
		fs = append(fs, fmt.Sprintf("%s %d", k, f.faults[k]))
		total += f.faults[k]
	}
	t.Logf("%s: runs %d, operations %d, grants %d (busy or held %d, operator revokes %d), "+
		"guarded transactions committed %d (outcome lost %d), renewals %d (lost lease %d), releases %d, vanished %d, "+
		"reconnects %d, writes after a lost lease %d; faults %d (%s); stale writes attempted %d, refused with FN001 %d "+
		"(%d mid-transaction), committed %d; writes presenting no token %d, refused with FN002 %d, committed %d; "+
		"lease pairs checked by the server clock %d; violations %d; unexpected errors %d",
		what, f.runs, f.ops, f.grants, f.busy, f.revokes, f.writesCommitted, f.writesLost, f.renewed, f.renewLost,
		f.released, f.vanished, f.reconnects, f.zombieWrites, total, strings.Join(fs, ", "),
		f.staleRefused+f.staleCommitted, f.staleRefused, f.staleRefusedMidTx, f.staleCommitted,
		f.blindTried, f.blindRefused, f.blindCommitted, f.exclusionPairs, len(f.violations), len(f.unexpected))
	if len(f.stmts) == 0 && f.foreignTried == 0 {
		return
	}
	t.Logf("%s, per-row statements: %s; writes presenting another resource's token (or none of it) %d, refused %d, accepted %d; "+
		"guarded transactions refused with a deadlock %d",
		what, f.stmtLine(f.stmts), f.foreignTried, f.foreignRefused, f.foreignCommitted, f.deadlocks)
	t.Logf("%s, per-row statements by the resources they were to write: %s", what, f.stmtLine(f.sizes))
	var rs []string
	for _, k := range slices.Sorted(maps.Keys(f.refusals)) {
		rs = append(rs, fmt.Sprintf("%s %d", k, f.refusals[k]))
	}
	locks := ""
	if f.maxLocks > 0 {
		locks = fmt.Sprintf("; most locks in pg_locks at one sample %d", f.maxLocks)
	}
	t.Logf("%s, per-row transactions: %s; refused with %s%s", what, f.stmtLine(f.txKinds), strings.Join(rs, ", "), locks)
}

// stmtLine is one line of statement figures, in the order of their keys.
func (f *figures) stmtLine(m map[string]stmtFigures) string {
	var ks []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		n := m[k]
		ks = append(ks, fmt.Sprintf("%s: tried %d, refused %d, committed %d (%d rows)", k, n.tried, n.refused, n.committed, n.rows))
	}
	return strings.Join(ks, "; ")
}

// addStmtFigures adds the counts of o to m (made when nil) and returns m.
func addStmtFigures(m, o map[string]stmtFigures) map[string]stmtFigures {
	if m == nil {
		m = map[string]stmtFigures{}
	}
	for k, n := range o {
		x := m[k]
		x.tried += n.tried
		x.refused += n.refused
		x.committed += n.committed
		x.rows += n.rows
		m[k] = x
	}
	return m
}

// stmtFigures count the guarded statements of one kind in a per-row run:
// sent, refused (that statement raised), and committed (its transaction
// committed), with the rows the committed ones wrote. The rest rolled back
// with their transaction or had their outcome lost.
type stmtFigures struct{ tried, refused, committed, rows int }

// history collects events from every goroutine.
type history struct {
	mu     sync.Mutex
	events []event
	txid   atomic.Int64
	// counters the checker cannot derive from events
	reconnects, zombie, vanished atomic.Int64
	// writes that presented no token (blindWrite): tried, refused with
	// FN002, and committed (each one a violation)
	blindTried, blindRefused, blindCommitted atomic.Int64
	// per-row runs: writes presenting the token of a resource the worker
	// does not hold (foreignWrite), and statements by kind, statements by
	// size, transactions by kind, refusals by SQLSTATE (under mu)
	foreignTried, foreignRefused, foreignCommitted atomic.Int64
	stmts, sizes, txKinds                          map[string]stmtFigures
	refusals                                       map[string]int
}

func (h *history) add(e event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

// outcome classifies an error: nil is ok, a connection-level failure or a
// timeout is lost (the server may or may not have committed), any other
// PostgreSQL error is refused (the transaction rolled back).
func outcome(err error) (out, code string) {
	if err == nil {
		return outOK, ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !isConnError(err) && pgErr.Code != "57014" {
		return outRefused, pgErr.Code
	}
	return outLost, ""
}

// expectedCode says which refusals the workload expects: FN001 (stale
// token) always; with the tables unguarded none arise. In a per-row run
// also a deadlock (40P01): a zombie's first statement on a resource's rows
// locks some of them before its check refuses it, and the new holder's
// statement over the same rows may have locked others first; PostgreSQL
// rolls one back, which is safe (the zombie's would fail anyway). And a
// serialization failure (40001): per-row transactions also run under
// REPEATABLE READ, where the check of a lease row that a grant (or a
// revoke) changed after the transaction's snapshot fails so, instead of
// with FN001.
func (w workload) expectedCode(code string) bool {
	return code == sqlfuncs.CodeStaleToken || (w.rows && (code == "40P01" || code == "40001"))
}

// worker is one client.
type worker struct {
	id   int
	w    workload
	url  string // through the worker's proxy
	h    *history
	rng  *rand.Rand
	conn *pgx.Conn
	pid  atomic.Int32
	// pauseNS, set by the fault injector, makes the worker stop for that
	// long at its next step (between statements, also inside a transaction).
	pauseNS atomic.Int64
	unexp   []string
	// deleted are rows this worker deleted (per-row runs), to insert again
	// under the same id; no other worker uses them.
	deleted []rowRef
	// held are the leases the worker holds in a large per-row run, for the
	// fault injector's revokes (nil between holds).
	held atomic.Pointer[[]lease]
	// writing are resources (indexes) whose tokens the worker's open
	// guarded transaction presented so far, in a large per-row run (nil
	// outside one): those presented in the token column only, if any; for
	// the fault injector's revokes.
	writing atomic.Pointer[[]int]
	// forcedStale: in an unguarded large per-row run (the checker's
	// control), this worker made the stale write that holdMany forces;
	// columnOnly makes writeRows present tokens in the token column only
	// (fence.use_token refuses a stale token even on unguarded tables).
	forcedStale, columnOnly bool
}

// opTimeout bounds one statement of a worker: a frozen proxy holds a worker
// for at most a few TTLs, never this long, unless the thaw is lost.
const workerOpTimeout = 5 * time.Second

func (wk *worker) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// step honours a pause requested by the fault injector.
func (wk *worker) step(ctx context.Context) {
	if d := wk.pauseNS.Swap(0); d > 0 {
		wk.sleep(ctx, time.Duration(d))
	}
}

func (wk *worker) drop() {
	if wk.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = wk.conn.Close(ctx)
		cancel()
		wk.conn = nil
		wk.pid.Store(0)
	}
}

// connect (re)opens the worker's session; false when ctx ended first.
func (wk *worker) connect(ctx context.Context) bool {
	wk.drop()
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, wk.url)
		if err == nil {
			var pid int32
			err = conn.QueryRow(cctx, `SELECT pg_backend_pid()`).Scan(&pid)
			if err == nil {
				// A grant waits for an open guarded transaction of a paused
				// holder at most this long, then reports the resource busy.
				_, err = conn.Exec(cctx, `SET fence.grant_wait = '250ms'`)
			}
			if err == nil {
				cancel()
				wk.conn = conn
				wk.pid.Store(pid)
				return true
			}
			_ = conn.Close(cctx)
		}
		cancel()
		wk.sleep(ctx, 50*time.Millisecond)
	}
	return false
}

func (wk *worker) unexpected(op string, err error) {
	wk.unexp = append(wk.unexp, fmt.Sprintf("worker %d: %s: %v", wk.id, op, err))
}

// finish records the outcome of an operation and drops a broken session.
func (wk *worker) finish(e event, err error) event {
	e.out, e.code = outcome(err)
	if err != nil {
		e.err = err.Error()
	}
	if e.out == outLost {
		wk.drop()
	}
	if e.out == outRefused && !wk.w.expectedCode(e.code) {
		wk.unexpected(e.kind, err)
	}
	wk.h.add(e)
	return e
}

// inTx runs fn in a transaction on the worker's session; the error is the
// first failure, the commit's included.
func (wk *worker) inTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return wk.inTxIso(ctx, pgx.ReadCommitted, fn)
}

// inTxIso is inTx at isolation level iso.
func (wk *worker) inTxIso(ctx context.Context, iso pgx.TxIsoLevel, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if wk.conn == nil {
		return errNoSession
	}
	ctx, cancel := context.WithTimeout(ctx, workerOpTimeout)
	defer cancel()
	tx, err := wk.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		_ = tx.Rollback(rctx)
		rcancel()
		return err
	}
	return tx.Commit(ctx)
}

// errNoGrant marks a NULL/false answer inside inTx, so the transaction
// rolls back (it changed nothing anyway).
var errNoGrant = errors.New("no grant")

// errInvisibleGrant: fence.leases does not show the lease that the same
// transaction just granted. Never expected.
var errInvisibleGrant = errors.New("the lease row is not visible in its granting transaction")

// errNoSession: the worker's session died in an earlier step of the same
// round; the operation was not sent (its outcome counts as lost).
var errNoSession = errors.New("no session")

// acquire tries fence.acquire and logs the grant in the same transaction.
func (wk *worker) acquire(ctx context.Context, res string) (int64, bool) {
	var tok int64
	err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		t, ok, err := sqlfuncs.Acquire(ctx, tx, res, fmt.Sprintf("w%d", wk.id), wk.w.ttl)
		if err != nil {
			return err
		}
		if !ok {
			return errNoGrant
		}
		tok = t
		return logGrant(ctx, tx, wk.w, res, t, opAcquire, wk.id)
	})
	if errors.Is(err, errNoGrant) {
		wk.h.add(event{worker: wk.id, kind: opAcquire, res: res, out: outNone})
		return 0, false
	}
	if errors.Is(err, errInvisibleGrant) {
		wk.unexpected(opAcquire, err)
	}
	e := wk.finish(event{worker: wk.id, kind: opAcquire, res: res, tok: tok}, err)
	return tok, e.out == outOK
}

// logGrant appends the grant just made in tx to the run's grant log, with
// the lease row as the server wrote it and the next commit-order number.
func logGrant(ctx context.Context, tx pgx.Tx, w workload, res string, tok int64, kind string, worker int) error {
	tag, err := tx.Exec(ctx, `INSERT INTO `+w.schema()+`.grant_log (res, tok, kind, worker, acquired_at, expires_at, seq)
		SELECT resource, token, $3, $4, acquired_at, expires_at, nextval('`+w.schema()+`.seq')
		  FROM fence.leases WHERE resource = $1 AND token = $2`, res, tok, kind, worker)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("%w: %s, token %d", errInvisibleGrant, res, tok)
	}
	return err
}

func (wk *worker) renew(ctx context.Context, res string, tok int64) bool {
	err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		exp, ok, err := sqlfuncs.Renew(ctx, tx, res, tok, wk.w.ttl)
		if err != nil {
			return err
		}
		if !ok {
			return errNoGrant
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+wk.w.schema()+`.renew_log (res, tok, expires_at, seq)
			VALUES ($1, $2, $3, nextval('`+wk.w.schema()+`.seq'))`, res, tok, exp)
		return err
	})
	if errors.Is(err, errNoGrant) {
		wk.h.add(event{worker: wk.id, kind: opRenew, res: res, tok: tok, out: outNone})
		return false
	}
	return wk.finish(event{worker: wk.id, kind: opRenew, res: res, tok: tok}, err).out == outOK
}

func (wk *worker) release(ctx context.Context, res string, tok int64) {
	err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		ok, err := sqlfuncs.Release(ctx, tx, res, tok)
		if err != nil {
			return err
		}
		if !ok {
			return errNoGrant
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+wk.w.schema()+`.end_log (res, tok, ended_at, seq)
			SELECT resource, token, ended_at, nextval('`+wk.w.schema()+`.seq') FROM fence.leases WHERE resource = $1 AND token = $2`, res, tok)
		return err
	})
	if errors.Is(err, errNoGrant) {
		wk.h.add(event{worker: wk.id, kind: opRelease, res: res, tok: tok, out: outNone})
		return
	}
	wk.finish(event{worker: wk.id, kind: opRelease, res: res, tok: tok}, err)
}

// write runs one guarded transaction under tok: one to four inserts, into
// the token-column table or (after fence.use_token) the use_token table,
// sometimes with a pause longer than the TTL between them, and last the log
// row with the commit-order number.
func (wk *worker) write(ctx context.Context, j int, tok int64) event {
	res := wk.w.resource(j)
	txid := wk.h.txid.Add(1)
	n := 1 + wk.rng.IntN(4)
	done := 0
	useToken := false
	err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		for i := range n {
			wk.step(ctx)
			if i > 0 && wk.rng.IntN(12) == 0 {
				wk.sleep(ctx, wk.w.ttl+time.Duration(wk.rng.Int64N(int64(wk.w.ttl)))) // paused holder, transaction open
			}
			var err error
			if wk.rng.IntN(2) == 0 {
				_, err = tx.Exec(ctx, `INSERT INTO `+wk.w.table("tc", j)+` (txid, tok, pos) VALUES ($1, $2, $3)`, txid, tok, i)
			} else {
				if !useToken {
					if err = sqlfuncs.UseToken(ctx, tx, res, tok); err != nil {
						return err
					}
					useToken = true
				}
				_, err = tx.Exec(ctx, `INSERT INTO `+wk.w.table("ut", j)+` (txid, tok, pos) VALUES ($1, $2, $3)`, txid, tok, i)
			}
			if err != nil {
				return err
			}
			done++
		}
		wk.step(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO `+wk.w.schema()+`.txlog (txid, res, tok, nrows, seq, lsn)
			VALUES ($1, $2, $3, $4, nextval('`+wk.w.schema()+`.seq'), pg_current_wal_insert_lsn())`, txid, []string{res}, []int64{tok}, n)
		return err
	})
	return wk.finish(event{worker: wk.id, kind: opWrite, res: res, tok: tok, txid: txid, midTx: done > 0}, err)
}

// blindWrite tries, in its own transaction, a write to the resource's
// tables that presents no token: an UPDATE of other columns, a DELETE, or
// (PostgreSQL 15+) a MERGE, of rows that holders wrote, so they carry a
// token, often the latest. Whatever they carry, the write must fail with
// FN002 (migration 003; migration 002 let such writes commit once the rows
// carried the newest token). One that writes a row is a violation.
func (wk *worker) blindWrite(ctx context.Context, j int) {
	ctx, cancel := context.WithTimeout(ctx, workerOpTimeout)
	defer cancel()
	merge := false
	if v, _ := strconv.Atoi(strings.SplitN(wk.conn.PgConn().ParameterStatus("server_version"), ".", 2)[0]); v >= 15 {
		merge = true
	}
	var stmts []string
	if wk.w.rows {
		stmts = wk.blindRowStatements(merge)
		if wk.w.large {
			stmts = append(stmts, wk.largeBlindStatements()...)
		}
	} else {
		tc, ut := wk.w.table("tc", j), wk.w.table("ut", j)
		stmts = []string{
			`UPDATE ` + tc + ` SET pos = pos + 1000 WHERE txid = (SELECT max(txid) FROM ` + tc + `)`,
			`UPDATE ` + ut + ` SET pos = pos + 1000 WHERE txid = (SELECT max(txid) FROM ` + ut + `)`,
			`DELETE FROM ` + tc + ` WHERE txid = (SELECT max(txid) FROM ` + tc + `)`,
		}
		if merge {
			stmts = append(stmts, `MERGE INTO `+tc+` t USING (SELECT max(txid) AS txid FROM `+tc+`) s ON t.txid = s.txid
			WHEN MATCHED THEN UPDATE SET pos = t.pos + 1000`)
		}
	}
	wk.h.blindTried.Add(1)
	tag, err := wk.conn.Exec(ctx, stmts[wk.rng.IntN(len(stmts))])
	switch out, code := outcome(err); {
	case out == outOK && tag.RowsAffected() > 0:
		wk.h.blindCommitted.Add(1)
	case out == outOK: // no row matched: nothing written, nothing to judge
	case out == outLost:
		wk.drop()
	case code == sqlfuncs.CodeNoToken:
		wk.h.blindRefused.Add(1)
	case wk.w.rows && code == "40P01":
		// a deadlock with a holder over the rows of many resources: rolled
		// back before the guard had its say (not counted as refused)
	default:
		wk.unexpected("write presenting no token", err)
	}
}

// lease is a lease a worker holds: resource j under token tok.
type lease struct {
	j   int
	tok int64
}

// loop is the worker's life until ctx ends.
func (wk *worker) loop(ctx context.Context) {
	defer wk.drop()
	for ctx.Err() == nil {
		if wk.conn == nil && !wk.connect(ctx) {
			return
		}
		wk.step(ctx)
		if wk.w.large {
			wk.largeRound(ctx)
			continue
		}
		j := wk.rng.IntN(wk.w.resources)
		l, granted := wk.acquireOrWait(ctx, j)
		if !granted {
			continue
		}
		ls := []lease{l}
		// In a per-row run, half the holders take a second resource too
		// (without waiting long: they already hold one), so that their
		// transactions write rows of both and move rows between them.
		if wk.w.rows && wk.w.resources > 1 && wk.rng.IntN(2) == 0 && wk.conn != nil {
			k := (j + 1 + wk.rng.IntN(wk.w.resources-1)) % wk.w.resources
			if tok, ok := wk.acquire(ctx, wk.w.resource(k)); ok {
				ls = append(ls, lease{k, tok})
			}
		}
		wk.hold(ctx, ls)
	}
}

// acquireOrWait tries to acquire resource j a few times.
func (wk *worker) acquireOrWait(ctx context.Context, j int) (lease, bool) {
	for try := 0; try < 6 && ctx.Err() == nil && wk.conn != nil; try++ { // acquire, or wait and retry
		if tok, granted := wk.acquire(ctx, wk.w.resource(j)); granted {
			return lease{j, tok}, true
		}
		wk.sleep(ctx, time.Duration(5+wk.rng.IntN(40))*time.Millisecond)
	}
	return lease{}, false
}

// hold works under the leases ls until the worker lets go of them.
func (wk *worker) hold(ctx context.Context, ls []lease) {
	lost := false // the worker knows it lost a lease (renewal refused, FN001)
	rounds := 1 + wk.rng.IntN(5)
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		if wk.conn == nil {
			// The session died (fault); most holders reconnect and carry on
			// with the token they have, which is safe: the database judges.
			if !wk.connect(ctx) {
				return
			}
			wk.h.reconnects.Add(1)
			if wk.rng.IntN(4) == 0 {
				return
			}
		}
		switch r := wk.rng.IntN(20); {
		case r < 2: // a pause longer than the TTL (GC, swap, a stall)
			wk.sleep(ctx, wk.w.ttl+time.Duration(wk.rng.Int64N(int64(2*wk.w.ttl))))
		case r < 8:
			for _, l := range ls {
				if wk.conn != nil && !wk.renew(ctx, wk.w.resource(l.j), l.tok) {
					lost = true
				}
			}
		}
		if wk.conn == nil {
			continue // the renewal lost the session; reconnect first
		}
		if lost {
			wk.h.zombie.Add(1)
		}
		if wk.rng.IntN(5) == 0 {
			wk.blindWrite(ctx, ls[0].j)
			if wk.conn == nil {
				continue
			}
		}
		var e event
		if wk.w.rows {
			if wk.rng.IntN(6) == 0 {
				wk.foreignWrite(ctx, ls)
				if wk.conn == nil {
					continue
				}
			}
			e = wk.writeRows(ctx, ls)
		} else {
			e = wk.write(ctx, ls[0].j, ls[0].tok)
		}
		if e.out == outRefused {
			lost = true
			if wk.rng.IntN(3) != 0 { // a well-behaved holder stops; a zombie writes on
				return
			}
		}
	}
	if ctx.Err() != nil || wk.conn == nil {
		return
	}
	switch r := wk.rng.IntN(10); {
	case r < 6:
		for _, l := range ls {
			if wk.conn != nil {
				wk.release(ctx, wk.w.resource(l.j), l.tok)
			}
		}
	case r < 8:
		wk.h.vanished.Add(1) // walk away; the lease expires by itself
	default:
		wk.h.vanished.Add(1) // walk away and drop the session too
		wk.drop()
	}
}

// target is where a run happens: a URL and, on a private cluster, a way to
// crash the server.
type target struct {
	url   string
	crash func()
}

// runWorkload prepares the run's schema on target, runs the workers and the
// fault injector for w.duration, and checks the result.
func runWorkload(t *testing.T, ctx context.Context, tg target, w workload) figures {
	t.Helper()
	t.Logf("run %d: seed %d (replay with %s=%d), %d workers, %d resources, ttl %s, %s, faults %v, crash %v, unguarded %v",
		w.run, w.seed, envCheckSeed, w.seed, w.workers, w.resources, w.ttl, w.duration, w.faults, w.crash != nil, w.unguarded)
	admin := newAdmin(t, ctx, tg.url)
	if w.large {
		// Large statements must fit the default lock table.
		var locks string
		require.NoError(t, admin.get(ctx).QueryRow(ctx, `SHOW max_locks_per_transaction`).Scan(&locks))
		require.Equal(t, "64", locks, "the large run is meant for the default max_locks_per_transaction")
	}
	setupRun(t, ctx, admin.get(ctx), w)

	h := &history{}
	proxies := make([]*pgtest.Proxy, w.workers)
	workers := make([]*worker, w.workers)
	for i := range workers {
		proxies[i] = pgtest.NewProxy(t, tg.url)
		workers[i] = &worker{id: i, w: w, url: proxies[i].URL(tg.url), h: h, rng: rand.New(rand.NewPCG(w.seed, uint64(i)+1))}
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, wk := range workers {
		wg.Go(func() { wk.loop(wctx) })
	}

	faults := map[string]int{}
	rng := rand.New(rand.NewPCG(w.seed, 0))
	deadline := time.Now().Add(w.duration)
	lastCrash := time.Now()
	crashGap := max(w.duration/3, 2*time.Second)
	crashed := false
	maxLocks := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(min(time.Duration(50+rng.IntN(300))*time.Millisecond, time.Until(deadline)+time.Millisecond))
		if w.large {
			// the lock budget: how full the lock table gets
			var n int
			qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
			if c := admin.get(ctx); c.QueryRow(qctx, `SELECT count(*) FROM pg_locks`).Scan(&n) == nil {
				maxLocks = max(maxLocks, n)
			} else {
				admin.reset()
			}
			qcancel()
		}
		if !w.faults || !time.Now().Before(deadline) {
			continue
		}
		wk := workers[rng.IntN(len(workers))]
		if w.large && rng.IntN(2) == 0 {
			// Large runs: more revokes of leases that workers hold, and of
			// resources that an open transaction has written (the revoke
			// must wait for it, and give up: busy).
			var open []int
			for i := range workers {
				if js := workers[(wk.id+i)%len(workers)].writing.Load(); js != nil && len(*js) > 0 {
					open = *js
					break
				}
			}
			if len(open) > 0 && rng.IntN(3) != 0 {
				operatorRevoke(ctx, admin, w, w.resource(open[rng.IntN(len(open))]), h)
				faults["operator revoke of a resource an open transaction wrote"]++
			} else if ls := wk.held.Load(); ls != nil && len(*ls) > 0 {
				operatorRevoke(ctx, admin, w, w.resource((*ls)[rng.IntN(len(*ls))].j), h)
				faults["operator revoke of a held lease"]++
			}
		}
		switch r := rng.IntN(20); {
		case r < 5:
			if pid := wk.pid.Load(); pid != 0 {
				if c := admin.get(ctx); c != nil {
					if _, err := c.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
						admin.reset()
					}
				}
				faults["terminate"]++
			}
		case r < 10:
			p := proxies[wk.id]
			p.Freeze()
			d := w.ttl + time.Duration(rng.Int64N(int64(3*w.ttl)))
			if rng.IntN(4) == 0 {
				time.AfterFunc(d, func() { p.Kill(); p.Thaw() })
				faults["freeze then cut"]++
			} else {
				time.AfterFunc(d, p.Thaw)
				faults["freeze"]++
			}
		case r < 15:
			wk.pauseNS.Store(int64(w.ttl + time.Duration(rng.Int64N(int64(2*w.ttl)))))
			faults["pause"]++
		case r < 18:
			operatorRevoke(ctx, admin, w, w.resource(rng.IntN(w.resources)), h)
			faults["operator revoke"]++
		default:
			// A crash at most every crashGap, and at least one per run.
			if tg.crash != nil && time.Since(lastCrash) >= crashGap {
				tg.crash()
				admin.reset()
				lastCrash, crashed = time.Now(), true
				faults["crash and restart"]++
			}
		}
		if w.faults && tg.crash != nil && !crashed && time.Until(deadline) < w.duration/3 {
			tg.crash()
			admin.reset()
			lastCrash, crashed = time.Now(), true
			faults["crash and restart"]++
		}
	}
	for _, p := range proxies {
		p.Thaw()
	}
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("run %d: workers did not stop within 30s", w.run)
	}
	for _, p := range proxies {
		p.Thaw() // a freeze timer may have fired late; nothing waits on it now
	}

	st := readState(t, ctx, admin.get(ctx), w)
	h.mu.Lock()
	events := slices.Clone(h.events)
	h.mu.Unlock()
	res := checkHistory(events, st)

	f := figures{runs: 1, ops: len(events), faults: faults, exclusionPairs: res.exclusionPairs, maxLocks: maxLocks,
		staleRefused: res.staleRefused, staleCommitted: res.staleCommitted, violations: res.violations,
		reconnects: int(h.reconnects.Load()), zombieWrites: int(h.zombie.Load()), vanished: int(h.vanished.Load()),
		blindTried: int(h.blindTried.Load()), blindRefused: int(h.blindRefused.Load()), blindCommitted: int(h.blindCommitted.Load()),
		foreignTried: int(h.foreignTried.Load()), foreignRefused: int(h.foreignRefused.Load()), foreignCommitted: int(h.foreignCommitted.Load()),
		stmts: maps.Clone(h.stmts), sizes: maps.Clone(h.sizes), txKinds: maps.Clone(h.txKinds), refusals: maps.Clone(h.refusals)}
	if f.blindCommitted > 0 {
		res.violations = append(res.violations, fmt.Sprintf("%d writes that presented no token committed", f.blindCommitted))
	}
	if f.foreignCommitted > 0 {
		res.violations = append(res.violations, fmt.Sprintf("%d writes that presented the token of another resource (or none of it) were accepted", f.foreignCommitted))
	}
	f.violations = res.violations
	for _, wk := range workers {
		f.unexpected = append(f.unexpected, wk.unexp...)
	}
	for _, e := range events {
		switch {
		case (e.kind == opAcquire || e.kind == opRevoke) && e.out == outOK:
			f.grants++
			if e.kind == opRevoke {
				f.revokes++
			}
		case e.kind == opAcquire && e.out == outNone:
			f.busy++
		case e.kind == opRenew && e.out == outOK:
			f.renewed++
		case e.kind == opRenew && e.out == outNone:
			f.renewLost++
		case e.kind == opRelease && e.out == outOK:
			f.released++
		case e.kind == opWrite && e.out == outOK:
			f.writesCommitted++
		case e.kind == opWrite && e.out == outLost:
			f.writesLost++
		}
		if e.kind == opWrite && e.code == sqlfuncs.CodeStaleToken && e.midTx {
			f.staleRefusedMidTx++
		}
		if e.kind == opWrite && e.code == "40P01" {
			f.deadlocks++
		}
	}
	for i, v := range res.violations {
		if i == 20 {
			t.Logf("run %d: ... %d more violations", w.run, len(res.violations)-i)
			break
		}
		t.Logf("run %d: violation: %s", w.run, v)
	}
	return f
}

// admin is a direct (unproxied) session for the fault injector, reopened
// after a crash.
type admin struct {
	t    *testing.T
	url  string
	conn *pgx.Conn
}

func newAdmin(t *testing.T, ctx context.Context, url string) *admin {
	a := &admin{t: t, url: url}
	t.Cleanup(a.reset)
	return a
}

func (a *admin) get(ctx context.Context) *pgx.Conn {
	if a.conn != nil && !a.conn.IsClosed() {
		return a.conn
	}
	for range 100 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, a.url)
		cancel()
		if err == nil {
			a.conn = conn
			return conn
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.t.Fatalf("admin session: cannot connect to %s", a.url)
	return nil
}

func (a *admin) reset() {
	if a.conn != nil {
		_ = a.conn.Close(context.Background())
		a.conn = nil
	}
}

// operatorRevoke is fence.revoke from an operator's session, logged like a
// grant.
func operatorRevoke(ctx context.Context, a *admin, w workload, res string, h *history) {
	conn := a.get(ctx)
	var tok int64
	ctx, cancel := context.WithTimeout(ctx, workerOpTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		t, err := sqlfuncs.Revoke(ctx, tx, res)
		if err != nil {
			return err
		}
		tok = t
		return logGrant(ctx, tx, w, res, t, opRevoke, -1)
	})
	e := event{worker: -1, kind: opRevoke, res: res, tok: tok}
	e.out, e.code = outcome(err)
	if errors.Is(err, sqlfuncs.ErrBusy) {
		e.out = outNone // a holder's transaction stayed open past fence.grant_wait
	}
	if e.out == outLost {
		a.reset()
	}
	h.add(e)
}

// setupRun creates the run's schema: logs, sequence, and per resource a
// table guarded by a token column and one guarded through fence.use_token
// (in a per-row run, the two per-row tables of setupRows).
func setupRun(t *testing.T, ctx context.Context, conn *pgx.Conn, w workload) {
	t.Helper()
	s := w.schema()
	stmts := []string{
		`CREATE SCHEMA ` + s,
		`CREATE SEQUENCE ` + s + `.seq`,
		`CREATE TABLE ` + s + `.grant_log (res text NOT NULL, tok bigint NOT NULL, kind text NOT NULL, worker int NOT NULL,
			acquired_at timestamptz NOT NULL, expires_at timestamptz, seq bigint NOT NULL)`,
		`CREATE TABLE ` + s + `.renew_log (res text NOT NULL, tok bigint NOT NULL, expires_at timestamptz NOT NULL, seq bigint NOT NULL)`,
		`CREATE TABLE ` + s + `.end_log (res text NOT NULL, tok bigint NOT NULL, ended_at timestamptz NOT NULL, seq bigint NOT NULL)`,
		`CREATE TABLE ` + s + `.txlog (txid bigint PRIMARY KEY, res text[] NOT NULL, tok bigint[] NOT NULL, nrows int NOT NULL,
			seq bigint NOT NULL, lsn pg_lsn NOT NULL)`,
	}
	if w.rows {
		for _, sql := range stmts {
			_, err := conn.Exec(ctx, sql)
			require.NoError(t, err, sql)
		}
		setupRows(t, ctx, conn, w)
		return
	}
	for j := range w.resources {
		for _, kind := range []string{"tc", "ut"} {
			stmts = append(stmts, `CREATE TABLE `+w.table(kind, j)+` (txid bigint NOT NULL, tok bigint, pos int NOT NULL)`)
		}
	}
	for _, sql := range stmts {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	if w.unguarded {
		return
	}
	for j := range w.resources {
		require.NoError(t, sqlfuncs.Protect(ctx, conn, w.table("tc", j), w.resource(j), "tok"))
		require.NoError(t, sqlfuncs.Protect(ctx, conn, w.table("ut", j), w.resource(j), ""))
	}
}

// readState reads the logs, the guarded rows and fence.leases of a run.
func readState(t *testing.T, ctx context.Context, conn *pgx.Conn, w workload) dbState {
	t.Helper()
	s := w.schema()
	st := dbState{txs: map[int64]txRec{}, orphans: map[int64]int{}, final: map[string]int64{}}
	// One snapshot for every read: a worker's COMMIT that the server
	// finishes after the worker gave up on it (its context ended) must be
	// seen in all the tables or in none.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, `SELECT res, tok, kind, worker, acquired_at, coalesce(expires_at, acquired_at), seq FROM `+s+`.grant_log`)
	require.NoError(t, err)
	st.grants, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (grantRec, error) {
		var g grantRec
		err := r.Scan(&g.res, &g.tok, &g.kind, &g.worker, &g.acquiredAt, &g.expiresAt, &g.seq)
		return g, err
	})
	require.NoError(t, err)
	rows, err = tx.Query(ctx, `SELECT res, tok, expires_at, seq FROM `+s+`.renew_log`)
	require.NoError(t, err)
	st.renews, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (renewRec, error) {
		var x renewRec
		err := r.Scan(&x.res, &x.tok, &x.expiresAt, &x.seq)
		return x, err
	})
	require.NoError(t, err)
	rows, err = tx.Query(ctx, `SELECT res, tok, ended_at, seq FROM `+s+`.end_log`)
	require.NoError(t, err)
	st.ends, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (endRec, error) {
		var x endRec
		err := r.Scan(&x.res, &x.tok, &x.endedAt, &x.seq)
		return x, err
	})
	require.NoError(t, err)

	if w.rows {
		readRows(t, ctx, tx, w, &st)
	} else {
		readGuardedRows(t, ctx, tx, w, &st)
	}

	rows, err = tx.Query(ctx, `SELECT resource, token FROM fence.leases WHERE resource LIKE $1`, s+"/%")
	require.NoError(t, err)
	for rows.Next() {
		var res string
		var tok int64
		require.NoError(t, rows.Scan(&res, &tok))
		st.final[res] = tok
	}
	require.NoError(t, rows.Err())
	return st
}

// readGuardedRows reads the table-wide guarded tables of a run: the rows
// each transaction left in them, and those of no committed transaction.
func readGuardedRows(t *testing.T, ctx context.Context, tx pgx.Tx, w workload, st *dbState) {
	t.Helper()
	s := w.schema()
	var parts []string
	for j := range w.resources {
		parts = append(parts, `SELECT txid FROM `+w.table("tc", j), `SELECT txid FROM `+w.table("ut", j))
	}
	rows, err := tx.Query(ctx, `SELECT g.txid, count(*), l.txid IS NOT NULL, coalesce(l.res, '{}'), coalesce(l.tok, '{}'), coalesce(l.nrows, 0), coalesce(l.seq, 0)
		FROM (`+strings.Join(parts, " UNION ALL ")+`) g LEFT JOIN `+s+`.txlog l USING (txid)
		GROUP BY g.txid, l.txid, l.res, l.tok, l.nrows, l.seq
		UNION ALL
		SELECT l.txid, 0, true, l.res, l.tok, l.nrows, l.seq FROM `+s+`.txlog l
		 WHERE NOT EXISTS (SELECT 1 FROM (`+strings.Join(parts, " UNION ALL ")+`) g WHERE g.txid = l.txid)`)
	require.NoError(t, err)
	scanTxs(t, rows, st)
}

// scanTxs reads rows of (txid, rows found, logged, res[], tok[], nrows, seq)
// into st.txs, or st.orphans when the transaction has no log row.
func scanTxs(t *testing.T, rows pgx.Rows, st *dbState) {
	t.Helper()
	for rows.Next() {
		var tx txRec
		var logged bool
		var res []string
		var tok []int64
		require.NoError(t, rows.Scan(&tx.txid, &tx.rows, &logged, &res, &tok, &tx.nrows, &tx.seq))
		require.Len(t, tok, len(res))
		for i := range res {
			tx.toks = append(tx.toks, resTok{res[i], tok[i]})
		}
		if logged {
			st.txs[tx.txid] = tx
		} else {
			st.orphans[tx.txid] = tx.rows
		}
	}
	require.NoError(t, rows.Err())
}

// checkEnv reads the seed and durations of the randomized runs.
func checkEnv(t *testing.T, short time.Duration) (seed uint64, total, perRun time.Duration) {
	t.Helper()
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv(envCheckSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "%s", envCheckSeed)
		seed = v
	}
	total = short
	if s := os.Getenv(envCheckDuration); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "%s", envCheckDuration)
		total = d
	}
	perRun = min(total, 30*time.Second)
	if s := os.Getenv(envCheckRun); s != "" {
		d, err := time.ParseDuration(s)
		require.NoError(t, err, "%s", envCheckRun)
		perRun = d
	}
	return seed, total, perRun
}

// TestRandomizedHistory is the randomized workload with every fault, on a
// private cluster that it crashes and restarts, judged by checkHistory. In
// the test command it runs for a few seconds; PGFENCE_CHECK_DURATION makes it
// the long run (runs of PGFENCE_CHECK_RUN, default 30s, seeds seed, seed+1,
// ...).
func TestRandomizedHistory(t *testing.T) {
	t.Parallel()
	randomizedHistory(t, tableWide)
}

// historyKind is a variant of the randomized workload.
type historyKind int

const (
	tableWide   historyKind = iota // tables protected with fence.protect (history_test.go)
	perRow                         // 6 per-row resources, one or two held at once (history_rows_test.go)
	perRowLarge                    // 600 per-row resources, up to 300 held at once (history_large_test.go)
)

// workload is the run of kind k with the given seed, number and length;
// unguarded runs (the checker's controls) have more contention: fewer
// resources, fewer workers, shorter TTLs.
func (k historyKind) workload(seed uint64, run int, d time.Duration, unguarded bool) workload {
	w := workload{seed: seed + uint64(run), run: run, workers: 5, resources: 3, duration: d,
		ttl: 150 * time.Millisecond, faults: true, rows: k != tableWide, large: k == perRowLarge, unguarded: unguarded}
	switch {
	case k == perRow && unguarded:
		w.resources = 3
	case k == perRow:
		w.resources = 6
	case k == perRowLarge && unguarded:
		w.resources, w.ttl = 120, 250*time.Millisecond
	case k == perRowLarge:
		w.resources, w.ttl = 600, 300*time.Millisecond
	case unguarded:
		w.resources = 1
	}
	if unguarded {
		w.workers = 4
		if k != perRowLarge {
			w.ttl = 60 * time.Millisecond
		}
	}
	return w
}

// randomizedHistory is TestRandomizedHistory of kind k (also
// TestRandomizedHistoryPerRow, TestRandomizedHistoryLargeStatements).
func randomizedHistory(t *testing.T, k historyKind) {
	short := 4 * time.Second
	if k == perRowLarge {
		short = 8 * time.Second
	}
	seed, total, perRun := checkEnv(t, short)
	ctx, cancel := context.WithTimeout(t.Context(), total+5*time.Minute)
	defer cancel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	crash := func() {
		c.Stop(t, "immediate")
		c.Start(t)
	}
	var all figures
	start := time.Now()
	// A run that committed nothing checked nothing: on a loaded machine (the
	// README's command beside another copy of it, a crash in the first
	// seconds) another run follows, up to four in all, before the test says
	// the workload did no work.
	for run := 0; run == 0 || time.Since(start)+perRun <= total || (all.writesCommitted == 0 && run < 4); run++ {
		w := k.workload(seed, run, perRun, false)
		w.crash = crash
		runStart := time.Now()
		f := runWorkload(t, ctx, target{url: c.URL(), crash: crash}, w)
		f.log(t, fmt.Sprintf("run %d (seed %d, %s with the checks)", run, w.seed, time.Since(runStart).Round(time.Millisecond)))
		all.add(f)
		if len(f.violations) > 0 || len(f.unexpected) > 0 {
			t.Logf("run %d failed: replay with %s=%d", run, envCheckSeed, w.seed)
			break
		}
	}
	all.log(t, "total")
	for _, u := range all.unexpected {
		t.Errorf("unexpected error: %s", u)
	}
	require.Empty(t, all.violations, "the checker found violations; replay with %s (the failed run's seed is logged above; base seed %d)", envCheckSeed, seed)
	require.Positive(t, all.writesCommitted, "the workload did no work")
}

// TestHistoryCheckerCatchesUnguardedTables runs the same workload on tables
// that were never protected (the guards switched off) and expects the
// checker to find stale writes that committed after a newer grant. If it
// did not, a clean report from TestRandomizedHistory would mean nothing.
func TestHistoryCheckerCatchesUnguardedTables(t *testing.T) {
	pgtest.Long(t, "the randomized workload (the checker's control)")
	t.Parallel()
	catchesUnguarded(t, tableWide)
}

// catchesUnguarded is TestHistoryCheckerCatchesUnguardedTables of kind k
// (also TestHistoryCheckerCatchesUnguardedRows,
// TestHistoryCheckerCatchesUnguardedLargeStatements).
func catchesUnguarded(t *testing.T, k historyKind) {
	seed, _, _ := checkEnv(t, 0)
	db := pgtest.Setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var f figures
	// Up to ten runs: on a loaded machine (PostgreSQL 13 in CI) five runs of
	// the large workload once ended without a stale commit to find, and ten
	// on a 2-core machine at load 7-10 (issue 27). The large workload now
	// forces its stale commits (holdMany); the others still draw them.
	for run := 0; run < 10 && f.staleCommitted == 0; run++ {
		f.add(runWorkload(t, ctx, target{url: db.URL}, k.workload(seed, run, 2*time.Second, true)))
	}
	f.log(t, "unguarded")
	require.Positive(t, f.staleCommitted, "the checker did not notice stale writes on unguarded tables")
	require.NotEmpty(t, f.violations)
}
