package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
)

// grantUsageFix is the fix for a role that lacks the kit's usage privilege
// (operator: the operator privilege, for fence.revoke), addressed to the
// role that can grant it: the kit's owner. doctor and the errors of the
// commands say it in the same words.
func grantUsageFix(k kitState, operator bool) string {
	call := "SELECT fence.grant_usage(" + quoteLiteral(k.User)
	if operator {
		call += ", operator => true"
	}
	return fmt.Sprintf("as role %s (the kit's owner): %s)", k.KitOwner, call)
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// explainDenied adds the way forward to a "permission denied" (42501) that
// comes from the kit: which privilege this role lacks and the exact call
// that grants it, as whom (the same fix as doctor's privileges check). Any
// other error, or one it cannot explain from the catalogs, is returned as
// it is.
func explainDenied(ctx context.Context, pool *pgxpool.Pool, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" || ctx.Err() != nil {
		return err
	}
	k, kerr := readKit(ctx, pool)
	if kerr != nil || !k.Installed || k.Super {
		return err
	}
	if !k.Usage {
		return fmt.Errorf("%w; role %s may not use the kit (no usage on schema fence): %s", err, k.User, grantUsageFix(k, false))
	}
	if pgErr.Message == "permission denied for function revoke" {
		if p, perr := catalog.ReadKitPrivileges(ctx, pool); perr == nil && !p.Revoke {
			return fmt.Errorf("%w; revoke is an operator action, and role %s has usage without it: %s", err, k.User, grantUsageFix(k, true))
		}
	}
	return err
}
