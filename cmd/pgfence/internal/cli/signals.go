package cli

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// NotifyContext returns a context that the first SIGINT or SIGTERM cancels,
// so that the running command winds down (releases its lease, drops the
// demo's database); it also handles SIGPIPE, so that a write to a closed
// pipe fails instead of ending the process before its cleanup. A second SIGINT or SIGTERM ends the process at once with
// exit code 128+N, after the abort hooks have run (pgfence run's sends
// SIGKILL to its command's process group): a command that does not stop, or
// a connection that does not close, never keeps pgfence from exiting.
// signal.NotifyContext would swallow every signal after the first.
//
// stop undoes the signal handling; main calls it before exiting.
func NotifyContext(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	// A reader that goes away (pgfence demo | head) must not kill us before
	// the cleanup (the demo's database, a held lease): with SIGPIPE handled,
	// a write to the closed pipe fails with EPIPE instead, and the command
	// ends through its error path. Handled, not ignored, so that commands
	// pgfence run starts get the default disposition back on exec.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			runAbortHooks()
			os.Exit(128 + int(sig.(syscall.Signal)))
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			signal.Stop(sigs)
			signal.Stop(pipe)
			close(done)
			cancel()
		})
	}
}

var (
	abortMu    sync.Mutex
	abortHooks = map[int]func(){}
	abortNext  int
)

// onAbort registers fn to run if the process is ended at once by a second
// signal; the returned function unregisters it. Hooks must be quick and must
// not block.
func onAbort(fn func()) (unregister func()) {
	abortMu.Lock()
	defer abortMu.Unlock()
	id := abortNext
	abortNext++
	abortHooks[id] = fn
	return func() {
		abortMu.Lock()
		defer abortMu.Unlock()
		delete(abortHooks, id)
	}
}

func runAbortHooks() {
	abortMu.Lock()
	defer abortMu.Unlock()
	for _, fn := range abortHooks {
		fn()
	}
}
