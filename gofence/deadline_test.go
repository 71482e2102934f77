package gofence_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// The tests of this file try to make gofence say "held" past a lease's
// local trust deadline: a grant answered late, a process paused past the
// deadline, a caller that leaves while the grant's reply is on its way.

// slowClient is a client of b whose connections go through a proxy; its
// pool runs each statement in one round trip (no prepare step), so that a
// delayed direction delays each call by exactly one delay. The pool is
// connected and the kit's version checked before the test slows anything.
func (b *bundle) slowClient(t *testing.T, cfg gofence.Config) (*gofence.Client, *pgtest.Proxy) {
	t.Helper()
	proxy := pgtest.NewProxy(t, b.db.URL)
	c := b.client(t, b.pool(t, proxy.URL(b.db.URL)+"&default_query_exec_mode=exec"), cfg)
	_, err := c.Leases(b.ctx)
	require.NoError(t, err)
	return c, proxy
}

// lease reads the row of resource in fence.leases (server clock).
func (b *bundle) lease(t *testing.T, resource string) sqlfuncs.LeaseState {
	t.Helper()
	row, ok, err := sqlfuncs.GetLease(b.ctx, b.db.Pool, resource)
	require.NoError(t, err)
	require.True(t, ok, "%s was never granted", resource)
	return row
}

// poll calls cond every 10ms until it is true, failing the test after 30s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A grant whose reply arrives after the lease's local trust deadline (the
// request's send time + TTL - SafetyMargin) is never handed over as a live
// lease: Acquire (waiting or not), Do and Elect give it back at once and
// say why. (Acquire used to return it, with Err() nil past its TrustDeadline,
// and Elect ran fn under it while another candidate could already lead.)
func TestGrantAnsweredAfterTheTrustDeadline(t *testing.T) {
	t.Parallel()
	// The trust deadline is 1.4s after the grant is sent, the server's
	// expiry 2s after it reached the server; the reply takes 1.5s.
	cfg := gofence.Config{Holder: "A", TTL: 2 * time.Second, SafetyMargin: 600 * time.Millisecond, PollInterval: 50 * time.Millisecond}
	const delay = 1500 * time.Millisecond

	// requireGivenBack checks the error of a late grant, and that the server
	// ended that grant before its expiry (released, not left to expire).
	requireGivenBack := func(t *testing.T, b *bundle, err error) {
		t.Helper()
		require.ErrorIs(t, err, gofence.ErrLost)
		require.ErrorContains(t, err, "after the local trust deadline")
		require.ErrorContains(t, err, "given back")
		row := b.lease(t, "job")
		require.Equal(t, "A", row.Holder)
		require.False(t, row.Live)
		require.False(t, row.EndedAt.IsZero(), "the late grant was left to expire, not given back")
		require.True(t, row.EndedAt.Before(row.ExpiresAt))
		t.Logf("given back %s before its expiry by the server's clock", row.ExpiresAt.Sub(row.EndedAt).Round(time.Millisecond))
	}

	t.Run("Acquire", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, proxy := b.slowClient(t, cfg)
		proxy.Delay(pgtest.ToClient, delay)
		l, err := a.Acquire(b.ctx, "job", nil)
		if err == nil {
			defer l.Release(b.ctx)
			t.Fatalf("Acquire returned a lease %s past its trust deadline (Err: %v)", time.Since(l.TrustDeadline()), l.Err())
		}
		require.Nil(t, l)
		requireGivenBack(t, b, err)
	})

	t.Run("Acquire, waiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, proxy := b.slowClient(t, cfg)
		proxy.Delay(pgtest.ToClient, delay)
		l, err := a.Acquire(b.ctx, "job", &gofence.LeaseOptions{Wait: true})
		if err == nil {
			defer l.Release(b.ctx)
			t.Fatalf("a waiting Acquire returned a lease %s past its trust deadline (Err: %v)", time.Since(l.TrustDeadline()), l.Err())
		}
		requireGivenBack(t, b, err)
	})

	t.Run("Do", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, proxy := b.slowClient(t, cfg)
		proxy.Delay(pgtest.ToClient, delay)
		err := a.Do(b.ctx, "job", nil, func(ctx context.Context, l *gofence.Lease) error {
			t.Errorf("fn ran %s past the trust deadline (ctx.Err: %v)", time.Since(l.TrustDeadline()), ctx.Err())
			return nil
		})
		requireGivenBack(t, b, err)
	})

	t.Run("Elect", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, proxy := b.slowClient(t, cfg)
		proxy.Delay(pgtest.ToClient, delay)
		ctx, cancel := context.WithCancel(b.ctx)
		defer cancel()
		var ran atomic.Bool
		done := make(chan error, 1)
		go func() {
			done <- a.Elect(ctx, "job", nil, func(ctx context.Context, l *gofence.Lease) error {
				ran.Store(true)
				t.Errorf("fn ran %s past the trust deadline (ctx.Err: %v)", time.Since(l.TrustDeadline()), ctx.Err())
				return nil
			})
		}()
		// Every grant is late: the candidate gives each back and campaigns again.
		var first int64
		poll(t, "a first grant given back", func() bool {
			require.False(t, ran.Load())
			row, ok, err := sqlfuncs.GetLease(b.ctx, b.db.Pool, "job")
			require.NoError(t, err)
			first = row.Token
			return ok && !row.EndedAt.IsZero()
		})
		poll(t, "a second grant given back", func() bool {
			require.False(t, ran.Load())
			row := b.lease(t, "job")
			return row.Token > first && !row.EndedAt.IsZero()
		})
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		require.False(t, ran.Load())
	})

	// The case: TTL 1s, the reply 1.25s late, and another holder
	// granted the lease by the server meanwhile.
	t.Run("superseded before the reply came", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a, proxy := b.slowClient(t, gofence.Config{Holder: "A", TTL: time.Second, SafetyMargin: 100 * time.Millisecond})
		other := b.client(t, nil, gofence.Config{Holder: "B", TTL: 10 * time.Second, PollInterval: 20 * time.Millisecond})
		proxy.Delay(pgtest.ToClient, 1250*time.Millisecond)
		type result struct {
			l   *gofence.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := a.Acquire(b.ctx, "job", nil)
			got <- result{l, err}
		}()
		poll(t, "A granted on the server", func() bool { return b.serverLive(t, "job") })
		l2, err := other.Acquire(b.ctx, "job", &gofence.LeaseOptions{Wait: true}) // at the server's expiry of A's grant
		require.NoError(t, err)
		defer l2.Release(b.ctx)
		r := <-got
		if r.err == nil {
			held := r.l.Err() == nil
			late := time.Since(r.l.TrustDeadline())
			t.Fatalf("Acquire returned a lease %s past its trust deadline (held: %v) while B (token %d) held it", late, held, l2.Token())
		}
		require.ErrorIs(t, r.err, gofence.ErrLost)
		require.ErrorContains(t, r.err, "after the local trust deadline")
		row := b.lease(t, "job")
		require.Equal(t, "B", row.Holder, "the give-back of A's stale token must not touch B's lease")
		require.True(t, row.Live)
	})
}

// A caller that goes away (its ctx cancelled) while the grant's reply is on
// its way does not strand the lease: the grant runs to completion, the
// token it brings back is given back at once, and the next waiter gets the
// lease without waiting for a TTL. (The lease used to stay held by nobody
// until its TTL ran out: 4.8s of a 5s TTL with no leader.)
func TestGrantWhoseCallerLeftIsGivenBack(t *testing.T) {
	t.Parallel()
	const ttl = 5 * time.Second
	for _, via := range []string{"Acquire, waiting", "Elect"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			a, proxy := b.slowClient(t, gofence.Config{Holder: "A", TTL: ttl})
			// Polling once a minute: only the give-back's notification can
			// wake the next holder before A's grant expires.
			next := b.client(t, nil, gofence.Config{Holder: "B", TTL: ttl, PollInterval: time.Minute})
			proxy.Delay(pgtest.ToClient, 700*time.Millisecond)

			ctx, cancel := context.WithCancel(b.ctx)
			defer cancel()
			var ran atomic.Bool
			done := make(chan error, 1)
			go func() {
				switch via {
				case "Acquire, waiting":
					l, err := a.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
					if err == nil {
						ran.Store(true)
						_ = l.Release(b.ctx)
					}
					done <- err
				case "Elect":
					done <- a.Elect(ctx, "job", nil, func(context.Context, *gofence.Lease) error {
						ran.Store(true)
						return nil
					})
				}
			}()
			// Granted on the server; the reply is held up in the proxy.
			poll(t, "A granted on the server", func() bool { return b.serverLive(t, "job") })
			granted := b.lease(t, "job")
			require.Equal(t, "A", granted.Holder)
			cancel()
			select {
			case err := <-done:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s did not honour its cancelled ctx", via)
			}
			require.False(t, ran.Load())

			l2, err := next.Acquire(b.ctx, "job", &gofence.LeaseOptions{Wait: true})
			require.NoError(t, err)
			defer l2.Release(b.ctx)
			row := b.lease(t, "job")
			require.Equal(t, "B", row.Holder)
			waited := row.AcquiredAt.Sub(granted.AcquiredAt)
			t.Logf("the next holder was granted %s after the abandoned grant (server clock; TTL %s)", waited.Round(time.Millisecond), ttl)
			require.Less(t, waited, ttl/2, "the abandoned grant was left to expire instead of being given back")
		})
	}
}

// The paused-holder test runs a holder in a child process (this test
// binary, run again with these variables set) and stops it with SIGSTOP.
const (
	envPausedMode     = "GOFENCE_TEST_PAUSED_HOLDER" // "lease" or "elect"
	envPausedURL      = "GOFENCE_TEST_PAUSED_URL"
	envPausedResource = "GOFENCE_TEST_PAUSED_RESOURCE"
	pausedPrefix      = "paused-holder: "
)

// pausedReport is what the child saw, on its local clock.
type pausedReport struct {
	// Violations counts the looks that began at or after the trust deadline
	// (as it stood when the look returned) and still said "held".
	Violations int
	// WorstViolation is how far past the deadline the worst of them began.
	WorstViolation time.Duration
	// LastHeld is the wall-clock time at which the last look that said
	// "held" began.
	LastHeld time.Time
	// LossAfterDeadline is how long after the trust deadline the first look
	// that said "lost" returned; LossAfterResume how long after the first
	// look after the pause returned (a pause shows as a gap between two
	// looks of one goroutine).
	LossAfterDeadline, LossAfterResume time.Duration
	// DoneAfterResume is how long after that a goroutine blocked on Done
	// woke (the loss timer's path).
	DoneAfterResume time.Duration
	// Looks is the number of looks in all.
	Looks int64
}

// TestPausedHolderSeesTheLossAtItsFirstLook stops a process that holds a
// lease (SIGSTOP) until another holder has been granted the lease by the
// server, then lets it go on (SIGCONT). From its first look after the pause
// the process must see the lease as lost: Err, Done, Context, and under
// Elect the context of fn, check the clock themselves instead of waiting
// for the loss timer's goroutine (which may run after the process's own
// goroutines). Judged by the server: every look that said "held" began
// before the other holder's grant (clock_timestamp(), the same clock on this
// host). An unfenced insert made after a look that said "held" may still
// land after the grant when the pause falls between the look and the
// insert: the test logs how many did; only fenced writes are safe against
// that. (Err used to report "held" after SIGCONT: 1.9s past the deadline
// in the runs, up to 0.13s here.)
func TestPausedHolderSeesTheLossAtItsFirstLook(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"lease", "elect"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			_, err := b.db.Pool.Exec(b.ctx, `CREATE TABLE side_effects (resource text, checked_at timestamptz, landed_at timestamptz DEFAULT clock_timestamp())`)
			require.NoError(t, err)
			other := b.client(t, nil, gofence.Config{Holder: "B", PollInterval: 20 * time.Millisecond})
			rounds := 5
			if testing.Short() {
				rounds = 1 // each round is a child process spinning on three goroutines
			}
			for round := range rounds {
				resource := fmt.Sprintf("paused-%d", round)
				rep := pauseHolder(t, b, mode, resource, func() time.Time {
					l, err := other.Acquire(b.ctx, resource, &gofence.LeaseOptions{Wait: true})
					require.NoError(t, err)
					defer l.Release(b.ctx)
					return b.lease(t, resource).AcquiredAt
				})
				t.Logf("round %d: %d looks; loss seen %s after the trust deadline, %s after the first look after the pause; Done woke %s after it",
					round, rep.Looks, rep.LossAfterDeadline, rep.LossAfterResume, rep.DoneAfterResume)
			}
		})
	}
}

// pauseHolder runs one round of TestPausedHolderSeesTheLossAtItsFirstLook.
// grant runs while the child is stopped: it takes the lease for the other
// holder and returns the time of that grant by the server's clock.
func pauseHolder(t *testing.T, b *bundle, mode, resource string, grant func() time.Time) pausedReport {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPausedHolderChild$", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), envPausedMode+"="+mode, envPausedURL+"="+b.db.URL, envPausedResource+"="+resource)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 4)
	exited := make(chan error, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if line, ok := strings.CutPrefix(s.Text(), pausedPrefix); ok {
				lines <- line
			} else {
				fmt.Fprintf(os.Stderr, "%s (child): %s\n", t.Name(), s.Text())
			}
		}
		close(lines)
		exited <- cmd.Wait() // after the last read: Wait closes the pipe
	}()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	next := func() string {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the child ended without a report")
			return line
		case <-time.After(30 * time.Second):
			t.Fatal("the child said nothing for 30s")
			return ""
		}
	}

	require.Equal(t, "held", next())
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	grantedAt := grant() // by the server's clock, while the child is stopped
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	var rep pausedReport
	require.NoError(t, json.Unmarshal([]byte(next()), &rep))
	require.NoError(t, <-exited)
	exited <- nil // for the deferred clean-up, which waits for it

	require.Zero(t, rep.Violations, "%d looks said held at or past the trust deadline, the worst %s past it", rep.Violations, rep.WorstViolation)
	require.True(t, rep.LastHeld.Before(grantedAt),
		"the child's last look that said held began at %s, %s after the server granted the lease to B", rep.LastHeld, rep.LastHeld.Sub(grantedAt))
	if mode == "elect" {
		var late, lateLanded int
		require.NoError(t, b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE checked_at >= $2), count(*) FILTER (WHERE landed_at >= $2)
			FROM side_effects WHERE resource = $1`, resource, grantedAt).Scan(&late, &lateLanded))
		require.Zero(t, late, "side effects decided by a look that began after B's grant")
		t.Logf("%s: %d unfenced inserts decided before B's grant landed after it (a pause between the look and the insert)", resource, lateLanded)
	}
	return rep
}

// TestPausedHolderChild is the child process of
// TestPausedHolderSeesTheLossAtItsFirstLook; run on its own, it skips.
func TestPausedHolderChild(t *testing.T) {
	mode := os.Getenv(envPausedMode)
	if mode == "" {
		t.Skip("the child process of TestPausedHolderSeesTheLossAtItsFirstLook")
	}
	ctx := t.Context()
	resource := os.Getenv(envPausedResource)
	pool, err := pgxpool.New(ctx, os.Getenv(envPausedURL))
	require.NoError(t, err)
	defer pool.Close()
	c, err := gofence.New(pool, &gofence.Config{Holder: "A", TTL: time.Second, RenewInterval: 300 * time.Millisecond, SafetyMargin: 100 * time.Millisecond, Logger: quiet})
	require.NoError(t, err)
	defer c.Close(ctx)

	report := func(rep pausedReport) {
		b, err := json.Marshal(rep)
		require.NoError(t, err)
		fmt.Printf("%s%s\n", pausedPrefix, b)
	}
	switch mode {
	case "lease":
		l, err := c.Acquire(ctx, resource, nil)
		require.NoError(t, err)
		defer l.Release(ctx)
		report(watchLease(l, l.Context(), nil))
	case "elect":
		ectx, stop := context.WithCancel(ctx)
		var rep pausedReport
		err := c.Elect(ectx, resource, nil, func(fctx context.Context, l *gofence.Lease) error {
			rep = watchLease(l, fctx, func(checked time.Time) {
				// An unfenced side effect, decided by the look that began
				// at checked.
				_, _ = pool.Exec(fctx, `INSERT INTO side_effects (resource, checked_at) VALUES ($1, $2)`, resource, checked)
			})
			stop()
			return nil
		})
		require.ErrorIs(t, err, context.Canceled)
		report(rep)
	}
}

// watchLease looks at the lease (Err, a non-blocking receive from Done, and
// ctx.Err) in three busy goroutines until one of them sees it lost, the
// first also calling sideEffect after each look that said "held", and
// reports what they saw. It prints "held" once each has looked.
func watchLease(l *gofence.Lease, ctx context.Context, sideEffect func(checked time.Time)) pausedReport {
	looks := []func() bool{
		func() bool { return ctx.Err() == nil },
		func() bool { return l.Err() == nil },
		func() bool {
			select {
			case <-l.Done():
				return false
			default:
				return true
			}
		},
	}
	var (
		mu      sync.Mutex
		rep     pausedReport
		resumed time.Time // when the first look after the pause returned
		lost    time.Time // when the first look that said lost returned
		n       atomic.Int64
		started sync.WaitGroup
		wg      sync.WaitGroup
		stop    atomic.Bool
	)
	earliest := func(t *time.Time, at time.Time) {
		if t.IsZero() || at.Before(*t) {
			*t = at
		}
	}
	doneWoke := make(chan time.Time, 1)
	go func() { <-l.Done(); doneWoke <- time.Now() }()
	started.Add(len(looks))
	for i, look := range looks {
		wg.Go(func() {
			var prev time.Time
			for !stop.Load() {
				t0 := time.Now()
				held := look()
				t1 := time.Now()
				d := l.TrustDeadline() // after the look: a deadline only ever moves later
				n.Add(1)
				mu.Lock()
				if !prev.IsZero() && t1.Sub(prev) > 200*time.Millisecond {
					earliest(&resumed, t1)
				}
				if !held {
					earliest(&lost, t1)
					mu.Unlock()
					stop.Store(true)
					break
				}
				if !t0.Before(d) {
					rep.Violations++
					rep.WorstViolation = max(rep.WorstViolation, t0.Sub(d))
				}
				if t0.After(rep.LastHeld) {
					rep.LastHeld = t0
				}
				mu.Unlock()
				if prev.IsZero() {
					started.Done()
				}
				prev = t1
				if i == 0 && sideEffect != nil {
					sideEffect(t0)
				}
			}
			if prev.IsZero() {
				started.Done()
			}
		})
	}
	started.Wait()
	fmt.Printf("%sheld\n", pausedPrefix)
	wg.Wait()
	woke := <-doneWoke
	rep.Looks = n.Load()
	rep.LossAfterDeadline = lost.Sub(l.TrustDeadline())
	if !resumed.IsZero() {
		rep.LossAfterResume = max(lost.Sub(resumed), 0)
		rep.DoneAfterResume = max(woke.Sub(resumed), 0)
	}
	return rep
}
