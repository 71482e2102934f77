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

	// PollInterval is how often AcquireWait asks again while it waits, whatever the
	// notifications say (they can be lost, and poolers such as PgBouncer in
	// transaction mode block LISTEN). Each wait is jittered by ±25%, and
	// shortened to the held lease's expiry when that comes sooner.
	// Default 1s.
	PollInterval time.Duration

	// DisableNotify turns off LISTEN/NOTIFY: AcquireWait then relies on polling only.
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
	pool  *pgxpool.Pool
	cfg   Config // with the defaults filled in
	given Config // as the caller set it, to derive per-lease timings (WithTTL)
	log   *slog.Logger

	installed atomic.Bool
	pooler    poolerCheck // pooler.go: the statement-cache check of the first calls

	mu     sync.Mutex // guards closed, notify, leases and stop
	closed bool
	notify *notifier
	leases map[*Lease]struct{} // held (neither released nor lost), for Close

	// inflight counts the calls that can still grant a lease (see begin);
	// Close waits for them. stop (made on first use) ends when Close stops
	// waiting: the calls then give up what they still wait for.
	inflight sync.WaitGroup
	stop     context.Context
	stopAll  context.CancelFunc
}

// New returns a client over pool (which it never closes). A nil cfg gives
// the defaults; invalid settings are reported here, once.
func New(pool *pgxpool.Pool, cfg *Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("pgfence: New needs a *pgxpool.Pool")
	}
	var given Config
	if cfg != nil {
		given = *cfg
	}
	c := given
	if c.Holder == "" {
		c.Holder = defaultHolder()
	}
	c.PollInterval = cmp.Or(c.PollInterval, time.Second)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	t, err := timings(given, c.Holder, given.TTL, "Config.")
	if err != nil {
		return nil, err
	}
	c.TTL, c.RenewInterval, c.SafetyMargin, c.RetryInterval = t.ttl, t.renew, t.margin, t.retry
	if c.PollInterval <= 0 {
		return nil, errors.New("pgfence: Config.PollInterval must be positive")
	}
	return &Client{pool: pool, cfg: c, given: given, log: c.Logger, leases: map[*Lease]struct{}{}}, nil
}

// leaseTimings are the settings of one lease: the Client's, or those of the
// call's options (WithHolder, WithTTL).
type leaseTimings struct {
	holder                    string
	ttl, renew, margin, retry time.Duration
}

// timings fills in the defaults of a lease with the given TTL (0: the
// default 30s) from the caller's config, and validates them. The timings
// derived from the TTL (TTL/3, TTL/10, ...) follow it unless the config set
// them; field prefixes the names in errors ("Config." or "WithTTL: Config.").
func timings(given Config, holder string, ttl time.Duration, field string) (leaseTimings, error) {
	t := leaseTimings{holder: holder, ttl: cmp.Or(ttl, 30*time.Second)}
	t.renew = cmp.Or(given.RenewInterval, t.ttl/3)
	t.margin = cmp.Or(given.SafetyMargin, t.ttl/10)
	t.retry = cmp.Or(given.RetryInterval, min(time.Second, t.renew/4))
	switch {
	case len(t.holder) > 255:
		return t, fmt.Errorf("pgfence: holder name is %d bytes; the limit is 255 characters", len(t.holder))
	case t.ttl < 10*time.Millisecond || t.ttl > 24*time.Hour:
		return t, fmt.Errorf("pgfence: %sTTL %s is out of range: use 10ms to 24h", field, t.ttl)
	case t.margin <= 0 || t.margin >= t.ttl/2:
		return t, fmt.Errorf("pgfence: %sSafetyMargin %s must be positive and under half the TTL (%s)", field, t.margin, t.ttl)
	case t.renew <= 0 || t.renew >= t.ttl-t.margin:
		return t, fmt.Errorf("pgfence: %sRenewInterval %s must be positive and under TTL - SafetyMargin (%s), or the lease is lost between renewals",
			field, t.renew, t.ttl-t.margin)
	case t.retry <= 0:
		return t, fmt.Errorf("pgfence: %sRetryInterval must be positive", field)
	}
	return t, nil
}

// LeaseOption sets something of one lease, instead of the Client's Config:
// pass it to Acquire, AcquireWait, AcquireSession or AcquireSessionWait, so that one
// Client (one pool, one LISTEN connection) serves differently named workers
// and different TTLs.
type LeaseOption func(*leaseOptions)

type leaseOptions struct {
	holder string
	ttl    time.Duration
}

// WithHolder names the holder of this lease in fence.leases, instead of
// Config.Holder (up to 255 characters).
func WithHolder(name string) LeaseOption {
	return func(o *leaseOptions) { o.holder = name }
}

// WithTTL sets the TTL of this lease, instead of Config.TTL (10ms to 24h).
// Its renewal interval, safety margin and retry interval follow from it as
// the defaults do from Config.TTL (TTL/3, TTL/10, min(1s, TTL/12)), except
// those that the Config set explicitly, which must fit this TTL. WithTTL(0)
// keeps Config.TTL. Session leases have no TTL and refuse it.
func WithTTL(ttl time.Duration) LeaseOption {
	return func(o *leaseOptions) { o.ttl = ttl }
}

// sessionTimings returns the settings of a session lease taken with opts:
// the Client's, with the holder of WithHolder; WithTTL is refused.
func (c *Client) sessionTimings(opts []LeaseOption) (leaseTimings, error) {
	var o leaseOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.ttl != 0 {
		return leaseTimings{}, errors.New("pgfence: WithTTL does not apply to a session lease: it lives as long as its connection")
	}
	return c.leaseTimings(opts)
}

// leaseTimings returns the settings of a lease taken with opts.
func (c *Client) leaseTimings(opts []LeaseOption) (leaseTimings, error) {
	var o leaseOptions
	for _, opt := range opts {
		opt(&o)
	}
	holder := cmp.Or(o.holder, c.cfg.Holder)
	if o.ttl == 0 {
		t := leaseTimings{holder: holder, ttl: c.cfg.TTL, renew: c.cfg.RenewInterval, margin: c.cfg.SafetyMargin, retry: c.cfg.RetryInterval}
		if len(holder) > 255 {
			return t, fmt.Errorf("pgfence: WithHolder: the name is %d bytes; the limit is 255 characters", len(holder))
		}
		return t, nil
	}
	if o.ttl < 10*time.Millisecond || o.ttl > 24*time.Hour {
		return leaseTimings{}, fmt.Errorf("pgfence: WithTTL %s is out of range: use 10ms to 24h", o.ttl)
	}
	return timings(c.given, holder, o.ttl, "WithTTL: Config.")
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

// closeTimeout bounds how long Close waits for the acquires in flight, and
// each release that Close makes (ReleaseOnClose).
const closeTimeout = 5 * time.Second

// Close stops the client: from its start, Acquire, AcquireWait,
// AcquireSession and AcquireSessionWait return ErrClosed. It first waits for
// the acquires already in flight, so that none can grant a lease after
// Close returned: a grant that comes back during Close is given back at once
// (those calls return ErrClosed). That wait is bounded (5s): an acquire still
// waiting for the server then is cut off; if its request reaches the server
// after all, the lease it grants is nobody's and ends at its TTL. With
// Config.ReleaseOnClose, Close then releases every lease the client still
// holds (they end with ErrReleased; each release is bounded by 5s, and one
// that cannot reach the server leaves its lease to expire at its TTL).
// Without it, leases already granted are the caller's: they keep renewing
// until released or lost (release them first, or use Do or Elect, which
// release). Last, Close stops the background listener. Close is idempotent.
func (c *Client) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	c.shutdown(ctx)
}

// shutdown is Close with its wait for the acquires in flight bounded by ctx.
func (c *Client) shutdown(ctx context.Context) {
	c.mu.Lock()
	c.closed = true
	n := c.notify
	c.mu.Unlock()
	c.waitInflight(ctx)
	var held []*Lease
	if c.cfg.ReleaseOnClose {
		c.mu.Lock()
		for l := range c.leases {
			held = append(held, l)
		}
		c.mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, l := range held {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
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

// waitInflight waits until no call can grant a lease any more, or until
// ctx is done: then it stops the calls still in flight (each gives up what
// it waits for, which its context bounds too) and waits for them to return.
func (c *Client) waitInflight(ctx context.Context) {
	idle := make(chan struct{})
	go func() {
		c.inflight.Wait()
		close(idle)
	}()
	select {
	case <-idle:
		return
	case <-ctx.Done():
	}
	c.mu.Lock()
	if c.stopAll != nil {
		c.stopAll()
	}
	c.mu.Unlock()
	c.log.Warn("pgfence: Close stopped acquires that the server did not answer in time; a grant that reaches the server later is nobody's and ends at its TTL")
	<-idle
}

// call is one acquire in flight, which Close waits for (Client.begin).
type call struct {
	// stop ends when Close stops waiting for the calls in flight.
	stop context.Context
	once *sync.Once
	c    *Client
}

// begin registers an acquire that can grant a lease; it refuses with
// ErrClosed once Close has begun. The call must end with done once nothing
// it started can grant any more and what it granted is either tracked (so
// that Close sees the lease) or given back.
func (c *Client) begin() (call, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return call{}, ErrClosed
	}
	if c.stop == nil {
		c.stop, c.stopAll = context.WithCancel(context.Background())
	}
	c.inflight.Add(1)
	return call{stop: c.stop, once: new(sync.Once), c: c}, nil
}

// done ends the call (once; later calls do nothing).
func (k call) done() { k.once.Do(k.c.inflight.Done) }

// ensureInstalled is Client.ensureInstalled, also cut off when Close stops
// waiting.
func (k call) ensureInstalled(ctx context.Context) error {
	ctx, cancel := k.bound(ctx)
	defer cancel()
	return k.c.ensureInstalled(ctx)
}

// bound derives from ctx a context that also ends when Close stops waiting.
func (k call) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(k.stop, cancel)
	return ctx, func() { stop(); cancel() }
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

// ensureInstalled checks once that schema fence is installed at the version
// this package needs, so that a missing kit gives ErrNotInstalled with the
// command that fixes it instead of a bare "function does not exist".
func (c *Client) ensureInstalled(ctx context.Context) error {
	if c.installed.Load() {
		return nil
	}
	// Concurrent first calls may each ask; each waits only as long as its
	// own ctx allows.
	if err := c.checkPoolerStatementCache(ctx); err != nil { // pooler.go
		return err
	}
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
