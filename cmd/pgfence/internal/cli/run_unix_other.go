//go:build unix && !linux

package cli

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal: only Linux has a parent-death signal (and FreeBSD's
// differs); elsewhere a command outlives a pgfence that is SIGKILLed, which
// docs/cli.md says.
func setParentDeathSignal(*syscall.SysProcAttr) func(*exec.Cmd, chan<- error) error {
	return func(cmd *exec.Cmd, exited chan<- error) error {
		if err := cmd.Start(); err != nil {
			return err
		}
		go func() { exited <- cmd.Wait() }()
		return nil
	}
}
