//go:build unix

package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/pgfence/pgfence/gofence"
)

func newRunCmd(g *globals) *cobra.Command {
	var (
		ttl, timeout, grace    time.Duration
		holder                 string
		wait, exportURL        bool
		conflictCode, lostCode int
	)
	cmd := &cobra.Command{
		Use:   "run RESOURCE [flags] -- COMMAND [ARGS...]",
		Short: "Run a command under a lease; stop it before the lease can pass to another holder",
		Long: `run takes a lease on RESOURCE, keeps it alive, and runs COMMAND with
PGFENCE_TOKEN, PGFENCE_RESOURCE and PGFENCE_HOLDER in its environment (and
DATABASE_URL with --export-url), so that the command can write under the
token. COMMAND runs in a process group of its own; signals sent to pgfence
(INT, TERM, HUP, QUIT, USR1, USR2) are passed to the whole group.

A second INT or TERM (a second Ctrl-C) sends SIGKILL to the group and ends
pgfence at once; the lease then ends at its expiry. On Linux, the command
itself (not what it started) is also SIGKILLed by the kernel if pgfence
dies without cleaning up (parent-death signal).

If the lease cannot be renewed, run sends SIGTERM to the group when less than
--grace is left before the local trust deadline, and SIGKILL before the
deadline itself, which comes before the server could grant the lease to
anyone else. A shell wrapper cannot keep a grandchild alive: the whole group
is signalled.

Exit code: COMMAND's own when it ran to its end (128+N when killed by signal
N); 75 (-E/--conflict-exit-code) when another holder has the lease or the
previous holder's guarded transaction is still open (or, with --wait
--timeout, still at the timeout): COMMAND never started;
76 (--lost-exit-code) when the lease was lost and COMMAND was stopped; 1 for
every other failure before COMMAND started (no kit, no server, no
privilege); 2 for a command line that does not parse. COMMAND may exit with
any of these itself: a script that must tell "another holder" or "lost"
from COMMAND's own code picks codes COMMAND never uses, as with flock(1)'s
-E (pgfence run job -E 200 --lost-exit-code 201 -- ./job).`,
		Example: `  pgfence run nightly-report -- ./report.sh
  pgfence run nightly-report -E 0 -- ./report.sh      # another instance runs: exit 0, quietly done
  pgfence run nightly-report --wait --timeout 10m --ttl 1m -- sh -c 'psql -c "..." '
  pgfence run billing --export-url -- ./bill --token-from-env`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || cmd.ArgsLenAtDash() != 1 {
				return usageError{errors.New("usage: pgfence run RESOURCE [flags] -- COMMAND [ARGS...] (put -- before the command)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout > 0 && !wait {
				return usageError{errors.New("--timeout goes with --wait")}
			}
			for _, c := range []struct {
				flag string
				code int
			}{{"--conflict-exit-code", conflictCode}, {"--lost-exit-code", lostCode}} {
				if c.code < 0 || c.code > 255 {
					return usageError{fmt.Errorf("%s %d: an exit code is 0 to 255", c.flag, c.code)}
				}
			}
			// The watchdog reports a lost lease in its own line, with what it
			// does about it: gofence's line for it would say it twice.
			cfg := gofence.Config{TTL: ttl, Holder: holder, Logger: newLogger(g.stderr, func(r slog.Record) bool {
				return r.Message == "pgfence: lease lost"
			})}
			if grace <= 0 {
				grace = min(5*time.Second, ttl/5)
			}
			if grace >= ttl/2 {
				return usageError{fmt.Errorf("--grace %s must be under half the TTL (%s)", grace, ttl)}
			}
			codes := runCodes{conflict: conflictCode, lost: lostCode}
			return runUnderLease(cmd.Context(), g, cfg, args[0], args[1:], wait, timeout, grace, exportURL, codes)
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 30*time.Second, "lease time to live; renewed every TTL/3 while the command runs")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the lease instead of exiting when another holder has it")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --wait: give up after this long (exit --conflict-exit-code)")
	cmd.Flags().IntVarP(&conflictCode, "conflict-exit-code", "E", ExitRunNotAcquired, "exit code when another holder has the lease and COMMAND did not start (flock -E)")
	cmd.Flags().IntVar(&lostCode, "lost-exit-code", ExitRunLost, "exit code when the lease was lost and COMMAND was stopped")
	cmd.Flags().DurationVar(&grace, "grace", 0, "time between SIGTERM and SIGKILL on lease loss (default min(5s, TTL/5))")
	cmd.Flags().StringVar(&holder, "holder", "", "holder name shown in status (default host/pid/random)")
	cmd.Flags().BoolVar(&exportURL, "export-url", false, "also pass the connection URL to the command as DATABASE_URL")
	return cmd
}

// runCodes are the exit codes of pgfence run's own outcomes (flags
// --conflict-exit-code and --lost-exit-code).
type runCodes struct{ conflict, lost int }

func runUnderLease(ctx context.Context, g *globals, cfg gofence.Config, resource string, argv []string,
	wait bool, timeout, grace time.Duration, exportURL bool, codes runCodes) error {
	c, pool, err := g.client(ctx, cfg)
	if err != nil {
		return err
	}
	// After a loss the database may not answer: the pool is then closed in
	// the background, so that pgfence's exit is not delayed at all.
	closer := closePool
	defer func() { closer(pool) }()
	defer closeClient(c)

	lease, err := takeLease(ctx, c, resource, wait, timeout)
	if err != nil {
		// The conflict code means "held by another" and nothing else: a cron
		// wrapper reads it as "another instance is running", so an outage
		// (no kit, no server, no privilege) must not look like one.
		var held *gofence.HeldError
		switch {
		case errors.As(err, &held):
			return exitError{codes.conflict, fmt.Errorf("%s not acquired, %s not started: %s", resource, argv[0], heldMessage(held))}
		case errors.Is(err, gofence.ErrBusy):
			// The previous holder's guarded transaction is still open:
			// that instance is still at work.
			return exitError{codes.conflict, fmt.Errorf("%s not acquired, %s not started: %w", resource, argv[0], err)}
		case wait && timeout > 0 && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			return exitError{codes.conflict, fmt.Errorf("%s not acquired, %s not started: not granted within %s (--timeout; another holder kept it)", resource, argv[0], timeout)}
		}
		return explainDenied(ctx, pool, err)
	}

	child := exec.Command(argv[0], argv[1:]...)
	child.Env = append(os.Environ(),
		"PGFENCE_TOKEN="+fmt.Sprint(lease.Token()),
		"PGFENCE_RESOURCE="+resource,
		"PGFENCE_HOLDER="+lease.Holder())
	if exportURL {
		child.Env = append(child.Env, "DATABASE_URL="+pool.Config().ConnString())
	}
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, g.stdout, g.stderr
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// If pgfence itself dies (SIGKILL, OOM killer), nothing is left to stop
	// the command before the lease passes: on Linux the kernel sends it
	// SIGKILL then (see setParentDeathSignal for what that covers).
	startOnThread := setParentDeathSignal(child.SysProcAttr)
	// A group of its own is how the whole command is signalled; on a
	// terminal that group must also be the foreground one, or the command
	// is stopped (SIGTTIN) as soon as it reads from the terminal.
	restoreForeground := func() {}
	if tty, ok := terminal(os.Stdin); ok {
		child.SysProcAttr.Foreground = true
		child.SysProcAttr.Ctty = tty
		restoreForeground = func() { takeForeground(tty) }
	}
	// Signals are caught before the command starts: one that comes between
	// the start and a later Notify would reach only main's NotifyContext,
	// and the command would get SIGTERM (the ctx branch below) instead of
	// the signal sent. Caught early, it waits in the channel and is passed
	// on to the group once the command runs.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(signals)

	exited := make(chan error, 1)
	if err := startOnThread(child, exited); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = lease.Release(rctx)
		return fmt.Errorf("starting %s: %w", argv[0], err)
	}
	pgid := child.Process.Pid
	// A second SIGINT or SIGTERM ends pgfence at once (NotifyContext): the
	// group goes first.
	defer onAbort(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })()

	// The watchdog: SIGTERM when less than grace is left before the trust
	// deadline (or at once when the lease is lost), SIGKILL when a quarter of
	// grace is left (or three quarters of grace after a SIGTERM sent because
	// the lease was lost), so the group is gone before the deadline, which
	// itself comes before the server's expiry. Nothing else changes these
	// rules: signals sent to pgfence are passed on as they are, and never
	// delay or replace the watchdog's SIGKILL.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var termAt, termDeadline time.Time // the SIGTERM, and the trust deadline then
	killed, forwarded, interrupts := false, false, 0
	ctxDone := ctx.Done()
	var ctxSettled <-chan time.Time
	var waitErr error
loop:
	for {
		select {
		case waitErr = <-exited:
			break loop
		case sig := <-signals:
			forwarded = true
			if sig == syscall.SIGINT || sig == syscall.SIGTERM {
				// A command that ignores INT and TERM is not left running
				// after a second one: escalate, as for a lost lease.
				if interrupts++; interrupts > 1 {
					fmt.Fprintf(g.stderr, "pgfence: %s asked to stop again; sending SIGKILL to %s\n", sig, argv[0])
					_ = syscall.Kill(-pgid, syscall.SIGKILL)
					continue
				}
			}
			_ = syscall.Kill(-pgid, sig.(syscall.Signal))
		case <-ctxDone:
			// main cancels ctx on SIGINT/SIGTERM, which the case above passes
			// on (its channel gets the same signal within moments); a caller
			// that cancels ctx without a signal (pgfence used as a library)
			// gets one SIGTERM, after a short look for such a signal.
			ctxDone = nil
			ctxSettled = time.After(100 * time.Millisecond)
		case <-ctxSettled:
			ctxSettled = nil
			if !forwarded {
				_ = syscall.Kill(-pgid, syscall.SIGTERM)
			}
		case <-tick.C:
			left := time.Until(lease.TrustDeadline())
			lost := lease.Err() != nil
			if !termAt.IsZero() && !killed && !lost && left >= grace {
				// A renewal succeeded in the grace window: the lease is held
				// again, so the watchdog stands down (no SIGKILL). A command
				// that handles or ignores SIGTERM keeps running under it.
				termAt = time.Time{}
				fmt.Fprintf(g.stderr, "pgfence: a renewal of the lease on %s succeeded after all (%s); not sending SIGKILL to %s\n",
					resource, deadlineLeft(left), argv[0])
			}
			if termAt.IsZero() && (lost || left < grace) {
				termAt, termDeadline = time.Now(), lease.TrustDeadline()
				what := lossReason(lease, resource, left)
				if left < grace/4 {
					// Too late for SIGTERM to be of use: a SIGTERM and a
					// SIGKILL in one instant would read as "did not stop"
					// for a command that had no time to.
					killed = true
					if lost {
						what += "; too late for SIGTERM (" + deadlineLeft(left) + ")"
					} else {
						what += "; too late for SIGTERM"
					}
					fmt.Fprintf(g.stderr, "pgfence: %s: sending SIGKILL to %s\n", what, argv[0])
					_ = syscall.Kill(-pgid, syscall.SIGKILL)
				} else {
					fmt.Fprintf(g.stderr, "pgfence: %s; sending SIGTERM to %s\n", what, argv[0])
					_ = syscall.Kill(-pgid, syscall.SIGTERM)
				}
			}
			if !termAt.IsZero() && !killed && (left < grace/4 || time.Since(termAt) > grace*3/4) {
				// Say "still runs" only of a command that does: it may
				// have ended on the SIGTERM since the last look.
				select {
				case waitErr = <-exited:
					break loop
				default:
				}
				killed = true
				fmt.Fprintf(g.stderr, "pgfence: %s still runs %s after SIGTERM (%s); sending SIGKILL\n",
					argv[0], time.Since(termAt).Round(time.Millisecond), deadlineLeft(left))
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // nothing of the group outlives the command
	restoreForeground()

	code, ended := 0, "exited with status 0"
	var exitErr *exec.ExitError
	switch {
	case waitErr == nil:
	case errors.As(waitErr, &exitErr):
		code = exitErr.ExitCode()
		ended = fmt.Sprintf("exited with status %d", code)
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
			ended = fmt.Sprintf("ended on %s (exit status %d)", signalName(ws.Signal()), code)
		}
	default:
		return fmt.Errorf("waiting for %s: %w", argv[0], waitErr)
	}

	if !termAt.IsZero() && lease.Err() == nil && lease.TrustDeadline().After(termDeadline) {
		// Stopped because no renewal came in time, and one did since: the
		// lease was never lost. Release it, and report the command's end.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := lease.Release(rctx); err != nil {
			fmt.Fprintf(g.stderr, "pgfence: %s\n", message(err))
		}
		return exitError{max(code, 1), fmt.Errorf("%s %s after it was stopped: no renewal of the lease on %s succeeded in time, one did since (the lease was not lost, and is released)", argv[0], ended, resource)}
	}
	if !termAt.IsZero() {
		// Lost: do not wait on a database that may not answer. Releasing
		// with a context that is already done stops the keepalive and the
		// loss timer without a round trip.
		closer = func(p *pgxpool.Pool) { go p.Close() }
		done, cancel := context.WithCancel(ctx)
		cancel()
		_ = lease.Release(done)
		return exitError{codes.lost, fmt.Errorf("%s %s after the lease on %s was lost", argv[0], ended, resource)}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := lease.Release(rctx); err != nil {
		fmt.Fprintf(g.stderr, "pgfence: %s\n", message(err))
	}
	if code != 0 {
		return exitError{code, nil}
	}
	return nil
}

// terminal reports whether f is a terminal, and its descriptor (asked with
// TIOCGWINSZ, which every Unix pgfence builds for has, unlike TCGETS).
func terminal(f *os.File) (int, bool) {
	fd := int(f.Fd())
	_, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	return fd, err == nil
}

// takeForeground makes pgfence's process group the terminal's foreground
// group again once the command is gone (SIGTTOU ignored meanwhile: a
// background group may not change it otherwise).
func takeForeground(tty int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(tty, unix.TIOCSPGRP, syscall.Getpgrp())
}

// lossReason says what the watchdog saw: the lease lost (and why), or about
// to be, with no renewal succeeding.
func lossReason(l *gofence.Lease, resource string, left time.Duration) string {
	if err := l.Err(); err != nil {
		why := strings.TrimPrefix(err.Error(), gofence.ErrLost.Error()+": "+resource+": ")
		return fmt.Sprintf("lost the lease on %s (%s)", resource, apiToFlags.Replace(strings.ReplaceAll(why, "pgfence: ", "")))
	}
	return fmt.Sprintf("the lease on %s is about to be lost (no renewal succeeded; %s)", resource, deadlineLeft(left))
}

// deadlineLeft says how far the local trust deadline is.
func deadlineLeft(left time.Duration) string {
	if left <= 0 {
		return "the local trust deadline has passed"
	}
	return fmt.Sprintf("%s left before the local trust deadline", left.Round(time.Millisecond))
}

// signalName is the name of sig as the docs and shells write it (SIGTERM).
func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", int(sig))
}
