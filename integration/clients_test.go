package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// EnvRequireClients, set to 1 (by .ci/run), turns a missing client of
// docs/clients.md (python3 with psycopg, java with the PostgreSQL JDBC
// driver, node with pg in .ci/node) from a skip into a failure.
const EnvRequireClients = "PGFENCE_TEST_REQUIRE_CLIENTS"

const clientsDir = "testdata/clients"

// requireClient skips (or, under PGFENCE_TEST_REQUIRE_CLIENTS=1, fails)
// unless the command runs, saying what to install.
func requireClient(t *testing.T, install string, name string, args ...string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("%s %s: %v %s (install: %s)", name, strings.Join(args, " "), err, bytes.TrimSpace(out), install)
	if os.Getenv(EnvRequireClients) == "1" {
		t.Fatalf("%s (%s=1)", msg, EnvRequireClients)
	}
	t.Skipf("skipping: %s; %s=1 makes this a failure", msg, EnvRequireClients)
}

// python is the first of $PGFENCE_TEST_PYTHON, python3 on PATH and
// Debian's /usr/bin/python3 that imports psycopg (a python3 of pyenv or a
// virtualenv on PATH does not see Debian's python3-psycopg).
func python(t *testing.T) string {
	t.Helper()
	candidates := []string{"python3", "/usr/bin/python3"}
	if p := os.Getenv("PGFENCE_TEST_PYTHON"); p != "" {
		candidates = []string{p}
	}
	for _, p := range candidates {
		if exec.CommandContext(t.Context(), p, "-c", "import psycopg").Run() == nil {
			return p
		}
	}
	requireClient(t, "apt-get install python3-psycopg, or pip install psycopg", candidates[len(candidates)-1], "-c", "import psycopg")
	return ""
}

// client is one of docs/clients.md's workers: how to start it on a URL of
// the server (postgres://...), as a named worker.
type client struct {
	name string
	// command checks that the client can run (skipping the test, or
	// failing it under PGFENCE_TEST_REQUIRE_CLIENTS=1) and returns a
	// function that gives the command line and environment for a worker.
	command func(t *testing.T) func(url, worker string) (args, env []string)
}

// jdbcJar is Debian's libpostgresql-jdbc-java.
const jdbcJar = "/usr/share/java/postgresql.jar"

var clients = []client{
	{"python", func(t *testing.T) func(string, string) ([]string, []string) {
		py := python(t)
		return func(url, worker string) ([]string, []string) {
			return []string{py, filepath.Join(clientsDir, "worker.py"), url, worker}, nil
		}
	}},
	{"node", func(t *testing.T) func(string, string) ([]string, []string) {
		modules, err := filepath.Abs("../.ci/node/node_modules")
		require.NoError(t, err)
		requireClient(t, "node, and npm install --prefix .ci/node pg@8.16.3", "node", "-e", "require(process.argv[1])", filepath.Join(modules, "pg"))
		return func(url, worker string) ([]string, []string) {
			return []string{"node", filepath.Join(clientsDir, "worker.js"), url, worker}, []string{"NODE_PATH=" + modules}
		}
	}},
	{"java", func(t *testing.T) func(string, string) ([]string, []string) {
		requireClient(t, "apt-get install default-jdk-headless libpostgresql-jdbc-java", "java", "-version")
		requireClient(t, "apt-get install libpostgresql-jdbc-java", "test", "-r", jdbcJar)
		return func(url, worker string) ([]string, []string) {
			return []string{"java", "-cp", jdbcJar, filepath.Join(clientsDir, "Worker.java"), jdbcURL(t, url), worker}, nil
		}
	}},
}

// jdbcURL turns postgres://user@host:port/db?k=v into JDBC's form.
func jdbcURL(t *testing.T, pgURL string) string {
	t.Helper()
	u, err := url.Parse(pgURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("user", u.User.Username())
	return fmt.Sprintf("jdbc:postgresql://%s%s?%s", u.Host, u.Path, q.Encode())
}

// clientTargets runs f against the database directly and through
// PgBouncer in transaction mode.
func clientTargets(t *testing.T, f func(t *testing.T, db *pgtest.DB, url string)) {
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		db := pgtest.Setup(t)
		f(t, db, db.URL)
	})
	t.Run("through PgBouncer", func(t *testing.T) {
		t.Parallel()
		db := pgtest.Setup(t)
		pb := pgtest.NewPgBouncer(t, db.URL)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("pgbouncer log:\n%s", pb.LogTail(40))
			}
		})
		f(t, db, pb.URL(db.URL))
	})
}

// queueSchema creates docs/clients.md's queue and result tables (and its
// two jobs) and adds n more jobs.
func queueSchema(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	sql, err := os.ReadFile(filepath.Join(clientsDir, "schema.sql"))
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), string(sql))
	require.NoError(t, err)
	_, err = pool.Exec(t.Context(), `INSERT INTO jobs (payload) SELECT 'job ' || g FROM generate_series(1, $1::int) g`, n)
	require.NoError(t, err)
}

// requireEveryJobDoneOnce checks that every job is done, with one result
// written under the latest token of its resource.
func requireEveryJobDoneOnce(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var jobs, done, results, underLatest int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM jobs), (SELECT count(*) FROM jobs WHERE done),
		(SELECT count(*) FROM job_results),
		(SELECT count(*) FROM job_results r JOIN fence.lease l ON l.resource = 'job:' || r.job_id AND l.token = r.fence_token)`).
		Scan(&jobs, &done, &results, &underLatest))
	require.Equal(t, jobs, done, "every job done")
	require.Equal(t, jobs, results, "one result per job")
	require.Equal(t, jobs, underLatest, "each written under the latest token of job:N")
}

// clientProcess is a client of docs/clients.md running as a child process,
// its output read line by line.
type clientProcess struct {
	cmd   *exec.Cmd
	lines chan string
	mu    sync.Mutex
	all   []string
	done  chan error
}

func startClient(t *testing.T, env []string, name string, args ...string) *clientProcess {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &clientProcess{cmd: cmd, lines: make(chan string, 1000), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.mu.Lock()
			p.all = append(p.all, sc.Text())
			p.mu.Unlock()
			p.lines <- sc.Text()
		}
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%s: %w\nstderr:\n%s", name, err, stderr.String())
		}
		p.done <- err
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// expect waits for the next line that matches re and returns its groups.
func (p *clientProcess) expect(t *testing.T, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				err := <-p.done
				p.done <- err
				t.Fatalf("the client ended (%v) before printing %q; it printed:\n%s", err, re, p.output())
			}
			if m := rx.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-timeout:
			t.Fatalf("no line %q within a minute; printed:\n%s", re, p.output())
		}
	}
}

func (p *clientProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.all, "\n")
}

// wait waits for the process to exit and fails the test on a non-zero exit.
func (p *clientProcess) wait(t *testing.T) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case _, ok := <-p.lines:
			if ok {
				continue
			}
			err := <-p.done
			p.done <- err
			require.NoError(t, err, "output:\n%s", p.output())
			return
		case <-timeout:
			t.Fatalf("the client did not exit within a minute; printed:\n%s", p.output())
		}
	}
}

// waitStopped waits until the process is stopped (state T in /proc).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		require.NoError(t, err)
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "T" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d never stopped", pid)
}

// TestClientWorkersDrainTheQueue: three workers of docs/clients.md (in
// Python with psycopg, in Node with node-postgres, in Java with JDBC)
// share a SKIP LOCKED queue of 6 jobs, directly and through PgBouncer in
// transaction mode; each job is done once, its result written under the
// latest token of job:N.
func TestClientWorkersDrainTheQueue(t *testing.T) {
	t.Parallel()
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			command := c.command(t)
			clientTargets(t, func(t *testing.T, db *pgtest.DB, url string) {
				queueSchema(t, db.Pool, 4)
				var ws []*clientProcess
				for i := range 3 {
					args, env := command(url, fmt.Sprintf("%s-%d", c.name, i))
					ws = append(ws, startClient(t, append(env, "TTL=5"), args[0], args[1:]...))
				}
				for _, w := range ws {
					w.wait(t)
					require.NotContains(t, w.output(), "refused")
				}
				requireEveryJobDoneOnce(t, db.Pool)
			})
		})
	}
}

// TestClientWorkerPausedPastItsTTLIsRefused: worker A claims job 1 and is
// stopped (SIGSTOP, sent by itself right after its last check of the
// deadline) past its TTL; worker B takes job:1 and writes its result; A,
// continued, writes under its old token and the database refuses it with
// FN001, which A tells apart by the error's SQLSTATE. B's result stays.
// For each client, directly and through PgBouncer.
func TestClientWorkerPausedPastItsTTLIsRefused(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc to see the worker stopped")
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			command := c.command(t)
			clientTargets(t, func(t *testing.T, db *pgtest.DB, url string) {
				queueSchema(t, db.Pool, 0)
				args, env := command(url, c.name+"-A")
				a := startClient(t, append(env, "TTL=3", "MAX_JOBS=1", "PAUSE_BEFORE_WRITE=1"), args[0], args[1:]...)
				tokA := a.expect(t, `^claimed 1 token (\d+)$`)[1]
				waitStopped(t, a.cmd.Process.Pid)
				waitForQuery(t, db, `SELECT NOT live FROM fence.leases WHERE resource = 'job:1'`)

				args, env = command(url, c.name+"-B")
				b := startClient(t, append(env, "TTL=5", "MAX_JOBS=1"), args[0], args[1:]...)
				tokB := b.expect(t, `^claimed 1 token (\d+)$`)[1]
				b.expect(t, `^done 1$`)
				b.wait(t)
				require.NotEqual(t, tokA, tokB)

				require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
				m := a.expect(t, `^refused 1 FN001 (.*)$`)
				require.Equal(t, fmt.Sprintf("resource=job:1 token=%s latest=%s", tokA, tokB), m[1])
				a.wait(t)

				var result, token string
				require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT result, fence_token::text FROM job_results WHERE job_id = 1`).Scan(&result, &token))
				require.Equal(t, "FIRST", result)
				require.Equal(t, tokB, token, "B's result, under B's token")
			})
		})
	}
}

// waitForQuery polls query (a boolean) until it answers true.
func waitForQuery(t *testing.T, db *pgtest.DB, query string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, query).Scan(&ok))
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never true: %s", query)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestPsycopgPreparesBehindPgBouncerUnlessTold (issue 28 item 2): psycopg
// prepares a statement after its fifth run on a connection, and PgBouncer
// in transaction mode hands that server connection to other clients; with
// prepare_threshold=None (docs/clients.md) no call fails. Six threads of 60
// calls each through PgBouncer. How many fail with the default depends on
// the PgBouncer version (1.21 and newer can keep prepared statements per
// client) and on the interleaving, so that count is logged, not required.
func TestPsycopgPreparesBehindPgBouncerUnlessTold(t *testing.T) {
	t.Parallel()
	py := python(t)
	db := pgtest.Setup(t)
	pb := pgtest.NewPgBouncer(t, db.URL)
	run := func(mode string) string {
		out, err := exec.CommandContext(t.Context(), py, filepath.Join(clientsDir, "prepare_threshold.py"), pb.URL(db.URL), mode).CombinedOutput()
		require.NoError(t, err, "%s\npgbouncer log:\n%s", out, pb.LogTail(20))
		return strings.TrimSpace(string(out))
	}
	require.Equal(t, "0 {}", run("none"), "prepare_threshold=None: no call fails")
	t.Logf("psycopg's default prepare_threshold through %s: %s errors (by SQLSTATE)", pb.Version, run("default"))
}

// TestPsqlSessionIsRefused: docs/clients.md's psql session, directly and
// through PgBouncer: C gets NULL while A holds job:1, B's grant after A's
// TTL, A's write under the old token refused with FN001, B's result kept.
func TestPsqlSessionIsRefused(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("psql"); err != nil {
		requireClient(t, "apt-get install postgresql-client", "psql", "--version")
	}
	clientTargets(t, func(t *testing.T, db *pgtest.DB, url string) {
		queueSchema(t, db.Pool, 0)
		out, err := exec.CommandContext(t.Context(), "psql", url, "-X", "-q", "-f", filepath.Join(clientsDir, "session.sql")).CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Regexp(t, `(?s)A holds job:1 with token \d+\nC is refused while A holds it \(NULL: t\)\nB holds job:1 with token \d+\n.*ERROR:  pgfence: stale fencing token.*\nA was refused: FN001\nB released job:1: t\n$`, string(out))
		var result string
		require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT result FROM job_results WHERE job_id = 1`).Scan(&result))
		require.Equal(t, "by B", result)
	})
}

// TestClientsDocQuotesTheFiles: every block of docs/clients.md marked
// <!-- file: PATH --> is that file, whole, and every client file is
// quoted, so the page shows exactly what the tests run.
func TestClientsDocQuotesTheFiles(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/clients.md")
	require.NoError(t, err)
	quoted := map[string]bool{}
	for _, m := range regexp.MustCompile("(?s)<!-- file: (\\S+) -->\n```\\w*\n(.*?)```\n").FindAllStringSubmatch(string(doc), -1) {
		file, err := os.ReadFile(filepath.Join("..", m[1]))
		require.NoError(t, err, "docs/clients.md quotes %s", m[1])
		require.Equal(t, string(file), m[2], "docs/clients.md's copy of %s", m[1])
		quoted[filepath.Base(m[1])] = true
	}
	entries, err := os.ReadDir(clientsDir)
	require.NoError(t, err)
	for _, e := range entries {
		if e.Name() == "prepare_threshold.py" {
			continue // a test helper
		}
		require.True(t, quoted[e.Name()], "docs/clients.md does not quote %s/%s", clientsDir, e.Name())
	}
}
