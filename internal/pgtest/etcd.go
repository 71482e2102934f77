package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// Etcd is a one-member etcd cluster (Debian's etcd-server) for one test,
// on free ports of 127.0.0.1, its data under a scratch directory. It is
// stopped, and its directory removed, when the test ends.
type Etcd struct {
	// ClientURL is where clients (Patroni, patronictl) reach it:
	// http://127.0.0.1:PORT.
	ClientURL string
	// Version is what `etcd --version` printed first.
	Version string
	d       *daemon
}

// startEtcd starts etcd with its data and log in dir (which must exist and
// be writable by the current user) and waits until /health answers. It
// registers no cleanup: the caller stops it (Stop) on every path.
func startEtcd(ctx context.Context, bin, dir string) (*Etcd, error) {
	version := "etcd"
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		version = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}
	var lastErr error
	for attempt := range 3 { // another process may take a free port first
		client, err1 := pgcluster.FreePort()
		peer, err2 := pgcluster.FreePort()
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		clientURL := "http://127.0.0.1:" + strconv.Itoa(client)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
		data := filepath.Join(dir, "etcd-data-"+strconv.Itoa(attempt))
		cmd := exec.Command(bin,
			"--name", "pgtest",
			"--data-dir", data,
			"--listen-client-urls", clientURL,
			"--advertise-client-urls", clientURL,
			"--listen-peer-urls", peerURL,
			"--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", "pgtest="+peerURL,
			"--initial-cluster-state", "new",
			"--initial-cluster-token", filepath.Base(dir),
			"--listen-metrics-urls", "",
			"--logger", "zap",
			"--log-outputs", "stderr",
		)
		cmd.Dir = dir
		cmd.Env = scrubEnv(os.Environ(), "ETCD_") // the flags alone configure it
		d, err := startDaemon("etcd", filepath.Join(dir, "etcd.log"), cmd)
		if err != nil {
			return nil, err
		}
		e := &Etcd{ClientURL: clientURL, Version: version, d: d}
		if lastErr = e.waitHealthy(ctx); lastErr == nil {
			return e, nil
		}
		e.Stop()
		if !strings.Contains(d.logTail(30), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("etcd did not become healthy: %w", lastErr)
}

// waitHealthy polls GET /health until etcd reports itself healthy, the
// process exits or ctx ends.
func (e *Etcd) waitHealthy(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.ClientURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`) {
				return nil
			}
			err = fmt.Errorf("GET /health: %s %s", resp.Status, strings.TrimSpace(string(body)))
		}
		select {
		case <-e.d.exited:
			return fmt.Errorf("etcd exited (%v); log:\n%s", e.d.err, e.d.logTail(20))
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops etcd (SIGTERM, SIGKILL after 10 s) and waits until it exited.
func (e *Etcd) Stop() { e.d.stop(10 * time.Second) }

// PID returns the etcd process's id.
func (e *Etcd) PID() int { return e.d.pid() }

// LogTail returns the last n lines of etcd's log.
func (e *Etcd) LogTail(n int) string { return e.d.logTail(n) }

// findEtcd returns the etcd binary: PATH, then /usr/bin/etcd.
func findEtcd() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if fi, err := os.Stat("/usr/bin/etcd"); err == nil && !fi.IsDir() {
		return "/usr/bin/etcd", nil
	}
	return "", errors.New("no etcd binary (PATH, /usr/bin; Debian: apt-get install etcd-server)")
}

// scrubEnv returns env without the variables whose names start with prefix.
func scrubEnv(env []string, prefix string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return out
}
