package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The rows scenario: tables protected per row (fence.protect_rows), each row
// its own resource, in a database of its own so that its 10,000 leases and
// the bloat of its 10,000-row UPDATEs touch no other scenario.
const (
	// grantBatch is how many leases one transaction grants while the bench
	// prepares its fixtures (prefill, grantRows): each grant takes an
	// advisory lock that its transaction keeps, so a batch must stay well
	// inside the server's lock table (max_locks_per_transaction x
	// max_connections), prefillWorkers batches at a time included.
	grantBatch = 250
	// rowsPrefix is the resource prefix of the per-row tables: row 42 is
	// resource "bench-row:42".
	rowsPrefix = "bench-row:"
	// rowsMulti is how many rows, of as many resources, the multi-row
	// UPDATE writes.
	rowsMulti = 10_000
	// rowsSingle is how many rows the single-row tables hold (clients
	// update rows 1..clients).
	rowsSingle = 256
	// rowsTTL is the TTL of the per-row leases: far longer than the
	// scenario, so none expires while it runs.
	rowsTTL = time.Hour
	// rowsMultiSlices is how many times --duration a slice of the multi-row
	// pair lasts: one such UPDATE takes a good part of the default 300ms.
	rowsMultiSlices = 5
)

// rowsTables are the tables of the rows scenario: the per-row pair for
// single-row UPDATEs, the per-row pair for the multi-row UPDATE, and the
// table-wide pair of the guarded scenario, measured again beside them.
var rowsTables = []struct {
	name    string
	create  string // CREATE TABLE with %s for the name
	rows    int
	protect string // "rows", "table" or "" (unprotected)
}{
	{"bench_rows_guarded", benchWriteTable, rowsSingle, "rows"},
	{"bench_rows_unguarded", benchWriteTable, rowsSingle, ""},
	{"bench_rows_multi_guarded", benchRowsMultiTable, rowsMulti, "rows"},
	{"bench_rows_multi_unguarded", benchRowsMultiTable, rowsMulti, ""},
	{"bench_guarded", benchWriteTable, rowsSingle, "table"},
	{"bench_unguarded", benchWriteTable, rowsSingle, ""},
}

// rowsSetup creates the tables of the rows scenario on pool and protects
// the guarded ones.
func rowsSetup(ctx context.Context, pool *pgxpool.Pool) error {
	for _, t := range rowsTables {
		if _, err := pool.Exec(ctx, fmt.Sprintf(t.create, t.name)); err != nil {
			return fmt.Errorf("rows setup: %w", err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(benchRowsRows, t.name), t.rows); err != nil {
			return fmt.Errorf("rows setup: %w", err)
		}
		var err error
		switch t.protect {
		case "rows":
			err = sqlfuncs.ProtectRows(ctx, pool, t.name, "id", rowsPrefix, "token")
		case "table":
			err = sqlfuncs.Protect(ctx, pool, t.name, guardResource, "token")
		}
		if err != nil {
			return err
		}
	}
	names := make([]string, len(rowsTables))
	for i, t := range rowsTables {
		names[i] = t.name
	}
	_, err := pool.Exec(ctx, fmt.Sprintf(benchVacuum, strings.Join(names, ", ")))
	return err
}

// grantRows grants the leases of resources rowsPrefix1..rowsPrefixN through
// fence.acquire, grantBatch to a transaction (a batch keeps the advisory
// lock of each of its grants until it commits), and returns the tokens:
// tokens[i] is the token of row i+1.
func grantRows(ctx context.Context, pool *pgxpool.Pool, n int) ([]int64, error) {
	tokens := make([]int64, 0, n)
	for first := 1; first <= n; first += grantBatch {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for id := first; id < first+grantBatch && id <= n; id++ {
				tok, ok, err := sqlfuncs.Acquire(ctx, tx, rowsPrefix+strconv.Itoa(id), "pgfence-bench-rows", rowsTTL)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("resource %s%d is held: the bench database should be new", rowsPrefix, id)
				}
				tokens = append(tokens, tok)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("granting the per-row leases: %w", err)
		}
	}
	return tokens, nil
}

// rowsSingleUpdate is the single-row UPDATE of table by clients clients,
// client i writing row i+1 with the token of that row's own lease.
func rowsSingleUpdate(name, table string, clients int, pool *pgxpool.Pool, tokens []int64) workload {
	sql := fmt.Sprintf(benchWriteUpdate, table)
	return workload{name: name, clients: clients, worker: func(_ context.Context, id int) (func(context.Context) error, func(), error) {
		return func(ctx context.Context) error {
			_, err := pool.Exec(ctx, sql, id+1, tokens[id])
			return err
		}, nil, nil
	}}
}

// rowsMultiUpdate is one UPDATE of rows 1..len(tokens) of table, each row
// presenting its own token, by one client.
func rowsMultiUpdate(name, table string, pool *pgxpool.Pool, ids []int32, tokens []int64) workload {
	sql := fmt.Sprintf(benchRowsUpdate, table)
	return workload{name: name, clients: 1, worker: func(context.Context, int) (func(context.Context) error, func(), error) {
		return func(ctx context.Context) error {
			tag, err := pool.Exec(ctx, sql, ids, tokens)
			if err == nil && tag.RowsAffected() != int64(len(ids)) {
				err = fmt.Errorf("the UPDATE wrote %d rows, not %d", tag.RowsAffected(), len(ids))
			}
			return err
		}, nil, nil
	}}
}

func (b *bench) rowsScenario(ctx context.Context, s *ScenarioResult) error {
	c := b.midClients()
	pool, _, err := b.createDB(ctx, "_rows", int32(c+4), nil)
	if err != nil {
		return err
	}
	defer b.closePool(pool)
	off, _, err := b.openPool(ctx, b.prefix+"_rows", int32(c+4), map[string]string{"synchronous_commit": "off"})
	if err != nil {
		return err
	}
	defer b.closePool(off)
	if err := rowsSetup(ctx, pool); err != nil {
		return err
	}
	client, err := gofence.New(pool, &gofence.Config{Holder: "pgfence-bench-rows", Logger: b.log})
	if err != nil {
		return err
	}
	defer closeClient(client)
	l, err := client.Acquire(ctx, guardResource, nil)
	if err != nil {
		return err
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()

	start := time.Now()
	tokens, err := grantRows(ctx, pool, rowsMulti)
	if err != nil {
		return err
	}
	s.fact(fmt.Sprintf("time to grant the %d per-row leases", rowsMulti), time.Since(start).Seconds(),
		fmt.Sprintf("s (%d grants per transaction)", grantBatch))
	ids := make([]int32, rowsMulti)
	for i := range ids {
		ids[i] = int32(i + 1)
	}

	var pairs []pair
	for _, m := range []struct {
		label string
		pool  *pgxpool.Pool
	}{{"on", pool}, {"off", off}} {
		label := ", synchronous_commit=" + m.label
		upd, plainUpd, _, _ := guardedWrites(c, m.pool, l, label)
		pairs = append(pairs,
			pair{key: cmpKey{what: cmpGuardedUpdate, clients: c, commit: m.label},
				name: "table-wide guarded UPDATE vs plain UPDATE" + label, a: upd, b: plainUpd},
			pair{key: cmpKey{what: cmpRowUpdate, clients: c, commit: m.label},
				name: "per-row guarded UPDATE vs plain UPDATE" + label,
				a:    rowsSingleUpdate("UPDATE protected per row (own row's lease, token column)"+label, "bench_rows_guarded", c, m.pool, tokens),
				b:    rowsSingleUpdate("UPDATE unprotected"+label, "bench_rows_unguarded", c, m.pool, tokens)})
	}
	multi := cmpKey{what: cmpRowsMulti, clients: 1}
	pairs = append(pairs, pair{
		key:   multi,
		name:  fmt.Sprintf("%d-row UPDATE per-row guarded vs plain", rowsMulti),
		a:     rowsMultiUpdate(fmt.Sprintf("UPDATE of %d rows protected per row (a token per row)", rowsMulti), "bench_rows_multi_guarded", pool, ids, tokens),
		b:     rowsMultiUpdate(fmt.Sprintf("UPDATE of %d rows unprotected", rowsMulti), "bench_rows_multi_unguarded", pool, ids, tokens),
		slice: rowsMultiSlices * b.o.Duration,
	})
	cmps, err := b.interleave(ctx, pairs)
	s.Comparisons = cmps
	if err != nil {
		return err
	}
	for _, m := range []string{"on", "off"} {
		wide := s.comparison(cmpKey{what: cmpGuardedUpdate, clients: c, commit: m})
		rows := s.comparison(cmpKey{what: cmpRowUpdate, clients: c, commit: m})
		s.relative(fmt.Sprintf("per-row guarded UPDATE/plain, synchronous_commit=%s (table-wide ratio of this run - 0.05)", m),
			rows.Ratio.Median, wide.Ratio.Median, -0.05)
	}
	s.atLeast(fmt.Sprintf("%d-row UPDATE per-row guarded/plain", rowsMulti), s.comparison(multi).Ratio.Median, 0.5)
	s.Notes = append(s.Notes,
		fmt.Sprintf("single-row: %d clients, each updating its own row; per row under that row's own lease (resource %s<id>), table-wide under one lease on %q", c, rowsPrefix, guardResource),
		fmt.Sprintf("multi-row: one client, UPDATE ... FROM unnest(ids, tokens) of rows 1..%d, each of its own leased resource; slices of %s (%d x --duration); synchronous_commit as the server", rowsMulti, rowsMultiSlices*b.o.Duration, rowsMultiSlices))
	return b.rowsExplain(ctx, pool, ids, tokens, s)
}

// explainResult is what the bench reads from EXPLAIN (ANALYZE, FORMAT JSON).
type explainResult struct {
	ExecutionTime float64 `json:"Execution Time"`
	Triggers      []struct {
		Name     string  `json:"Trigger Name"`
		Relation string  `json:"Relation"`
		Time     float64 `json:"Time"`
		Calls    int64   `json:"Calls"`
	} `json:"Triggers"`
}

// explainRows runs EXPLAIN ANALYZE of the multi-row UPDATE of table in a
// transaction that it rolls back.
func explainRows(ctx context.Context, pool *pgxpool.Pool, table string, ids []int32, tokens []int64) (explainResult, error) {
	var out []explainResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var doc []byte
		if err := tx.QueryRow(ctx, benchExplain+fmt.Sprintf(benchRowsUpdate, table), ids, tokens).Scan(&doc); err != nil {
			return err
		}
		if err := json.Unmarshal(doc, &out); err != nil {
			return fmt.Errorf("reading EXPLAIN: %w", err)
		}
		return errRollback
	})
	if err != nil && !errors.Is(err, errRollback) {
		return explainResult{}, err
	}
	if len(out) != 1 {
		return explainResult{}, fmt.Errorf("EXPLAIN gave %d plans, not 1", len(out))
	}
	return out[0], nil
}

// errRollback makes pgx.BeginFunc roll back a transaction that succeeded.
var errRollback = errors.New("rolled back on purpose")

// rowsExplain reports where the multi-row UPDATE spends its time: the
// median over --rounds runs of EXPLAIN ANALYZE (in transactions rolled
// back) of the guarded and the plain statement, and of each guard trigger.
// Execution time covers the statement and its triggers, not the commit.
func (b *bench) rowsExplain(ctx context.Context, pool *pgxpool.Pool, ids []int32, tokens []int64, s *ScenarioResult) error {
	var guarded, plain []float64
	triggers := map[string][]float64{}
	calls := map[string]int64{}
	var order []string
	for range b.o.Rounds {
		p, err := explainRows(ctx, pool, "bench_rows_multi_unguarded", ids, tokens)
		if err != nil {
			return fmt.Errorf("EXPLAIN ANALYZE of the plain %d-row UPDATE: %w", rowsMulti, err)
		}
		g, err := explainRows(ctx, pool, "bench_rows_multi_guarded", ids, tokens)
		if err != nil {
			return fmt.Errorf("EXPLAIN ANALYZE of the guarded %d-row UPDATE: %w", rowsMulti, err)
		}
		plain, guarded = append(plain, p.ExecutionTime), append(guarded, g.ExecutionTime)
		for _, t := range g.Triggers {
			if _, ok := triggers[t.Name]; !ok {
				order = append(order, t.Name)
			}
			triggers[t.Name] = append(triggers[t.Name], t.Time)
			calls[t.Name] = t.Calls
		}
	}
	med := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return math.Round(median(v)*1000) / 1000
	}
	s.fact(fmt.Sprintf("EXPLAIN ANALYZE %d-row UPDATE, plain: execution time", rowsMulti), med(plain), "ms")
	s.fact(fmt.Sprintf("EXPLAIN ANALYZE %d-row UPDATE, guarded: execution time", rowsMulti), med(guarded), "ms")
	for _, name := range order {
		s.fact("  of which trigger "+name, med(triggers[name]), fmt.Sprintf("ms (%d calls)", calls[name]))
	}
	s.Notes = append(s.Notes, fmt.Sprintf("EXPLAIN ANALYZE: median of %d runs each, in transactions rolled back; execution time includes the triggers, not the commit", b.o.Rounds))
	return nil
}
