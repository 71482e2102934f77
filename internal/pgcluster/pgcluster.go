// Package pgcluster is the one place that makes scratch PostgreSQL servers
// and databases, for the test harness (internal/pgtest), pgfence demo and
// pgfence bench:
//
//   - throwaway clusters from the server binaries installed on this machine
//     ([LocalBins], [StartThrowaway], [Instance]): initdb into a temporary
//     directory, start on a free loopback port, stop and remove. As root,
//     the binaries run as the OS user postgres (initdb refuses root);
//   - waiting for a server to accept connections, or to reach a state
//     ([WaitReady]);
//   - randomly named databases, created and force-dropped
//     ([CreateScratchDB], [CreateDB], [DropDB]).
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Bins is a directory holding the server binaries of one PostgreSQL
// version. All tools are taken from the same directory, so that initdb,
// postgres and pg_basebackup agree on the version (and Debian's pg_wrapper
// scripts in /usr/bin are bypassed).
type Bins struct{ Dir string }

// Path returns the path of the server tool named tool (initdb, pg_ctl...).
func (b Bins) Path(tool string) string { return filepath.Join(b.Dir, tool) }

var (
	binsOnce sync.Once
	binsVal  Bins
	binsErr  error
)

// FindBins locates initdb and pg_ctl: override (a directory) when set, then PATH,
// then pg_config --bindir, then well-known install directories (highest
// version first).
func FindBins(override string) (Bins, error) {
	binsOnce.Do(func() { binsVal, binsErr = lookupBins(override) })
	return binsVal, binsErr
}

func lookupBins(override string) (Bins, error) {
	usable := func(dir string) bool {
		for _, tool := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, tool)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := override; d != "" {
		if usable(d) {
			return Bins{Dir: d}, nil
		}
		return Bins{}, fmt.Errorf("%s lacks initdb, pg_ctl or postgres", d)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil && usable(filepath.Dir(r)) {
			return Bins{Dir: filepath.Dir(r)}, nil
		}
		if usable(filepath.Dir(p)) {
			return Bins{Dir: filepath.Dir(p)}, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); usable(d) {
			return Bins{Dir: d}, nil
		}
	}
	var dirs []string
	for _, pattern := range []string{
		"/usr/lib/postgresql/*/bin",
		"/usr/pgsql-*/bin",
		"/opt/homebrew/opt/postgresql@*/bin",
		"/usr/local/opt/postgresql@*/bin",
		"/usr/local/pgsql/bin",
	} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	sort.SliceStable(dirs, func(i, j int) bool { return dirVersion(dirs[i]) > dirVersion(dirs[j]) })
	for _, d := range dirs {
		if usable(d) {
			return Bins{Dir: d}, nil
		}
	}
	return Bins{}, errors.New("initdb/pg_ctl not found (PATH, pg_config --bindir, /usr/lib/postgresql/*/bin)")
}

var versionRe = regexp.MustCompile(`(\d+)(?:\.(\d+))?`)

// dirVersion extracts a sortable version number from an install directory
// such as /usr/lib/postgresql/15/bin or /usr/pgsql-9.6/bin.
func dirVersion(dir string) int {
	m := versionRe.FindAllStringSubmatch(dir, -1)
	if len(m) == 0 {
		return 0
	}
	last := m[len(m)-1]
	major, _ := strconv.Atoi(last[1])
	minor, _ := strconv.Atoi(last[2])
	return major*1000 + minor
}

// osCred is the OS user that server binaries run as.
type osCred struct{ uid, gid uint32 }

var (
	credOnce sync.Once
	credVal  *osCred
	credErr  error
)

// CheckCredential reports whether the server binaries can be run: not as
// root, so as root only when the OS user postgres exists.
func CheckCredential() error {
	_, err := pgCredential()
	return err
}

// pgCredential returns the credential to run server binaries with: nil when
// not root (they run as the current user), the OS user postgres when root,
// because initdb and postgres refuse to run as root.
func pgCredential() (*osCred, error) {
	credOnce.Do(func() {
		if os.Geteuid() != 0 {
			return
		}
		u, err := user.Lookup("postgres")
		if err != nil {
			credErr = fmt.Errorf("running as root and no OS user postgres to run the server as: %w", err)
			return
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			credErr = fmt.Errorf("OS user postgres has a non-numeric uid/gid %s/%s", u.Uid, u.Gid)
			return
		}
		credVal = &osCred{uid: uint32(uid), gid: uint32(gid)}
	})
	return credVal, credErr
}

// Instance is one throwaway cluster on disk: base holds the data directory,
// the server log, the unix socket and an owner file naming the test process,
// so that a later run can reap it if this one dies before cleaning up.
type Instance struct {
	// Bins is where the server binaries come from.
	Bins Bins
	// Base is the cluster's directory: data directory, log, unix socket.
	Base string
	// Data is the data directory.
	Data string
	// Logfile is the server log.
	Logfile string
	// Port is the loopback TCP port the server listens on.
	Port int
}

const instancePrefix = "pgfence-pg-"

// Timeout bounds each server operation (start, stop, initdb).
const Timeout = 2 * time.Minute

// New creates the directory of a new cluster in the temporary directory,
// owned by the user the server runs as.
func New(bins Bins) (*Instance, error) { return NewIn(bins, "") }

// NewIn is New in directory parent ("": the temporary directory), which
// must be os.TempDir() or RAMDir(): the directories where reapStale looks
// for clusters that a dead process left behind.
func NewIn(bins Bins, parent string) (*Instance, error) {
	reapStale(bins)
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	base, err := os.MkdirTemp(parent, instancePrefix)
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(base, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(base)
		return nil, fmt.Errorf("write owner file: %w", err)
	}
	if cred != nil {
		if err := os.Chown(base, int(cred.uid), int(cred.gid)); err != nil {
			os.RemoveAll(base)
			return nil, fmt.Errorf("chown %s to the postgres user: %w", base, err)
		}
	}
	return &Instance{
		Bins:    bins,
		Base:    base,
		Data:    filepath.Join(base, "data"),
		Logfile: filepath.Join(base, "server.log"),
	}, nil
}

// Initdb creates the data directory and appends conf lines to
// postgresql.conf.
func (in *Instance) Initdb(ctx context.Context, conf []string) error {
	if _, err := in.Run(ctx, "initdb", "-D", in.Data, "-A", "trust", "-U", "postgres",
		"--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
		return err
	}
	return in.AppendConf(append([]string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = " + QuoteConf(in.Base),
	}, conf...))
}

// AppendConf appends settings to postgresql.conf; later lines win, which is
// how a standby overrides the port it inherited from its primary.
func (in *Instance) AppendConf(lines []string) error {
	f, err := os.OpenFile(filepath.Join(in.Data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open postgresql.conf: %w", err)
	}
	_, err = f.WriteString("\n# pgtest\n" + strings.Join(lines, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("append to postgresql.conf: %w", err)
	}
	return nil
}

// StartNewPort picks a free port and starts the server on it, picking
// another if some other process grabbed the port in between.
func (in *Instance) StartNewPort(ctx context.Context) error {
	var err error
	for range 3 {
		var port int
		port, err = FreePort()
		if err != nil {
			return err
		}
		if err = in.AppendConf([]string{"port = " + strconv.Itoa(port)}); err != nil {
			return err
		}
		in.Port = port
		if err = in.Start(ctx); err == nil {
			return nil
		}
		if !strings.Contains(in.LogTail(20), "already in use") {
			return err
		}
	}
	return err
}

// Start starts the server and waits until it accepts connections (pg_ctl -w
// waits for crash recovery, and for a standby until it allows read-only
// connections).
func (in *Instance) Start(ctx context.Context) error {
	if _, err := in.Run(ctx, "pg_ctl", "start", "-w", "-t", strconv.Itoa(int(Timeout/time.Second)),
		"-D", in.Data, "-l", in.Logfile); err != nil {
		return err
	}
	return WaitReady(ctx, in.URL("postgres"), nil)
}

// Stop stops the server with the given pg_ctl shutdown mode.
func (in *Instance) Stop(ctx context.Context, mode string) error {
	_, err := in.Run(ctx, "pg_ctl", "stop", "-w", "-t", strconv.Itoa(int(Timeout/time.Second)),
		"-D", in.Data, "-m", mode)
	return err
}

// Running reports whether a postmaster runs on the data directory.
func (in *Instance) Running(ctx context.Context) bool {
	_, err := in.Run(ctx, "pg_ctl", "status", "-D", in.Data)
	return err == nil
}

// Destroy stops the server, if any, and removes the whole directory.
func (in *Instance) Destroy() {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if in.Running(ctx) {
		if err := in.Stop(ctx, "immediate"); err != nil {
			fmt.Fprintf(os.Stderr, "pgcluster: stop cluster in %s: %v\n", in.Base, err)
		}
	}
	if err := os.RemoveAll(in.Base); err != nil {
		fmt.Fprintf(os.Stderr, "pgcluster: remove %s: %v\n", in.Base, err)
	}
}

// Preserve stops the server cleanly and keeps its directory for a person to
// inspect, removing the owner file so that no later run reaps it.
func (in *Instance) Preserve() {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if in.Running(ctx) {
		if err := in.Stop(ctx, "fast"); err != nil {
			fmt.Fprintf(os.Stderr, "pgcluster: stop cluster in %s: %v\n", in.Base, err)
		}
	}
	_ = os.Remove(filepath.Join(in.Base, "owner.pid"))
}

// URL returns the superuser URL of database db.
func (in *Instance) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", in.Port, db)
}

// LogTail returns the last n lines of the server log.
func (in *Instance) LogTail(n int) string { return TailFile(in.Logfile, "server log", n) }

// TailFile returns the last n lines of the file at path, a log read for a
// failure message; when it cannot be read, the answer says so, naming the
// file as what.
func TailFile(path, what string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no %s: %v)", what, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Run runs a server tool from the Instance's bin directory, as the server's
// OS user, in the Instance directory (a root-owned working directory would
// make initdb fail), with PG* variables removed so that the caller's
// environment cannot redirect it.
func (in *Instance) Run(ctx context.Context, tool string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, in.Bins.Path(tool), args...)
	cmd.Dir = in.Base
	cmd.Env = toolEnv(in.Base)
	cmd.WaitDelay = 5 * time.Second
	cred, err := pgCredential()
	if err != nil {
		return "", err
	}
	runAs(cmd, cred)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", tool, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

func toolEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") ||
			strings.HasPrefix(kv, "LANG=") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	// English messages (the port-in-use check reads them) and a home the
	// server's user can read.
	return append(env, "LC_ALL=C", "LANG=C", "HOME="+home)
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1 (free when
// asked: the caller retries when another process takes it first).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// QuoteConf quotes s as a postgresql.conf string value.
func QuoteConf(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

var reapOnce sync.Once

// reapStale stops and removes clusters left behind by test processes that
// died without cleaning up (a timeout panic, a kill), once per process.
func reapStale(bins Bins) {
	reapOnce.Do(func() {
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), instancePrefix+"*"))
		if ram := RAMDir(); ram != "" {
			more, _ := filepath.Glob(filepath.Join(ram, instancePrefix+"*"))
			dirs = append(dirs, more...)
		}
		for _, base := range dirs {
			b, err := os.ReadFile(filepath.Join(base, "owner.pid"))
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid == os.Getpid() || processAlive(pid) {
				continue
			}
			(&Instance{Bins: bins, Base: base, Data: filepath.Join(base, "data")}).Destroy()
		}
	})
}
