package gofence

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// Config configures a Client. The zero value (or a nil *Config) gives the
// documented defaults.
type Config struct {
	// Holder names this process in fence.leases. Default: host/pid/random,
	// unique per Client.
	Holder string

	// TTL is the lease time to live on the server. Default 30s; allowed
	// 10ms to 24h (the SQL kit's limits).
	TTL time.Duration

	// RenewInterval is how often a lease renews itself. Default TTL/3, so a
	// lease survives two failed renewals before its trust deadline comes near.
	RenewInterval time.Duration

	// SafetyMargin is subtracted from the TTL to get the local trust deadline:
	// the time the acquire or last successful renew was sent + TTL -
	// SafetyMargin, on the local monotonic clock. It covers the difference in
	// rate between the local clock and the server's over one TTL, and the
	// scheduling delay of the loss signal. Default TTL/10.
	SafetyMargin time.Duration

	// RetryInterval is the pause between attempts of a renewal or release
	// that failed with a transient error. Default min(1s, RenewInterval/4).
	RetryInterval time.Duration

	// PollInterval is how often Lock asks again while it waits, whatever the
	// notifications say (they can be lost, and poolers such as PgBouncer in
	// transaction mode block LISTEN). Each wait is jittered by ±25%, and
	// shortened to the held lease's expiry when that comes sooner.
	// Default 1s.
	PollInterval time.Duration

	// DisableNotify turns off LISTEN/NOTIFY: Lock then relies on polling only.
	DisableNotify bool

	// ReleaseOnClose makes Close release every lease the client still holds,
	// as etcd's Session.Close revokes its lease: nothing keeps renewing after
	// Close, and the next holder need not wait for a TTL. Default false:
	// leases belong to the caller and outlive Close (they keep renewing until
	// released or lost), which a program that hands a token to another
	// process needs (pgfence acquire prints the token and exits, leaving the
	// lease held for its TTL).
	ReleaseOnClose bool

	// Logger receives what the package notices on its own, in the
	// background: a lease lost (WARN), a renewal retried or the notification
	// listener reconnecting (INFO), a lease acquired (DEBUG). Default: none;
	// a library stays quiet unless asked, and every such event also reaches
	// the caller (Lease.Done and Lease.Err, errors of the calls).
	Logger *slog.Logger
}

// Client hands out leases on resources of one database. It is safe for
// concurrent use. Create it with New; Close it when done.
type Client struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger

	installed atomic.Bool

	mu     sync.Mutex // guards closed, notify and leases
	closed bool
	notify *notifier
	leases map[*Lease]struct{} // held (neither released nor lost), for Close
}

// New returns a client over pool (which it never closes). A nil cfg gives
// the defaults; invalid settings are reported here, once.
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("pgfence: New needs a *pgxpool.Pool")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Holder == "" {
		c.Holder = defaultHolder()
	}
	c.TTL = cmp.Or(c.TTL, 30*time.Second)
	c.RenewInterval = cmp.Or(c.RenewInterval, c.TTL/3)
	c.SafetyMargin = cmp.Or(c.SafetyMargin, c.TTL/10)
	c.RetryInterval = cmp.Or(c.RetryInterval, min(time.Second, c.RenewInterval/4))
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	switch {
	case len(c.Holder) > 255:
		return nil, fmt.Errorf("pgfence: Config.Holder is %d bytes; the limit is 255 characters", len(c.Holder))
	case c.TTL < 10*time.Millisecond || c.TTL > 24*time.Hour:
		return nil, fmt.Errorf("pgfence: Config.TTL %s is out of range: use 10ms to 24h", c.TTL)
	case c.SafetyMargin <= 0 || c.SafetyMargin >= c.TTL/2:
		return nil, fmt.Errorf("pgfence: Config.SafetyMargin %s must be positive and under half the TTL (%s)", c.SafetyMargin, c.TTL)
	case c.RenewInterval <= 0 || c.RenewInterval >= c.TTL-c.SafetyMargin:
		return nil, fmt.Errorf("pgfence: Config.RenewInterval %s must be positive and under TTL - SafetyMargin (%s), or the lease is lost between renewals",
			c.RenewInterval, c.TTL-c.SafetyMargin)
	case c.RetryInterval <= 0 || c.PollInterval <= 0:
		return nil, errors.New("pgfence: Config.RetryInterval and Config.PollInterval must be positive")
	}
	return &Client{pool: pool, cfg: c, log: c.Logger, leases: map[*Lease]struct{}{}}, nil
}

// defaultHolder is host/pid/random: unique per process instance, and still
// telling a person where the holder runs.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Holder is the name this client holds leases under.
func (c *Client) Holder() string { return c.cfg.Holder }

// Config returns the client's configuration with the defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// closeReleaseTimeout bounds each release that Close makes (ReleaseOnClose).
const closeReleaseTimeout = 5 * time.Second

// Close stops the client's background listener; with
// Config.ReleaseOnClose it first releases every lease the client still
// holds (they end with ErrReleased; each release is bounded by 5s, and one
// that cannot reach the server leaves its lease to expire at its TTL).
// Without it, leases already granted are the caller's: they keep renewing
// until released or lost (release them first, or use Do or Elect, which
// release). After Close, Acquire, Lock and AcquireSession return ErrClosed.
// Close is idempotent.
func (c *Client) Close() {
	c.mu.Lock()
	c.closed = true
	n := c.notify
	var held []*Lease
	if c.cfg.ReleaseOnClose {
		for l := range c.leases {
			held = append(held, l)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range held {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), closeReleaseTimeout)
			defer cancel()
			if err := l.Release(ctx); err != nil {
				c.log.Warn("pgfence: release at Close failed; the lease ends at its expiry", "resource", l.resource, "error", err.Error())
			}
		})
	}
	wg.Wait()
	if n != nil {
		n.close()
	}
}

// track registers a new lease for Close, until it ends. It refuses (false)
// once the client is closed: the caller then releases the lease.
func (c *Client) track(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.leases[l] = struct{}{}
	context.AfterFunc(l.ctx, func() {
		c.mu.Lock()
		delete(c.leases, l)
		c.mu.Unlock()
	})
	return true
}

// isClosed reports whether Close was called.
func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// ensureInstalled checks once that schema fence is installed at the version
// this package needs, so that a missing kit gives ErrNotInstalled with the
// command that fixes it instead of a bare "function does not exist".
func (c *Client) ensureInstalled(ctx context.Context) error {
	if c.installed.Load() {
		return nil
	}
	// Concurrent first calls may each ask; each waits only as long as its
	// own ctx allows.
	v, err := sqlfuncs.Version(ctx, c.pool)
	if err != nil {
		return err
	}
	if v < migrations.Latest {
		return fmt.Errorf("%w (the database has version %d, this package needs %d)", ErrNotInstalled, v, migrations.Latest)
	}
	c.installed.Store(true)
	return nil
}
