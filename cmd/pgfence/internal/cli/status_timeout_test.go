package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// lockedBuffer is a bytes.Buffer that a command writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStatusWatchBoundsEachRead: a read that hangs (the network to the
// server stalls) is cut at max(interval, minTickTimeout) and reported as a
// failed tick, and the watch reads again once the network is back. Not
// parallel: it shortens the package's bound while it runs.
func TestStatusWatchBoundsEachRead(t *testing.T) {
	defer func(d time.Duration) { minTickTimeout = d }(minTickTimeout)
	minTickTimeout = 500 * time.Millisecond
	db := pgtest.Setup(t)
	proxy := pgtest.NewProxy(t, db.URL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"status", "--watch=100ms", "--json", "--database-url", proxy.URL(db.URL)}, &stdout, &stderr)
	}()
	type line struct {
		At    time.Time `json:"at"`
		Error string    `json:"error"`
	}
	lines := func() []line {
		var out []line
		for _, text := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			var l line
			if json.Unmarshal([]byte(text), &l) == nil {
				out = append(out, l)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(lines()) >= 1 }, 30*time.Second, 10*time.Millisecond)
	proxy.Freeze()
	frozen := time.Now()
	var failedAt time.Time
	require.Eventually(t, func() bool {
		for _, l := range lines() {
			if l.Error != "" {
				failedAt = l.At
				return true
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "a hung read was never reported: %s", stdout.String())
	require.Less(t, failedAt.Sub(frozen), 5*time.Second, "the read was not cut at its bound")
	require.Contains(t, stderr.String(), "timed out")
	proxy.Thaw()
	require.Eventually(t, func() bool {
		ls := lines()
		return len(ls) > 0 && ls[len(ls)-1].Error == "" && ls[len(ls)-1].At.After(failedAt)
	}, 30*time.Second, 10*time.Millisecond, "no good read after the network came back: %s", stdout.String())
	cancel()
	require.Equal(t, ExitOK, <-done)
}
