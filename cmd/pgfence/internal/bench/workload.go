package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// errHeld marks an operation that found its random resource held by another
// client: neither a success nor an error, and not counted.
var errHeld = errors.New("held")

// workload is one side of a comparison: clients goroutines, each running op
// in a loop for the length of a slice.
type workload struct {
	name    string
	clients int
	// worker prepares the state of one client (id 0..clients-1) and returns
	// its operation and what to run when the slice ends (may be nil).
	worker func(ctx context.Context, id int) (op func(context.Context) error, done func(), err error)
}

// sliceResult is what one slice of a workload did.
type sliceResult struct {
	ops, errs, held int64
	firstErr        error
	elapsed         time.Duration
}

func (r sliceResult) perSec() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// run runs w for d: every client loops until the deadline. A failed worker
// setup fails the slice.
func (w workload) run(ctx context.Context, d time.Duration) (sliceResult, error) {
	ops := make([]func(context.Context) error, w.clients)
	var dones []func()
	defer func() {
		for _, f := range dones {
			f()
		}
	}()
	for i := range ops {
		op, done, err := w.worker(ctx, i)
		if err != nil {
			return sliceResult{}, fmt.Errorf("%s: preparing client %d: %w", w.name, i, err)
		}
		ops[i] = op
		if done != nil {
			dones = append(dones, done)
		}
	}
	var (
		res   sliceResult
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = time.Now()
	)
	deadline := start.Add(d)
	for _, op := range ops {
		wg.Go(func() {
			var n, e, h int64
			var first error
			for time.Now().Before(deadline) && ctx.Err() == nil {
				switch err := op(ctx); {
				case err == nil:
					n++
				case errors.Is(err, errHeld):
					h++
				default:
					if ctx.Err() != nil {
						break
					}
					e++
					if first == nil {
						first = err
					}
				}
			}
			mu.Lock()
			res.ops += n
			res.errs += e
			res.held += h
			if res.firstErr == nil {
				res.firstErr = first
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res, ctx.Err()
}

// pair is a comparison of workload a (ours) against b (the baseline).
type pair struct {
	key  cmpKey
	name string
	a, b workload
	// slice is the length of this pair's slices; 0 for --duration. A pair
	// whose one operation takes a good part of --duration needs longer
	// slices to complete more than one or two operations per slice.
	slice time.Duration
}

// sliceLen is the length of p's slices under options o.
func (p pair) sliceLen(o Options) time.Duration {
	if p.slice > 0 {
		return p.slice
	}
	return o.Duration
}

// cmpKey names a comparison for the code that reads it (targets, charts):
// what it compares, at how many clients, and under which synchronous_commit
// ("" where the server's setting holds).
type cmpKey struct {
	what    string
	clients int
	commit  string
}

// What a comparison compares (cmpKey.what).
const (
	cmpGrant         = "grant"          // gofence Acquire+Release vs the hand-written upsert+update
	cmpAdvisory      = "advisory"       // pg_try_advisory_lock+unlock vs the hand-written upsert+update
	cmpGuardedUpdate = "guarded-update" // UPDATE of the table-wide protected table (token column) vs unprotected
	cmpUseTokenTx    = "use-token-tx"   // Lease.Tx (use_token) + UPDATE vs a plain transaction
	cmpRowUpdate     = "row-update"     // single-row UPDATE protected per row vs unprotected
	cmpRowsMulti     = "rows-multi"     // one UPDATE of rowsMulti rows protected per row vs unprotected
	cmpScale         = "scale"          // grant at BigResources vs at scaleSmall resources
)

// comparison is s's comparison named key. A scenario looks up only the keys
// of the pairs it ran, and interleave returns every pair when it succeeds:
// a missing key is a bug of the bench, and panics.
func (s *ScenarioResult) comparison(key cmpKey) *Comparison {
	for _, c := range s.Comparisons {
		if c.key == key {
			return c
		}
	}
	panic(fmt.Sprintf("bench: scenario %s has no comparison %+v", s.Name, key))
}

// interleave runs every pair's A and B slices alternately (A B A B ...), one
// short unrecorded warm-up round first (connections, prepared statements,
// caches), then rounds recorded ones, and summarises throughput and ratio
// A/B per pair.
func (b *bench) interleave(ctx context.Context, pairs []pair) ([]*Comparison, error) {
	for _, p := range pairs {
		warm := max(p.sliceLen(b.o)/4, 20*time.Millisecond)
		for _, w := range []workload{p.a, p.b} {
			if _, err := w.run(ctx, warm); err != nil {
				return nil, err
			}
		}
	}
	out := make([]*Comparison, len(pairs))
	aOps := make([][]float64, len(pairs))
	bOps := make([][]float64, len(pairs))
	for i, p := range pairs {
		out[i] = &Comparison{key: p.key, Name: p.name, A: p.a.name, B: p.b.name, Clients: p.a.clients}
	}
	for range b.o.Rounds {
		for i, p := range pairs {
			c := out[i]
			for side, w := range []workload{p.a, p.b} {
				r, err := w.run(ctx, p.sliceLen(b.o))
				if err != nil {
					return out, err
				}
				c.Errors += r.errs
				c.Held += r.held
				if r.firstErr != nil && c.FirstError == "" {
					c.FirstError = oneLine(r.firstErr)
				}
				if side == 0 {
					aOps[i] = append(aOps[i], r.perSec())
				} else {
					bOps[i] = append(bOps[i], r.perSec())
				}
			}
		}
	}
	for i, c := range out {
		ratios := make([]float64, len(aOps[i]))
		for r := range ratios {
			if bOps[i][r] > 0 {
				ratios[r] = aOps[i][r] / bOps[i][r]
			}
		}
		c.AOps, c.BOps, c.Ratio = summarize(aOps[i]), summarize(bOps[i]), summarize(ratios)
	}
	return out, nil
}

func summarize(v []float64) Summary {
	if len(v) == 0 {
		return Summary{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return Summary{Median: median(s), Min: s[0], Max: s[len(s)-1], Rounds: roundAll(v)}
}

// median of sorted values.
func median(s []float64) float64 {
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// quantile of sorted values (nearest rank).
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func roundAll(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Round(x*1000) / 1000
	}
	return out
}

func latencies(name string, samples []time.Duration) Latency {
	ms := make([]float64, len(samples))
	for i, d := range samples {
		ms[i] = float64(d.Microseconds()) / 1000
	}
	slices.Sort(ms)
	l := Latency{Name: name, N: len(ms), Samples: ms}
	if len(ms) > 0 {
		l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs = quantile(ms, 0.5), quantile(ms, 0.9), quantile(ms, 0.99), ms[len(ms)-1]
	}
	return l
}

// ---------------------------------------------------------------------------
// Counting round trips
// ---------------------------------------------------------------------------

// rtCounter counts, for every connection of a pool, the statements pgx sends
// (a QueryTracer) and the network round trips: a write to the socket that
// follows a read from it (or opens the conversation) starts a round trip,
// whatever it carries (a statement, a prepare, a BEGIN, a ping).
type rtCounter struct {
	trips      atomic.Int64
	statements atomic.Int64
}

func (c *rtCounter) instrument(cfg *pgx.ConnConfig) {
	dial := cfg.DialFunc
	if dial == nil {
		d := &net.Dialer{KeepAlive: 5 * time.Minute}
		dial = d.DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &countingConn{Conn: conn, c: c}
		cc.readLast.Store(true)
		return cc, nil
	}
	cfg.Tracer = c
}

func (c *rtCounter) snapshot() (trips, statements int64) {
	return c.trips.Load(), c.statements.Load()
}

// TraceQueryStart counts a statement.
func (c *rtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	return ctx
}

// TraceQueryEnd does nothing.
func (c *rtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type countingConn struct {
	net.Conn
	c        *rtCounter
	readLast atomic.Bool
}

func (cc *countingConn) Write(p []byte) (int, error) {
	if cc.readLast.Swap(false) {
		cc.c.trips.Add(1)
	}
	return cc.Conn.Write(p)
}

func (cc *countingConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	if n > 0 {
		cc.readLast.Store(true)
	}
	return n, err
}
