//go:build unix

package pgcluster

import (
	"errors"
	"os/exec"
	"syscall"
)

// runAs makes cmd run as the OS user c (nil: the current user).
func runAs(cmd *exec.Cmd, c *osCred) {
	if c != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: c.uid, Gid: c.gid}}
	}
}

// processAlive reports whether process pid exists (one of another user
// counts as alive: it is not ours to reap).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
