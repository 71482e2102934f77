package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// LocalBins finds the server binaries as FindBins does and checks that they
// can be run (CheckCredential): the two conditions for starting a cluster
// on this machine.
func LocalBins(override string) (Bins, error) {
	bins, err := FindBins(override)
	if err != nil {
		return Bins{}, err
	}
	if err := CheckCredential(); err != nil {
		return Bins{}, err
	}
	return bins, nil
}

// StartThrowaway creates a cluster from bins (New), runs initdb with the
// conf lines appended to postgresql.conf (Initdb) and starts it on a free
// port (StartNewPort), all bounded by Timeout. The caller removes it with
// Destroy (or keeps it with Preserve). On failure nothing is left behind,
// and an error of the start carries the tail of the server log.
func StartThrowaway(ctx context.Context, bins Bins, conf []string) (*Instance, error) {
	return StartThrowawayIn(ctx, bins, "", conf)
}

// StartThrowawayIn is StartThrowaway with the cluster's directory in parent
// (see NewIn).
func StartThrowawayIn(ctx context.Context, bins Bins, parent string, conf []string) (*Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	inst, err := NewIn(bins, parent)
	if err != nil {
		return nil, err
	}
	if err := inst.Initdb(ctx, conf); err != nil {
		inst.Destroy()
		return nil, err
	}
	if err := inst.StartNewPort(ctx); err != nil {
		err = fmt.Errorf("%w\nserver log:\n%s", err, inst.LogTail(30))
		inst.Destroy()
		return nil, err
	}
	return inst, nil
}

// StartCopy is StartThrowaway from a copy of src, the data directory of a
// stopped cluster (one that Snapshot saved), instead of initdb: a copy
// takes a fraction of initdb's time. The conf lines are appended to the
// copy's postgresql.conf (after the listen address and socket directory of
// the new cluster, which replace the snapshot's), and the copy starts on a
// free port. The cluster's directory is made in parent (see NewIn). On
// failure nothing is left behind.
func StartCopy(ctx context.Context, bins Bins, parent, src string, conf []string) (*Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	inst, err := NewIn(bins, parent)
	if err != nil {
		return nil, err
	}
	if err := copyDir(ctx, src, inst.Data); err != nil {
		inst.Destroy()
		return nil, err
	}
	if err := inst.AppendConf(append([]string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = " + QuoteConf(inst.Base),
	}, conf...)); err != nil {
		inst.Destroy()
		return nil, err
	}
	if err := inst.StartNewPort(ctx); err != nil {
		err = fmt.Errorf("%w\nserver log:\n%s", err, inst.LogTail(30))
		inst.Destroy()
		return nil, err
	}
	return inst, nil
}

// Snapshot copies the data directory of the instance, which must be
// stopped, to dst (which must not exist yet), keeping owners and modes, for
// StartCopy.
func (in *Instance) Snapshot(ctx context.Context, dst string) error {
	return copyDir(ctx, in.Data, dst)
}

// copyDir copies the directory src to dst (which must not exist), keeping
// owners, modes and times: cp -a, which a data directory owned by the
// server's user needs when the caller is root.
func copyDir(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "-a", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// RAMDir is a directory in memory (tmpfs) where throwaway clusters can live
// when durability does not matter: /dev/shm on Linux when it is a
// writable directory, else "". Files written there never reach a disk,
// which on a busy or virtual disk makes initdb, a copy of a data
// directory and CREATE DATABASE several times faster; a cluster there
// still needs fsync off to be fast, and is lost at reboot.
func RAMDir() string {
	const shm = "/dev/shm"
	if runtime.GOOS != "linux" {
		return ""
	}
	fi, err := os.Stat(shm)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o002 == 0 && os.Geteuid() != 0 {
		return ""
	}
	return shm
}
