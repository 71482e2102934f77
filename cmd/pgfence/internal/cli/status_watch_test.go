//go:build linux

package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/cli"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// watchLine is a line of status --watch --json.
type watchLine struct {
	At     time.Time `json:"at"`
	Leases []struct {
		Resource string `json:"resource"`
		Live     bool   `json:"live"`
	} `json:"leases"`
	Refusals []struct {
		SQLState string `json:"sqlstate"`
		Count    int64  `json:"count"`
	} `json:"refusals"`
	Error string `json:"error"`
}

func (l watchLine) refused(code string) int64 {
	for _, r := range l.Refusals {
		if r.SQLState == code {
			return r.Count
		}
	}
	return -1
}

func (l watchLine) has(resource string) bool {
	for _, r := range l.Leases {
		if r.Resource == resource {
			return true
		}
	}
	return false
}

// readOnlyURL is base with every transaction of its sessions read-only: a
// write by the command under test fails instead of happening.
func readOnlyURL(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	q := u.Query()
	q.Set("default_transaction_read_only", "on")
	u.RawQuery = q.Encode()
	return u.String()
}

// TestStatusWatchOnlyReadsAndEndsOnCtrlC (issue 22, item 4): the built
// binary's status --watch --json, as a role granted usage and nothing more
// whose sessions are read-only, prints one JSON line per tick; the kit
// (objects, lease rows, sequences) is as it was after several ticks; new
// leases and refusals show in later lines; SIGINT (Ctrl-C) ends it with
// exit 0 within a second and its connections are gone.
func TestStatusWatchOnlyReadsAndEndsOnCtrlC(t *testing.T) {
	t.Parallel()
	s := newStatusStory(t)
	bin := buildPgfence(t)
	before := snapshotKit(t, s.db)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "status", "--watch=200ms", "--json", "--database-url", readOnlyURL(t, s.db.URLAs(s.reader)))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr syncBuf
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() watchLine {
		t.Helper()
		select {
		case text, ok := <-lines:
			require.True(t, ok, "status --watch ended; stderr: %s", stderr.String())
			var l watchLine
			require.NoError(t, json.Unmarshal([]byte(text), &l), "one JSON document per line: %q", text)
			require.Empty(t, l.Error, "a tick failed")
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("no line from status --watch in 30s; stderr: %s", stderr.String())
			return watchLine{}
		}
	}

	var last time.Time
	for range 3 {
		l := next()
		require.Len(t, l.Leases, 6)
		require.Equal(t, int64(1), l.refused(sqlfuncs.CodeStaleToken))
		require.True(t, l.At.After(last), "one line per tick")
		last = l.At
	}
	require.Equal(t, before, snapshotKit(t, s.db), "status --watch changed the kit")

	// What happens meanwhile shows in a later line.
	_, _, err = sqlfuncs.Acquire(t.Context(), s.db.Pool, "newcomer", "n", time.Minute)
	require.NoError(t, err)
	_, err = s.db.Pool.Exec(t.Context(), `INSERT INTO report (body) VALUES ('no token')`)
	require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrNoToken)
	for l := next(); !l.has("newcomer") || l.refused(sqlfuncs.CodeNoToken) != 1; l = next() {
	}

	sent := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	code := exitCode(t, cmd)
	took := time.Since(sent)
	t.Logf("SIGINT to exit: %s", took)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	require.Less(t, took, time.Second, "Ctrl-C must end the watch within a second")
	require.Empty(t, stderr.String())
	// The process has exited and its sockets are closed; a backend notices
	// and leaves pg_stat_activity a moment later: wait for it, bounded.
	var n int
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		require.NoError(t, s.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, s.reader).Scan(&n))
		if n == 0 || time.Now().After(end) {
			break
		}
	}
	require.Zero(t, n, "connections of the watch stayed open")
}

// TestStatusWatchFramesAndCancel: without --json, each tick prints a frame
// (a header, the table, the refusal counts), one after the other when
// stdout is not a terminal; a cancelled context (what SIGINT does in main)
// ends the watch with exit 0.
func TestStatusWatchFramesAndCancel(t *testing.T) {
	t.Parallel()
	s := newStatusStory(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"status", "live", "--watch=100ms", "--database-url", s.db.URLAs(s.reader)}, &stdout, &stderr)
	}()
	require.Eventually(t, func() bool { return strings.Count(stdout.String(), "pgfence status of live every 100ms") >= 2 }, 30*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, cli.ExitOK, code, "stderr: %s", stderr.String())
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end after its context was cancelled")
	}
	frame := strings.Split(stdout.String(), "pgfence status of live")[1]
	require.NotContains(t, stdout.String(), "\x1b[", "no terminal: no escapes")
	require.Regexp(t, `RESOURCE\s+HOLDER\s+TOKEN\s+KIND\s+STATE\s+EXPIRES IN\nlive\s+holder-of-live\s+\d+\s+ttl\s+live\s+59m`, frame)
	require.Contains(t, frame, "refused since the install: FN001 (stale token) 1, FN002 (no token) 0, FN003 (token never granted) 0")
	require.Empty(t, stderr.String())
}

// TestStatusWatchGoesOnAfterAFailedRead: a read that fails after the start
// (the server's connections cut) is reported, as a JSON line with "error"
// and on stderr, and the next tick reads again on a new connection.
func TestStatusWatchGoesOnAfterAFailedRead(t *testing.T) {
	t.Parallel()
	s := newStatusStory(t)
	proxy := pgtest.NewProxy(t, s.db.URL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuf
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"status", "--watch=200ms", "--json", "--database-url", proxy.URL(s.db.URLAs(s.reader))}, &stdout, &stderr)
	}()
	lines := func() []watchLine {
		var out []watchLine
		for _, text := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			var l watchLine
			if json.Unmarshal([]byte(text), &l) == nil {
				out = append(out, l)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(lines()) >= 1 }, 30*time.Second, 10*time.Millisecond)
	proxy.Kill()
	var failed int
	require.Eventually(t, func() bool {
		ls := lines()
		for i, l := range ls {
			if l.Error != "" && i+1 < len(ls) && ls[i+1].Error == "" && len(ls[i+1].Leases) == 6 {
				failed = i
				return true
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "no failed tick followed by a good one: %s", stdout.String())
	require.Nil(t, lines()[failed].Leases, "a failed tick carries its error only")
	require.Contains(t, stderr.String(), "(trying again in 200ms)")
	cancel()
	require.Equal(t, cli.ExitOK, <-done)
	require.True(t, bytes.HasSuffix([]byte(stdout.String()), []byte("\n")))
}

// TestStatusWatchOnATerminal: on a terminal (script(1) gives the built
// binary a pseudo-terminal) every frame starts by moving home and clearing
// the screen, so that it replaces the last; SIGTERM ends the watch with
// exit 0, as SIGINT does. (timeout --foreground signals pgfence alone:
// without it, timeout signals its whole process group as well, and the
// second SIGTERM ends pgfence at once with 143, as documented.)
func TestStatusWatchOnATerminal(t *testing.T) {
	t.Parallel()
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) (util-linux) is not installed")
	}
	s := newStatusStory(t)
	bin := buildPgfence(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	shell := "timeout --foreground --preserve-status -s TERM 3 " + bin + " status live --watch=100ms --database-url '" + s.db.URLAs(s.reader) + "'; echo exit=$?"
	out, _ := exec.CommandContext(ctx, scriptBin, "-qec", shell, "/dev/null").CombinedOutput()
	frames := strings.Split(string(out), "\x1b[H\x1b[2J")
	require.GreaterOrEqual(t, len(frames), 2, "frames redrawn in place: %q", out)
	require.Contains(t, frames[1], "live")
	require.Contains(t, frames[len(frames)-1], "exit=0")
}
