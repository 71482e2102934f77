// Package interleave runs every order of the steps of a few concurrent
// sessions against real PostgreSQL, the way PostgreSQL's own isolation
// tester (src/test/isolation) runs its permutations, and checks the
// fencing guarantees after each order.
//
// A [Spec] is data: sessions, each with a role and a list of [Step]s (SQL
// text, and a [Kind] that tells the engine what the step means for the
// guarantees: a grant, a transaction's end, a savepoint). [Run] enumerates
// every interleaving of the sessions' steps (each session's own steps stay
// in order), runs each one on one connection per session, and checks:
//
//   - guarantee 3 (linearizable fencing): no row written under a token T
//     of resource r was committed after a grant of a newer token of r
//     returned, when that grant committed;
//   - guarantee 1 (monotonic tokens): the committed grants of a resource
//     returned strictly increasing tokens, each above the tokens of the
//     order's setup, and the final lease row carries the last of them.
//
// A step is sent asynchronously; while it has not returned, the engine asks
// pg_blocking_pids() about its backend, as the isolation tester does. A
// step that waits on a lock leaves its session blocked and the order goes
// on with the next step of another session; a blocked step that returns
// later is recorded when it does. An order whose next step belongs to a
// blocked session cannot be run as written: it is pruned, and every later
// order with the same prefix with it. Orders that differ only in where a
// session's first step, BEGIN, stands (BEGIN takes no snapshot, no lock and
// no transaction id: it commutes with every step of another session) are
// run once.
//
// Between orders the database is reset (every session rolled back,
// prepared transactions rolled back, then the target's Reset statements),
// instead of cloned: a clone costs 0.1-0.5 s, a reset a few milliseconds.
//
// The package imports nothing but pgx, like the harness it belongs to.
package interleave

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Kind says what a step means to the engine's bookkeeping. The SQL of a
// step is always sent as written (after its references are filled in).
type Kind int

// The kinds of step.
const (
	// SQL is any statement with no meaning to the bookkeeping (a write, a
	// check, a row lock, a read).
	SQL Kind = iota
	// Begin starts a new transaction of its session; the engine names the
	// transaction ({tx} in later steps of the session).
	Begin
	// Grant returns a token of Step.Resource (fence.acquire, fence.revoke)
	// in its first column; Step.Save names it for later steps.
	Grant
	// Commit ends the session's transaction (COMMIT, END); it committed
	// when the server answers with the COMMIT tag.
	Commit
	// Rollback ends the session's transaction without committing.
	Rollback
	// Prepare runs PREPARE TRANSACTION '{gid}': the transaction is no
	// longer the session's, and commits with a CommitPrepared step.
	Prepare
	// CommitPrepared runs COMMIT PREPARED '{gid:S}' for the transaction
	// session S prepared last (Step.Of names S).
	CommitPrepared
	// Savepoint, ReleaseSavepoint and RollbackTo run SAVEPOINT,
	// RELEASE SAVEPOINT and ROLLBACK TO SAVEPOINT Step.Savepoint; a
	// rollback to a savepoint takes back the grants made since.
	Savepoint
	ReleaseSavepoint
	RollbackTo
)

// Step is one statement of a session.
//
// SQL may refer to saved tokens as {NAME} (NULL when the grant that was to
// save NAME returned NULL or failed), to the session's current transaction
// as {tx} (a name unique in the order, which writes store so that the
// check can tell which transaction wrote a row), to the session's next
// prepared transaction as {gid}, and to the one session S prepared last as
// {gid:S}.
type Step struct {
	// Name labels the step in an order's description ("A:check").
	Name string
	// SQL is what the session sends, in the simple protocol (one or more
	// statements).
	SQL string
	// Kind tells the engine what the step means; SQL by default.
	Kind Kind
	// Resource is the resource a Grant step grants.
	Resource string
	// Save names the token a Grant step returns, for {NAME} references.
	Save string
	// Savepoint names the savepoint of a Savepoint, ReleaseSavepoint or
	// RollbackTo step.
	Savepoint string
	// Of names the session whose prepared transaction a CommitPrepared
	// step commits.
	Of string
}

// Session is one connection of a spec and its steps, in order.
type Session struct {
	// Name is a short label, unique in the spec ("A").
	Name string
	// Role picks the connection URL from Target.URLs.
	Role string
	// Steps run in this order, interleaved with the other sessions'.
	Steps []Step
}

// Spec is one scenario: its sessions, and the tokens the order starts
// with.
type Spec struct {
	// Name identifies the spec in reports.
	Name string
	// Family groups specs in the counts printed.
	Family string
	// Sessions are the concurrent sessions (two or three).
	Sessions []Session
	// Setup, when set, replaces Target.Setup for this spec.
	Setup string
}

// Target is the database the orders run in, and how to read it.
type Target struct {
	// URLs maps a Session.Role to a connection URL.
	URLs map[string]string
	// Admin is a superuser URL of the same database: the monitor that
	// polls pg_blocking_pids, resets the database and reads the results.
	Admin string
	// Reset runs on Admin before every order, after every session was
	// rolled back and every prepared transaction of the database rolled
	// back: it empties the tables and the lease rows.
	Reset string
	// Setup runs on Admin after Reset (both in one round trip) and returns
	// rows of (name, resource, token): the tokens every order starts with
	// (granted and committed), saved under name.
	Setup string
	// Rows returns (resource, token, tx) for every row the sessions wrote
	// that is in the tables at the end of an order: tx is the {tx} the
	// writing step stored.
	Rows string
	// Leases returns (resource, token) of every lease row at the end of
	// an order (sent with Rows in one round trip).
	Leases string
	// StepTimeout bounds each step and the wait of a blocked one
	// (default 20 s).
	StepTimeout time.Duration
	// Every runs only every Every-th order that enumeration keeps (1 or
	// 0: all of them), for a quick run.
	Every int
}

// Stats counts the orders of a spec.
type Stats struct {
	// Enumerated is the number of interleavings of the sessions' steps.
	Enumerated int
	// Commuted is how many of them only moved a BEGIN and were not run.
	Commuted int
	// Pruned is how many needed a blocked session to go on.
	Pruned int
	// Sampled is how many were left out by Target.Every.
	Sampled int
	// Run is how many ran to the end and were checked.
	Run int
	// Failed is how many of those broke a guarantee.
	Failed int
}

// Add adds the counts of o to s.
func (s *Stats) Add(o Stats) {
	s.Enumerated += o.Enumerated
	s.Commuted += o.Commuted
	s.Pruned += o.Pruned
	s.Sampled += o.Sampled
	s.Run += o.Run
	s.Failed += o.Failed
}

// Failure is one order that broke a guarantee.
type Failure struct {
	// Spec is the spec's name.
	Spec string
	// Order lists the steps as they ran ("B:begin_rr A:release ...").
	Order string
	// Report says what each step returned, which guarantee broke, and the
	// rows and leases the order left.
	Report string
}

// debug, set by PGFENCE_IL_DEBUG=1, prints every order run, its time and
// its steps' results.
var debug = os.Getenv("PGFENCE_IL_DEBUG") == "1"

// ref is one position of an order: session index and step index.
type ref struct{ s, i int }

// Runner runs specs on one target: it holds the sessions' connections and
// the monitor, reused across orders and specs.
type Runner struct {
	t       Target
	monitor *pgx.Conn
	dbname  string
	seq     int // gid sequence
}

// NewRunner connects the monitor. Session connections are opened as
// specs need them (one per session of a spec, by role).
func NewRunner(ctx context.Context, t Target) (*Runner, error) {
	if t.StepTimeout == 0 {
		t.StepTimeout = 20 * time.Second
	}
	m, err := pgx.Connect(ctx, t.Admin)
	if err != nil {
		return nil, fmt.Errorf("interleave: monitor: %w", err)
	}
	r := &Runner{t: t, monitor: m}
	if err := m.QueryRow(ctx, `SELECT current_database()`).Scan(&r.dbname); err != nil {
		_ = m.Close(ctx)
		return nil, fmt.Errorf("interleave: monitor: %w", err)
	}
	return r, nil
}

// Close closes every connection of the runner.
func (r *Runner) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = r.monitor.Close(ctx)
}

// session is a spec's session during an order.
type session struct {
	spec    *Session
	conn    *pgx.Conn
	pid     uint32
	next    int          // next step to send
	waiting *pending     // the step in flight, when it blocked
	txn     int          // transactions begun
	inTx    bool         // a Begin step ran and its transaction has not ended
	tx      string       // current transaction's name
	gid     string       // last prepared transaction's gid
	sps     []savepoint  // open savepoints
	grants  []*grantInfo // grants of the current transaction
}

type savepoint struct {
	name   string
	grants int
}

type grantInfo struct {
	resource string
	token    int64
	returned int // event index
	tx       string
	live     bool // not rolled back to a savepoint
}

// pending is a step in flight.
type pending struct {
	step  ref
	sql   string
	done  chan result
	early *result // the result, when blocked() received it
	grant bool    // a Grant step, which may wait in pg_sleep
	auto  bool    // sent outside a transaction block: commits on success
}

// poll returns p's result when it is there.
func (p *pending) poll() (result, bool) {
	if p.early != nil {
		res := *p.early
		p.early = nil
		return res, true
	}
	select {
	case res := <-p.done:
		return res, true
	default:
		return result{}, false
	}
}

type result struct {
	tag  string
	rows [][]string // last result's rows, NULL as "\x00NULL"
	err  error
}

const null = "\x00NULL"

// outcome is what one order produced.
type outcome struct {
	order    []ref
	lines    []string
	events   int
	grants   []*grantInfo
	commits  map[string]int // tx -> event index of its commit
	pruned   int            // prefix length at which the order was pruned; 0: ran
	setupTok map[string]int64
	setupRes map[string]string
	prepared map[string]string // session -> {tx} of the transaction it prepared last
}

// Run runs every order of spec and returns its counts and failures. An
// error means the engine could not run an order (a step timed out, a
// connection broke), not that a guarantee broke.
func (r *Runner) Run(ctx context.Context, spec Spec) (Stats, []Failure, error) {
	var st Stats
	var fails []Failure
	sess := make([]*session, len(spec.Sessions))
	for i := range spec.Sessions {
		s := &spec.Sessions[i]
		url, ok := r.t.URLs[s.Role]
		if !ok {
			return st, nil, fmt.Errorf("interleave: spec %s: no URL for role %q", spec.Name, s.Role)
		}
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return st, nil, fmt.Errorf("interleave: spec %s: connect session %s: %w", spec.Name, s.Name, err)
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Close(cctx)
		}()
		sess[i] = &session{spec: s, conn: c, pid: c.PgConn().PID()}
	}
	var dead []ref // prefix that needed a blocked session
	sampled := 0
	var runErr error
	enumerate(spec, func(order []ref, commuted bool) bool {
		st.Enumerated++
		if commuted {
			st.Commuted++
			return true
		}
		if dead != nil && hasPrefix(order, dead) {
			st.Pruned++
			return true
		}
		sampled++
		if r.t.Every > 1 && (sampled-1)%r.t.Every != 0 {
			st.Sampled++
			return true
		}
		t0 := time.Now()
		out, err := r.runOrder(ctx, spec, sess, order)
		if debug {
			fmt.Printf("interleave: %s: %s: %s\n", spec.Name, time.Since(t0), describe(spec, order))
			if out != nil {
				fmt.Printf("    %s\n", strings.Join(out.lines, "\n    "))
			}
		}
		if err != nil {
			runErr = fmt.Errorf("interleave: spec %s, order %s: %w", spec.Name, describe(spec, order), err)
			return false
		}
		if out.pruned > 0 {
			dead = append([]ref(nil), order[:out.pruned]...)
			st.Pruned++
			return true
		}
		dead = nil
		st.Run++
		if rep, bad, err := r.check(ctx, out); err != nil {
			runErr = fmt.Errorf("interleave: spec %s, order %s: check: %w", spec.Name, describe(spec, order), err)
			return false
		} else if bad {
			st.Failed++
			fails = append(fails, Failure{Spec: spec.Name, Order: describe(spec, order), Report: rep})
		}
		return true
	})
	// Leave nothing behind: a prepared transaction outlives its session
	// and keeps the database from being dropped.
	if err := r.reset(ctx, spec, sess); err != nil && runErr == nil {
		runErr = fmt.Errorf("interleave: spec %s: %w", spec.Name, err)
	}
	return st, fails, runErr
}

func hasPrefix(order, prefix []ref) bool {
	if len(order) < len(prefix) {
		return false
	}
	for i := range prefix {
		if order[i] != prefix[i] {
			return false
		}
	}
	return true
}

// describe spells an order as "A:step B:step ...".
func describe(spec Spec, order []ref) string {
	parts := make([]string, len(order))
	for k, x := range order {
		s := &spec.Sessions[x.s]
		parts[k] = s.Name + ":" + s.Steps[x.i].Name
	}
	return strings.Join(parts, " ")
}

// enumerate calls visit with every interleaving of the sessions' steps, in
// lexicographic order of session indexes, and says whether the order only
// differs from an earlier kept one by where a BEGIN stands: kept is the
// order in which no BEGIN directly follows a step of a session with a
// higher index (moving it before that step gives the same execution, and
// the lexicographically least order of each such class has no such pair).
// visit returns false to stop.
func enumerate(spec Spec, visit func(order []ref, commuted bool) bool) {
	n := len(spec.Sessions)
	next := make([]int, n)
	total := 0
	for _, s := range spec.Sessions {
		total += len(s.Steps)
	}
	order := make([]ref, 0, total)
	var rec func() bool
	rec = func() bool {
		if len(order) == total {
			return visit(order, commutedOrder(spec, order))
		}
		for s := 0; s < n; s++ {
			if next[s] >= len(spec.Sessions[s].Steps) {
				continue
			}
			order = append(order, ref{s, next[s]})
			next[s]++
			ok := rec()
			next[s]--
			order = order[:len(order)-1]
			if !ok {
				return false
			}
		}
		return true
	}
	rec()
}

func commutedOrder(spec Spec, order []ref) bool {
	for k := 1; k < len(order); k++ {
		a, b := order[k-1], order[k]
		if a.s <= b.s {
			continue
		}
		// b's session has a lower index and directly follows a: moving b
		// first gives the same execution when either step is a
		// session's opening BEGIN.
		if isOpening(spec, b) || isOpening(spec, a) {
			return true
		}
	}
	return false
}

func isOpening(spec Spec, x ref) bool {
	return x.i == 0 && spec.Sessions[x.s].Steps[0].Kind == Begin
}

// runOrder resets the database, runs order, and returns what happened.
func (r *Runner) runOrder(ctx context.Context, spec Spec, sess []*session, order []ref) (*outcome, error) {
	out := &outcome{order: order, commits: map[string]int{}, setupTok: map[string]int64{}, setupRes: map[string]string{}, prepared: map[string]string{}}
	vars := map[string]string{}
	if err := r.reset(ctx, spec, sess); err != nil {
		return nil, err
	}
	setup := r.t.Setup
	if spec.Setup != "" {
		setup = spec.Setup
	}
	rs, err := r.monitor.PgConn().Exec(ctx, r.t.Reset+";\n"+setup).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reset and setup: %w", err)
	}
	for _, row := range rs[len(rs)-1].Rows {
		if len(row) != 3 {
			return nil, fmt.Errorf("setup: %d columns, want (name, resource, token)", len(row))
		}
		tok, err := strconv.ParseInt(string(row[2]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("setup: token %q: %w", row[2], err)
		}
		vars[string(row[0])] = string(row[2])
		out.setupTok[string(row[0])] = tok
		out.setupRes[string(row[0])] = string(row[1])
	}
	for _, s := range sess {
		s.next, s.waiting, s.txn, s.tx, s.gid, s.sps, s.grants, s.inTx = 0, nil, 0, "", "", nil, nil, false
	}
	for k, x := range order {
		s := sess[x.s]
		if s.waiting != nil {
			out.pruned = k + 1
			return out, r.finish(ctx, spec, sess, out)
		}
		p := r.send(ctx, sess, s, x, vars)
		if err := r.await(ctx, spec, sess, s, p, vars, out); err != nil {
			return nil, err
		}
		if err := r.settle(ctx, spec, sess, vars, out); err != nil {
			return nil, err
		}
	}
	return out, r.finish(ctx, spec, sess, out)
}

// finish waits for the steps still blocked (a deadlock is broken by the
// server; one blocked for good, on a prepared transaction, is cancelled)
// and ends whatever the sessions left open.
func (r *Runner) finish(ctx context.Context, spec Spec, sess []*session, out *outcome) error {
	deadline := time.Now().Add(r.t.StepTimeout)
	for {
		any := false
		for _, s := range sess {
			if s.waiting == nil {
				continue
			}
			any = true
			if res, ok := s.waiting.poll(); ok {
				r.record(spec, s, s.waiting, res, nil, out)
				s.waiting = nil
				continue
			}
			select {
			case res := <-s.waiting.done:
				r.record(spec, s, s.waiting, res, nil, out)
				s.waiting = nil
			case <-time.After(2 * time.Millisecond):
			}
		}
		if !any {
			return nil
		}
		if out.pruned > 0 || time.Now().After(deadline) || r.stuck(ctx, sess) {
			for _, s := range sess {
				if s.waiting == nil {
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_ = s.conn.PgConn().CancelRequest(cctx)
				cancel()
				select {
				case res := <-s.waiting.done:
					if out.pruned == 0 {
						r.record(spec, s, s.waiting, res, nil, out)
						out.lines[len(out.lines)-1] += " (cancelled: blocked at the end of the order)"
					}
				case <-time.After(r.t.StepTimeout):
					return fmt.Errorf("session %s: step did not end after a cancel", s.spec.Name)
				}
				s.waiting = nil
			}
			return nil
		}
	}
}

// stuck says whether no blocked session waits on another blocked one:
// then nothing will move any more (every step of the order was sent; a
// blocker is idle, a prepared transaction, which pg_blocking_pids reports
// as pid 0, or outside the order), where a cycle of waits is a deadlock
// that the server breaks.
func (r *Runner) stuck(ctx context.Context, sess []*session) bool {
	var waiting []int32
	for _, s := range sess {
		if s.waiting != nil {
			waiting = append(waiting, int32(s.pid))
		}
	}
	var n int
	err := r.monitor.QueryRow(ctx, `SELECT count(*) FROM unnest($1::int[]) w(pid)
		WHERE EXISTS (SELECT 1 FROM unnest(pg_blocking_pids(w.pid)) b(pid) WHERE b.pid = ANY($1::int[]))`, waiting).Scan(&n)
	return err == nil && n == 0
}

// reset rolls back every session of the spec and every prepared transaction
// of the database.
func (r *Runner) reset(ctx context.Context, spec Spec, sess []*session) error {
	prepares := false
	for _, s := range sess {
		for _, st := range s.spec.Steps {
			prepares = prepares || st.Kind == Prepare
		}
		if s.conn.PgConn().TxStatus() == 'I' {
			continue
		}
		// A second try: the cancel of a step that returned meanwhile
		// can reach the server late, and cancel this ROLLBACK instead.
		if _, err := s.conn.PgConn().Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
			if _, err := s.conn.PgConn().Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
				return fmt.Errorf("reset session %s: %w", s.spec.Name, err)
			}
		}
	}
	if !prepares {
		return nil
	}
	rows, err := r.monitor.Query(ctx, `SELECT gid FROM pg_prepared_xacts WHERE database = current_database()`)
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	for _, g := range gids {
		if _, err := r.monitor.Exec(ctx, "ROLLBACK PREPARED "+quote(g)); err != nil {
			return fmt.Errorf("reset: %w", err)
		}
	}
	return nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// fill replaces the references of a step's SQL.
func (r *Runner) fill(s *session, st *Step, vars map[string]string, sess []*session) string {
	sql := st.SQL
	if st.Kind == Prepare {
		r.seq++
		s.gid = fmt.Sprintf("%s_%s_%d", r.dbname, s.spec.Name, r.seq)
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(sql, '{')
		if i < 0 {
			b.WriteString(sql)
			break
		}
		j := strings.IndexByte(sql[i:], '}')
		if j < 0 {
			b.WriteString(sql)
			break
		}
		b.WriteString(sql[:i])
		name := sql[i+1 : i+j]
		switch {
		case name == "tx":
			b.WriteString(quote(s.tx))
		case name == "gid":
			b.WriteString(quote(s.gid))
		case strings.HasPrefix(name, "gid:"):
			g := ""
			for _, o := range sess {
				if o.spec.Name == name[4:] {
					g = o.gid
				}
			}
			b.WriteString(quote(g))
		default:
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString("NULL")
			}
		}
		sql = sql[i+j+1:]
	}
	return b.String()
}

// send starts step x of s.
func (r *Runner) send(ctx context.Context, sess []*session, s *session, x ref, vars map[string]string) *pending {
	st := &s.spec.Steps[x.i]
	p := &pending{step: x, done: make(chan result, 1), grant: st.Kind == Grant}
	switch {
	case st.Kind == Begin:
		s.txn++
		s.tx = fmt.Sprintf("%s%d", s.spec.Name, s.txn)
		s.sps, s.grants = nil, nil
		s.inTx = true
	case !s.inTx && st.Kind != CommitPrepared:
		// Outside a transaction block the statement is a transaction
		// of its own, committed when it returns without an error.
		s.txn++
		s.tx = fmt.Sprintf("%s%d", s.spec.Name, s.txn)
		s.sps, s.grants = nil, nil
		p.auto = true
	}
	p.sql = r.fill(s, st, vars, sess)
	s.next++
	sctx, cancel := context.WithTimeout(ctx, r.t.StepTimeout)
	go func() {
		defer cancel()
		rs, err := s.conn.PgConn().Exec(sctx, p.sql).ReadAll()
		res := result{err: err}
		if len(rs) > 0 {
			last := rs[len(rs)-1]
			res.tag = last.CommandTag.String()
			for _, row := range last.Rows {
				cells := make([]string, len(row))
				for c, v := range row {
					if v == nil {
						cells[c] = null
					} else {
						cells[c] = string(v)
					}
				}
				res.rows = append(res.rows, cells)
			}
			if err == nil {
				for _, q := range rs {
					if q.Err != nil {
						res.err = q.Err
					}
				}
			}
		}
		p.done <- res
	}()
	return p
}

// await waits until p returns or blocks.
func (r *Runner) await(ctx context.Context, spec Spec, sess []*session, s *session, p *pending, vars map[string]string, out *outcome) error {
	deadline := time.Now().Add(r.t.StepTimeout)
	wait := time.Millisecond
	for {
		select {
		case res := <-p.done:
			r.record(spec, s, p, res, vars, out)
			return nil
		case <-time.After(wait):
		}
		if wait < 5*time.Millisecond {
			wait *= 2
		}
		blocked, err := r.blocked(ctx, s.pid, p)
		if err != nil {
			return err
		}
		if res, ok := p.poll(); ok {
			r.record(spec, s, p, res, vars, out)
			return nil
		}
		if blocked {
			s.waiting = p
			out.lines = append(out.lines, fmt.Sprintf("%s:%s blocks", s.spec.Name, s.spec.Steps[p.step.i].Name))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("session %s: step %s neither returned nor blocked within %s", s.spec.Name, s.spec.Steps[p.step.i].Name, r.t.StepTimeout)
		}
	}
}

// blocked says whether the step in flight on pid waits: on a lock (as
// pg_blocking_pids reports it, the isolation tester's test), or in
// pg_sleep, which is how fence._lock_lease waits for a row lock it tried
// with SKIP LOCKED. A sleep is only a wait when it is still one a few
// milliseconds later and p has not returned meanwhile: a grant whose
// blocker just ended sleeps once more before it returns.
func (r *Runner) blocked(ctx context.Context, pid uint32, p *pending) (bool, error) {
	q := `SELECT cardinality(pg_blocking_pids($1)) > 0, false`
	if p.grant {
		q = `SELECT cardinality(pg_blocking_pids($1)) > 0,
			EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep')`
	}
	for try := 0; ; try++ {
		var locked, sleeping bool
		if err := r.monitor.QueryRow(ctx, q, int32(pid)).Scan(&locked, &sleeping); err != nil {
			return false, fmt.Errorf("pg_blocking_pids: %w", err)
		}
		if locked || !sleeping {
			return locked, nil
		}
		if try == 2 {
			return true, nil
		}
		select {
		case res := <-p.done:
			p.early = &res
			return false, nil
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// settle records the blocked steps that returned, as the isolation tester
// does after each step: a waiting step that is no longer blocked is waited
// for until it returns or blocks again.
func (r *Runner) settle(ctx context.Context, spec Spec, sess []*session, vars map[string]string, out *outcome) error {
	for again := true; again; {
		again = false
		for _, s := range sess {
			p := s.waiting
			if p == nil {
				continue
			}
			deadline := time.Now().Add(r.t.StepTimeout)
			for s.waiting != nil {
				if res, ok := p.poll(); ok {
					s.waiting = nil
					r.record(spec, s, p, res, vars, out)
					again = true
					break
				}
				blocked, err := r.blocked(ctx, s.pid, p)
				if err != nil {
					return err
				}
				if p.early != nil {
					continue
				}
				if blocked {
					break
				}
				select {
				case res := <-p.done:
					s.waiting = nil
					r.record(spec, s, p, res, vars, out)
					again = true
				case <-time.After(time.Millisecond):
				}
				if s.waiting != nil && time.Now().After(deadline) {
					return fmt.Errorf("session %s: step %s neither returned nor blocked within %s", s.spec.Name, s.spec.Steps[p.step.i].Name, r.t.StepTimeout)
				}
			}
		}
	}
	return nil
}

// record books the result of a step that returned.
func (r *Runner) record(spec Spec, s *session, p *pending, res result, vars map[string]string, out *outcome) {
	st := &s.spec.Steps[p.step.i]
	out.events++
	ev := out.events
	line := fmt.Sprintf("%s:%s", s.spec.Name, st.Name)
	var pe *pgconn.PgError
	switch {
	case errors.As(res.err, &pe):
		line += fmt.Sprintf(" -> ERROR %s %s", pe.Code, firstLine(pe.Message))
	case res.err != nil:
		line += " -> ERROR " + res.err.Error()
	default:
		if len(res.rows) == 1 && len(res.rows[0]) == 1 {
			v := res.rows[0][0]
			if v == null {
				v = "NULL"
			}
			line += " -> " + v
		} else {
			line += " -> " + res.tag
		}
	}
	out.lines = append(out.lines, line)
	ok := res.err == nil
	defer func() {
		if p.auto {
			if ok {
				out.commits[s.tx] = ev
			}
			s.endTx(ok, out)
		}
	}()
	switch st.Kind {
	case Grant:
		if ok && len(res.rows) == 1 && len(res.rows[0]) >= 1 && res.rows[0][0] != null {
			tok, err := strconv.ParseInt(res.rows[0][0], 10, 64)
			if err == nil {
				g := &grantInfo{resource: st.Resource, token: tok, returned: ev, tx: s.tx, live: true}
				s.grants = append(s.grants, g)
				out.grants = append(out.grants, g)
				if st.Save != "" && vars != nil {
					vars[st.Save] = res.rows[0][0]
				}
			}
		}
	case Commit:
		if ok && res.tag == "COMMIT" {
			out.commits[s.tx] = ev
		}
		s.inTx = false
		s.endTx(ok && res.tag == "COMMIT", out)
	case Rollback:
		s.inTx = false
		s.endTx(false, out)
	case Prepare:
		s.inTx = false
		prepared := ok && res.tag == "PREPARE TRANSACTION"
		if !prepared {
			s.gid = ""
			s.endTx(false, out)
		} else {
			// The grants stay pending until COMMIT PREPARED commits
			// the transaction's {tx}.
			out.prepared[s.spec.Name] = s.tx
			s.grants, s.sps = nil, nil
		}
	case CommitPrepared:
		if tx, found := out.prepared[st.Of]; found && ok && res.tag == "COMMIT PREPARED" {
			out.commits[tx] = ev
		}
	case Savepoint:
		if ok {
			s.sps = append(s.sps, savepoint{name: st.Savepoint, grants: len(s.grants)})
		}
	case ReleaseSavepoint:
		if ok {
			for k := len(s.sps) - 1; k >= 0; k-- {
				if s.sps[k].name == st.Savepoint {
					s.sps = s.sps[:k]
					break
				}
			}
		}
	case RollbackTo:
		if ok {
			for k := len(s.sps) - 1; k >= 0; k-- {
				if s.sps[k].name == st.Savepoint {
					for _, g := range s.grants[s.sps[k].grants:] {
						g.live = false
					}
					s.grants = s.grants[:s.sps[k].grants]
					s.sps = s.sps[:k+1]
					break
				}
			}
		}
	}
}

func (s *session) endTx(committed bool, out *outcome) {
	if !committed {
		for _, g := range s.grants {
			g.live = false
		}
	}
	s.grants, s.sps = nil, nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// check reads the final rows and leases and checks guarantees 3 and 1.
func (r *Runner) check(ctx context.Context, out *outcome) (string, bool, error) {
	type row struct {
		res string
		tok int64
		tx  string
	}
	var rowsOut []row
	rs, err := r.monitor.PgConn().Exec(ctx, r.t.Rows+";\n"+r.t.Leases).ReadAll()
	if err != nil {
		return "", false, err
	}
	if len(rs) != 2 {
		return "", false, fmt.Errorf("the rows and leases queries: %d results, want 2", len(rs))
	}
	for _, x := range rs[0].Rows {
		if len(x) != 3 {
			return "", false, fmt.Errorf("the rows query: %d columns, want (resource, token, tx)", len(x))
		}
		var tok int64 // a row without a token counts as older than every grant
		if x[1] != nil {
			if tok, err = strconv.ParseInt(string(x[1]), 10, 64); err != nil {
				return "", false, fmt.Errorf("the rows query: token %q: %w", x[1], err)
			}
		}
		rowsOut = append(rowsOut, row{res: string(x[0]), tok: tok, tx: string(x[2])})
	}
	leases := map[string]int64{}
	for _, x := range rs[1].Rows {
		if len(x) != 2 {
			return "", false, fmt.Errorf("the leases query: %d columns, want (resource, token)", len(x))
		}
		tok, err := strconv.ParseInt(string(x[1]), 10, 64)
		if err != nil {
			return "", false, fmt.Errorf("the leases query: token %q: %w", x[1], err)
		}
		leases[string(x[0])] = tok
	}

	var problems []string
	var committed []*grantInfo
	for _, g := range out.grants {
		if _, ok := out.commits[g.tx]; ok && g.live {
			committed = append(committed, g)
		}
	}
	// Guarantee 3.
	for _, w := range rowsOut {
		c, ok := out.commits[w.tx]
		if !ok {
			problems = append(problems, fmt.Sprintf("row of %s under token %d written by %s, which did not commit", w.res, w.tok, w.tx))
			continue
		}
		for _, g := range committed {
			if g.resource == w.res && g.token > w.tok && c > g.returned {
				problems = append(problems, fmt.Sprintf("guarantee 3: %s committed (event %d) a row of %s under token %d after the grant of token %d returned (event %d, committed by %s)",
					w.tx, c, w.res, w.tok, g.token, g.returned, g.tx))
			}
		}
	}
	// Guarantee 1.
	last := map[string]int64{}
	for name, tok := range out.setupTok {
		res := out.setupRes[name]
		last[res] = max(last[res], tok)
	}
	sort.SliceStable(committed, func(a, b int) bool { return committed[a].returned < committed[b].returned })
	seen := map[int64]bool{}
	for _, g := range out.grants {
		if seen[g.token] {
			problems = append(problems, fmt.Sprintf("guarantee 1: token %d returned twice", g.token))
		}
		seen[g.token] = true
	}
	for _, g := range committed {
		if g.token <= last[g.resource] {
			problems = append(problems, fmt.Sprintf("guarantee 1: grant of %s returned %d, not above %d", g.resource, g.token, last[g.resource]))
		}
		last[g.resource] = max(last[g.resource], g.token)
	}
	for res, tok := range last {
		if leases[res] != tok {
			problems = append(problems, fmt.Sprintf("guarantee 1: the lease of %s ends with token %d, the last committed grant was %d", res, leases[res], tok))
		}
	}
	if len(problems) == 0 {
		return "", false, nil
	}
	var b strings.Builder
	for _, p := range problems {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	b.WriteString("  steps:\n")
	for _, l := range out.lines {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	b.WriteString("  rows:")
	for _, w := range rowsOut {
		fmt.Fprintf(&b, " (%s %d %s)", w.res, w.tok, w.tx)
	}
	b.WriteString("\n  leases:")
	names := make([]string, 0, len(leases))
	for res := range leases {
		names = append(names, res)
	}
	sort.Strings(names)
	for _, res := range names {
		fmt.Fprintf(&b, " (%s %d)", res, leases[res])
	}
	b.WriteString("\n")
	return b.String(), true, nil
}

// Count returns how many orders spec has and how many of them only move a
// BEGIN (those are not run), without running any.
func Count(spec Spec) (enumerated, commuted int) {
	enumerate(spec, func(_ []ref, c bool) bool {
		enumerated++
		if c {
			commuted++
		}
		return true
	})
	return enumerated, commuted
}
