package gofence_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// pooledPool opens a pool on the bundle's database through PgBouncer in
// transaction mode, with the given pgx query execution mode.
func pooledPool(t *testing.T, b *bundle, pb *pgtest.PgBouncer, mode string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(b.ctx, pb.URL(b.db.URL)+"&default_query_exec_mode="+mode)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestThroughPgBouncer: TTL leases, Tx (with several leases on a table
// protected per row too), Do and a waiting Acquire work through PgBouncer in
// transaction mode with a pool in a query execution mode that sends no named
// prepared statements; session leases refuse.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pb := pgtest.NewPgBouncer(t, b.db.URL)

	for _, mode := range []string{"exec", "simple_protocol", "cache_describe"} {
		t.Run("TTL leases, Tx and Do with "+mode, func(t *testing.T) {
			pool := pooledPool(t, b, pb, mode)
			c := b.client(t, pool, gofence.Config{TTL: time.Minute, PollInterval: 50 * time.Millisecond})
			ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
			defer cancel()
			var last int64
			for range 5 { // more rounds than PgBouncer has server connections
				l, err := c.Acquire(ctx, "job", nil)
				require.NoError(t, err)
				require.Greater(t, l.Token(), last)
				last = l.Token()
				require.NoError(t, l.Renew(ctx))
				require.NoError(t, l.Tx(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO work (who, token) VALUES ($1, $2)`, mode, l.Token())
					return err
				}))
				require.NoError(t, l.Release(ctx))
				err = c.Do(ctx, "job", &gofence.LeaseOptions{Wait: true}, func(ctx context.Context, l *gofence.Lease) error {
					last = l.Token()
					return l.Tx(ctx, pool, func(tx pgx.Tx) error {
						_, err := tx.Exec(ctx, `UPDATE work SET who = who || '+do', token = $1 WHERE who = $2`, l.Token(), mode)
						return err
					})
				})
				require.NoError(t, err)
			}

			// A write under a token that is no longer the latest is refused,
			// through the pooler as directly.
			old, err := c.Acquire(ctx, "job", nil)
			require.NoError(t, err)
			_, err = sqlfuncs.Revoke(ctx, b.db.Pool, "job")
			require.NoError(t, err)
			err = old.Tx(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO work (who, token) VALUES ('stale', $1)`, old.Token())
				return err
			})
			require.ErrorIs(t, err, gofence.ErrStaleToken)
			_ = old.Release(ctx)
		})
	}

	t.Run("per-row leases, several in one Tx", func(t *testing.T) {
		pool := pooledPool(t, b, pb, "exec")
		c := b.client(t, pool, gofence.Config{TTL: time.Minute})
		ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
		defer cancel()
		_, err := b.db.Pool.Exec(ctx, `CREATE TABLE inv (id int PRIMARY KEY, note text, tok bigint)`)
		require.NoError(t, err)
		require.NoError(t, c.ProtectRows(ctx, "inv", "id", "inv:", "tok"))
		l1, err := c.Acquire(ctx, "inv:1", nil)
		require.NoError(t, err)
		l2, err := c.Acquire(ctx, "inv:2", nil)
		require.NoError(t, err)
		for range 5 { // more rounds than PgBouncer has server connections
			require.NoError(t, gofence.Tx(ctx, pool, &gofence.TxOptions{Leases: []*gofence.Lease{l1, l2}}, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO inv VALUES (1, 'a', $1), (2, 'b', $2)
					ON CONFLICT (id) DO UPDATE SET note = excluded.note, tok = excluded.tok`, l1.Token(), l2.Token())
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `DELETE FROM inv WHERE id = 2`) // by the registered token of inv:2
				return err
			}))
		}
		// inv:1 taken over: its row refuses the old token, inv:2's does not.
		_, err = sqlfuncs.Revoke(ctx, b.db.Pool, "inv:1")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE inv SET note = 'stale', tok = $1 WHERE id = 1`, l1.Token())
		require.ErrorIs(t, sqlfuncs.Translate(err), sqlfuncs.ErrStaleToken)
		_, err = pool.Exec(ctx, `INSERT INTO inv VALUES (2, 'b', $1)`, l2.Token())
		require.NoError(t, err)
	})

	t.Run("a waiting Acquire gets the lease by polling when LISTEN is useless", func(t *testing.T) {
		pool := pooledPool(t, b, pb, "exec")
		c := b.client(t, pool, gofence.Config{TTL: time.Minute, PollInterval: 50 * time.Millisecond})
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second) // a waiter that is never granted fails here
		defer cancel()
		for range 3 {
			holder, err := c.Acquire(ctx, "lock", nil)
			require.NoError(t, err)
			got := make(chan *gofence.Lease, 1)
			errs := make(chan error, 1)
			go func() {
				l, err := c.Acquire(ctx, "lock", &gofence.LeaseOptions{Wait: true})
				if err != nil {
					errs <- err
					return
				}
				got <- l
			}()
			// Release once the waiter is waiting (it set the lease's waiters
			// flag), so that the release sends a NOTIFY that the pooler may
			// deliver to nobody.
			require.NoError(t, waitFor(ctx, func() (bool, error) {
				var waiting bool
				err := b.db.Pool.QueryRow(ctx, `SELECT waiters FROM fence.lease WHERE resource = 'lock'`).Scan(&waiting)
				return waiting, err
			}))
			require.NoError(t, holder.Release(ctx))
			select {
			case l := <-got:
				require.Greater(t, l.Token(), holder.Token())
				require.NoError(t, l.Release(ctx))
			case err := <-errs:
				t.Fatalf("a waiting Acquire through PgBouncer: %v", err)
			}
		}
	})

	t.Run("a session lease is refused", func(t *testing.T) {
		pool := pooledPool(t, b, pb, "exec")
		c := b.client(t, pool, gofence.Config{})
		_, err := c.Acquire(b.ctx, "session", &gofence.LeaseOptions{Session: true})
		require.ErrorIs(t, err, gofence.ErrPooledSession)
		require.Contains(t, err.Error(), "take a TTL lease, without LeaseOptions.Session")
		row, ok, err := sqlfuncs.GetLease(b.ctx, b.db.Pool, "session")
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, row.Live, "the refused session lease was released")
		l, err := c.Acquire(b.ctx, "session", nil)
		require.NoError(t, err, "a TTL lease of the same resource is granted next")
		require.NoError(t, l.Release(b.ctx))
	})

	t.Run("a session lease on a direct connection is not refused", func(t *testing.T) {
		c := b.client(t, nil, gofence.Config{})
		l, err := c.Acquire(b.ctx, "session-direct", &gofence.LeaseOptions{Session: true})
		require.NoError(t, err)
		require.NoError(t, l.Release(b.ctx))
	})
}

// waitFor polls cond until it is true or ctx ends.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestPoolerStatementCache: a pool in pgx's default mode (a cache of named
// prepared statements) is refused on the Client's first call when it goes
// through PgBouncer in transaction mode, which hands one client's named
// statements to others; the same pool in exec mode works, and the default
// mode is not refused on a direct connection, through a plain TCP proxy, or
// through a session-mode PgBouncer (which keeps a client on one server
// connection; the Client warns that it could not tell the mode).
func TestPoolerStatementCache(t *testing.T) {
	t.Parallel()
	b := setup(t)
	open := func(t *testing.T, url string) *pgxpool.Pool {
		t.Helper()
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	logged := func() (*slog.Logger, *strings.Builder) {
		var buf strings.Builder
		var mu sync.Mutex
		return slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return buf.Write(p)
		}), nil)), &buf
	}

	t.Run("PgBouncer in transaction mode, default mode: refused", func(t *testing.T) {
		pb := pgtest.NewPgBouncer(t, b.db.URL)
		pool := open(t, pb.URL(b.db.URL))
		require.Equal(t, pgx.QueryExecModeCacheStatement, pool.Config().ConnConfig.DefaultQueryExecMode)
		c := b.client(t, pool, gofence.Config{})
		ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
		defer cancel()
		_, err := c.Acquire(ctx, "job", nil)
		require.ErrorIs(t, err, gofence.ErrPoolerStatementCache)
		require.Contains(t, err.Error(), "default_query_exec_mode=exec")
		_, err = c.Leases(ctx)
		require.ErrorIs(t, err, gofence.ErrPoolerStatementCache, "every call, not only the first")
		row, ok, err := sqlfuncs.GetLease(ctx, b.db.Pool, "job")
		require.NoError(t, err)
		require.False(t, ok && row.Live, "nothing was granted: %+v", row)
		var left int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'pgfence_probe_%'`).Scan(&left))
		require.Zero(t, left, "the probe's statements are deallocated (this backend)")

		t.Run("eight workers starting at once on a pool of four: all refused", func(t *testing.T) {
			pool := open(t, pb.URL(b.db.URL))
			c := b.client(t, pool, gofence.Config{})
			errs := make([]error, 8)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() {
					l, err := c.Acquire(ctx, fmt.Sprintf("worker-%d", i), nil)
					if err == nil {
						_ = l.Release(ctx)
					}
					errs[i] = err
				})
			}
			wg.Wait()
			for i, err := range errs {
				require.ErrorIs(t, err, gofence.ErrPoolerStatementCache, "worker %d", i)
			}
		})

		t.Run("the same pooler with exec mode works", func(t *testing.T) {
			pool := open(t, pb.URL(b.db.URL)+"&default_query_exec_mode=exec")
			c := b.client(t, pool, gofence.Config{})
			l, err := c.Acquire(ctx, "job", nil)
			require.NoError(t, err)
			require.NoError(t, write(ctx, l, pool, "exec"))
			require.NoError(t, l.Release(ctx))
		})
	})

	t.Run("direct connection and plain TCP proxy, default mode: not refused", func(t *testing.T) {
		proxy := pgtest.NewProxy(t, b.db.URL)
		for _, url := range []string{b.db.URL, proxy.URL(b.db.URL)} {
			pool := open(t, url)
			log, buf := logged()
			c, err := gofence.New(pool, &gofence.Config{Logger: log})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close(context.Background()) })
			l, err := c.Acquire(b.ctx, "job", nil)
			require.NoError(t, err)
			require.NoError(t, write(b.ctx, l, pool, "direct"))
			require.NoError(t, l.Release(b.ctx))
			require.NotContains(t, buf.String(), "pooler", "nothing to warn about")
		}
	})

	t.Run("PgBouncer in session mode, default mode: not refused, warned", func(t *testing.T) {
		pb := pgtest.NewPgBouncerInMode(t, b.db.URL, "session")
		pool := open(t, pb.URL(b.db.URL))
		log, buf := logged()
		c, err := gofence.New(pool, &gofence.Config{Logger: log})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
		defer cancel()
		for range 3 {
			l, err := c.Acquire(ctx, "job", nil)
			require.NoError(t, err)
			require.NoError(t, write(ctx, l, pool, "session-mode"))
			require.NoError(t, l.Release(ctx))
		}
		require.Contains(t, buf.String(), "whose mode could not be told")
		require.Equal(t, 1, strings.Count(buf.String(), "could not be told"), "once per Client")
	})
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// A waiting Acquire through a transaction-mode pooler does not LISTEN
// (PgBouncer's server connections would keep the channel, and its
// notifications would reach the pool's other clients): no server
// connection of the pooler listens while it waits, and it is granted the
// lease by polling. (It used to LISTEN on a pooled server connection, which
// kept fence_release in pg_listening_channels.)
func TestNoListenBehindAPooler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pb := pgtest.NewPgBouncer(t, b.db.URL)
	holder := b.client(t, nil, gofence.Config{Holder: "B"})
	held, err := holder.Acquire(b.ctx, "job", nil)
	require.NoError(t, err)
	waiter := b.client(t, pooledPool(t, b, pb, "exec"), gofence.Config{Holder: "A", PollInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "job", &gofence.LeaseOptions{Wait: true})
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(time.Second) // the listener, if any, has started by now
	require.Empty(t, pb.ServerListens(t, b.db.URL), "a server connection of the pooler listens")
	require.NoError(t, held.Release(b.ctx))
	require.NoError(t, <-got)
	require.Empty(t, pb.ServerListens(t, b.db.URL))
}
