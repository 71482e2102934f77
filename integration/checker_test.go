package integration

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The history checker. It judges a run of the randomized workload
// (history_test.go) from two sources:
//
//   - the client history: every operation a worker or the fault injector
//     issued, with the outcome the client saw (ok, no grant, refused with a
//     SQLSTATE, or lost: the connection died or timed out, so the outcome is
//     unknown);
//   - the database state after the run: the workload wraps every grant,
//     renewal, release and guarded write in a transaction that also appends
//     a row to a log table of the run, with nextval of one sequence as its
//     last step. That row commits exactly when the operation commits, so the
//     logs are the complete list of committed operations, also those whose
//     reply the client never got, and the sequence gives their commit order
//     where it matters (see orderArgument).
//
// orderArgument: a guarded write under token T takes its sequence number
// while it still holds the resource's gate (shared) and lease row (KEY
// SHARE), from its first guarded statement until it commits. A grant of T2
// > T takes its number after it got the gate (exclusive) and the row (FOR
// UPDATE). If the guards work, the grant either waited for the write to
// commit (write number < grant number) or came first and the write failed.
// So a committed write under T numbered after a grant of a larger token is a
// violation of guarantee 3. Sequence numbers of committed transactions
// survive a crash in order: nextval is WAL-logged before the commit record
// that is flushed.

// grantRec is one committed grant: fence.acquire ("acquire") or
// fence.revoke ("revoke"), with the lease row as read in the granting
// transaction (server clock).
type grantRec struct {
	res                   string
	tok                   int64
	kind                  string
	worker                int
	acquiredAt, expiresAt time.Time // expiresAt is zero for a revoke
	seq                   int64
}

// renewRec is one committed fence.renew that returned a new expiry.
type renewRec struct {
	res       string
	tok       int64
	expiresAt time.Time
	seq       int64
}

// endRec is one committed fence.release that returned true, with the
// lease's ended_at.
type endRec struct {
	res     string
	tok     int64
	endedAt time.Time
	seq     int64
}

// txRec is one committed guarded transaction: its log row and the number of
// guarded rows found in the protected tables under its txid.
type txRec struct {
	txid int64
	// toks are the tokens the transaction presented: one resource in a
	// table-wide run, each resource whose rows it wrote in a per-row run.
	toks  []resTok
	nrows int   // rows the transaction wrote, by its own count
	rows  int   // rows found
	seq   int64 // its commit-order number
}

// resTok is a token of a resource.
type resTok struct {
	res string
	tok int64
}

// rowWrite is one row a guarded statement of a per-row run wrote, as the
// statement returned it (RETURNING), logged in the same transaction.
type rowWrite struct {
	txid int64 // 0: the rows the run's tables were seeded with
	ord  int64 // the order of the transaction's writes
	tbl  string
	op   string // rowInsert, rowUpdate or rowDelete
	id   int64
	// oldRid is the row's resource id before the write (updates and
	// deletes), newRid after it (inserts and updates); they differ when the
	// update moved the row to another resource.
	oldRid, newRid int
	// tok is the row's token column as written (inserts and updates of a
	// table with one), that is the token the row presented; 0 otherwise.
	tok int64
}

// Operations of a rowWrite.
const (
	rowInsert = "insert"
	rowUpdate = "update"
	rowDelete = "delete"
)

// rowRec is a row of a per-row table after the run.
type rowRec struct {
	rid  int
	tok  int64 // 0 in a table without a token column
	txid int64 // the transaction that wrote it last
}

// dbState is what the database holds after a run.
type dbState struct {
	grants []grantRec
	renews []renewRec
	ends   []endRec
	txs    map[int64]txRec
	// orphans counts guarded rows per txid that has no log row: parts of a
	// transaction that did not commit as a whole.
	orphans map[int64]int
	// final is the token of every resource in fence.leases at the end.
	final map[string]int64

	// Per-row runs only (rowPrefix is not empty): the resource of a row is
	// rowPrefix followed by its resource id.
	rowPrefix string
	rowWrites []rowWrite
	// rows is the content of each per-row table at the end, by row id.
	rows map[string]map[int64]rowRec
}

func (st dbState) rowResource(rid int) string { return fmt.Sprintf("%s%d", st.rowPrefix, rid) }

// Kinds of client operations.
const (
	opAcquire = "acquire"
	opRevoke  = "revoke"
	opRenew   = "renew"
	opRelease = "release"
	opWrite   = "write"
)

// Outcomes the client saw.
const (
	outOK      = "ok"      // the call (and its transaction) returned success
	outNone    = "none"    // the function answered NULL or false: no grant, not renewed, not released
	outRefused = "refused" // PostgreSQL raised an error; the transaction rolled back
	outLost    = "lost"    // connection error or timeout: the outcome is unknown
)

// event is one client operation.
type event struct {
	worker int // -1: the fault injector (operator revokes)
	kind   string
	res    string
	tok    int64
	txid   int64 // writes only
	out    string
	code   string // SQLSTATE when refused
	err    string
	// midTx: a write refused after some of its statements had succeeded
	// (the lease was lost while the transaction was open).
	midTx bool
}

// checkResult is what the checker found.
type checkResult struct {
	violations []string
	// staleRefused counts writes refused with FN001, staleCommitted writes
	// under a token that a larger grant preceded (each is a violation).
	staleRefused, staleCommitted int
	exclusionPairs               int // pairs of consecutive leases compared by the server clock
}

// checkHistory runs every check and returns the violations it found.
func checkHistory(events []event, st dbState) checkResult {
	var r checkResult
	fail := func(format string, args ...any) {
		r.violations = append(r.violations, fmt.Sprintf(format, args...))
	}

	byRes := map[string][]grantRec{}
	for _, g := range st.grants {
		byRes[g.res] = append(byRes[g.res], g)
	}

	// Guarantee 1: in commit order, tokens of a resource strictly increase;
	// no token is granted twice.
	for res, gs := range byRes {
		slices.SortFunc(gs, func(a, b grantRec) int { return cmp.Compare(a.seq, b.seq) })
		seen := map[int64]int{}
		for i, g := range gs {
			if g.tok <= 0 {
				fail("%s: grant #%d has non-positive token %d", res, g.seq, g.tok)
			}
			if j, dup := seen[g.tok]; dup {
				fail("%s: token %d granted twice (grants #%d and #%d)", res, g.tok, gs[j].seq, g.seq)
			}
			seen[g.tok] = i
			if i > 0 && g.tok <= gs[i-1].tok {
				fail("%s: grant #%d (token %d) follows grant #%d (token %d) in commit order but is not larger",
					res, g.seq, g.tok, gs[i-1].seq, gs[i-1].tok)
			}
		}
		if last := gs[len(gs)-1]; st.final != nil && st.final[res] != last.tok {
			fail("%s: fence.leases holds token %d, the last committed grant was %d", res, st.final[res], last.tok)
		}
	}

	granted := func(res string, tok int64) (grantRec, bool) {
		for _, g := range byRes[res] {
			if g.tok == tok {
				return g, true
			}
		}
		return grantRec{}, false
	}
	// firstAbove returns the first grant of res (in commit order) with a
	// token larger than tok; tokens increase in that order (checked above).
	firstAbove := func(res string, tok int64) (grantRec, bool) {
		for _, g := range byRes[res] {
			if g.tok > tok {
				return g, true
			}
		}
		return grantRec{}, false
	}

	// Guarantee 2 and 3: no committed guarded write under T after a grant of
	// a larger token; every write carries a granted token; transactions
	// commit whole.
	txids := slices.Sorted(func(yield func(int64) bool) {
		for id := range st.txs {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range txids {
		tx := st.txs[id]
		if len(tx.toks) == 0 {
			fail("transaction %d committed without presenting a token", id)
		}
		for _, p := range tx.toks {
			if _, ok := granted(p.res, p.tok); !ok {
				fail("%s: transaction %d committed under token %d, which was never granted", p.res, id, p.tok)
			}
			if g, ok := firstAbove(p.res, p.tok); ok && g.seq < tx.seq {
				r.staleCommitted++
				fail("%s: transaction %d under token %d committed (#%d) after the grant of token %d (#%d)",
					p.res, id, p.tok, tx.seq, g.tok, g.seq)
			}
		}
		if tx.rows != tx.nrows {
			fail("transaction %d wrote %d guarded rows, %d are in the tables", id, tx.nrows, tx.rows)
		}
	}
	for id, n := range st.orphans {
		fail("transaction %d did not commit, yet %d of its guarded rows are in the tables", id, n)
	}
	if st.rowPrefix != "" {
		checkRows(st, fail)
	}

	// The client's view against the database's.
	for _, e := range events {
		switch e.kind {
		case opAcquire, opRevoke:
			if e.out == outOK {
				if g, ok := granted(e.res, e.tok); !ok || g.kind != e.kind {
					fail("%s: %s returned token %d to worker %d, but no such committed grant exists", e.res, e.kind, e.tok, e.worker)
				}
			}
		case opWrite:
			tx, committed := st.txs[e.txid]
			switch e.out {
			case outOK:
				if !committed {
					fail("%s: worker %d saw transaction %d (token %d) commit, but it is not in the database", e.res, e.worker, e.txid, e.tok)
				}
			case outRefused:
				if e.code == "FN001" {
					r.staleRefused++
				}
				if committed {
					fail("%s: transaction %d (token %d) was refused with %s, but it is in the database (%d rows)", e.res, e.txid, e.tok, e.code, tx.rows)
				}
			}
		}
	}

	// Renewals and releases act on the latest grant only: their numbers lie
	// between the grant of their token and the next grant.
	inLease := func(what, res string, tok, seq int64) {
		g, ok := granted(res, tok)
		if !ok {
			fail("%s: %s of token %d, which was never granted", res, what, tok)
			return
		}
		if g.kind != opAcquire {
			fail("%s: %s of token %d, which is a %s", res, what, tok, g.kind)
		}
		if seq < g.seq {
			fail("%s: %s of token %d (#%d) before its grant (#%d)", res, what, tok, seq, g.seq)
		}
		if n, ok := firstAbove(res, tok); ok && seq > n.seq {
			fail("%s: %s of token %d (#%d) after the grant of token %d (#%d)", res, what, tok, seq, n.tok, n.seq)
		}
	}
	expiry := map[string]map[int64]time.Time{} // latest expiry of each lease, renewals included
	ended := map[string]map[int64]time.Time{}
	for _, g := range st.grants {
		if expiry[g.res] == nil {
			expiry[g.res], ended[g.res] = map[int64]time.Time{}, map[int64]time.Time{}
		}
		expiry[g.res][g.tok] = g.expiresAt
	}
	for _, rn := range st.renews {
		inLease("renewal", rn.res, rn.tok, rn.seq)
		if m := expiry[rn.res]; m != nil && rn.expiresAt.After(m[rn.tok]) {
			m[rn.tok] = rn.expiresAt
		}
	}
	for _, en := range st.ends {
		inLease("release", en.res, en.tok, en.seq)
		if m := ended[en.res]; m != nil {
			if prev, dup := m[en.tok]; dup {
				fail("%s: lease %d released twice (at %s and %s)", en.res, en.tok, prev.Format(time.RFC3339Nano), en.endedAt.Format(time.RFC3339Nano))
			}
			m[en.tok] = en.endedAt
		}
	}

	// Guarantee 4: by the server's clock, a lease (acquire) lives from its
	// acquired_at until the earlier of its last expiry and its release. A
	// revoke ends the lease before it on purpose and starts none. So for two
	// consecutive grants that are both acquires, the second one's acquired_at
	// must not be before the end of the first.
	for res, gs := range byRes {
		sorted := slices.Clone(gs)
		slices.SortFunc(sorted, func(a, b grantRec) int { return cmp.Compare(a.tok, b.tok) })
		for i := 1; i < len(sorted); i++ {
			a, b := sorted[i-1], sorted[i]
			if b.acquiredAt.Before(a.acquiredAt) {
				fail("%s: token %d acquired at %s, before token %d (%s)", res, b.tok, ts(b.acquiredAt), a.tok, ts(a.acquiredAt))
			}
			if a.kind != opAcquire || b.kind != opAcquire {
				continue
			}
			r.exclusionPairs++
			end := expiry[res][a.tok]
			if e, ok := ended[res][a.tok]; ok && e.Before(end) {
				end = e
			}
			if b.acquiredAt.Before(end) {
				fail("%s: leases %d and %d were both live from %s to %s (server clock)", res, a.tok, b.tok, ts(b.acquiredAt), ts(end))
			}
		}
	}
	return r
}

// checkRows judges the rows of a per-row run. The check of every committed
// transaction above covers the tokens it presented; this ties them to the
// rows it wrote, as the server returned them:
//
//   - every row a committed transaction inserted, updated or deleted belongs
//     (before and after the write) to a resource whose token the transaction
//     presented, so guarantee 3 for that token is guarantee 3 for the row;
//   - a row written into a token column carries exactly that token;
//   - replaying the committed writes in commit order (the order in which
//     they took each row's lock: a transaction that writes a row another
//     one wrote waits for it to commit, and takes its number after that),
//     starting from the seeded rows, gives the tables as they are. So no
//     write committed that is not in the logs (a write that presented no
//     token, or the token of another resource), none that is in them was
//     lost, and none committed in part.
func checkRows(st dbState, fail func(format string, args ...any)) {
	byTx := map[int64][]rowWrite{}
	for _, w := range st.rowWrites {
		byTx[w.txid] = append(byTx[w.txid], w)
	}
	order := []int64{0} // the seed first
	for id := range byTx {
		if id == 0 {
			continue
		}
		if _, ok := st.txs[id]; !ok {
			fail("transaction %d did not commit, yet its row log is in the database", id)
			continue
		}
		order = append(order, id)
	}
	slices.SortFunc(order[1:], func(a, b int64) int { return cmp.Compare(st.txs[a].seq, st.txs[b].seq) })

	// the tokens each transaction presented, by resource (large runs
	// present hundreds)
	presented := map[int64]map[string]int64{}
	tokenOf := func(id int64, res string) (int64, bool) {
		m, ok := presented[id]
		if !ok {
			m = map[string]int64{}
			for _, p := range st.txs[id].toks {
				m[p.res] = p.tok
			}
			presented[id] = m
		}
		tok, ok := m[res]
		return tok, ok
	}
	model := map[string]map[int64]rowRec{}
	for tbl := range st.rows {
		model[tbl] = map[int64]rowRec{}
	}
	for _, id := range order {
		tx := st.txs[id]
		ws := byTx[id]
		slices.SortFunc(ws, func(a, b rowWrite) int { return cmp.Compare(a.ord, b.ord) })
		for _, w := range ws {
			m := model[w.tbl]
			if m == nil {
				fail("transaction %d wrote row %d of unknown table %q", id, w.id, w.tbl)
				continue
			}
			if id != 0 {
				for _, rid := range []int{w.oldRid, w.newRid} {
					if rid == 0 {
						continue
					}
					res := st.rowResource(rid)
					if _, ok := tokenOf(id, res); !ok {
						fail("%s: transaction %d (#%d) wrote row %d of %s (%s) without presenting a token of %s", res, id, tx.seq, w.id, w.tbl, w.op, res)
					}
				}
				if w.op != rowDelete && w.tok != 0 {
					if tok, ok := tokenOf(id, st.rowResource(w.newRid)); ok && tok != w.tok {
						fail("%s: transaction %d wrote row %d of %s with token %d in its token column, but presented %d",
							st.rowResource(w.newRid), id, w.id, w.tbl, w.tok, tok)
					}
				}
			}
			old, exists := m[w.id]
			switch w.op {
			case rowInsert:
				if exists {
					fail("transaction %d inserted row %d of %s, which already existed", id, w.id, w.tbl)
				}
				m[w.id] = rowRec{rid: w.newRid, tok: w.tok, txid: id}
			case rowUpdate:
				if !exists || old.rid != w.oldRid {
					fail("transaction %d updated row %d of %s in resource %d, but the row is not there (present %v, resource %d)",
						id, w.id, w.tbl, w.oldRid, exists, old.rid)
				}
				m[w.id] = rowRec{rid: w.newRid, tok: w.tok, txid: id}
			case rowDelete:
				if !exists || old.rid != w.oldRid {
					fail("transaction %d deleted row %d of %s in resource %d, but the row is not there (present %v, resource %d)",
						id, w.id, w.tbl, w.oldRid, exists, old.rid)
				}
				delete(m, w.id)
			default:
				fail("transaction %d: unknown row operation %q", id, w.op)
			}
		}
	}
	for tbl, rows := range st.rows {
		m := model[tbl]
		for _, id := range slices.Sorted(maps.Keys(rows)) {
			got, want := rows[id], m[id]
			if _, ok := m[id]; !ok {
				fail("%s: row %d (resource %d, token %d, transaction %d) is in the table, but no committed write left it there",
					tbl, id, got.rid, got.tok, got.txid)
				continue
			}
			if got != want {
				fail("%s: row %d is (resource %d, token %d, transaction %d), the committed writes say (resource %d, token %d, transaction %d)",
					tbl, id, got.rid, got.tok, got.txid, want.rid, want.tok, want.txid)
			}
		}
		for _, id := range slices.Sorted(maps.Keys(m)) {
			if _, ok := rows[id]; !ok {
				w := m[id]
				fail("%s: row %d (resource %d, transaction %d) is missing from the table, though no committed write deleted it", tbl, id, w.rid, w.txid)
			}
		}
	}
}

func ts(t time.Time) string { return t.UTC().Format("15:04:05.000000") }

// TestCheckerFlagsFabricatedViolations feeds the checker histories that
// break each property once, and a clean one, and expects exactly the
// violations that were planted. A checker that reports nothing is worthless
// unless it is shown to report something.
func TestCheckerFlagsFabricatedViolations(t *testing.T) {
	t.Parallel()
	base := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	const tok1, tok2, tok3 = 8796093022209, 8796093022210, 8796093022211
	// clean: three leases of r, each after the previous ended (expiry,
	// release, revoke), two writes ordered before the next grant, one
	// refused write.
	clean := func() ([]event, dbState) {
		st := dbState{
			grants: []grantRec{
				{res: "r", tok: tok1, kind: opAcquire, acquiredAt: at(0), expiresAt: at(100), seq: 1},
				{res: "r", tok: tok2, kind: opAcquire, acquiredAt: at(150), expiresAt: at(250), seq: 4},
				{res: "r", tok: tok3, kind: opRevoke, acquiredAt: at(200), seq: 7},
			},
			renews: []renewRec{{res: "r", tok: tok1, expiresAt: at(120), seq: 2}},
			ends:   []endRec{{res: "r", tok: tok2, endedAt: at(180), seq: 6}},
			txs: map[int64]txRec{
				10: {txid: 10, toks: []resTok{{"r", tok1}}, nrows: 2, rows: 2, seq: 3},
				11: {txid: 11, toks: []resTok{{"r", tok2}}, nrows: 1, rows: 1, seq: 5},
			},
			orphans: map[int64]int{},
			final:   map[string]int64{"r": tok3},
		}
		ev := []event{
			{worker: 0, kind: opAcquire, res: "r", tok: tok1, out: outOK},
			{worker: 0, kind: opWrite, res: "r", tok: tok1, txid: 10, out: outOK},
			{worker: 1, kind: opAcquire, res: "r", tok: tok2, out: outOK},
			{worker: 0, kind: opWrite, res: "r", tok: tok1, txid: 12, out: outRefused, code: "FN001"},
			{worker: 1, kind: opWrite, res: "r", tok: tok2, txid: 11, out: outOK},
			{worker: -1, kind: opRevoke, res: "r", tok: tok3, out: outOK},
		}
		return ev, st
	}

	t.Run("a clean history passes", func(t *testing.T) {
		ev, st := clean()
		r := checkHistory(ev, st)
		require.Empty(t, r.violations)
		require.Equal(t, 1, r.staleRefused)
		require.Equal(t, 1, r.exclusionPairs)
	})

	cases := []struct {
		name   string
		mutate func(ev *[]event, st *dbState)
		want   string
	}{
		{"overlapping leases", func(_ *[]event, st *dbState) {
			st.grants[1].acquiredAt = at(110) // the renewal kept lease 1 until 120
		}, "were both live"},
		{"release after the next grant", func(_ *[]event, st *dbState) {
			st.ends = append(st.ends, endRec{res: "r", tok: tok1, endedAt: at(140), seq: 5})
		}, "release of token 8796093022209 (#5) after the grant"},
		{"token granted twice", func(_ *[]event, st *dbState) {
			st.grants[2].tok = tok2
			st.final["r"] = tok2
		}, "granted twice"},
		{"token lower than an earlier grant", func(_ *[]event, st *dbState) {
			st.grants[1].tok = tok1 - 1
		}, "is not larger"},
		{"stale write committed after a newer grant", func(_ *[]event, st *dbState) {
			st.txs[12] = txRec{txid: 12, toks: []resTok{{"r", tok1}}, nrows: 1, rows: 1, seq: 8}
		}, "committed (#8) after the grant"},
		{"write the client saw commit is missing", func(_ *[]event, st *dbState) {
			delete(st.txs, 11)
		}, "not in the database"},
		{"write refused with FN001 is present", func(_ *[]event, st *dbState) {
			st.txs[12] = txRec{txid: 12, toks: []resTok{{"r", tok1}}, nrows: 1, rows: 1, seq: 3}
		}, "was refused with FN001"},
		{"half a transaction committed", func(_ *[]event, st *dbState) {
			st.orphans[99] = 1
		}, "did not commit"},
		{"a grant the client saw is lost", func(ev *[]event, _ *dbState) {
			*ev = append(*ev, event{worker: 2, kind: opAcquire, res: "r", tok: tok3 + 1, out: outOK})
		}, "no such committed grant"},
		{"write under a token never granted", func(_ *[]event, st *dbState) {
			st.txs[13] = txRec{txid: 13, toks: []resTok{{"r", tok3 + 5}}, nrows: 1, rows: 1, seq: 9}
		}, "never granted"},
		{"lease row disagrees with the grants", func(_ *[]event, st *dbState) {
			st.final["r"] = tok1
		}, "fence.leases holds token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev, st := clean()
			c.mutate(&ev, &st)
			r := checkHistory(ev, st)
			require.NotEmpty(t, r.violations, "the checker missed: %s", c.name)
			require.Contains(t, fmt.Sprint(r.violations), c.want)
		})
	}
}

// TestRowCheckerFlagsFabricatedViolations does for the per-row checks
// (checkRows) what TestCheckerFlagsFabricatedViolations does for the rest:
// a clean per-row history passes, and each planted violation is reported.
func TestRowCheckerFlagsFabricatedViolations(t *testing.T) {
	t.Parallel()
	base := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	const tok1, tok2, tok3 = 8796093022209, 8796093022210, 8796093022211
	// clean: resources p1 and p2; row 1 seeded in p1, row 2 in p2.
	// Transaction 10 (both tokens) updates row 1 through the token column,
	// moves row 2 from p2 to p1 and inserts row 3 into p2; transaction 11
	// deletes row 3; then p1 is granted again.
	clean := func() ([]event, dbState) {
		st := dbState{
			grants: []grantRec{
				{res: "p1", tok: tok1, kind: opAcquire, acquiredAt: at(0), expiresAt: at(100), seq: 1},
				{res: "p2", tok: tok2, kind: opAcquire, acquiredAt: at(10), expiresAt: at(110), seq: 2},
				{res: "p1", tok: tok3, kind: opAcquire, acquiredAt: at(150), expiresAt: at(250), seq: 5},
			},
			txs: map[int64]txRec{
				10: {txid: 10, toks: []resTok{{"p1", tok1}, {"p2", tok2}}, nrows: 3, rows: 3, seq: 3},
				11: {txid: 11, toks: []resTok{{"p2", tok2}}, nrows: 1, rows: 1, seq: 4},
			},
			orphans:   map[int64]int{},
			final:     map[string]int64{"p1": tok3, "p2": tok2},
			rowPrefix: "p",
			rowWrites: []rowWrite{
				{txid: 0, ord: 1, tbl: rowsTC, op: rowInsert, id: 1, newRid: 1},
				{txid: 0, ord: 2, tbl: rowsTC, op: rowInsert, id: 2, newRid: 2},
				{txid: 10, ord: 3, tbl: rowsTC, op: rowUpdate, id: 1, oldRid: 1, newRid: 1, tok: tok1},
				{txid: 10, ord: 4, tbl: rowsTC, op: rowUpdate, id: 2, oldRid: 2, newRid: 1, tok: tok1},
				{txid: 10, ord: 5, tbl: rowsTC, op: rowInsert, id: 3, newRid: 2, tok: tok2},
				{txid: 11, ord: 6, tbl: rowsTC, op: rowDelete, id: 3, oldRid: 2},
			},
			rows: map[string]map[int64]rowRec{rowsTC: {
				1: {rid: 1, tok: tok1, txid: 10},
				2: {rid: 1, tok: tok1, txid: 10},
			}},
		}
		ev := []event{
			{worker: 0, kind: opAcquire, res: "p1", tok: tok1, out: outOK},
			{worker: 0, kind: opAcquire, res: "p2", tok: tok2, out: outOK},
			{worker: 0, kind: opWrite, res: "p1", tok: tok1, txid: 10, out: outOK},
			{worker: 0, kind: opWrite, res: "p1", tok: tok1, txid: 11, out: outOK},
			{worker: 1, kind: opAcquire, res: "p1", tok: tok3, out: outOK},
		}
		return ev, st
	}

	t.Run("a clean history passes", func(t *testing.T) {
		ev, st := clean()
		r := checkHistory(ev, st)
		require.Empty(t, r.violations)
	})

	cases := []struct {
		name   string
		mutate func(st *dbState)
		want   string
	}{
		{"row of a resource whose token was not presented", func(st *dbState) {
			st.txs[11] = txRec{txid: 11, toks: []resTok{{"p1", tok1}}, nrows: 1, rows: 1, seq: 4}
		}, "wrote row 3 of rtc (delete) without presenting a token of p2"},
		{"move without the old resource's token", func(st *dbState) {
			st.txs[10] = txRec{txid: 10, toks: []resTok{{"p1", tok1}}, nrows: 3, rows: 3, seq: 3}
		}, "wrote row 2 of rtc (update) without presenting a token of p2"},
		{"token column disagrees with the presented token", func(st *dbState) {
			st.rowWrites[2].tok = tok2
			st.rows[rowsTC][1] = rowRec{rid: 1, tok: tok2, txid: 10}
		}, "with token 8796093022210 in its token column, but presented 8796093022209"},
		{"stale per-row write after a newer grant", func(st *dbState) {
			st.txs[12] = txRec{txid: 12, toks: []resTok{{"p1", tok1}}, nrows: 1, rows: 1, seq: 6}
			st.rowWrites = append(st.rowWrites, rowWrite{txid: 12, ord: 7, tbl: rowsTC, op: rowUpdate, id: 1, oldRid: 1, newRid: 1, tok: tok1})
			st.rows[rowsTC][1] = rowRec{rid: 1, tok: tok1, txid: 12}
		}, "p1: transaction 12 under token 8796093022209 committed (#6) after the grant"},
		{"a row no committed write explains", func(st *dbState) {
			st.rows[rowsTC][7] = rowRec{rid: 2, txid: -1}
		}, "row 7 (resource 2, token 0, transaction -1) is in the table"},
		{"a committed row write is lost", func(st *dbState) {
			delete(st.rows[rowsTC], 1)
		}, "row 1 (resource 1, transaction 10) is missing"},
		{"a committed move is undone", func(st *dbState) {
			st.rows[rowsTC][2] = rowRec{rid: 2, tok: tok1, txid: 10}
		}, "row 2 is (resource 2"},
		{"row log of a transaction that did not commit", func(st *dbState) {
			st.rowWrites = append(st.rowWrites, rowWrite{txid: 99, ord: 8, tbl: rowsTC, op: rowInsert, id: 9, newRid: 1, tok: tok3})
		}, "transaction 99 did not commit, yet its row log"},
		{"delete of a row that is not there", func(st *dbState) {
			st.rowWrites[5].id = 5
			st.rows[rowsTC][3] = rowRec{rid: 2, tok: tok2, txid: 10}
		}, "deleted row 5 of rtc in resource 2, but the row is not there"},
		{"half a transaction's rows committed", func(st *dbState) {
			st.orphans[98] = 1
		}, "did not commit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev, st := clean()
			c.mutate(&st)
			r := checkHistory(ev, st)
			require.NotEmpty(t, r.violations, "the checker missed: %s", c.name)
			require.Contains(t, fmt.Sprint(r.violations), c.want)
		})
	}
}
