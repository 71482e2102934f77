package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The per-row variant of the randomized workload (history_test.go). The
// resources h<run>/row:1 .. row:N are rows of two tables protected with
// fence.protect_rows (resource column rid, prefix h<run>/row:): rtc with
// the token column tok, rut without one (fence.use_token only). Both start
// with three rows per resource. A worker holds one lease, or two, and its
// guarded transactions write only the rows of the resources it holds (or
// held: zombies write on), one to three statements each, of these kinds:
//
//   - update with the token column assigned per row (UPDATE ... FROM
//     unnest(rids, tokens)), for one held resource or all of them;
//   - update after fence.use_token, the token column not assigned (rtc) or
//     absent (rut);
//   - insert of a new row, presenting the token in the column or through
//     fence.use_token;
//   - delete of a row (fence.use_token), and later re-insert of a row the
//     worker deleted, under the same id;
//   - move of a row from one held resource to the other (fence.use_token
//     for the old one; the new one's token in the column or through
//     fence.use_token).
//
// Each statement returns the rows it wrote (RETURNING), and the transaction
// logs them in wlog before its txlog row, which lists the tokens it
// presented. Besides, in their own transactions, workers try writes that
// present no token (blindWrite: must fail with FN002) and writes of a row
// of a resource they do not hold with the token of one they hold
// (foreignWrite: must fail with FN001, FN002 or FN003). checkHistory and
// checkRows (checker_test.go) judge the run.

// Kinds of guarded statements in a per-row run (stmtFigures).
const (
	stmtUpdateColumn   = "update (token column)"
	stmtUpdateUseToken = "update (use_token)"
	stmtInsertColumn   = "insert (token column)"
	stmtInsertUseToken = "insert (use_token)"
	stmtReinsert       = "re-insert"
	stmtDelete         = "delete"
	stmtMoveColumn     = "move (token column)"
	stmtMoveUseToken   = "move (use_token)"
)

// The per-row tables: rowsTC has the token column tok, rowsUT has none.
const (
	rowsTC = "rtc"
	rowsUT = "rut"
)

// seedRows is the number of rows per resource each per-row table starts
// with.
func (w workload) seedRows() int {
	if w.large {
		return 4
	}
	return 3
}

// rowRef names a row of a per-row table.
type rowRef struct {
	tbl string
	id  int64
}

// rowPrefix is the resource prefix of the run's per-row tables.
func (w workload) rowPrefix() string { return fmt.Sprintf("h%d/row:", w.run) }

// rowTable is the qualified name of per-row table tbl.
func (w workload) rowTable(tbl string) string { return w.schema() + "." + tbl }

// setupRows creates the per-row tables of a run, seeds them (logging the
// seed rows as writes of transaction 0) and protects them unless the run is
// unguarded.
func setupRows(t *testing.T, ctx context.Context, conn *pgx.Conn, w workload) {
	t.Helper()
	s := w.schema()
	tc, ut := w.rowTable(rowsTC), w.rowTable(rowsUT)
	seedRows := w.seedRows()
	stmts := []string{
		fmt.Sprintf(`CREATE SEQUENCE %s.row_id START %d`, s, 1000+seedRows*w.resources),
		`CREATE TABLE ` + tc + ` (id bigint PRIMARY KEY, rid int NOT NULL, tok bigint, txid bigint NOT NULL, note int NOT NULL DEFAULT 0)`,
		`CREATE TABLE ` + ut + ` (id bigint PRIMARY KEY, rid int NOT NULL, txid bigint NOT NULL, note int NOT NULL DEFAULT 0)`,
		`CREATE TABLE ` + s + `.wlog (ord bigserial PRIMARY KEY, txid bigint NOT NULL, tbl text NOT NULL, op text NOT NULL,
			id bigint NOT NULL, old_rid int NOT NULL, new_rid int NOT NULL, tok bigint NOT NULL)`,
		`CREATE INDEX ON ` + s + `.wlog (txid)`,
		fmt.Sprintf(`INSERT INTO %s (id, rid, txid) SELECT i, (i - 1) %% %d + 1, 0 FROM generate_series(1, %d) i`, tc, w.resources, seedRows*w.resources),
		fmt.Sprintf(`INSERT INTO %s (id, rid, txid) SELECT i, (i - 1) %% %d + 1, 0 FROM generate_series(1, %d) i`, ut, w.resources, seedRows*w.resources),
		`INSERT INTO ` + s + `.wlog (txid, tbl, op, id, old_rid, new_rid, tok)
			SELECT 0, '` + rowsTC + `', '` + rowInsert + `', id, 0, rid, 0 FROM ` + tc + `
			UNION ALL SELECT 0, '` + rowsUT + `', '` + rowInsert + `', id, 0, rid, 0 FROM ` + ut + ` ORDER BY 2, 4`,
	}
	for _, sql := range stmts {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	if w.unguarded {
		return
	}
	require.NoError(t, sqlfuncs.ProtectRows(ctx, conn, tc, "rid", w.rowPrefix(), "tok"))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, conn, ut, "rid", w.rowPrefix(), ""))
}

// readRows reads the per-row tables, their write log and the transactions
// of a per-row run into st (in the caller's snapshot).
func readRows(t *testing.T, ctx context.Context, tx pgx.Tx, w workload, st *dbState) {
	t.Helper()
	s := w.schema()
	tc, ut := w.rowTable(rowsTC), w.rowTable(rowsUT)
	rows, err := tx.Query(ctx, `SELECT l.txid, (SELECT count(*) FROM `+s+`.wlog x WHERE x.txid = l.txid), true, l.res, l.tok, l.nrows, l.seq
		  FROM `+s+`.txlog l
		UNION ALL
		SELECT g.txid, count(*), false, '{}', '{}', 0, 0
		  FROM (SELECT txid FROM `+tc+` UNION ALL SELECT txid FROM `+ut+`) g
		 WHERE g.txid <> 0 AND NOT EXISTS (SELECT 1 FROM `+s+`.txlog l WHERE l.txid = g.txid)
		 GROUP BY g.txid`)
	require.NoError(t, err)
	scanTxs(t, rows, st)

	rows, err = tx.Query(ctx, `SELECT txid, ord, tbl, op, id, old_rid, new_rid, tok FROM `+s+`.wlog`)
	require.NoError(t, err)
	st.rowWrites, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (rowWrite, error) {
		var x rowWrite
		err := r.Scan(&x.txid, &x.ord, &x.tbl, &x.op, &x.id, &x.oldRid, &x.newRid, &x.tok)
		return x, err
	})
	require.NoError(t, err)

	st.rowPrefix = w.rowPrefix()
	st.rows = map[string]map[int64]rowRec{rowsTC: {}, rowsUT: {}}
	rows, err = tx.Query(ctx, `SELECT '`+rowsTC+`', id, rid, coalesce(tok, 0), txid FROM `+tc+`
		UNION ALL SELECT '`+rowsUT+`', id, rid, 0, txid FROM `+ut)
	require.NoError(t, err)
	for rows.Next() {
		var tbl string
		var id int64
		var r rowRec
		require.NoError(t, rows.Scan(&tbl, &id, &r.rid, &r.tok, &r.txid))
		st.rows[tbl][id] = r
	}
	require.NoError(t, rows.Err())
}

// errNothingWritten: a per-row transaction wrote no row and registered no
// token (the resources it chose had no rows left); it rolls back and counts
// as no write.
var errNothingWritten = errors.New("nothing written")

// rowTx is one guarded transaction of a per-row run in progress.
type rowTx struct {
	wk *worker
	// columnOnly: every statement is a large update that presents its
	// tokens in the token column only (worker.columnOnly).
	columnOnly bool
	tx         pgx.Tx
	txid       int64
	ls         []lease
	// presented is the token the transaction presented per resource index:
	// registered with fence.use_token, or assigned to the token column of a
	// row it wrote; registered says which were registered.
	presented  map[int]int64
	registered map[int]bool
	nlog       int
	// deleted are the rows it deleted; reinserted those it took from the
	// worker's deleted rows and inserted again.
	deleted, reinserted []rowRef
	// want is the number of resources the statement being built is to
	// write (for the figures by size).
	want int
	// tokOf is the token of each lease of ls, by resource index.
	tokOf map[int]int64
	// smallOnly: the large statements of this transaction are over 9-16
	// resources each, and there are six to nine of them, so that they name
	// more than 64 resources in all (a large run).
	smallOnly bool
}

// use registers l's token with fence.use_token (once per transaction).
func (rt *rowTx) use(ctx context.Context, l lease) error {
	if rt.registered[l.j] {
		return nil
	}
	if err := sqlfuncs.UseToken(ctx, rt.tx, rt.wk.w.resource(l.j), l.tok); err != nil {
		return err
	}
	rt.registered[l.j] = true
	rt.presented[l.j] = l.tok
	return nil
}

// pickTable is rtc or rut, at random.
func (rt *rowTx) pickTable() string {
	if rt.wk.rng.IntN(2) == 0 {
		return rowsTC
	}
	return rowsUT
}

// exec runs one guarded statement that returns (id, old_rid, new_rid, tok)
// of every row it wrote, and logs them in wlog as operation op of table tbl.
// A row written by assigning the token column presents its resource's
// token (column true).
func (rt *rowTx) exec(ctx context.Context, tbl, op string, column bool, sql string, args ...any) (int, error) {
	rows, err := rt.tx.Query(ctx, sql, args...)
	if err != nil {
		return 0, err
	}
	var ids, toks []int64
	var olds, news []int32
	for rows.Next() {
		var id, tok int64
		var o, n int32
		if err := rows.Scan(&id, &o, &n, &tok); err != nil {
			rows.Close()
			return 0, err
		}
		ids, olds, news, toks = append(ids, id), append(olds, o), append(news, n), append(toks, tok)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if column {
		for _, n := range news {
			j := int(n) - 1
			if tok, ok := rt.tokOf[j]; ok {
				if _, ok := rt.presented[j]; !ok {
					rt.presented[j] = tok
				}
			}
		}
	}
	if op == rowDelete {
		for _, id := range ids {
			rt.deleted = append(rt.deleted, rowRef{tbl, id})
		}
	}
	rt.nlog += len(ids)
	s := rt.wk.w.schema()
	_, err = rt.tx.Exec(ctx, `INSERT INTO `+s+`.wlog (txid, tbl, op, id, old_rid, new_rid, tok)
		SELECT $1, $2, $3, u.* FROM unnest($4::bigint[], $5::int[], $6::int[], $7::bigint[]) u`,
		rt.txid, tbl, op, ids, olds, news, toks)
	return len(ids), err
}

// statement runs one guarded statement of a kind chosen at random and
// returns the kind and the rows it wrote.
func (rt *rowTx) statement(ctx context.Context) (string, int, error) {
	wk, w := rt.wk, rt.wk.w
	rng := wk.rng
	l := rt.ls[rng.IntN(len(rt.ls))]
	rid := l.j + 1
	tokCol := func(tbl string) string {
		if tbl == rowsTC {
			return "tok"
		}
		return "0::bigint"
	}
	// pick a random row of resource rid; the statement also requires rid
	// again, so that under READ COMMITTED a row moved meanwhile is skipped
	pick := func(tbl string) string {
		return `rid = $1 AND id = (SELECT id FROM ` + w.rowTable(tbl) + ` WHERE rid = $1 ORDER BY random() LIMIT 1)`
	}
	r := rng.IntN(20)
	if r >= 16 && len(rt.ls) < 2 {
		r = 0 // a move needs two resources
	}
	if r >= 14 && r < 16 && len(wk.deleted) == 0 {
		r = 8 // nothing to re-insert: insert
	}
	rt.want = 1
	if r >= 16 {
		rt.want = 2
	}
	switch {
	case r < 5: // update, token column, one held resource or all
		sel := []lease{l}
		if rng.IntN(2) == 0 {
			sel = rt.ls
		}
		rt.want = len(sel)
		var rids []int32
		var toks []int64
		for _, x := range sel {
			rids, toks = append(rids, int32(x.j+1)), append(toks, x.tok)
		}
		n, err := rt.exec(ctx, rowsTC, rowUpdate, true, `UPDATE `+w.rowTable(rowsTC)+` t SET tok = u.tok, txid = $3
			FROM unnest($1::int[], $2::bigint[]) AS u(rid, tok) WHERE t.rid = u.rid RETURNING t.id, t.rid, t.rid, t.tok`, rids, toks, rt.txid)
		return stmtUpdateColumn, n, err
	case r < 8: // update after fence.use_token, token column not assigned
		tbl := rt.pickTable()
		if err := rt.use(ctx, l); err != nil {
			return stmtUpdateUseToken, 0, err
		}
		n, err := rt.exec(ctx, tbl, rowUpdate, false, `UPDATE `+w.rowTable(tbl)+` SET txid = $2, note = note + 1
			WHERE rid = $1 RETURNING id, rid, rid, `+tokCol(tbl), rid, rt.txid)
		return stmtUpdateUseToken, n, err
	case r < 11, r >= 14 && r < 16: // insert a new row, or re-insert one the worker deleted
		kind := stmtInsertColumn
		tbl := rowsTC
		var id *int64
		if r >= 14 {
			kind = stmtReinsert
			ref := wk.deleted[len(wk.deleted)-1]
			wk.deleted = wk.deleted[:len(wk.deleted)-1]
			rt.reinserted = append(rt.reinserted, ref)
			tbl, id = ref.tbl, &ref.id
		} else if rng.IntN(2) == 0 {
			kind, tbl = stmtInsertUseToken, rt.pickTable()
		}
		column := tbl == rowsTC && (kind == stmtInsertColumn || rng.IntN(2) == 0)
		var tok *int64
		if column {
			tok = &l.tok
		} else if err := rt.use(ctx, l); err != nil {
			return kind, 0, err
		}
		newID := `coalesce($1::bigint, nextval('` + w.schema() + `.row_id'))`
		if tbl == rowsUT {
			n, err := rt.exec(ctx, tbl, rowInsert, false, `INSERT INTO `+w.rowTable(tbl)+` (id, rid, txid)
				VALUES (`+newID+`, $2, $3) RETURNING id, 0, rid, 0::bigint`, id, rid, rt.txid)
			return kind, n, err
		}
		n, err := rt.exec(ctx, tbl, rowInsert, column, `INSERT INTO `+w.rowTable(tbl)+` (id, rid, tok, txid)
			VALUES (`+newID+`, $2, $3, $4) RETURNING id, 0, rid, tok`, id, rid, tok, rt.txid)
		return kind, n, err
	case r < 14: // delete a row (fence.use_token)
		tbl := rt.pickTable()
		if err := rt.use(ctx, l); err != nil {
			return stmtDelete, 0, err
		}
		n, err := rt.exec(ctx, tbl, rowDelete, false, `DELETE FROM `+w.rowTable(tbl)+` WHERE `+pick(tbl)+`
			RETURNING id, rid, 0, 0::bigint`, rid)
		return stmtDelete, n, err
	default: // move a row from one held resource to the other
		var m lease
		for _, x := range rt.ls {
			if x.j != l.j {
				m = x
			}
		}
		tbl := rt.pickTable()
		if err := rt.use(ctx, l); err != nil {
			return stmtMoveUseToken, 0, err
		}
		if tbl == rowsTC && rng.IntN(2) == 0 {
			n, err := rt.exec(ctx, tbl, rowUpdate, true, `UPDATE `+w.rowTable(tbl)+` SET rid = $2, tok = $3, txid = $4
				WHERE `+pick(tbl)+` RETURNING id, $1::int, rid, tok`, rid, m.j+1, m.tok, rt.txid)
			return stmtMoveColumn, n, err
		}
		if err := rt.use(ctx, m); err != nil {
			return stmtMoveUseToken, 0, err
		}
		n, err := rt.exec(ctx, tbl, rowUpdate, false, `UPDATE `+w.rowTable(tbl)+` SET rid = $2, txid = $3
			WHERE `+pick(tbl)+` RETURNING id, $1::int, rid, `+tokCol(tbl), rid, m.j+1, rt.txid)
		return stmtMoveUseToken, n, err
	}
}

// writeRows runs one guarded transaction of a per-row run under the leases
// ls: one to three statements (rowTx.statement), sometimes with a pause
// longer than the TTL between them, and last the log row with the tokens
// it presented and the commit-order number.
func (wk *worker) writeRows(ctx context.Context, ls []lease) event {
	rt := &rowTx{wk: wk, columnOnly: wk.columnOnly, txid: wk.h.txid.Add(1), ls: ls, presented: map[int]int64{}, registered: map[int]bool{}, tokOf: map[int]int64{}}
	for _, l := range ls {
		rt.tokOf[l.j] = l.tok
	}
	n := 1 + wk.rng.IntN(3)
	if wk.w.large {
		n = 1 + wk.rng.IntN(6)
		if len(ls) > 16 && wk.rng.IntN(4) == 0 {
			rt.smallOnly, n = true, 6+wk.rng.IntN(4)
		}
	}
	// Half the transactions run under REPEATABLE READ, where the guards
	// check lease rows that may have changed since the snapshot.
	iso, isoName := pgx.ReadCommitted, "read committed"
	if wk.rng.IntN(2) == 0 {
		iso, isoName = pgx.RepeatableRead, "repeatable read"
	}
	type stmt struct {
		kind string
		rows int
		want int
	}
	var done []stmt
	refused := stmt{}
	err := wk.inTxIso(ctx, iso, func(ctx context.Context, tx pgx.Tx) error {
		rt.tx = tx
		pause := 12
		var targets []int
		columnBefore := map[int]bool{}
		if wk.w.large {
			pause = 6
			defer wk.writing.Store(nil)
		}
		for i := range n {
			wk.step(ctx)
			if i > 0 && wk.rng.IntN(pause) == 0 {
				wk.sleep(ctx, wk.w.ttl+time.Duration(wk.rng.Int64N(int64(wk.w.ttl)))) // paused holder, transaction open
			}
			var kind string
			var rows int
			var err error
			before := len(rt.presented)
			if wk.w.large && (rt.smallOnly || rt.columnOnly || wk.rng.IntN(3) != 0) {
				kind, rows, err = rt.largeStatement(ctx)
			} else {
				kind, rows, err = rt.statement(ctx)
			}
			if err != nil {
				refused = stmt{kind, 0, rt.want}
				return fmt.Errorf("%s of %d resources: %w", kind, rt.want, err)
			}
			done = append(done, stmt{kind, rows, rt.want})
			if wk.w.large && len(rt.presented) > before {
				// For the fault injector: resources presented in the token
				// column only, where no gate of fence.use_token holds
				// grants off and the guard's own check must; first those of
				// statements over more than 16 resources or under
				// REPEATABLE READ (checked through the lease rows), else
				// any, else all.
				var rowLocked, column []int
				for j := range rt.presented {
					if !rt.registered[j] {
						column = append(column, j)
						if !columnBefore[j] && (rt.want > 16 || iso == pgx.RepeatableRead) {
							rowLocked = append(rowLocked, j)
						}
						columnBefore[j] = true
					}
				}
				targets = append(targets, rowLocked...)
				js := targets
				if len(js) == 0 {
					js = column
				}
				if len(js) == 0 {
					js = slices.Collect(maps.Keys(rt.presented))
				}
				js = slices.Clone(js)
				wk.writing.Store(&js)
			}
		}
		if len(rt.presented) == 0 {
			return errNothingWritten
		}
		wk.step(ctx)
		var res []string
		var toks []int64
		for _, j := range slices.Sorted(maps.Keys(rt.presented)) {
			res, toks = append(res, wk.w.resource(j)), append(toks, rt.presented[j])
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+wk.w.schema()+`.txlog (txid, res, tok, nrows, seq, lsn)
			VALUES ($1, $2, $3, $4, nextval('`+wk.w.schema()+`.seq'), pg_current_wal_insert_lsn())`, rt.txid, res, toks, rt.nlog)
		return err
	})
	var e event
	if errors.Is(err, errNothingWritten) {
		e = event{worker: wk.id, kind: opWrite, res: wk.w.resource(ls[0].j), tok: ls[0].tok, txid: rt.txid, out: outNone}
		wk.h.add(e)
	} else {
		e = wk.finish(event{worker: wk.id, kind: opWrite, res: wk.w.resource(ls[0].j), tok: ls[0].tok, txid: rt.txid, midTx: len(done) > 0}, err)
	}
	switch e.out {
	case outOK:
		wk.deleted = append(wk.deleted, rt.deleted...)
	case outRefused, outNone:
		wk.deleted = append(wk.deleted, rt.reinserted...) // still free
	}
	wk.h.mu.Lock()
	defer wk.h.mu.Unlock()
	if wk.h.stmts == nil {
		wk.h.stmts = map[string]stmtFigures{}
	}
	if wk.h.sizes == nil {
		wk.h.sizes, wk.h.txKinds, wk.h.refusals = map[string]stmtFigures{}, map[string]stmtFigures{}, map[string]int{}
	}
	count := func(m map[string]stmtFigures, key string, rows int, refusedHere bool) {
		x := m[key]
		x.tried++
		if e.out == outOK {
			x.committed++
			x.rows += rows
		}
		if refusedHere && e.out == outRefused {
			x.refused++
		}
		m[key] = x
	}
	// gated: resources named by statements of at most 16 resources each,
	// which the per-row guard of migration 008 checks under shared gates
	// while the transaction holds at most 64 of them
	gated, total := 0, 0
	for _, d := range done {
		count(wk.h.stmts, d.kind, d.rows, false)
		count(wk.h.sizes, sizeBucket(d.want), d.rows, false)
		total += d.rows
		if d.want <= 16 {
			gated += d.want
		}
	}
	if refused.kind != "" {
		count(wk.h.stmts, refused.kind, 0, true)
		count(wk.h.sizes, sizeBucket(refused.want), 0, true)
	}
	if e.out != outNone {
		count(wk.h.txKinds, isoName, total, true)
		if gated > 64 {
			count(wk.h.txKinds, "more than 64 resources in statements of at most 16", total, true)
		}
	}
	if e.out == outRefused {
		wk.h.refusals[e.code]++
	}
	return e
}

// sizeBucket names the size class of a statement that is to write the rows
// of n resources: the per-row guard takes shared gates for at most 16 and
// locks lease rows beyond; 64 is its gate budget per transaction.
func sizeBucket(n int) string {
	switch {
	case n <= 1:
		return "1 resource"
	case n <= 16:
		return "2-16 resources"
	case n <= 64:
		return "17-64 resources"
	default:
		return "65-300 resources"
	}
}

// blindRowStatements are the writes presenting no token of a per-row run,
// one row each (an UPDATE of other columns, a DELETE, an INSERT with no
// token, a move, a MERGE on PostgreSQL 15+): each must fail with FN002.
func (wk *worker) blindRowStatements(merge bool) []string {
	tc, ut := wk.w.rowTable(rowsTC), wk.w.rowTable(rowsUT)
	rid := 1 + wk.rng.IntN(wk.w.resources)
	last := func(tbl string) string { return `id = (SELECT max(id) FROM ` + tbl + `)` }
	stmts := []string{
		`UPDATE ` + tc + ` SET note = note + 1 WHERE ` + last(tc),
		`UPDATE ` + ut + ` SET note = note + 1 WHERE ` + last(ut),
		`DELETE FROM ` + tc + ` WHERE ` + last(tc),
		`DELETE FROM ` + ut + ` WHERE ` + last(ut),
		fmt.Sprintf(`INSERT INTO %s (id, rid, txid) VALUES (nextval('%s.row_id'), %d, -1)`, tc, wk.w.schema(), rid),
		fmt.Sprintf(`INSERT INTO %s (id, rid, txid) VALUES (nextval('%s.row_id'), %d, -1)`, ut, wk.w.schema(), rid),
		fmt.Sprintf(`UPDATE %s SET rid = %d WHERE %s`, tc, rid, last(tc)),
	}
	if merge {
		stmts = append(stmts, `MERGE INTO `+tc+` t USING (SELECT max(id) AS id FROM `+tc+`) s ON t.id = s.id
			WHEN MATCHED THEN UPDATE SET note = t.note + 1`)
	}
	return stmts
}

// foreignWrite tries, in its own transaction, to write a row of a resource
// the worker does not hold, presenting the token of one it holds: in the
// token column of an UPDATE or INSERT (FN001, or FN003 when the token is
// newer than the other resource's or it was never granted), or through
// fence.use_token of the held resource (FN002: nothing registered for the
// row's); or to move a row of a held resource into one it does not hold
// (after fence.use_token of the held one: the held token in the token
// column, or nothing for the new resource), or a row of a resource it does
// not hold into a held one (the held token in the token column or
// registered: nothing for the old resource). One that writes a row is a
// violation.
func (wk *worker) foreignWrite(ctx context.Context, ls []lease) {
	var others []int
	for k := range wk.w.resources {
		if !slices.ContainsFunc(ls, func(l lease) bool { return l.j == k }) {
			others = append(others, k)
		}
	}
	if len(others) == 0 {
		return
	}
	l := ls[wk.rng.IntN(len(ls))]
	rid := others[wk.rng.IntN(len(others))] + 1
	tc, ut := wk.w.rowTable(rowsTC), wk.w.rowTable(rowsUT)
	kind := wk.rng.IntN(7)
	ctx, cancel := context.WithTimeout(ctx, workerOpTimeout)
	defer cancel()
	wk.h.foreignTried.Add(1)
	var n int64
	err := pgx.BeginFunc(ctx, wk.conn, func(tx pgx.Tx) error {
		var sql string
		args := []any{rid}
		switch kind {
		case 0:
			sql = `UPDATE ` + tc + ` SET tok = $2, note = note + 1 WHERE id = (SELECT max(id) FROM ` + tc + ` WHERE rid = $1)`
			args = append(args, l.tok)
		case 1:
			sql = `INSERT INTO ` + tc + ` (id, rid, tok, txid) VALUES (nextval('` + wk.w.schema() + `.row_id'), $1, $2, -1)`
			args = append(args, l.tok)
		case 2, 3: // move a row of the held resource into rid
			if err := sqlfuncs.UseToken(ctx, tx, wk.w.resource(l.j), l.tok); err != nil {
				return err
			}
			if kind == 2 {
				sql = `UPDATE ` + tc + ` SET rid = $1, tok = $2 WHERE id = (SELECT max(id) FROM ` + tc + ` WHERE rid = $3) AND rid = $3`
				args = append(args, l.tok, l.j+1)
			} else {
				sql = `UPDATE ` + ut + ` SET rid = $1 WHERE id = (SELECT max(id) FROM ` + ut + ` WHERE rid = $2) AND rid = $2`
				args = append(args, l.j+1)
			}
		case 4: // move a row of rid into the held resource, its token in the column
			sql = `UPDATE ` + tc + ` SET rid = $2, tok = $3 WHERE id = (SELECT max(id) FROM ` + tc + ` WHERE rid = $1) AND rid = $1`
			args = append(args, l.j+1, l.tok)
		case 5: // the same, the held token registered
			if err := sqlfuncs.UseToken(ctx, tx, wk.w.resource(l.j), l.tok); err != nil {
				return err
			}
			sql = `UPDATE ` + ut + ` SET rid = $2 WHERE id = (SELECT max(id) FROM ` + ut + ` WHERE rid = $1) AND rid = $1`
			args = append(args, l.j+1)
		default:
			if err := sqlfuncs.UseToken(ctx, tx, wk.w.resource(l.j), l.tok); err != nil {
				return err
			}
			sql = `UPDATE ` + ut + ` SET note = note + 1 WHERE id = (SELECT max(id) FROM ` + ut + ` WHERE rid = $1)`
		}
		tag, err := tx.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	switch out, code := outcome(err); {
	case out == outOK && n > 0:
		wk.h.foreignCommitted.Add(1)
	case out == outOK: // no row matched: nothing written, nothing to judge
	case out == outLost:
		wk.drop()
	case code == sqlfuncs.CodeStaleToken || code == sqlfuncs.CodeNoToken || code == sqlfuncs.CodeUnknownToken:
		wk.h.foreignRefused.Add(1)
	case wk.w.expectedCode(code): // a deadlock with the holder of the other resource
		wk.h.foreignRefused.Add(1)
	default:
		wk.unexpected("write presenting another resource's token", err)
	}
}

// TestRandomizedHistoryPerRow is TestRandomizedHistory with per-row
// resources: 6 resources that are rows of two fence.protect_rows tables,
// each worker holding one or two leases and writing, moving, deleting and
// re-inserting only the rows of its resources, with every fault, on a
// private cluster that it crashes and restarts. Besides the checks of
// checkHistory per resource, checkRows ties every committed row to the
// tokens its transaction presented and replays the committed writes to the
// final tables.
func TestRandomizedHistoryPerRow(t *testing.T) {
	t.Parallel()
	randomizedHistory(t, perRow)
}

// TestHistoryCheckerCatchesUnguardedRows runs the per-row workload on
// tables that were never protected and expects the checker to find stale
// writes committed after a newer grant of their row's resource.
func TestHistoryCheckerCatchesUnguardedRows(t *testing.T) {
	pgtest.Long(t, "the randomized per-row workload (the checker's control)")
	t.Parallel()
	catchesUnguarded(t, perRow)
}
