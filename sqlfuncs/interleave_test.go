package sqlfuncs_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/pgtest/interleave"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The interleaving tester's specs (docs/development.md, "The interleaving
// tester"). Every order of each spec's steps runs against the server, and
// guarantees 3 and 1 are checked after it. The sessions' roles:
//
//	H  the holder of T1 (usage), who writes under it
//	U  another role with usage only
//	O  a role with usage and operator rights (fence.revoke)
//	S  the kit's and the tables' owner (the superuser here), the only one
//	   who may lock fence.lease rows with SELECT ... FOR
//
// Every order starts with T1, a live lease of resource r granted to H and
// committed. The tables: il_tw is protected table-wide for r with token
// column tok, il_tp table-wide for r without one (writes need
// fence.use_token), il_pr per row with resource column job (job 'r' is r).

// isoNames spells the isolation levels for step names and BEGIN.
var isoNames = []struct{ short, sql string }{
	{"rc", "READ COMMITTED"},
	{"rr", "REPEATABLE READ"},
	{"ser", "SERIALIZABLE"},
}

func ilBegin(iso int) interleave.Step {
	return interleave.Step{Name: "begin_" + isoNames[iso].short, SQL: "BEGIN ISOLATION LEVEL " + isoNames[iso].sql, Kind: interleave.Begin}
}

var (
	ilSnap     = interleave.Step{Name: "snap", SQL: `SELECT count(*) FROM public.il_tw`}
	ilCommit   = interleave.Step{Name: "commit", SQL: `COMMIT`, Kind: interleave.Commit}
	ilRollback = interleave.Step{Name: "rollback", SQL: `ROLLBACK`, Kind: interleave.Rollback}
	ilPrepare  = interleave.Step{Name: "prepare", SQL: `PREPARE TRANSACTION {gid}`, Kind: interleave.Prepare}
	ilRelease  = interleave.Step{Name: "release", SQL: `SELECT fence.release('r', {T1})`}
	ilCheck    = interleave.Step{Name: "check", SQL: `SELECT fence.check('r', {T1})`}
	ilRenew    = interleave.Step{Name: "renew", SQL: `SELECT fence.renew('r', {T1}, '1h') IS NOT NULL`}
	ilAcquire  = interleave.Step{Name: "acquire", SQL: `SELECT fence.acquire('r', 'g', '1h')`, Kind: interleave.Grant, Resource: "r", Save: "T2"}
	ilRevoke   = interleave.Step{Name: "revoke", SQL: `SELECT fence.revoke('r')`, Kind: interleave.Grant, Resource: "r", Save: "T2"}
	// ilOwnAcquire is the writer's own grant, saved as TW.
	ilOwnAcquire = interleave.Step{Name: "acquire", SQL: `SELECT fence.acquire('r', 'h', '1h')`, Kind: interleave.Grant, Resource: "r", Save: "TW"}
	ilSP         = interleave.Step{Name: "savepoint", SQL: `SAVEPOINT s`, Kind: interleave.Savepoint, Savepoint: "s"}
	ilSPRel      = interleave.Step{Name: "release_s", SQL: `RELEASE SAVEPOINT s`, Kind: interleave.ReleaseSavepoint, Savepoint: "s"}
	ilSPBack     = interleave.Step{Name: "rollback_to_s", SQL: `ROLLBACK TO SAVEPOINT s`, Kind: interleave.RollbackTo, Savepoint: "s"}
)

func ilCommitPrepared(of string) interleave.Step {
	return interleave.Step{Name: "commit_prepared_" + of, SQL: `COMMIT PREPARED {gid:` + of + `}`, Kind: interleave.CommitPrepared, Of: of}
}

// ilLock is the owner's row lock on r's lease row.
func ilLock(mode string) interleave.Step {
	return interleave.Step{Name: "for_" + strings.ReplaceAll(strings.ToLower(mode), " ", "_"), SQL: `SELECT token FROM fence.lease WHERE resource = 'r' FOR ` + mode}
}

// ilWrite writes one row of table form under token tok ("T1", "T2").
func ilWrite(form, tok string) interleave.Step {
	var sql string
	switch form {
	case "tw":
		sql = `INSERT INTO public.il_tw (tok, tx) VALUES ({` + tok + `}, {tx})`
	case "tp":
		sql = `SELECT fence.use_token('r', {` + tok + `}); INSERT INTO public.il_tp (t, tx) VALUES ({` + tok + `}, {tx})`
	case "pr":
		sql = `INSERT INTO public.il_pr (job, tok, tx) VALUES ('r', {` + tok + `}, {tx})`
	case "pr17":
		// One READ COMMITTED statement over 17 resources, r among them
		// (fence._check_many's path).
		sql = `INSERT INTO public.il_pr (job, tok, tx) SELECT CASE WHEN i = 17 THEN 'r' ELSE 'q' || i END, CASE WHEN i = 17 THEN {` + tok + `} ELSE (SELECT token FROM fence.leases WHERE resource = 'q' || i) END, {tx} FROM generate_series(1, 17) i`
	default:
		panic(form)
	}
	return interleave.Step{Name: "write_" + form + "_" + strings.ToLower(tok), SQL: sql}
}

func ilSteps(parts ...any) []interleave.Step {
	var out []interleave.Step
	for _, p := range parts {
		switch v := p.(type) {
		case interleave.Step:
			out = append(out, v)
		case []interleave.Step:
			out = append(out, v...)
		case nil:
		default:
			panic(fmt.Sprintf("%T", p))
		}
	}
	return out
}

// writer is the holder's transaction under T1: BEGIN at iso, a snapshot
// first (or not), the write, COMMIT.
func ilWriter(name string, iso int, snap bool, form string) interleave.Session {
	s := interleave.Session{Name: name, Role: "H"}
	s.Steps = ilSteps(ilBegin(iso))
	if snap {
		s.Steps = append(s.Steps, ilSnap)
	}
	s.Steps = append(s.Steps, ilWrite(form, "T1"), ilCommit)
	return s
}

func ilWriterName(iso int, snap bool, form string) string {
	n := "W" + isoNames[iso].short
	if snap {
		n += "+snap"
	}
	return n + "/" + form
}

// grantor is one grant path: the steps between BEGIN and COMMIT and the
// roles that may take it.
type ilGrantor struct {
	name  string
	roles []string
	body  []interleave.Step
	setup string // the spec's Setup, when not the default
}

// ilGrantors are the grant paths: a grant after the caller's own release,
// check, renew or row lock, at the top level or in a savepoint (released or
// rolled back to), by every role that may take them.
func ilGrantors() []ilGrantor {
	var out []ilGrantor
	sp := []struct {
		name string
		wrap func(grant interleave.Step) []interleave.Step
	}{
		{"top", func(g interleave.Step) []interleave.Step { return ilSteps(g) }},
		{"sp", func(g interleave.Step) []interleave.Step { return ilSteps(ilSP, g, ilSPRel) }},
	}
	for _, w := range sp {
		out = append(out,
			ilGrantor{"release+check+acquire/" + w.name, []string{"U", "H", "S"}, ilSteps(ilRelease, ilCheck, w.wrap(ilAcquire)), ""},
			ilGrantor{"release+acquire/" + w.name, []string{"U", "H"}, ilSteps(ilRelease, w.wrap(ilAcquire)), ""},
			ilGrantor{"renew+release+acquire/" + w.name, []string{"H"}, ilSteps(ilRenew, ilRelease, w.wrap(ilAcquire)), ""},
			ilGrantor{"check+revoke/" + w.name, []string{"O", "S"}, ilSteps(ilCheck, w.wrap(ilRevoke)), ""},
			ilGrantor{"revoke/" + w.name, []string{"O"}, ilSteps(w.wrap(ilRevoke)), ""},
		)
		for _, mode := range []string{"KEY SHARE", "UPDATE"} {
			out = append(out, ilGrantor{"lock_" + strings.ReplaceAll(strings.ToLower(mode), " ", "_") + "+revoke/" + w.name, []string{"S"}, ilSteps(ilLock(mode), w.wrap(ilRevoke)), ""})
		}
	}
	out = append(out,
		ilGrantor{"release+check+acquire/sp_rolled_back", []string{"U"}, ilSteps(ilRelease, ilCheck, ilSP, ilAcquire, ilSPBack), ""},
		ilGrantor{"lock_share+revoke/sp", []string{"S"}, ilSteps(ilLock("SHARE"), ilSP, ilRevoke, ilSPRel), ""},
	)
	// After the holder's release committed (the order starts with T1
	// granted and released): fence.acquire's fast path, a grant of a
	// lease row that exists and is not live.
	for _, w := range sp {
		out = append(out,
			ilGrantor{"released:acquire/" + w.name, []string{"U", "H"}, ilSteps(w.wrap(ilAcquire)), ilSetupReleased},
			ilGrantor{"released:check+acquire/" + w.name, []string{"U"}, ilSteps(ilCheck, w.wrap(ilAcquire)), ilSetupReleased},
		)
	}
	return out
}

// ilSpecs builds the specs of every family.
func ilSpecs() []interleave.Spec {
	var specs []interleave.Spec
	forms := []string{"tw", "tp", "pr"}

	// grants: every grant path, by every role that may take it, at
	// READ COMMITTED and REPEATABLE READ (SERIALIZABLE too for the usage
	// role), against two writers of the holder (below), on one table
	// form per spec (in turn).
	n := 0
	for _, g := range ilGrantors() {
		for _, role := range g.roles {
			for giso := range isoNames {
				if giso == 2 && role != "U" {
					// SERIALIZABLE grants only by the usage role: its row
					// locks are REPEATABLE READ's, and the family is the
					// largest.
					continue
				}
				// The REPEATABLE READ writer with its snapshot taken
				// before the grant (break 1's), and one more in turn:
				// READ COMMITTED, REPEATABLE READ without a snapshot
				// yet, SERIALIZABLE with one.
				others := []struct {
					iso  int
					snap bool
				}{{0, false}, {1, false}, {2, true}}
				for k, w := range []struct {
					iso  int
					snap bool
				}{{1, true}, others[n%len(others)]} {
					form := forms[(n+k)%len(forms)]
					specs = append(specs, interleave.Spec{
						Family: "grants",
						Setup:  g.setup,
						Name:   fmt.Sprintf("grants/%s:%s/%s %s", role, isoNames[giso].short, g.name, ilWriterName(w.iso, w.snap, form)),
						Sessions: []interleave.Session{
							{Name: "G", Role: role, Steps: ilSteps(ilBegin(giso), g.body, ilCommit)},
							ilWriter("W", w.iso, w.snap, form),
						},
					})
				}
				n++
			}
		}
	}

	// writers: the holder's writer in more shapes (two writes, a
	// savepoint rolled back, the 17-resource statement, its own renew,
	// release or grant in the transaction) at each isolation level,
	// against a grant by another session, on one table form per spec
	// (the grant and the form in turn).
	type wshape struct {
		name string
		body func(form string) []interleave.Step
	}
	shapes := []wshape{
		{"write+write", func(f string) []interleave.Step { return ilSteps(ilWrite(f, "T1"), ilWrite(f, "T1")) }},
		{"sp+write+rollback_to+write", func(f string) []interleave.Step {
			return ilSteps(ilSP, ilWrite(f, "T1"), ilSPBack, ilWrite(f, "T1"))
		}},
		{"renew+write", func(f string) []interleave.Step { return ilSteps(ilRenew, ilWrite(f, "T1")) }},
		{"check+write", func(f string) []interleave.Step { return ilSteps(ilCheck, ilWrite(f, "T1")) }},
		{"write+release", func(f string) []interleave.Step { return ilSteps(ilWrite(f, "T1"), ilRelease) }},
		// The writer's own grant (docs/design.md, W6): after it, a write
		// under T1 fails and one under T2 is the newest grant's.
		{"release+acquire+write_t1", func(f string) []interleave.Step { return ilSteps(ilRelease, ilOwnAcquire, ilWrite(f, "T1")) }},
		{"release+acquire+write_tw", func(f string) []interleave.Step { return ilSteps(ilRelease, ilOwnAcquire, ilWrite(f, "TW")) }},
	}
	grants := []struct {
		name, role string
		body       []interleave.Step
	}{
		// A READ COMMITTED revoke, and break 1's grant: a REPEATABLE
		// READ transaction whose check locks the row FOR KEY SHARE.
		{"O:rc:revoke", "O", ilSteps(ilBegin(0), ilRevoke)},
		{"U:rr:release+check+sp_acquire", "U", ilSteps(ilBegin(1), ilRelease, ilCheck, ilSP, ilAcquire, ilSPRel)},
	}
	n = 0
	for _, sh := range shapes {
		for wiso := range isoNames {
			gr := grants[n%len(grants)]
			f := forms[n%len(forms)]
			n++
			specs = append(specs, interleave.Spec{
				Family: "writers",
				Name:   fmt.Sprintf("writers/W%s:%s/%s %s", isoNames[wiso].short, sh.name, f, gr.name),
				Sessions: []interleave.Session{
					{Name: "G", Role: gr.role, Steps: ilSteps(gr.body, ilCommit)},
					{Name: "W", Role: "H", Steps: ilSteps(ilBegin(wiso), sh.body(f), ilCommit)},
				},
			})
		}
	}
	// A grant that rolls back: the writer's commit after it is no
	// failure (the checker counts committed grants only).
	for _, f := range []string{"tw", "pr"} {
		specs = append(specs, interleave.Spec{
			Family: "writers",
			Name:   fmt.Sprintf("writers/Wrr:snap+write/%s U:release+check+acquire+rollback", f),
			Sessions: []interleave.Session{
				{Name: "G", Role: "U", Steps: ilSteps(ilBegin(1), ilRelease, ilCheck, ilAcquire, ilRollback)},
				ilWriter("W", 1, true, f),
			},
		})
	}
	for wiso := range isoNames {
		for _, gr := range grants {
			specs = append(specs, interleave.Spec{
				Family: "writers",
				Name:   fmt.Sprintf("writers/W%s:snap+write/pr17 %s", isoNames[wiso].short, gr.name),
				Setup:  ilSetup17,
				Sessions: []interleave.Session{
					{Name: "G", Role: gr.role, Steps: ilSteps(gr.body, ilCommit)},
					{Name: "W", Role: "H", Steps: ilSteps(ilBegin(wiso), ilSnap, ilWrite("pr17", "T1"), ilCommit)},
				},
			})
		}
	}

	// three: a revoke, the holder's writer (READ COMMITTED, or REPEATABLE
	// READ with its snapshot taken first), and a third session that locks the row or writes too
	// (three sessions of four steps have 34 650 orders: the family stays
	// small).
	thirds := []struct {
		name string
		s    interleave.Session
	}{
		{"S:for_key_share", interleave.Session{Name: "X", Role: "S", Steps: ilSteps(ilBegin(0), ilLock("KEY SHARE"), ilCommit)}},
		{"U:check", interleave.Session{Name: "X", Role: "U", Steps: ilSteps(ilBegin(1), ilCheck, ilCommit)}},
		{"H:writer_rr", ilWriter("X", 1, false, "tp")},
	}
	for _, th := range thirds {
		for _, wiso := range []int{0, 1} {
			gr := grants[0]
			specs = append(specs, interleave.Spec{
				Family: "three",
				Name:   fmt.Sprintf("three/%s %s %s", gr.name, ilWriterName(wiso, wiso > 0, "tw"), th.name),
				Sessions: []interleave.Session{
					{Name: "G", Role: gr.role, Steps: ilSteps(gr.body, ilCommit)},
					ilWriter("W", wiso, wiso > 0, "tw"),
					th.s,
				},
			})
		}
	}

	// prepared: the writer, or the grant, ends with PREPARE TRANSACTION
	// and commits later from another session.
	for wiso := range isoNames {
		for _, f := range forms {
			specs = append(specs, interleave.Spec{
				Family: "prepared",
				Name:   fmt.Sprintf("prepared/W%s:write/%s prepared, O:revoke", isoNames[wiso].short, f),
				Sessions: []interleave.Session{
					{Name: "W", Role: "H", Steps: ilSteps(ilBegin(wiso), ilSnap, ilWrite(f, "T1"), ilPrepare)},
					{Name: "G", Role: "O", Steps: ilSteps(ilBegin(0), ilRevoke, ilCommit, ilCommitPrepared("W"))},
				},
			})
		}
		specs = append(specs, interleave.Spec{
			Family: "prepared",
			Name:   fmt.Sprintf("prepared/U:release+check+sp_acquire prepared, W%s:snap+write/tw", isoNames[wiso].short),
			Sessions: []interleave.Session{
				{Name: "G", Role: "U", Steps: ilSteps(ilBegin(1), ilRelease, ilCheck, ilSP, ilAcquire, ilSPRel, ilPrepare, ilCommitPrepared("G"))},
				ilWriter("W", wiso, true, "tw"),
			},
		})
	}
	return specs
}

// ilSetup17 grants the 16 more resources of the 17-resource statement
// (q1 ... q16) besides r.
const ilSetup17 = `SELECT 'T1', 'r', fence.acquire('r', 'h', '1h')
	UNION ALL SELECT 'Q' || i, 'q' || i, fence.acquire('q' || i, 'h', '1h') FROM generate_series(1, 16) i`

// ilSetupReleased grants T1 to the holder and releases it: the lease row
// exists and is not live, and T1 is still r's latest token.
const ilSetupReleased = `WITH g AS (SELECT fence.acquire('r', 'h', '1h') AS t)
	SELECT 'T1', 'r', t FROM g WHERE fence.release('r', t)`

// ilKnownFailing lists specs that fail on this branch with a reason; they
// still run and their failures are reported, but do not fail the test.
// Keep it empty.
var ilKnownFailing = map[string]string{}

// TestInterleavings runs every order of every spec of ilSpecs against the
// server and checks guarantees 3 and 1 after each (internal/pgtest/
// interleave). On 008 it finds break 1 of the third review (issue 31):
// a usage role's grant in a savepoint after fence.check's FOR KEY SHARE
// lock let an older snapshot commit under T1. Under -short every 29th
// order runs. PGFENCE_IL_FAMILY=grants (a family) or PGFENCE_IL_SPEC (a
// substring of spec names) narrows the run.
func TestInterleavings(t *testing.T) {
	t.Parallel()
	specs := ilSpecs()
	if f := os.Getenv("PGFENCE_IL_FAMILY"); f != "" {
		specs = filterSpecs(specs, func(s interleave.Spec) bool { return s.Family == f })
	}
	if f := os.Getenv("PGFENCE_IL_SPEC"); f != "" {
		specs = filterSpecs(specs, func(s interleave.Spec) bool { return strings.Contains(s.Name, f) })
	}
	var maxPrepared int
	admin, err := pgx.Connect(t.Context(), pgtest.AdminURL(t))
	require.NoError(t, err)
	err = admin.QueryRow(t.Context(), `SELECT current_setting('max_prepared_transactions')::int`).Scan(&maxPrepared)
	_ = admin.Close(t.Context())
	require.NoError(t, err)
	if maxPrepared == 0 {
		// The harness's own cluster has 20; a server of
		// PGFENCE_TEST_DATABASE_URL may have none.
		fmt.Printf("NOTE: interleavings: the prepared family is left out: max_prepared_transactions = 0 on this server\n")
		specs = filterSpecs(specs, func(s interleave.Spec) bool { return s.Family != "prepared" })
	}
	every := 1
	if testing.Short() {
		every = 29
	}
	roles := map[string]string{
		"H": pgtest.NewRole(t, "ilh"),
		"U": pgtest.NewRole(t, "ilu"),
		"O": pgtest.NewRole(t, "ilo"),
	}

	const workers = 2
	jobs := make(chan int)
	type res struct {
		stats interleave.Stats
		fails []interleave.Failure
		err   error
		took  time.Duration
	}
	results := make([]res, len(specs))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		runner := ilTarget(t, roles, every)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				start := time.Now()
				st, fails, err := runner.Run(t.Context(), specs[i])
				results[i] = res{st, fails, err, time.Since(start)}
			}
		}()
	}
	for i := range specs {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	families := map[string]*interleave.Stats{}
	took := map[string]time.Duration{}
	var order []string
	var total interleave.Stats
	failedSpecs := 0
	for i, r := range results {
		sp := specs[i]
		require.NoError(t, r.err)
		if families[sp.Family] == nil {
			families[sp.Family] = &interleave.Stats{}
			order = append(order, sp.Family)
		}
		families[sp.Family].Add(r.stats)
		took[sp.Family] += r.took
		total.Add(r.stats)
		if len(r.fails) == 0 {
			continue
		}
		failedSpecs++
		why, known := ilKnownFailing[sp.Name]
		for k, f := range r.fails {
			if k >= 3 {
				t.Logf("%s: %d more failing orders", sp.Name, len(r.fails)-k)
				break
			}
			if known {
				t.Logf("known failing (%s): %s\n  order: %s\n%s", why, f.Spec, f.Order, f.Report)
			} else {
				t.Errorf("%s\n  order: %s\n%s", f.Spec, f.Order, f.Report)
			}
		}
	}
	for _, fam := range order {
		s := families[fam]
		fmt.Printf("NOTE: interleavings %s: %d orders enumerated, %d run (%d pruned as blocked, %d moved only a BEGIN, %d left out by sampling), %d failed, %.1f s of sessions\n",
			fam, s.Enumerated, s.Run, s.Pruned, s.Commuted, s.Sampled, s.Failed, took[fam].Seconds())
	}
	fmt.Printf("NOTE: interleavings: %d specs, %d orders enumerated, %d run, %d failing orders in %d specs\n",
		len(specs), total.Enumerated, total.Run, total.Failed, failedSpecs)
}

func filterSpecs(specs []interleave.Spec, keep func(interleave.Spec) bool) []interleave.Spec {
	var out []interleave.Spec
	for _, s := range specs {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// ilTarget makes a database for one worker: the roles' usage, the three
// tables, and a runner.
func ilTarget(t *testing.T, roles map[string]string, every int) *interleave.Runner {
	t.Helper()
	b := setup(t)
	ctx := b.ctx
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, roles["H"], false))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, roles["U"], false))
	require.NoError(t, sqlfuncs.GrantUsage(ctx, b.db.Pool, roles["O"], true))
	all := pgx.Identifier{roles["H"]}.Sanitize() + ", " + pgx.Identifier{roles["U"]}.Sanitize() + ", " + pgx.Identifier{roles["O"]}.Sanitize()
	for _, s := range []string{
		`CREATE TABLE il_tw (tok bigint, tx text)`,
		`CREATE TABLE il_tp (t bigint, tx text)`,
		`CREATE TABLE il_pr (job text NOT NULL, tok bigint, tx text)`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON il_tw, il_tp, il_pr TO ` + all,
		// A deadlock is broken in 50 ms instead of 1 s.
		`ALTER DATABASE ` + pgx.Identifier{b.db.Name}.Sanitize() + ` SET deadlock_timeout = '50ms'`,
	} {
		b.exec(t, s)
	}
	require.NoError(t, sqlfuncs.Protect(ctx, b.db.Pool, "il_tw", "r", "tok"))
	require.NoError(t, sqlfuncs.Protect(ctx, b.db.Pool, "il_tp", "r", ""))
	require.NoError(t, sqlfuncs.ProtectRows(ctx, b.db.Pool, "il_pr", "job", "", "tok"))

	urls := map[string]string{"S": b.db.URL}
	for k, r := range roles {
		urls[k] = b.db.URLAs(r)
	}
	runner, err := interleave.NewRunner(ctx, interleave.Target{
		URLs:  urls,
		Admin: b.db.URL,
		// DELETE, not TRUNCATE: a TRUNCATE of three tables took longer
		// than the rest of an order.
		Reset: `BEGIN; SET LOCAL session_replication_role = replica;
			DELETE FROM public.il_tw; DELETE FROM public.il_tp; DELETE FROM public.il_pr; DELETE FROM fence.lease; COMMIT`,
		Setup: `SELECT 'T1', 'r', fence.acquire('r', 'h', '1h')`,
		Rows: `SELECT 'r', tok, tx FROM public.il_tw UNION ALL SELECT 'r', t, tx FROM public.il_tp
			UNION ALL SELECT job, tok, tx FROM public.il_pr`,
		Leases: `SELECT resource, token FROM fence.lease`,
		Every:  every,
	})
	require.NoError(t, err)
	t.Cleanup(runner.Close)
	return runner
}
