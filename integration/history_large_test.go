package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The large per-row variant of the randomized workload (history_rows_test.go,
// history_test.go). The tables, their logs and the checks are those of the
// per-row run; what changes is the scale. There are 600 resources
// h<run>/row:1 .. row:600, four rows each per table to start with. A worker
// takes a window of consecutive resources (a sixth of the windows of 1-3, a
// sixth of 4-16, a third of 17-64, a third of 65-300) and acquires the free
// ones in batches, so that it holds up to 300 leases at once; it renews and
// releases them in batches too. Its guarded transactions (one to six
// statements, under READ COMMITTED or REPEATABLE READ) mix the single-row
// statements of the per-row run with statements over a subset of its
// leases of 1, 2-16, 17-64 or 65-300 resources, up to a few thousand rows:
//
//   - update assigning the token column per row (UPDATE ... FROM
//     unnest(rids, tokens)), or after fence.use_token of every resource of
//     the subset, of all the subset's rows or about one in two or three;
//   - insert of one or two rows per resource, the token in the column or
//     through fence.use_token;
//   - delete of about one row in two to four (fence.use_token), and
//     re-insert of rows the worker deleted, spread over the subset;
//   - moves: the rows of the subset rotated to the next resource of the
//     subset, or moved into one other held resource (fence.use_token for
//     the old resources; the new ones' tokens in the column or through
//     fence.use_token).
//
// A quarter of the transactions of a holder of more than 16 leases are six
// to nine statements of 9-16 resources each, which name more than 64
// resources in all. So a statement's check runs under the per-row guard's
// shared gates (at most 16 resources, while the transaction holds at most
// 64) or through the lease row locks (more than 16 resources, past 64 in
// the transaction, or under REPEATABLE READ); the figures count statements
// by size and transactions by isolation level. Leases run out in the middle
// of a transaction (pauses longer than the TTL, frozen proxies), operators
// revoke leases that workers hold and resources that an open transaction
// has written (preferably those it presented in the token column only,
// which no gate of fence.use_token protects), and a holder refused (or
// whose renewal failed) acquires the lost leases again (new tokens, where
// free) and goes on, while a stale copy of it may write once more with the
// old tokens; or it stops, or it writes on with all its old tokens as a
// zombie. Besides, workers try statements over their leases that also
// write one resource they do not hold (an update, an insert, a move into
// it or out of it; with a held resource's token in the column or with
// nothing registered for it), one row or many: each must be refused, and is
// rolled back whatever happens; and writes presenting no token over many
// resources, which must fail with FN002.

// acquireBatch is the most grants a large run makes in one transaction: each
// holds its resource's gate until the transaction ends.
const acquireBatch = 16

// largeRound is one turn of a worker of a large run: a window of
// resources, acquired where free, then held.
func (wk *worker) largeRound(ctx context.Context) {
	rng := wk.rng
	var k int
	switch r := rng.IntN(6); {
	case r == 0:
		k = 1 + rng.IntN(3)
	case r == 1:
		k = 4 + rng.IntN(13)
	case r < 4:
		k = 17 + rng.IntN(48)
	default:
		k = 65 + rng.IntN(236)
	}
	k = min(k, wk.w.resources)
	start := rng.IntN(wk.w.resources)
	js := make([]int, k)
	for i := range js {
		js[i] = (start + i) % wk.w.resources
	}
	slices.Sort(js)
	ls := wk.acquireMany(ctx, js)
	if len(ls) == 0 {
		wk.sleep(ctx, time.Duration(5+rng.IntN(40))*time.Millisecond)
		return
	}
	wk.holdMany(ctx, ls)
}

// ttlText is the run's TTL as an interval literal.
func (w workload) ttlText() string { return fmt.Sprintf("%d milliseconds", w.ttl.Milliseconds()) }

// finishMany records one outcome for several operations of one transaction
// (finish for each, one unexpected error at most).
func (wk *worker) finishMany(es []event, err error) string {
	out, code := outcome(err)
	for _, e := range es {
		e.out, e.code = out, code
		if err != nil {
			e.err = err.Error()
		}
		wk.h.add(e)
	}
	if out == outLost {
		wk.drop()
	}
	if out == outRefused && !wk.w.expectedCode(code) && len(es) > 0 {
		wk.unexpected(es[0].kind+" (batch)", err)
	}
	return out
}

// acquireMany tries fence.acquire for each of the resources js (in order,
// at most acquireBatch in a transaction) and logs the grants in the
// transaction that made them; it returns the leases granted.
func (wk *worker) acquireMany(ctx context.Context, js []int) []lease {
	var got []lease
	s := wk.w.schema()
	for from := 0; from < len(js) && ctx.Err() == nil && wk.conn != nil; from += acquireBatch {
		batch := js[from:min(from+acquireBatch, len(js))]
		names := make([]string, len(batch))
		for i, j := range batch {
			names[i] = wk.w.resource(j)
		}
		var granted []lease
		err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			granted = nil
			rows, err := tx.Query(ctx, `SELECT fence.acquire(u.r, $2, $3::interval) FROM unnest($1::text[]) WITH ORDINALITY AS u(r, i) ORDER BY u.i`,
				names, fmt.Sprintf("w%d", wk.id), wk.w.ttlText())
			if err != nil {
				return err
			}
			toks, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.Int8])
			if err != nil {
				return err
			}
			var rs []string
			var ts []int64
			for i, t := range toks {
				if t.Valid {
					granted = append(granted, lease{batch[i], t.Int64})
					rs, ts = append(rs, names[i]), append(ts, t.Int64)
				}
			}
			if len(granted) == 0 {
				return errNoGrant
			}
			tag, err := tx.Exec(ctx, `INSERT INTO `+s+`.grant_log (res, tok, kind, worker, acquired_at, expires_at, seq)
				SELECT l.resource, l.token, $3, $4, l.acquired_at, l.expires_at, nextval('`+s+`.seq')
				  FROM unnest($1::text[], $2::bigint[]) AS u(r, t) JOIN fence.leases l ON l.resource = u.r AND l.token = u.t`,
				rs, ts, opAcquire, wk.id)
			if err == nil && tag.RowsAffected() != int64(len(rs)) {
				err = fmt.Errorf("%w: %d of %d grants", errInvisibleGrant, tag.RowsAffected(), len(rs))
			}
			return err
		})
		if errors.Is(err, errInvisibleGrant) {
			wk.unexpected(opAcquire, err)
		}
		var es []event
		for i, j := range batch {
			e := event{worker: wk.id, kind: opAcquire, res: names[i], out: outNone}
			if k := slices.IndexFunc(granted, func(l lease) bool { return l.j == j }); k >= 0 {
				e.tok = granted[k].tok
				es = append(es, e)
			} else {
				wk.h.add(e)
			}
		}
		if errors.Is(err, errNoGrant) {
			continue
		}
		if wk.finishMany(es, err) == outOK {
			got = append(got, granted...)
		}
	}
	return got
}

// renewMany renews the leases ls in one transaction and logs the renewals;
// it returns the leases renewed, or all of ls when the transaction failed
// (the worker cannot tell; the database judges its writes).
func (wk *worker) renewMany(ctx context.Context, ls []lease) []lease {
	s := wk.w.schema()
	rs, ts := wk.w.namesToks(ls)
	var kept []lease
	err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		kept = nil
		rows, err := tx.Query(ctx, `SELECT fence.renew(u.r, u.t, $3::interval) FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(r, t, i) ORDER BY u.i`,
			rs, ts, wk.w.ttlText())
		if err != nil {
			return err
		}
		exps, err := pgx.CollectRows(rows, pgx.RowTo[pgtype.Timestamptz])
		if err != nil {
			return err
		}
		var rr []string
		var rt []int64
		var re []time.Time
		for i, e := range exps {
			if e.Valid {
				kept = append(kept, ls[i])
				rr, rt, re = append(rr, rs[i]), append(rt, ts[i]), append(re, e.Time)
			}
		}
		if len(kept) == 0 {
			return errNoGrant
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s+`.renew_log (res, tok, expires_at, seq)
			SELECT u.r, u.t, u.e, nextval('`+s+`.seq') FROM unnest($1::text[], $2::bigint[], $3::timestamptz[]) AS u(r, t, e)`, rr, rt, re)
		return err
	})
	var es []event
	for i, l := range ls {
		e := event{worker: wk.id, kind: opRenew, res: rs[i], tok: l.tok, out: outNone}
		if err == nil && slices.Contains(kept, l) || err != nil && !errors.Is(err, errNoGrant) {
			es = append(es, e)
		} else {
			wk.h.add(e)
		}
	}
	if errors.Is(err, errNoGrant) {
		return nil
	}
	if wk.finishMany(es, err) != outOK {
		return ls
	}
	return kept
}

// releaseMany releases the leases ls in one transaction and logs the
// releases that ended a lease.
func (wk *worker) releaseMany(ctx context.Context, ls []lease) {
	s := wk.w.schema()
	rs, ts := wk.w.namesToks(ls)
	var done []bool
	err := wk.inTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT fence.release(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(r, t, i) ORDER BY u.i`, rs, ts)
		if err != nil {
			return err
		}
		done, err = pgx.CollectRows(rows, pgx.RowTo[bool])
		if err != nil {
			return err
		}
		var er []string
		var et []int64
		for i, ok := range done {
			if ok {
				er, et = append(er, rs[i]), append(et, ts[i])
			}
		}
		if len(er) == 0 {
			return errNoGrant
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+s+`.end_log (res, tok, ended_at, seq)
			SELECT l.resource, l.token, l.ended_at, nextval('`+s+`.seq')
			  FROM unnest($1::text[], $2::bigint[]) AS u(r, t) JOIN fence.leases l ON l.resource = u.r AND l.token = u.t`, er, et)
		return err
	})
	var es []event
	for i, l := range ls {
		e := event{worker: wk.id, kind: opRelease, res: rs[i], tok: l.tok, out: outNone}
		if err == nil && done[i] || err != nil && !errors.Is(err, errNoGrant) {
			es = append(es, e)
		} else {
			wk.h.add(e)
		}
	}
	if !errors.Is(err, errNoGrant) {
		wk.finishMany(es, err)
	}
}

// namesToks are the resource names and tokens of ls.
func (w workload) namesToks(ls []lease) ([]string, []int64) {
	rs, ts := make([]string, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		rs[i], ts[i] = w.resource(l.j), l.tok
	}
	return rs, ts
}

// setHeld publishes the leases the worker holds to the fault injector.
func (wk *worker) setHeld(ls []lease) {
	if ls == nil {
		wk.held.Store(nil)
		return
	}
	c := slices.Clone(ls)
	wk.held.Store(&c)
}

// holdMany works under the leases ls (a large run) until the worker lets
// go of them: rounds of renewals, pauses, writes presenting no token or
// another resource's token, and guarded transactions.
func (wk *worker) holdMany(ctx context.Context, ls []lease) {
	wk.setHeld(ls)
	defer wk.setHeld(nil)
	lost, zombie := false, false
	rounds := 2 + wk.rng.IntN(8)
	// The control (tables unguarded) forces the interleaving it exists to
	// catch instead of hoping for it: until one of them commits, a
	// worker's hold sleeps past the TTL (round 0), renews and finds its
	// leases lost (round 1), acquires them again (a newer token, its own or
	// another worker's), and a stale copy then updates rows with the old
	// tokens in the token column, after that newer grant.
	force := wk.w.unguarded && !wk.forcedStale
	for i := 0; i < rounds && ctx.Err() == nil && len(ls) > 0; i++ {
		if wk.conn == nil {
			if !wk.connect(ctx) {
				return
			}
			wk.h.reconnects.Add(1)
			if wk.rng.IntN(4) == 0 {
				return
			}
		}
		r := wk.rng.IntN(20)
		if force && i < 2 {
			r = []int{0, 2}[i] // sleep past the TTL, then renew
		}
		switch {
		case r < 2:
			wk.sleep(ctx, wk.w.ttl+time.Duration(wk.rng.Int64N(int64(2*wk.w.ttl))))
		case r < 12:
			if kept := wk.renewMany(ctx, ls); len(kept) < len(ls) {
				lost = true
				if !zombie {
					// a careful holder goes on with what it still holds and
					// acquires the others again (new tokens, where free)
					old := ls
					ls = wk.reacquire(ctx, ls, kept)
					wk.setHeld(ls)
					if (force || wk.rng.IntN(3) == 0) && wk.conn != nil {
						// ... but a stale copy of it (a retry, a forked
						// process) writes once more with the old tokens
						wk.h.zombie.Add(1)
						wk.columnOnly = force
						e := wk.writeRows(ctx, old)
						wk.columnOnly = false
						if force && e.out == outOK {
							wk.forcedStale = true
						}
					}
				}
			}
		}
		if force && i >= 1 {
			force = false // this hold is done forcing; the next one tries again unless it committed
		}
		if wk.conn == nil || len(ls) == 0 {
			continue
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
		if wk.rng.IntN(5) == 0 {
			wk.foreignLargeWrite(ctx, ls)
			if wk.conn == nil {
				continue
			}
		}
		e := wk.writeRows(ctx, ls)
		if e.out == outRefused {
			lost = true
			switch wk.rng.IntN(3) {
			case 0: // stop
				return
			case 1: // write on with every lease, lost or not
				zombie = true
			default: // find out which leases are lost, acquire them again, go on
				if !zombie && wk.conn != nil {
					ls = wk.reacquire(ctx, ls, wk.renewMany(ctx, ls))
					wk.setHeld(ls)
				}
			}
		}
	}
	if ctx.Err() != nil || wk.conn == nil || len(ls) == 0 {
		return
	}
	switch r := wk.rng.IntN(10); {
	case r < 6:
		wk.releaseMany(ctx, ls)
	case r < 8:
		wk.h.vanished.Add(1)
	default:
		wk.h.vanished.Add(1)
		wk.drop()
	}
}

// reacquire is the leases kept (of ls) and new leases of the resources of
// ls that were not kept, where acquireMany gets them, sorted by resource.
func (wk *worker) reacquire(ctx context.Context, ls, kept []lease) []lease {
	var js []int
	for _, l := range ls {
		if !slices.Contains(kept, l) {
			js = append(js, l.j)
		}
	}
	out := slices.Clone(kept)
	if wk.conn != nil && len(js) > 0 {
		out = append(out, wk.acquireMany(ctx, js)...)
	}
	slices.SortFunc(out, func(a, b lease) int { return a.j - b.j })
	return out
}

// Kinds of the large statements (stmtFigures).
const (
	stmtLargeUpdateColumn   = "large update (token column)"
	stmtLargeUpdateUseToken = "large update (use_token)"
	stmtLargeInsertColumn   = "large insert (token column)"
	stmtLargeInsertUseToken = "large insert (use_token)"
	stmtLargeDelete         = "large delete"
	stmtLargeReinsert       = "large re-insert"
	stmtLargeRotateColumn   = "large move, rotated (token column)"
	stmtLargeRotateUseToken = "large move, rotated (use_token)"
	stmtLargeMoveColumn     = "large move into one (token column)"
	stmtLargeMoveUseToken   = "large move into one (use_token)"
)

// pickSet is a subset of the transaction's leases of 1, 2-16, 17-64 or
// 65-300 resources (a fifth each, two fifths for the last, as far as it
// holds that many; 9-16 in a transaction of many small statements), sorted
// by resource.
func (rt *rowTx) pickSet() []lease {
	rng := rt.wk.rng
	var k int
	switch r := rng.IntN(5); {
	case rt.smallOnly:
		k = 9 + rng.IntN(8)
	case r == 0:
		k = 1
	case r == 1:
		k = 2 + rng.IntN(15)
	case r == 2:
		k = 17 + rng.IntN(48)
	default:
		k = 65 + rng.IntN(236)
	}
	k = min(k, len(rt.ls))
	set := make([]lease, 0, k)
	for _, i := range rng.Perm(len(rt.ls))[:k] {
		set = append(set, rt.ls[i])
	}
	slices.SortFunc(set, func(a, b lease) int { return a.j - b.j })
	return set
}

// useMany registers the tokens of set with fence.use_token, in one
// statement, those not registered yet.
func (rt *rowTx) useMany(ctx context.Context, set []lease) error {
	var todo []lease
	for _, l := range set {
		if !rt.registered[l.j] {
			todo = append(todo, l)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	rs, ts := rt.wk.w.namesToks(todo)
	if _, err := rt.tx.Exec(ctx, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, rs, ts); err != nil {
		return err
	}
	for _, l := range todo {
		rt.registered[l.j] = true
		rt.presented[l.j] = l.tok
	}
	return nil
}

// ridsToks are the resource ids (rid column values) and tokens of set.
func ridsToks(set []lease) ([]int32, []int64) {
	rids, toks := make([]int32, len(set)), make([]int64, len(set))
	for i, l := range set {
		rids[i], toks[i] = int32(l.j+1), l.tok
	}
	return rids, toks
}

// largeStatement runs one statement over a subset of the transaction's
// leases (pickSet), of a kind chosen at random, and returns the kind and
// the rows it wrote.
func (rt *rowTx) largeStatement(ctx context.Context) (string, int, error) {
	wk, w, rng := rt.wk, rt.wk.w, rt.wk.rng
	set := rt.pickSet()
	rt.want = len(set)
	tc := w.rowTable(rowsTC)
	tokCol := func(tbl string) string {
		if tbl == rowsTC {
			return "t.tok"
		}
		return "0::bigint"
	}
	// every row, or about one in two or three (offset at random)
	mod := 1 + rng.IntN(3)
	off := rng.IntN(mod)
	r := rng.IntN(20)
	if r >= 14 && r < 16 && len(wk.deleted) == 0 {
		r = 8 // nothing to re-insert: insert
	}
	if r >= 16 && len(rt.ls) < 2 {
		r = 0 // a move needs two resources
	}
	if rt.columnOnly {
		r = 0
	}
	switch {
	case r < 5: // update, token column
		rids, toks := ridsToks(set)
		n, err := rt.exec(ctx, rowsTC, rowUpdate, true, `UPDATE `+tc+` t SET tok = u.tok, txid = $3, note = t.note + 1
			FROM unnest($1::int[], $2::bigint[]) AS u(rid, tok) WHERE t.rid = u.rid AND t.id % $4 = $5
			RETURNING t.id, t.rid, t.rid, t.tok`, rids, toks, rt.txid, mod, off)
		return stmtLargeUpdateColumn, n, err
	case r < 8: // update after fence.use_token, token column not assigned
		tbl := rt.pickTable()
		if err := rt.useMany(ctx, set); err != nil {
			return stmtLargeUpdateUseToken, 0, err
		}
		rids, _ := ridsToks(set)
		n, err := rt.exec(ctx, tbl, rowUpdate, false, `UPDATE `+w.rowTable(tbl)+` t SET txid = $2, note = t.note + 1
			WHERE t.rid = ANY($1::int[]) AND t.id % $3 = $4 RETURNING t.id, t.rid, t.rid, `+tokCol(tbl), rids, rt.txid, mod, off)
		return stmtLargeUpdateUseToken, n, err
	case r < 11: // insert one or two rows per resource
		tbl := rt.pickTable()
		copies := 1 + rng.IntN(2)
		rids, toks := ridsToks(set)
		newID := `nextval('` + w.schema() + `.row_id')`
		if tbl == rowsTC && rng.IntN(2) == 0 {
			n, err := rt.exec(ctx, tbl, rowInsert, true, `INSERT INTO `+tc+` (id, rid, tok, txid)
				SELECT `+newID+`, u.rid, u.tok, $3 FROM unnest($1::int[], $2::bigint[]) AS u(rid, tok), generate_series(1, $4)
				RETURNING id, 0, rid, tok`, rids, toks, rt.txid, copies)
			return stmtLargeInsertColumn, n, err
		}
		if err := rt.useMany(ctx, set); err != nil {
			return stmtLargeInsertUseToken, 0, err
		}
		ret := `RETURNING id, 0, rid, 0::bigint`
		if tbl == rowsTC {
			ret = `RETURNING id, 0, rid, tok`
		}
		n, err := rt.exec(ctx, tbl, rowInsert, false, `INSERT INTO `+w.rowTable(tbl)+` (id, rid, txid)
			SELECT `+newID+`, u.rid, $2 FROM unnest($1::int[]) AS u(rid), generate_series(1, $3) `+ret, rids, rt.txid, copies)
		return stmtLargeInsertUseToken, n, err
	case r < 14: // delete about one row in two to four
		tbl := rt.pickTable()
		if err := rt.useMany(ctx, set); err != nil {
			return stmtLargeDelete, 0, err
		}
		rids, _ := ridsToks(set)
		dmod := 2 + rng.IntN(3)
		n, err := rt.exec(ctx, tbl, rowDelete, false, `DELETE FROM `+w.rowTable(tbl)+` t WHERE t.rid = ANY($1::int[]) AND t.id % $2 = $3
			RETURNING t.id, t.rid, 0, 0::bigint`, rids, dmod, rng.IntN(dmod))
		return stmtLargeDelete, n, err
	case r < 16: // re-insert rows the worker deleted, spread over the subset
		tbl := wk.deleted[len(wk.deleted)-1].tbl
		var ids []int64
		var rids []int32
		var toks []int64
		keep := wk.deleted[:0:0]
		for i := len(wk.deleted) - 1; i >= 0; i-- {
			ref := wk.deleted[i]
			if ref.tbl != tbl || len(ids) == 2*len(set) {
				keep = append(keep, ref)
				continue
			}
			l := set[len(ids)%len(set)]
			ids, rids, toks = append(ids, ref.id), append(rids, int32(l.j+1)), append(toks, l.tok)
			rt.reinserted = append(rt.reinserted, ref)
		}
		slices.Reverse(keep)
		wk.deleted = keep
		if tbl == rowsTC && rng.IntN(2) == 0 {
			n, err := rt.exec(ctx, tbl, rowInsert, true, `INSERT INTO `+tc+` (id, rid, tok, txid)
				SELECT u.id, u.rid, u.tok, $4 FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS u(id, rid, tok)
				RETURNING id, 0, rid, tok`, ids, rids, toks, rt.txid)
			return stmtLargeReinsert, n, err
		}
		if err := rt.useMany(ctx, set); err != nil {
			return stmtLargeReinsert, 0, err
		}
		ret := `RETURNING id, 0, rid, 0::bigint`
		if tbl == rowsTC {
			ret = `RETURNING id, 0, rid, tok`
		}
		n, err := rt.exec(ctx, tbl, rowInsert, false, `INSERT INTO `+w.rowTable(tbl)+` (id, rid, txid)
			SELECT u.id, u.rid, $3 FROM unnest($1::bigint[], $2::int[]) AS u(id, rid) `+ret, ids, rids, rt.txid)
		return stmtLargeReinsert, n, err
	case r < 18: // rotate the rows of the subset: each to the next resource
		if len(set) < 2 {
			set = rt.ls[:2]
			if rt.ls[0].j > rt.ls[1].j {
				set = []lease{rt.ls[1], rt.ls[0]}
			}
			rt.want = 2
		}
		olds, news, toks := make([]int32, len(set)), make([]int32, len(set)), make([]int64, len(set))
		for i, l := range set {
			m := set[(i+1)%len(set)]
			olds[i], news[i], toks[i] = int32(l.j+1), int32(m.j+1), m.tok
		}
		tbl := rt.pickTable()
		if tbl == rowsTC && rng.IntN(2) == 0 {
			// The column presents the new resources' tokens; a resource of
			// the subset that had rows to give but got none (its
			// predecessor had none) is old only, and needs its token
			// registered: all are.
			if err := rt.useMany(ctx, set); err != nil {
				return stmtLargeRotateColumn, 0, err
			}
			n, err := rt.exec(ctx, tbl, rowUpdate, true, `UPDATE `+tc+` t SET rid = m.n, tok = m.t, txid = $4
				FROM unnest($1::int[], $2::int[], $3::bigint[]) AS m(o, n, t) WHERE t.rid = m.o AND t.id % $5 = $6
				RETURNING t.id, m.o, t.rid, t.tok`, olds, news, toks, rt.txid, mod, off)
			return stmtLargeRotateColumn, n, err
		}
		if err := rt.useMany(ctx, set); err != nil {
			return stmtLargeRotateUseToken, 0, err
		}
		n, err := rt.exec(ctx, tbl, rowUpdate, false, `UPDATE `+w.rowTable(tbl)+` t SET rid = m.n, txid = $3
			FROM unnest($1::int[], $2::int[]) AS m(o, n) WHERE t.rid = m.o AND t.id % $4 = $5
			RETURNING t.id, m.o, t.rid, `+tokCol(tbl), olds, news, rt.txid, mod, off)
		return stmtLargeRotateUseToken, n, err
	default: // move rows of the subset into one other held resource
		var into lease
		var others []lease
		for _, l := range rt.ls {
			if !slices.Contains(set, l) {
				others = append(others, l)
			}
		}
		if len(others) == 0 {
			into, set = set[len(set)-1], set[:len(set)-1]
		} else {
			into = others[rng.IntN(len(others))]
		}
		rt.want = len(set) + 1
		tbl := rt.pickTable()
		// the old resources are not in the statement's new rows: registered
		if err := rt.useMany(ctx, set); err != nil {
			return stmtLargeMoveUseToken, 0, err
		}
		rids, _ := ridsToks(set)
		if tbl == rowsTC && rng.IntN(2) == 0 {
			n, err := rt.exec(ctx, tbl, rowUpdate, true, `UPDATE `+tc+` t SET rid = $2, tok = $3, txid = $4
				FROM unnest($1::int[]) AS m(o) WHERE t.rid = m.o AND t.id % $5 = $6
				RETURNING t.id, m.o, t.rid, t.tok`, rids, into.j+1, into.tok, rt.txid, mod, off)
			return stmtLargeMoveColumn, n, err
		}
		if err := rt.useMany(ctx, []lease{into}); err != nil {
			return stmtLargeMoveUseToken, 0, err
		}
		n, err := rt.exec(ctx, tbl, rowUpdate, false, `UPDATE `+w.rowTable(tbl)+` t SET rid = $2, txid = $3
			FROM unnest($1::int[]) AS m(o) WHERE t.rid = m.o AND t.id % $4 = $5
			RETURNING t.id, m.o, t.rid, `+tokCol(tbl), rids, into.j+1, rt.txid, mod, off)
		return stmtLargeMoveUseToken, n, err
	}
}

// largeBlindStatements are writes presenting no token over the rows of
// many resources (an update of other columns, a delete, an insert, a
// move): each must fail with FN002.
func (wk *worker) largeBlindStatements() []string {
	tc, ut := wk.w.rowTable(rowsTC), wk.w.rowTable(rowsUT)
	lo := 1 + wk.rng.IntN(wk.w.resources)
	hi := lo + 16 + wk.rng.IntN(200)
	span := fmt.Sprintf(`rid BETWEEN %d AND %d`, lo, hi)
	return []string{
		`UPDATE ` + tc + ` SET note = note + 1 WHERE ` + span,
		`UPDATE ` + ut + ` SET note = note + 1 WHERE ` + span,
		`DELETE FROM ` + ut + ` WHERE ` + span + ` AND id % 3 = 0`,
		fmt.Sprintf(`INSERT INTO %s (id, rid, txid) SELECT nextval('%s.row_id'), r, -1 FROM generate_series(%d, %d) r`, ut, wk.w.schema(), lo, hi),
		fmt.Sprintf(`UPDATE %s SET rid = %d WHERE %s`, ut, lo, span),
	}
}

// foreignLargeWrite tries, in a transaction of its own that it always rolls
// back, a statement over some of the worker's leases that also writes rows
// of one resource f it does not hold: an update of the rows of both
// assigning each resource a held token in the token column (f gets one of
// another resource: FN001 or FN003), an update after fence.use_token of the
// held ones only (FN002 for f), an insert of rows into both (the same two
// ways), or a move of the held rows into f (with a held token in the column,
// or with nothing registered for f), or a move of the rows of f (and of the
// subset) into the subset's resources (their tokens in the column, or
// registered: nothing for f, which is old only). If the statement succeeds
// and one of the rows it returned belongs to f, before or after, the guard
// accepted a write presenting no token of f: a violation.
func (wk *worker) foreignLargeWrite(ctx context.Context, ls []lease) {
	held := map[int]bool{}
	for _, l := range ls {
		held[l.j] = true
	}
	if len(held) == wk.w.resources {
		return
	}
	f := wk.rng.IntN(wk.w.resources)
	for held[f] {
		f = (f + 1) % wk.w.resources
	}
	rt := &rowTx{wk: wk, ls: ls}
	set := rt.pickSet()
	// the token f is given in the column: a held one, or the largest held
	// (never granted for f, or stale)
	give := set[wk.rng.IntN(len(set))].tok
	rids, toks := ridsToks(set)
	frid := int32(f + 1)
	tc, ut := wk.w.rowTable(rowsTC), wk.w.rowTable(rowsUT)
	newID := `nextval('` + wk.w.schema() + `.row_id')`
	kind := wk.rng.IntN(8)
	ctx, cancel := context.WithTimeout(ctx, workerOpTimeout)
	defer cancel()
	wk.h.foreignTried.Add(1)
	accepted := false
	tx, err := wk.conn.Begin(ctx)
	if err == nil {
		var sql string
		var args []any
		switch kind {
		case 0:
			sql = `UPDATE ` + tc + ` t SET tok = u.tok, note = t.note + 1 FROM unnest($1::int[], $2::bigint[]) AS u(rid, tok)
				WHERE t.rid = u.rid RETURNING t.rid, t.rid`
			args = []any{append(rids, frid), append(toks, give)}
		case 1:
			if _, err = tx.Exec(ctx, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, wk.w.namesOf(set), toks); err == nil {
				sql = `UPDATE ` + ut + ` t SET note = t.note + 1 WHERE t.rid = ANY($1::int[]) RETURNING t.rid, t.rid`
				args = []any{append(rids, frid)}
			}
		case 2:
			sql = `INSERT INTO ` + tc + ` (id, rid, tok, txid) SELECT ` + newID + `, u.rid, u.tok, -1 FROM unnest($1::int[], $2::bigint[]) AS u(rid, tok)
				RETURNING 0, rid`
			args = []any{append(rids, frid), append(toks, give)}
		case 3:
			if _, err = tx.Exec(ctx, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, wk.w.namesOf(set), toks); err == nil {
				sql = `INSERT INTO ` + ut + ` (id, rid, txid) SELECT ` + newID + `, u.rid, -1 FROM unnest($1::int[]) AS u(rid) RETURNING 0, rid`
				args = []any{append(rids, frid)}
			}
		case 4: // move into f, a held token in the column (the old resources' tokens registered)
			if _, err = tx.Exec(ctx, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, wk.w.namesOf(set), toks); err == nil {
				sql = `UPDATE ` + tc + ` t SET rid = $2, tok = $3 WHERE t.rid = ANY($1::int[]) RETURNING $2::int, t.rid`
				args = []any{rids, frid, give}
			}
		case 5: // move into f, nothing registered for f
			if _, err = tx.Exec(ctx, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, wk.w.namesOf(set), toks); err == nil {
				sql = `UPDATE ` + ut + ` t SET rid = $2 WHERE t.rid = ANY($1::int[]) RETURNING $2::int, t.rid`
				args = []any{rids, frid}
			}
		case 6: // move the rows of f and of the subset into the subset's resources, their tokens in the column: nothing for f
			sql = `UPDATE ` + tc + ` t SET rid = u.n, tok = u.tok FROM unnest($1::int[], $2::int[], $3::bigint[]) AS u(o, n, tok)
				WHERE t.rid = u.o RETURNING u.o, t.rid`
			args = []any{append(slices.Clone(rids), frid), append(slices.Clone(rids), rids[0]), append(slices.Clone(toks), toks[0])}
		default: // the same after fence.use_token of the subset
			if _, err = tx.Exec(ctx, `SELECT fence.use_token(u.r, u.t) FROM unnest($1::text[], $2::bigint[]) AS u(r, t)`, wk.w.namesOf(set), toks); err == nil {
				sql = `UPDATE ` + ut + ` t SET rid = u.n FROM unnest($1::int[], $2::int[]) AS u(o, n) WHERE t.rid = u.o RETURNING u.o, t.rid`
				args = []any{append(slices.Clone(rids), frid), append(slices.Clone(rids), rids[0])}
			}
		}
		if err == nil {
			var rows pgx.Rows
			rows, err = tx.Query(ctx, sql, args...)
			if err == nil {
				var touched [][2]int32
				touched, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int32, error) {
					var x [2]int32
					err := r.Scan(&x[0], &x[1])
					return x, err
				})
				accepted = slices.ContainsFunc(touched, func(x [2]int32) bool { return x[0] == frid || x[1] == frid })
			}
		}
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		_ = tx.Rollback(rctx)
		rcancel()
	}
	switch out, code := outcome(err); {
	case out == outOK && accepted:
		wk.h.foreignCommitted.Add(1)
		wk.unexpected("write of a resource the worker does not hold", fmt.Errorf("accepted (kind %d, resource %d, %d held)", kind, f+1, len(set)))
	case out == outOK: // no row of f matched: nothing to judge
	case out == outLost:
		wk.drop()
	case code == sqlfuncs.CodeStaleToken || code == sqlfuncs.CodeNoToken || code == sqlfuncs.CodeUnknownToken:
		wk.h.foreignRefused.Add(1)
	case wk.w.expectedCode(code): // a deadlock with the holder of f, or a lease of the worker lost meanwhile
		wk.h.foreignRefused.Add(1)
	default:
		wk.unexpected("write of a resource the worker does not hold", err)
	}
}

// namesOf are the resource names of ls.
func (w workload) namesOf(ls []lease) []string {
	rs, _ := w.namesToks(ls)
	return rs
}

// TestRandomizedHistoryLargeStatements is TestRandomizedHistoryPerRow at
// scale: 600 per-row resources, workers holding up to 300 leases at once
// and writing them with statements over 1 to 300 resources (up to a few
// thousand rows), moving rows between them, under READ COMMITTED and
// REPEATABLE READ, with zombies, revokes of held leases, expiries in the
// middle of transactions and every other fault, on a private cluster that
// it crashes and restarts, under the default max_locks_per_transaction.
// The checks are those of the per-row run (checkHistory, checkRows).
func TestRandomizedHistoryLargeStatements(t *testing.T) {
	t.Parallel()
	randomizedHistory(t, perRowLarge)
}

// TestHistoryCheckerCatchesUnguardedLargeStatements runs the large per-row
// workload on tables that were never protected and expects the checker to
// find stale writes committed after a newer grant.
func TestHistoryCheckerCatchesUnguardedLargeStatements(t *testing.T) {
	pgtest.Long(t, "the randomized large per-row workload (the checker's control)")
	t.Parallel()
	catchesUnguarded(t, perRowLarge)
}
