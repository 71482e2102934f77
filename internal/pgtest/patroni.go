package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// EnvRequirePatroni, set to 1, turns "no patroni or etcd binary" from a skip
// into a failure (CI's PostgreSQL 15 leg installs Debian's patroni and
// etcd-server and sets it).
const EnvRequirePatroni = "PGFENCE_TEST_REQUIRE_PATRONI"

// Patroni's timing in the harness (its dynamic configuration): the leader
// key lives PatroniTTL after its last refresh, every node runs its loop
// every second (loop_wait) and gives a DCS or PostgreSQL call
// retry_timeout. A node that dies unannounced is replaced once its key
// expired, so PatroniTTL bounds an unplanned failover from below.
const (
	PatroniTTL          = 10 * time.Second
	patroniLoopWait     = 1
	patroniRetryTimeout = 4
	// PatroniMaxLag is maximum_lag_on_failover: a replica that lags more
	// bytes than this behind the last known leader position is not
	// promoted.
	PatroniMaxLag = 1 << 20
)

// PatroniOptions tunes NewPatroni.
type PatroniOptions struct {
	// Nodes is the number of Patroni nodes (default 3, at least 2).
	Nodes int
	// SynchronousMode sets Patroni's synchronous_mode: true, so that the
	// leader names one replica in synchronous_standby_names and only that
	// replica may be promoted (default false: asynchronous replication).
	SynchronousMode bool
	// Config holds extra PostgreSQL parameters for every node (name to
	// value, written as YAML strings).
	Config map[string]string
}

// Patroni is a Patroni cluster for one test: one etcd member and Nodes
// Patroni nodes (Debian's patroni, etcd3 DCS) over the run's PostgreSQL
// binaries, everything on ports of its own on 127.0.0.1, its data under one
// scratch directory. The first node bootstraps it (initdb); the database
// "fence" is created and migrated on it before the others clone it with
// pg_basebackup. Everything it started is stopped, and the directory
// removed, when the test ends.
type Patroni struct {
	// Scope is the cluster's name in the DCS.
	Scope string
	// Etcd is the DCS.
	Etcd *Etcd
	// Nodes are the Patroni nodes, in the order they were started.
	Nodes []*PatroniNode
	// Version is what `patroni --version` printed.
	Version string
	// Rewind reports whether use_pg_rewind is on (the bin directory has
	// pg_rewind).
	Rewind  bool
	dir     string
	bin     string
	ctl     string
	sync    bool
	started time.Time
}

// PatroniNode is one Patroni process and the PostgreSQL it runs.
type PatroniNode struct {
	// Name is the node's name in the cluster.
	Name string
	// Port is PostgreSQL's port, APIPort Patroni's REST API's.
	Port, APIPort int
	// Dir holds the node's configuration, logs and data directory (Data).
	Dir, Data string
	// ConfigFile is the node's patroni.yml (patronictl -c reads it too).
	ConfigFile string
	c          *Patroni
	d          *daemon
}

// NewPatroni starts a Patroni cluster and waits until its first node leads
// and every other node streams from it. Without patroni or etcd (or
// without pg_basebackup, which Patroni clones replicas with, in the bin
// directory) the test is skipped, or failed under
// PGFENCE_TEST_REQUIRE_PATRONI=1; under go test -short it is skipped.
func NewPatroni(t testing.TB, opts PatroniOptions) *Patroni {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: -short: skipping a test that needs a Patroni cluster")
	}
	skip := func(why string) {
		t.Helper()
		if os.Getenv(EnvRequirePatroni) == "1" {
			t.Fatalf("pgtest: %s (%s=1)", why, EnvRequirePatroni)
		}
		t.Skipf("pgtest: skipping, %s (install Debian's patroni and etcd-server, or set %s=1 to fail instead)", why, EnvRequirePatroni)
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 2 {
		t.Fatalf("pgtest: PatroniOptions.Nodes %d: at least 2", opts.Nodes)
	}
	bins, err := pgcluster.LocalBins(os.Getenv(EnvBinDir))
	if err != nil {
		skipOrFatal(t, &unavailableError{reasons: []string{"NewPatroni needs local PostgreSQL binaries: " + err.Error()}})
	}
	patroniBin, err1 := exec.LookPath("patroni")
	ctlBin, err2 := exec.LookPath("patronictl")
	if err := errors.Join(err1, err2); err != nil {
		skip("no patroni or patronictl on PATH")
	}
	etcdBin, err := findEtcd()
	if err != nil {
		skip(err.Error())
	}
	for _, tool := range []string{"pg_basebackup", "pg_controldata"} {
		if _, err := os.Stat(bins.Path(tool)); err != nil {
			skip(fmt.Sprintf("Patroni needs %s, which %s lacks", tool, bins.Dir))
		}
	}
	if err := pgcluster.CheckCredential(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	reapStalePatroni()

	dir, err := os.MkdirTemp(pgcluster.RAMDir(), patroniPrefix)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := pgcluster.ChownToServerUser(dir); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	version := "patroni"
	if out, err := exec.Command(patroniBin, "--version").Output(); err == nil {
		version = strings.TrimSpace(string(out))
	}
	_, rewindErr := os.Stat(bins.Path("pg_rewind"))
	c := &Patroni{
		Scope:   "pgtest-" + strings.TrimPrefix(filepath.Base(dir), patroniPrefix),
		Version: version,
		Rewind:  rewindErr == nil,
		dir:     dir,
		bin:     patroniBin,
		ctl:     ctlBin,
		sync:    opts.SynchronousMode,
		started: time.Now(),
	}
	t.Cleanup(func() { c.cleanup(t) })

	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if c.Etcd, err = startEtcd(ctx, etcdBin, dir); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	for i := range opts.Nodes {
		n, err := c.newNode(i+1, bins, opts)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		c.Nodes = append(c.Nodes, n)
	}

	// The first node bootstraps; the fence database is created and migrated
	// before the others clone it.
	if err := c.Nodes[0].start(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	leader, err := c.waitLeader(ctx, "")
	if err != nil {
		t.Fatalf("pgtest: patroni bootstrap: %v", err)
	}
	if err := createFenceDB(ctx, leader.URL("postgres")); err != nil {
		t.Fatalf("pgtest: patroni: %v", err)
	}
	if err := migrateURL(ctx, leader.URL(ClusterDB)); err != nil {
		t.Fatalf("pgtest: patroni: %v", err)
	}
	for _, n := range c.Nodes[1:] {
		if err := n.start(); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	if err := c.waitStreaming(ctx, opts.Nodes-1); err != nil {
		t.Fatalf("pgtest: patroni replicas: %v", err)
	}
	mode := "asynchronous"
	if c.sync {
		mode = "synchronous_mode"
	}
	t.Logf("pgtest: %s cluster %s (%d nodes, %s, use_pg_rewind %v) on %s, %s at %s, ready in %s",
		version, c.Scope, opts.Nodes, mode, c.Rewind, bins.Dir, c.Etcd.Version, c.Etcd.ClientURL, time.Since(c.started).Round(10*time.Millisecond))
	return c
}

const patroniPrefix = "pgfence-patroni-"

// newNode writes the configuration of node i.
func (c *Patroni) newNode(i int, bins pgcluster.Bins, opts PatroniOptions) (*PatroniNode, error) {
	name := "node" + strconv.Itoa(i)
	ndir := filepath.Join(c.dir, name)
	if err := os.Mkdir(ndir, 0o700); err != nil {
		return nil, err
	}
	if err := pgcluster.ChownToServerUser(ndir); err != nil {
		return nil, err
	}
	port, err1 := pgcluster.FreePort()
	api, err2 := pgcluster.FreePort()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	n := &PatroniNode{
		Name: name, Port: port, APIPort: api, Dir: ndir,
		Data:       filepath.Join(ndir, "data"),
		ConfigFile: filepath.Join(ndir, "patroni.yml"),
		c:          c,
	}
	// The dynamic configuration (bootstrap.dcs) holds what every node
	// shares; the node's own directories go in its local section.
	params := map[string]string{
		"wal_level":         "replica",
		"hot_standby":       "on",
		"wal_log_hints":     "on",
		"max_wal_senders":   "10",
		"max_connections":   "100",
		"shared_buffers":    "32MB",
		"fsync":             "on",
		"logging_collector": "on",
		"log_filename":      "postgresql.log",
		"log_line_prefix":   "%m [%p] ",
	}
	for k, v := range opts.Config {
		params[k] = v
	}
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var p strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&p, "        %s: %s\n", k, yamlString(params[k]))
	}
	conf := fmt.Sprintf(`scope: %[1]s
name: %[2]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[3]d
  connect_address: 127.0.0.1:%[3]d
etcd3:
  hosts: %[4]s
  protocol: http
watchdog:
  mode: "off"
bootstrap:
  dcs:
    ttl: %[5]d
    loop_wait: %[6]d
    retry_timeout: %[7]d
    maximum_lag_on_failover: %[8]d
    check_timeline: true
    synchronous_mode: %[9]v
    postgresql:
      use_pg_rewind: %[10]v
      use_slots: true
      parameters:
%[11]s  initdb:
    - encoding: UTF8
    - locale: C
    - auth: trust
postgresql:
  listen: 127.0.0.1:%[12]d
  connect_address: 127.0.0.1:%[12]d
  data_dir: %[13]s
  bin_dir: %[14]s
  pgpass: %[15]s
  remove_data_directory_on_rewind_failure: false
  remove_data_directory_on_diverged_timelines: false
  basebackup:
    - checkpoint: fast
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: %[16]s
    log_directory: %[16]s
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
`, c.Scope, name, api, strings.TrimPrefix(c.Etcd.ClientURL, "http://"),
		int(PatroniTTL/time.Second), patroniLoopWait, patroniRetryTimeout, PatroniMaxLag, c.sync, c.Rewind,
		p.String(), port, yamlString(n.Data), yamlString(bins.Dir), yamlString(filepath.Join(ndir, "pgpass")), yamlString(ndir))
	if err := os.WriteFile(n.ConfigFile, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	return n, pgcluster.ChownToServerUser(n.ConfigFile)
}

// yamlString quotes s as a YAML double-quoted scalar.
func yamlString(s string) string { b, _ := json.Marshal(s); return string(b) }

// createFenceDB creates the database ClusterDB through the superuser URL of
// the leader's postgres database.
func createFenceDB(ctx context.Context, adminURL string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = pgcluster.CreateDB(ctx, conn, ClusterDB, "")
	return err
}

// start runs the node's Patroni as the server's OS user.
func (n *PatroniNode) start() error {
	if n.d != nil && n.d.running() {
		return fmt.Errorf("patroni %s already runs", n.Name)
	}
	cmd, err := pgcluster.ServerCommand(n.Dir, n.c.bin, n.ConfigFile)
	if err != nil {
		return err
	}
	d, err := startDaemon("patroni "+n.Name, filepath.Join(n.Dir, "patroni.log"), cmd)
	if err != nil {
		return err
	}
	n.d = d
	return nil
}

// cleanup stops every node and etcd, then removes the directory (kept, with
// the logs' tails printed, when the test failed and PGFENCE_TEST_KEEP=1).
func (c *Patroni) cleanup(t testing.TB) {
	if t.Failed() {
		for _, n := range c.Nodes {
			t.Logf("pgtest: %s patroni log tail:\n%s\n%s postgresql log tail:\n%s", n.Name, n.PatroniLogTail(25), n.Name, n.LogTail(25))
		}
		if c.Etcd != nil {
			t.Logf("pgtest: etcd log tail:\n%s", c.Etcd.LogTail(10))
		}
	}
	for _, n := range c.Nodes {
		n.stop()
	}
	if c.Etcd != nil {
		c.Etcd.Stop()
	}
	if t.Failed() && keep() {
		_ = os.Remove(filepath.Join(c.dir, "owner.pid"))
		t.Logf("pgtest: %s=1: keeping %s", EnvKeep, c.dir)
		return
	}
	if err := os.RemoveAll(c.dir); err != nil {
		t.Errorf("pgtest: remove %s: %v", c.dir, err)
	}
}

// stop ends the node: Patroni gets SIGTERM (it stops PostgreSQL in fast
// mode), SIGKILL after 20 s, and a postmaster that outlived it is killed.
func (n *PatroniNode) stop() {
	if n.d != nil {
		n.d.stop(20 * time.Second)
	}
	if _, err := killPostmaster(n.Data, 30*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
	}
}

// reapStalePatroni stops what a test process that died (a timeout panic,
// a kill) left of its Patroni clusters: postmasters by their pid files,
// Patroni and etcd by their command lines naming the directory, and removes
// the directories.
func reapStalePatroni() {
	var dirs []string
	for _, parent := range []string{os.TempDir(), pgcluster.RAMDir()} {
		if parent != "" {
			m, _ := filepath.Glob(filepath.Join(parent, patroniPrefix+"*"))
			dirs = append(dirs, m...)
		}
	}
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() || pidAlive(pid) {
			continue
		}
		killByCommandLine(dir)
		nodes, _ := filepath.Glob(filepath.Join(dir, "node*", "data"))
		for _, data := range nodes {
			_, _ = killPostmaster(data, 10*time.Second)
		}
		_ = os.RemoveAll(dir)
	}
}

// killByCommandLine kills (SIGKILL) every process whose command line
// mentions dir: the Patroni nodes (their configuration file) and etcd (its
// data directory) of a dead test process.
func killByCommandLine(dir string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), dir+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// URL returns the superuser URL of database db on every node, in node
// order, with target_session_attrs=read-write: a client that connects
// through it reaches whichever node is primary, trying the hosts in turn
// (each attempt bounded by connect_timeout, 2 s).
func (c *Patroni) URL(db string) string {
	hosts := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(n.Port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", strings.Join(hosts, ","), db)
}

// URL returns the superuser URL of database db on this node only.
func (n *PatroniNode) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", n.Port, db)
}

// PatroniMember is one node as Patroni's REST API (GET /cluster) lists it.
type PatroniMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, replica, sync_standby
	State    string `json:"state"` // running, starting, stopped, ...
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"` // bytes, or "unknown"
}

// Members returns the cluster as the first node that answers GET /cluster
// sees it.
func (c *Patroni) Members(ctx context.Context) ([]PatroniMember, error) {
	var errs []error
	for _, n := range c.Nodes {
		var body struct {
			Members []PatroniMember `json:"members"`
		}
		if err := n.get(ctx, "/cluster", &body); err != nil {
			errs = append(errs, err)
			continue
		}
		return body.Members, nil
	}
	return nil, errors.Join(errs...)
}

// get reads path of the node's REST API into v (JSON), in at most 2 s.
func (n *PatroniNode) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(n.APIPort)+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s GET %s: %s", n.Name, path, resp.Status)
	}
	return json.Unmarshal(b, v)
}

// Node returns the node named name, nil when there is none.
func (c *Patroni) Node(name string) *PatroniNode {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// WaitLeader waits (at most two minutes) until a node other than notName
// ("" for any) holds the leader key, reports itself running, and its
// PostgreSQL accepts writes; it returns that node.
func (c *Patroni) WaitLeader(t testing.TB, notName string) *PatroniNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	n, err := c.waitLeader(ctx, notName)
	if err != nil {
		t.Fatalf("pgtest: patroni: %v", err)
	}
	return n
}

func (c *Patroni) waitLeader(ctx context.Context, notName string) (*PatroniNode, error) {
	var last error
	for {
		members, err := c.Members(ctx)
		if err == nil {
			last = fmt.Errorf("no running leader other than %q among %+v", notName, members)
			for _, m := range members {
				if m.Role != "leader" || m.State != "running" || m.Name == notName {
					continue
				}
				n := c.Node(m.Name)
				if n == nil {
					continue
				}
				if err := writable(ctx, n.URL("postgres")); err != nil {
					last = err
					continue
				}
				return n, nil
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writable reports, as an error, whether the server at connURL is not a
// primary.
func writable(ctx context.Context, connURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return err
	}
	if inRecovery {
		return errors.New("still in recovery")
	}
	return nil
}

// WaitStreaming waits (at most two minutes) until the leader has n
// replicas streaming from it, and under synchronous_mode one of them
// synchronous.
func (c *Patroni) WaitStreaming(t testing.TB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := c.waitStreaming(ctx, n); err != nil {
		t.Fatalf("pgtest: patroni: %v", err)
	}
}

func (c *Patroni) waitStreaming(ctx context.Context, want int) error {
	var last error
	for {
		leader, err := c.waitLeader(ctx, "")
		if err != nil {
			return err
		}
		// Patroni's replicas connect under their node's name; pg_basebackup's
		// WAL stream (application_name pg_basebackup) is listed as
		// streaming too while a replica is being cloned, and must not count.
		var others []string
		for _, n := range c.Nodes {
			if n != leader {
				others = append(others, n.Name)
			}
		}
		err = pgcluster.WaitReady(ctx, leader.URL("postgres"), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
			var streaming int
			var sync []string
			err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'streaming'),
				coalesce(array_agg(application_name) FILTER (WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')), '{}')
				FROM pg_stat_replication WHERE application_name = ANY ($1)`, others).Scan(&streaming, &sync)
			if err != nil {
				return false, err
			}
			last = fmt.Errorf("%s: %d of %d replicas streaming, synchronous: %v", leader.Name, streaming, want, sync)
			if streaming < want {
				return false, nil
			}
			if !c.sync {
				return true, nil
			}
			// Patroni writes its /sync key (which alone lets a replica be
			// promoted in synchronous_mode) one loop after PostgreSQL
			// reports the standby synchronous; a leader lost in between
			// leaves no node allowed to take over. Wait for both.
			members, err := c.Members(ctx)
			if err != nil {
				return false, nil
			}
			for _, m := range members {
				if m.Role == "sync_standby" && slices.Contains(sync, m.Name) {
					return true, nil
				}
			}
			last = fmt.Errorf("%w; Patroni's members: %+v", last, members)
			return false, nil
		})
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last: %v)", err, last)
		}
	}
}

// Switchover asks Patroni for a planned switchover from the current leader
// to candidate (patronictl switchover --force) and waits until candidate
// leads and accepts writes.
func (c *Patroni) Switchover(t testing.TB, leader, candidate *PatroniNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	out, err := c.Ctl(ctx, "switchover", "--leader", leader.Name, "--candidate", candidate.Name, "--force", c.Scope)
	if err != nil {
		t.Fatalf("pgtest: patronictl switchover: %v\n%s", err, out)
	}
	for {
		n, err := c.waitLeader(ctx, leader.Name)
		if err != nil {
			t.Fatalf("pgtest: after switchover: %v\n%s", err, out)
		}
		if n == candidate {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pgtest: switchover led to %s, not %s", n.Name, candidate.Name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Ctl runs patronictl with the first node's configuration file and args,
// bounded by ctx, and returns its combined output.
func (c *Patroni) Ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.ctl, append([]string{"-c", c.Nodes[0].ConfigFile}, args...)...)
	cmd.Env = append(scrubEnv(os.Environ(), "PATRONI"), "LC_ALL=C.UTF-8", "LANG=C.UTF-8")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// KillPostmaster kills the node's postmaster and its backends (SIGKILL);
// Patroni goes on running and decides what follows. It returns the pid it
// killed.
func (n *PatroniNode) KillPostmaster(t testing.TB) int {
	t.Helper()
	pid, err := killPostmaster(n.Data, 30*time.Second)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if pid == 0 {
		t.Fatalf("pgtest: %s: no postmaster running", n.Name)
	}
	return pid
}

// Kill kills the whole node at once, as a machine that loses power: its
// Patroni process (SIGKILL, so it cannot release the leader key) and its
// PostgreSQL. The leader key then expires after PatroniTTL. Start brings
// the node back.
func (n *PatroniNode) Kill(t testing.TB) {
	t.Helper()
	if n.d != nil {
		n.d.kill()
	}
	if _, err := killPostmaster(n.Data, 30*time.Second); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// Stop stops the node's Patroni as a service manager would (SIGTERM):
// Patroni shuts its PostgreSQL down (fast mode) and, when it leads, gives
// up the leader key, so that a replica takes over without waiting for the
// key to expire. Start brings the node back.
func (n *PatroniNode) Stop(t testing.TB) {
	t.Helper()
	if n.d == nil || !n.d.running() {
		t.Fatalf("pgtest: %s: patroni does not run", n.Name)
	}
	n.stop()
}

// Start starts the node's Patroni again after Kill or Stop; it rejoins the cluster
// on its own (rewound with pg_rewind when its timeline diverged).
func (n *PatroniNode) Start(t testing.TB) {
	t.Helper()
	if err := n.start(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// Running reports whether the node's Patroni process runs.
func (n *PatroniNode) Running() bool { return n.d != nil && n.d.running() }

// PIDs returns the ids of the node's Patroni process and postmaster (0
// for one that does not run).
func (n *PatroniNode) PIDs() (patroni, postmaster int) {
	if n.Running() {
		patroni = n.d.pid()
	}
	if pid := postmasterPID(n.Data); pidAlive(pid) {
		postmaster = pid
	}
	return patroni, postmaster
}

// PatroniLogTail returns the last n lines of the node's Patroni log.
func (n *PatroniNode) PatroniLogTail(lines int) string {
	return pgcluster.TailFile(filepath.Join(n.Dir, "patroni.log"), n.Name+" patroni log", lines)
}

// PatroniLog returns the node's whole Patroni log.
func (n *PatroniNode) PatroniLog() string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "patroni.log"))
	return string(b)
}

// LogTail returns the last n lines of the node's PostgreSQL log.
func (n *PatroniNode) LogTail(lines int) string {
	return pgcluster.TailFile(filepath.Join(n.Dir, "postgresql.log"), n.Name+" postgresql log", lines)
}

// SetSynchronousMode switches Patroni's synchronous_mode in the DCS
// (patronictl edit-config) and, when on, waits until a replica is
// synchronous; WaitStreaming then requires one.
func (c *Patroni) SetSynchronousMode(t testing.TB, on bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	out, err := c.Ctl(ctx, "edit-config", "--quiet", "--force", "--set", "synchronous_mode="+strconv.FormatBool(on), c.Scope)
	if err != nil {
		t.Fatalf("pgtest: patronictl edit-config: %v\n%s", err, out)
	}
	c.sync = on
	if err := c.waitStreaming(ctx, len(c.Nodes)-1); err != nil {
		t.Fatalf("pgtest: patroni after synchronous_mode=%v: %v", on, err)
	}
}

// SynchronousMode reports whether synchronous_mode is on.
func (c *Patroni) SynchronousMode() bool { return c.sync }

// Replica returns a node that may take over from the leader: under
// synchronous_mode the synchronous standby (the only one Patroni promotes),
// else the first streaming replica that Patroni lists.
func (c *Patroni) Replica(t testing.TB) *PatroniNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	for {
		members, err := c.Members(ctx)
		if err == nil {
			for _, m := range members {
				if m.State == "running" && (m.Role == "sync_standby" || !c.sync && m.Role == "replica") {
					if n := c.Node(m.Name); n != nil {
						return n
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pgtest: patroni: no replica to take over (%v, %+v)", err, members)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
