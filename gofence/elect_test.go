package gofence_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// term is one candidate's time as leader, by the local clock (all candidates
// run in this process, so their clocks are one).
type term struct {
	who        string
	token      int64
	start, end time.Time
}

type candidate struct {
	name   string
	proxy  *pgtest.Proxy
	client *gofence.Client
	cancel context.CancelFunc
	done   chan error
}

func TestElection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	observer := b.client(t, nil, gofence.Config{})

	var (
		mu    sync.Mutex
		terms []term
	)
	elected := make(chan string, 10)
	cfg := gofence.Config{TTL: time.Second, RenewInterval: 200 * time.Millisecond, SafetyMargin: 100 * time.Millisecond, PollInterval: time.Minute}
	var cands []*candidate
	for i := range 3 {
		c := &candidate{name: fmt.Sprint("candidate-", i), proxy: pgtest.NewProxy(t, b.db.URL), done: make(chan error, 1)}
		ccfg := cfg
		ccfg.Holder = c.name
		c.client = b.client(t, b.pool(t, c.proxy.URL(b.db.URL)), ccfg)
		ctx, cancel := context.WithCancel(b.ctx)
		c.cancel = cancel
		go func() {
			c.done <- c.client.Elect(ctx, "leader", nil, func(ctx context.Context, l *gofence.Lease) error {
				tm := term{who: c.name, token: l.Token(), start: time.Now()}
				elected <- c.name
				<-ctx.Done()
				tm.end = time.Now()
				mu.Lock()
				terms = append(terms, tm)
				mu.Unlock()
				return ctx.Err()
			})
		}()
		cands = append(cands, c)
	}
	byName := func(name string) *candidate {
		for _, c := range cands {
			if c.name == name {
				return c
			}
		}
		t.Fatalf("no candidate %s", name)
		return nil
	}
	waitElected := func() string {
		select {
		case who := <-elected:
			return who
		case <-time.After(20 * time.Second):
			t.Fatal("nobody was elected")
			return ""
		}
	}

	first := waitElected()
	info, ok, err := observer.LeaseOf(b.ctx, "leader")
	require.NoError(t, err)
	require.True(t, ok && info.Live)
	require.Equal(t, first, info.Holder)

	// Partition the leader from the database: it must give up leadership
	// (its function's context cancelled) before another candidate's term starts.
	byName(first).proxy.Freeze()
	second := waitElected()
	require.NotEqual(t, first, second)

	// The second leader steps down by cancelling its context: it releases,
	// and the third is elected at once, not after a TTL (with polling every
	// minute, only the release's notification can wake it so soon).
	byName(first).cancel() // the partitioned one stops campaigning
	byName(second).cancel()
	require.ErrorIs(t, <-byName(second).done, context.Canceled)
	third := waitElected()
	require.NotEqual(t, second, third)
	require.NotEqual(t, first, third)
	byName(third).cancel()
	require.ErrorIs(t, <-byName(third).done, context.Canceled)
	byName(first).proxy.Thaw()
	require.ErrorIs(t, <-byName(first).done, context.Canceled)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, terms, 3)
	slices.SortFunc(terms, func(a, b term) int { return cmp.Compare(a.token, b.token) })
	for i := 1; i < len(terms); i++ {
		prev, next := terms[i-1], terms[i]
		require.Greater(t, next.token, prev.token, "terms strictly increase")
		require.True(t, prev.end.Before(next.start),
			"%s (term %d) still led at %s when %s (term %d) started at %s", prev.who, prev.token, prev.end, next.who, next.token, next.start)
		t.Logf("%s -> %s: gap %s", prev.who, next.who, next.start.Sub(prev.end))
	}
	info, ok, err = observer.LeaseOf(b.ctx, "leader")
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, info.Live, "the last leader stepped down")
}
