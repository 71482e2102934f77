package gofence

import (
	"context"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/sqlfuncs"
)

// LeaseInfo describes one resource as the view fence.leases shows it, with
// the server's clock at the time of reading (sqlfuncs.LeaseState: one type
// for a lease's state in both packages).
type LeaseInfo = sqlfuncs.LeaseState

// Leases lists every resource ever granted, ordered by name.
func (c *Client) Leases(ctx context.Context) ([]LeaseInfo, error) {
	if err := c.ensureInstalled(ctx); err != nil {
		return nil, err
	}
	return sqlfuncs.ListLeases(ctx, c.pool)
}

// LeaseOf describes one resource; ok is false when it was never granted.
func (c *Client) LeaseOf(ctx context.Context, resource string) (info LeaseInfo, ok bool, err error) {
	if err := c.ensureInstalled(ctx); err != nil {
		return LeaseInfo{}, false, err
	}
	r, ok, err := sqlfuncs.GetLease(ctx, c.pool, resource)
	if err != nil || !ok {
		return LeaseInfo{}, ok, err
	}
	return r, true, nil
}

// RenewToken renews the lease of resource held with token, for callers that
// hold a token but no *Lease (another process, a shell script). It returns
// the new expiry by the server's clock, or an error matching ErrLost when
// token is not the live lease.
func (c *Client) RenewToken(ctx context.Context, resource string, token int64) (time.Time, error) {
	if err := c.ensureInstalled(ctx); err != nil {
		return time.Time{}, err
	}
	exp, ok, err := sqlfuncs.Renew(ctx, c.pool, resource, token, c.cfg.TTL)
	if err != nil {
		return time.Time{}, fmt.Errorf("pgfence: renewing %s: %w", resource, err)
	}
	if !ok {
		return time.Time{}, fmt.Errorf("%w: %s: token %d is not the live lease (it expired, was released, revoked or superseded)", ErrLost, resource, token)
	}
	return exp, nil
}

// ReleaseToken ends the lease of resource held with token, for callers that
// hold a token but no *Lease. It reports whether it ended a live lease;
// false (not an error) when token was not the live lease.
func (c *Client) ReleaseToken(ctx context.Context, resource string, token int64) (bool, error) {
	if err := c.ensureInstalled(ctx); err != nil {
		return false, err
	}
	ok, err := sqlfuncs.Release(ctx, c.pool, resource, token)
	if err != nil {
		return false, fmt.Errorf("pgfence: releasing %s: %w", resource, err)
	}
	return ok, nil
}

// Revoke is the operator action: it ends any lease of resource and grants a
// new token to nobody, so every outstanding token of the resource is stale.
// It returns that token, or an error matching ErrBusy when a guarded
// transaction under the current token stayed open past fence.grant_wait.
func (c *Client) Revoke(ctx context.Context, resource string) (int64, error) {
	if err := c.ensureInstalled(ctx); err != nil {
		return 0, err
	}
	tok, err := sqlfuncs.Revoke(ctx, c.pool, resource)
	if err != nil {
		return 0, fmt.Errorf("pgfence: revoking %s: %w", resource, err)
	}
	return tok, nil
}

// Protect installs the guard triggers on table (as PostgreSQL parses a name:
// "public.orders"), so writes to it need the latest token of resource:
// from tokenColumn (a bigint column) for INSERT and UPDATE, else from
// fence.use_token (Lease.Tx registers it). Only the table's owner may do it.
func (c *Client) Protect(ctx context.Context, table, resource, tokenColumn string) error {
	if err := c.ensureInstalled(ctx); err != nil {
		return err
	}
	if err := sqlfuncs.Protect(ctx, c.pool, table, resource, tokenColumn); err != nil {
		return fmt.Errorf("pgfence: protecting %s: %w", table, err)
	}
	return nil
}

// ProtectRows guards table per row: the resource of a row is prefix followed
// by the row's resourceColumn as text (resourceColumn "id" and prefix
// "invoice:" put row 42 under resource "invoice:42", leased like any other
// resource), and a write commits only when it presented the latest token of
// the resource of every row it wrote: in tokenColumn (a bigint column; ""
// for none), or with fence.use_token for that row's resource earlier in the
// transaction (Lease.Tx and Lease.UseToken register the tokens of all the
// leases they are given). DELETE, moving a row to another resource (its old
// resource) and TRUNCATE (every resource that has rows) need
// fence.use_token. Only the table's owner may do it; Unprotect undoes it.
func (c *Client) ProtectRows(ctx context.Context, table, resourceColumn, prefix, tokenColumn string) error {
	if err := c.ensureInstalled(ctx); err != nil {
		return err
	}
	if err := sqlfuncs.ProtectRows(ctx, c.pool, table, resourceColumn, prefix, tokenColumn); err != nil {
		return fmt.Errorf("pgfence: protecting %s per row: %w", table, err)
	}
	return nil
}

// Unprotect removes the guard triggers that Protect or ProtectRows installed
// on table.
func (c *Client) Unprotect(ctx context.Context, table string) error {
	if err := c.ensureInstalled(ctx); err != nil {
		return err
	}
	if err := sqlfuncs.Unprotect(ctx, c.pool, table); err != nil {
		return fmt.Errorf("pgfence: unprotecting %s: %w", table, err)
	}
	return nil
}
