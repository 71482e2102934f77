//go:build linux

package cli

import (
	"os/exec"
	"runtime"
	"syscall"
)

// setParentDeathSignal asks the kernel to SIGKILL the command when pgfence
// dies, and returns how to start it. It covers pgfence being killed in any
// way, SIGKILL and the OOM killer included, which no handler in pgfence can.
// It does not cover the command's own children (they are in its process
// group, which pgfence signals while it lives, but the kernel signals only
// the direct child), nor a set-user-ID or set-group-ID command (the kernel
// clears the setting on such an exec).
//
// Linux sends the signal when the thread that started the child exits, not
// the process: the start happens on a goroutine locked to its thread that
// stays there until the command has exited, so that the Go runtime never
// retires that thread while the command runs.
func setParentDeathSignal(attr *syscall.SysProcAttr) func(*exec.Cmd, chan<- error) error {
	attr.Pdeathsig = syscall.SIGKILL
	return func(cmd *exec.Cmd, exited chan<- error) error {
		started := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := cmd.Start(); err != nil {
				started <- err
				return
			}
			started <- nil
			exited <- cmd.Wait()
		}()
		return <-started
	}
}
