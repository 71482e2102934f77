package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

func TestLeaseCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL

	code, out, errOut := run(t, "acquire", "job", "--ttl", "1m", "--holder", "cron-1", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	tok, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	require.NoError(t, err, "acquire prints the token alone: %q", out)

	code, _, errOut = run(t, "acquire", "job", url)
	require.Equal(t, cli.ExitHeld, code)
	require.Contains(t, errOut, "held by cron-1")
	require.Contains(t, errOut, "--wait")

	code, out, errOut = run(t, "renew", "job", "--token", strconv.FormatInt(tok, 10), "--ttl", "2m", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	var renewed struct {
		Resource  string    `json:"resource"`
		Token     int64     `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &renewed), out)
	require.Equal(t, "job", renewed.Resource)
	require.Equal(t, tok, renewed.Token)
	require.WithinDuration(t, time.Now().Add(2*time.Minute), renewed.ExpiresAt, 30*time.Second)

	code, out, errOut = run(t, "status", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, `RESOURCE\s+HOLDER\s+TOKEN\s+KIND\s+STATE\s+EXPIRES IN`, out)
	require.Regexp(t, `job\s+cron-1\s+`+strconv.FormatInt(tok, 10)+`\s+ttl\s+live\s+1m\d`, out)

	code, out, errOut = run(t, "status", "job", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 1)
	require.Equal(t, "cron-1", rows[0]["holder"])
	require.Equal(t, true, rows[0]["live"])
	require.Greater(t, rows[0]["expires_in_seconds"].(float64), 60.0)

	code, out, errOut = run(t, "release", "job", "--token", strconv.FormatInt(tok, 10), url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Equal(t, "released\n", out)
	code, out, _ = run(t, "release", "job", "--token", strconv.FormatInt(tok, 10), "--json", url)
	require.Equal(t, cli.ExitOK, code, "release is idempotent")
	require.JSONEq(t, `{"resource":"job","token":`+strconv.FormatInt(tok, 10)+`,"released":false}`, out)

	// A released lease has no expiry left to show.
	code, out, errOut = run(t, "status", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Regexp(t, `job\s+cron-1\s+`+strconv.FormatInt(tok, 10)+`\s+ttl\s+released\s+-\n`, out)
	code, out, errOut = run(t, "status", "job", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	rows = nil
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.NotContains(t, rows[0], "expires_in_seconds")
	require.NotContains(t, rows[0], "expires_at")
	require.Contains(t, rows[0], "ended_at")

	code, _, errOut = run(t, "renew", "job", "--token", strconv.FormatInt(tok, 10), url)
	require.Equal(t, cli.ExitHeld, code, "renew of an ended lease")
	require.Contains(t, errOut, "not the live lease")

	code, out, errOut = run(t, "revoke", "job", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	var revoked struct{ Token int64 }
	require.NoError(t, json.Unmarshal([]byte(out), &revoked))
	require.Greater(t, revoked.Token, tok)
	code, out, _ = run(t, "status", url)
	require.Equal(t, cli.ExitOK, code)
	// A revoke grants to nobody: no kind of lease; the state says revoked,
	// once.
	require.Regexp(t, `(?m)^job\s+-\s+\d+\s+-\s+revoked\s+-\s*$`, out)

	t.Run("acquire --wait gets it when it is released", func(t *testing.T) {
		other, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "w", "other", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		go func() {
			// Release once the CLI waits: its waiting Acquire has set the lease's
			// waiters flag (fence.acquire(..., waiting => true)).
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				var waiting bool
				if err := db.Pool.QueryRow(t.Context(), `SELECT waiters FROM fence.lease WHERE resource = 'w'`).Scan(&waiting); err != nil || waiting {
					break
				}
			}
			_, _ = sqlfuncs.Release(t.Context(), db.Pool, "w", other)
		}()
		code, out, errOut := run(t, "acquire", "w", "--wait", "--timeout", "20s", url)
		require.Equal(t, cli.ExitOK, code, errOut)
		require.NotEmpty(t, strings.TrimSpace(out))
		code, _, errOut = run(t, "acquire", "w", "--wait", "--timeout", "200ms", url)
		require.Equal(t, cli.ExitHeld, code)
		require.Contains(t, errOut, "not granted within 200ms")
	})
}

func TestProtectCommands(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	_, err := db.Pool.Exec(t.Context(), `CREATE TABLE orders (id int, fence_token bigint)`)
	require.NoError(t, err)

	code, out, errOut := run(t, "protect", "orders", "--resource", "orders", "--token-column", "fence_token", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, "protected orders with resource orders (token from column fence_token)")
	_, err = db.Pool.Exec(t.Context(), `INSERT INTO orders VALUES (1, NULL)`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)

	code, out, errOut = run(t, "unprotect", "orders", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.JSONEq(t, `{"table":"orders"}`, out)
	_, err = db.Pool.Exec(t.Context(), `INSERT INTO orders VALUES (1, NULL)`)
	require.NoError(t, err)

	// A resource per row.
	_, err = db.Pool.Exec(t.Context(), `ALTER TABLE orders ALTER COLUMN id SET NOT NULL`)
	require.NoError(t, err)
	code, out, errOut = run(t, "protect", "orders", "--per-row", "id", "--prefix", "order:", "--token-column", "fence_token", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.Contains(t, out, "protected orders per row: resource order:<id> (token from column fence_token)")
	tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "order:2", "t", time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = db.Pool.Exec(t.Context(), `INSERT INTO orders VALUES (2, $1)`, tok)
	require.NoError(t, err, "row 2 with order:2's token")
	_, err = db.Pool.Exec(t.Context(), `INSERT INTO orders VALUES (3, $1)`, tok)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrUnknownToken, "row 3 is resource order:3, never granted")
	code, out, errOut = run(t, "protect", "orders", "--per-row", "id", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.JSONEq(t, `{"table":"orders","resource_column":"id","prefix":"","token_column":""}`, out)
}

// TestBadInput: every bad flag or argument gives one clear line on stderr, a
// non-zero exit code, and changes nothing in the database.
func TestBadInput(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL
	_, err := db.Pool.Exec(t.Context(), `CREATE TABLE orders (id int, note text)`)
	require.NoError(t, err)
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"bad duration", []string{"acquire", "r", "--ttl", "soon", url}, cli.ExitUsage, "invalid argument"},
		{"ttl out of range", []string{"acquire", "r", "--ttl", "48h", url}, cli.ExitUsage, "out of range"},
		{"timeout without wait", []string{"acquire", "r", "--timeout", "1s", url}, cli.ExitUsage, "--timeout goes with --wait"},
		{"missing token", []string{"renew", "r", url}, cli.ExitUsage, "--token is required"},
		{"token not a number", []string{"release", "r", "--token", "abc", url}, cli.ExitUsage, "not a positive integer"},
		{"negative token", []string{"release", "r", "--token", "-5", url}, cli.ExitUsage, "not a positive integer"},
		{"empty resource", []string{"acquire", "", url}, cli.ExitError, "resource must not be empty"},
		{"unknown table", []string{"protect", "nope", "--resource", "r", url}, cli.ExitError, `relation "nope" does not exist`},
		{"protect without resource", []string{"protect", "orders", url}, cli.ExitUsage, "--resource is required"},
		{"protect with both forms", []string{"protect", "orders", "--resource", "r", "--per-row", "id", url}, cli.ExitUsage, "exclude each other"},
		{"prefix without per-row", []string{"protect", "orders", "--resource", "r", "--prefix", "p:", url}, cli.ExitUsage, "--prefix needs --per-row"},
		{"per-row on a nullable column", []string{"protect", "orders", "--per-row", "id", url}, cli.ExitError, "may be NULL"},
		{"text token column", []string{"protect", "orders", "--resource", "r", "--token-column", "note", url}, cli.ExitError, "not bigint"},
		{"malformed URL", []string{"status", "--database-url", "postgres://%zz"}, cli.ExitError, "bad connection string"},
		{"unknown command", []string{"frobnicate", url}, cli.ExitUsage, "unknown command"},
		{"run without --", []string{"run", "r", "true", "x", url}, cli.ExitUsage, "put -- before the command"},
		{"status of a resource never granted", []string{"status", "never", url}, cli.ExitError, "has never been granted"},
		{"no schema", []string{"status", "--database-url", pgtest.Empty(t).URL}, cli.ExitError, "pgfence migrate up"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := run(t, c.args...)
			require.Equal(t, c.code, code, "stdout %q stderr %q", out, errOut)
			require.Contains(t, errOut, c.msg)
			require.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
		})
	}
	var leases, triggers int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM fence.leases`).Scan(&leases))
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_trigger WHERE tgrelid = 'orders'::regclass`).Scan(&triggers))
	require.Zero(t, leases+triggers, "bad input changed nothing")
}

func TestRun(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL

	t.Run("the command sees the token and its exit code passes through", func(t *testing.T) {
		code, out, errOut := run(t, "run", "job", url, "--", "sh", "-c", `echo "token=$PGFENCE_TOKEN resource=$PGFENCE_RESOURCE"; exit 7`)
		require.Equal(t, 7, code, errOut)
		require.Regexp(t, `token=\d+ resource=job`, out)
		row, ok, err := sqlfuncs.GetLease(t.Context(), db.Pool, "job")
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, row.Live, "released on exit")
	})

	t.Run("not acquired: 75 and the command never starts", func(t *testing.T) {
		tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "busy", "other", time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		defer sqlfuncs.Release(t.Context(), db.Pool, "busy", tok)
		marker := filepath.Join(t.TempDir(), "ran")
		code, _, errOut := run(t, "run", "busy", url, "--", "touch", marker)
		require.Equal(t, cli.ExitRunNotAcquired, code)
		require.Contains(t, errOut, "not acquired")
		require.NoFileExists(t, marker)
	})

	// Busy (nobody holds the lease, the previous holder's guarded
	// transaction is still open) is another instance still at work too:
	// run exits with the conflict code, acquire with 3, each saying busy.
	t.Run("busy: 75, and acquire 3", func(t *testing.T) {
		tok, ok, err := sqlfuncs.Acquire(t.Context(), db.Pool, "open", "old", 100*time.Millisecond)
		require.NoError(t, err)
		require.True(t, ok)
		tx, err := db.Pool.Begin(t.Context())
		require.NoError(t, err)
		defer tx.Rollback(context.Background())
		require.NoError(t, sqlfuncs.UseToken(t.Context(), tx, "open", tok))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			row, _, err := sqlfuncs.GetLease(t.Context(), db.Pool, "open")
			require.NoError(t, err)
			if !row.Live {
				break
			}
			require.True(t, time.Now().Before(deadline), "the lease never expired")
		}
		// Grants give up waiting for the gate after 100ms instead of 2s.
		fast := url + "&fence.grant_wait=100ms"
		marker := filepath.Join(t.TempDir(), "ran")
		code, _, errOut := run(t, "run", "open", fast, "--", "touch", marker)
		require.Equal(t, cli.ExitRunNotAcquired, code, errOut)
		require.Contains(t, errOut, "resource busy")
		require.Contains(t, errOut, "pass --wait to wait for it")
		require.NoFileExists(t, marker)
		code, _, errOut = run(t, "acquire", "open", fast)
		require.Equal(t, cli.ExitHeld, code, errOut)
		require.Contains(t, errOut, "resource busy")
	})
}

// TestRunStopsTheCommandBeforeTheLeaseCanPass freezes the connection between
// pgfence run and the database. The command (a shell wrapper whose child
// ignores SIGTERM) must be gone before the server's expiry of the lease;
// another run started then is granted a larger token.
func TestRunStopsTheCommandBeforeTheLeaseCanPass(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	proxy := pgtest.NewProxy(t, db.URL)
	dir := t.TempDir()
	started := filepath.Join(dir, "started")
	grandchild := filepath.Join(dir, "grandchild.pid")

	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		// sh ignores TERM and so does its child (the disposition is
		// inherited); only SIGKILL of the whole group stops them.
		script := `trap '' TERM; echo $PGFENCE_TOKEN > ` + started + `; sleep 60 & echo $! > ` + grandchild + `; wait`
		code, out, errOut := run(t, "run", "job", "--ttl", "3s", "--grace", "600ms", "--database-url", proxy.URL(db.URL), "--", "sh", "-c", script)
		done <- result{code, out, errOut}
	}()
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(grandchild)
		return err == nil && len(strings.TrimSpace(string(b))) > 0
	}, 20*time.Second, 10*time.Millisecond)
	firstTok, err := os.ReadFile(started)
	require.NoError(t, err)

	proxy.Freeze()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("pgfence run did not stop the command")
	}
	// The command is gone; the server still counts the lease live: nobody
	// else could have been granted it while the command ran.
	var live bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT live FROM fence.leases WHERE resource = 'job'`).Scan(&live))
	require.True(t, live, "the command outlived the server's expiry")
	require.Equal(t, cli.ExitRunLost, r.code, "stderr: %s", r.err)
	require.Contains(t, r.err, "SIGTERM")
	require.Contains(t, r.err, "SIGKILL")
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, grandchild)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !processRunning(pid) }, 5*time.Second, 10*time.Millisecond,
		"the grandchild was not killed with the group")

	code, out, errOut := run(t, "run", "job", "--wait", "--timeout", "20s", "--database-url", db.URL, "--", "sh", "-c", `echo $PGFENCE_TOKEN`)
	require.Equal(t, cli.ExitOK, code, errOut)
	second, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	require.NoError(t, err)
	first, err := strconv.ParseInt(strings.TrimSpace(string(firstTok)), 10, 64)
	require.NoError(t, err)
	require.Greater(t, second, first)
	proxy.Thaw()
}

// processRunning reports whether pid is a live process (not gone, not a
// zombie waiting for its new parent to reap it).
func processRunning(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// TestRunOnATerminal: on a terminal, the command's process group must be the
// foreground one, or reading the terminal stops it (SIGTTIN) and it hangs.
// Run under script(1), which gives pgfence a pseudo-terminal.
func TestRunOnATerminal(t *testing.T) {
	t.Parallel()
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) (util-linux) is not installed")
	}
	db := pgtest.Setup(t)
	bin := buildPgfence(t)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	line := bin + " run tty --database-url " + db.URL + ` -- sh -c 'read x; echo "got $x"'`
	cmd := exec.CommandContext(ctx, scriptBin, "-qec", line, "/dev/null")
	cmd.Stdin = strings.NewReader("hello\n")
	got, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", got)
	require.Contains(t, string(got), "got hello", "the command could read the terminal")
}

// TestJSONShapes: the --json documents of the commands not covered above.
func TestJSONShapes(t *testing.T) {
	t.Parallel()
	db := pgtest.Setup(t)
	url := "--database-url=" + db.URL

	code, out, errOut := run(t, "acquire", "j", "--holder", "h1", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	var acq struct {
		Resource, Holder string
		Token            int64
		ExpiresAt        time.Time `json:"expires_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &acq), out)
	require.Equal(t, "j", acq.Resource)
	require.Equal(t, "h1", acq.Holder)
	require.Positive(t, acq.Token)
	require.WithinDuration(t, time.Now().Add(30*time.Second), acq.ExpiresAt, 20*time.Second)

	code, out, errOut = run(t, "migrate", "version", "--json", url)
	require.Equal(t, cli.ExitOK, code, errOut)
	require.JSONEq(t, fmt.Sprintf(`{"version": %d, "dirty": false}`, migrations.Latest), out)

	code, out, _ = run(t, "doctor", "--json", url)
	require.Contains(t, []int{cli.ExitOK, cli.ExitError}, code)
	var findings []struct{ Check, Status, Detail, Fix string }
	require.NoError(t, json.Unmarshal([]byte(out), &findings), out)
	checks := map[string]string{}
	for _, f := range findings {
		checks[f.Check] = f.Status
	}
	for _, c := range []string{"connection", "server version", "clock", "migrations", "privileges", "synchronous_commit", "standbys", "idle_in_transaction_session_timeout"} {
		require.Contains(t, checks, c)
	}
	require.Equal(t, "ok", checks["migrations"])
	require.Equal(t, "ok", checks["connection"])

	code, out, errOut = run(t, "demo", "--ttl", "300ms", "--json", "--database-url", pgtest.AdminURL(t))
	require.Equal(t, cli.ExitOK, code, errOut)
	var demo struct {
		Fenced  bool
		Stories []struct {
			Table     string
			Protected bool
			Form      string
			Refused   *struct{ SQLState string }
			Rows      []struct {
				Job, Worker, Result string
				Token               int64
			}
			Steps []struct{ Worker, Action, Outcome string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &demo), out)
	require.True(t, demo.Fenced)
	require.Len(t, demo.Stories, 3)
	require.NotNil(t, demo.Stories[0].Refused)
	require.Equal(t, "FN001", demo.Stories[0].Refused.SQLState)
	require.Equal(t, "table", demo.Stories[0].Form)
	require.Equal(t, "worker-B", demo.Stories[0].Rows[0].Worker)
	require.Nil(t, demo.Stories[1].Refused)
	require.Empty(t, demo.Stories[1].Form)
	require.Equal(t, "worker-A", demo.Stories[1].Rows[0].Worker)
	require.NotEmpty(t, demo.Stories[0].Steps)

	// The per-row story: A's stale write to row 1 refused; B's writes to
	// row 2 accepted before and after it; the rows as C and B left them.
	rows := demo.Stories[2]
	require.Equal(t, "job", rows.Table)
	require.True(t, rows.Protected)
	require.Equal(t, "rows", rows.Form)
	require.NotNil(t, rows.Refused)
	require.Equal(t, "FN001", rows.Refused.SQLState)
	refusedAt, bWrites, bAfter := -1, 0, 0
	granted := map[string]int64{}
	for i, s := range rows.Steps {
		if m := regexp.MustCompile(`^granted token (\d+)`).FindStringSubmatch(s.Outcome); m != nil {
			tok, err := strconv.ParseInt(m[1], 10, 64)
			require.NoError(t, err)
			granted[s.Worker] = tok
		}
		switch {
		case s.Outcome == "REFUSED by the database":
			require.Equal(t, -1, refusedAt, "one refusal")
			require.Equal(t, "A", s.Worker)
			require.Contains(t, s.Action, "row 1")
			refusedAt = i
		case s.Worker == "B" && strings.Contains(s.Action, "row 2"):
			require.Equal(t, "accepted", s.Outcome, s.Action)
			bWrites++
			if refusedAt >= 0 {
				bAfter++
			}
		}
	}
	require.NotEqual(t, -1, refusedAt, rows.Steps)
	require.Equal(t, 3, bWrites, rows.Steps)
	require.Equal(t, 1, bAfter, "B writes row 2 after A's refusal: %v", rows.Steps)
	require.Len(t, rows.Rows, 2)
	require.Equal(t, "1", rows.Rows[0].Job)
	require.Equal(t, "worker-C", rows.Rows[0].Worker)
	require.Equal(t, "final by C", rows.Rows[0].Result)
	require.Equal(t, "2", rows.Rows[1].Job)
	require.Equal(t, "worker-B", rows.Rows[1].Worker)
	require.Equal(t, "final by B", rows.Rows[1].Result)
	require.Equal(t, granted["C"], rows.Rows[0].Token, "row 1 under C's token")
	require.Equal(t, granted["B"], rows.Rows[1].Token, "row 2 under B's token")
	require.NotZero(t, granted["B"])
	require.NotZero(t, granted["C"])
}
