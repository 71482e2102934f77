package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// daemon is a long-running process the harness started (etcd, a Patroni
// node): in a process group of its own, its output appended to a log file.
// stop ends it on every path: SIGTERM to the group, then SIGKILL to the
// group when it has not exited within the grace period, and it returns only
// once the process has been reaped. A process that left the group on
// purpose (Patroni's postmaster calls setsid) is not in it: its owner stops
// it by its pid file (stopPostmaster).
type daemon struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed when the process has been reaped
	err    error         // what Wait returned, valid once exited is closed
}

// startDaemon starts cmd in a new process group with stdout and stderr
// appended to logPath.
func startDaemon(name, logPath string, cmd *exec.Cmd) (*daemon, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", name, err)
	}
	defer f.Close() // the child holds its own descriptor
	if err := pgcluster.ChownToServerUser(logPath); err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.exited)
	}()
	return d, nil
}

// pid returns the process id (also its process group's id).
func (d *daemon) pid() int { return d.cmd.Process.Pid }

// running reports whether the process has not exited yet.
func (d *daemon) running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// signalGroup sends sig to the daemon's process group, while the daemon has
// not been reaped (after that the group id may belong to another process).
func (d *daemon) signalGroup(sig syscall.Signal) {
	if d.running() {
		_ = syscall.Kill(-d.pid(), sig)
	}
}

// stop ends the daemon: SIGTERM to its group, SIGKILL to the group after
// grace, and waits until it has been reaped. It is idempotent.
func (d *daemon) stop(grace time.Duration) {
	d.signalGroup(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(grace):
		d.kill()
	}
	// Children that outlived the leader in its group (none, normally).
	_ = syscall.Kill(-d.pid(), syscall.SIGKILL)
}

// kill ends the daemon's group at once (SIGKILL) and waits until it has
// been reaped.
func (d *daemon) kill() {
	d.signalGroup(syscall.SIGKILL)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		// A process in uninterruptible sleep; nothing more to do.
	}
}

// logTail returns the last n lines of the daemon's log.
func (d *daemon) logTail(n int) string { return pgcluster.TailFile(d.log, d.name+" log", n) }

// pidAlive reports whether a process with this pid exists and has not
// exited: a zombie (state Z in /proc/PID/stat, waiting for a parent that
// is not this process to reap it) counts as gone.
func pidAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

// postmasterPID reads the postmaster's pid from the first line of
// postmaster.pid in dataDir; 0 when there is none.
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(dataDir + "/postmaster.pid")
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0
	}
	return pid
}

// killPostmaster sends SIGKILL to the postmaster of dataDir and to its
// process group (Patroni starts it with setsid, so its backends, which do
// not exit at once when their postmaster dies, are in that group), and
// waits until the postmaster is gone, at most timeout. It returns the pid it
// killed, 0 when no postmaster ran.
func killPostmaster(dataDir string, timeout time.Duration) (int, error) {
	pid := postmasterPID(dataDir)
	if pid == 0 || !pidAlive(pid) {
		return 0, nil
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(timeout)
	for pidAlive(pid) {
		if time.Now().After(deadline) {
			return pid, fmt.Errorf("postmaster %d of %s still runs %s after SIGKILL", pid, dataDir, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return pid, nil
}
