package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/sqlfuncs"
)

// doctorPlatformChecks reports what doctor can tell about a connection
// pooler in front of the server and about a managed service that restricts
// the functions the token epoch is read from.
func doctorPlatformChecks(ctx context.Context, pool *pgxpool.Pool, add func(check, status, detail, fix string)) {
	doctorPoolerCheck(ctx, pool, add)

	if inRecovery, err := catalog.InRecovery(ctx, pool); err != nil || inRecovery {
		return // reported by the connection and writable checks
	}
	// Each read on its own, so that one a service refuses does not hide the
	// others.
	var failed []string
	for _, q := range []struct {
		name string
		read func(context.Context, catalog.DB) (string, error)
	}{
		{"pg_control_system()", catalog.SystemIdentifier},
		{"pg_current_wal_lsn()", catalog.CurrentWALLSN},
		{"pg_walfile_name()", catalog.WALTimelineHex},
	} {
		if _, err := q.read(ctx, pool); err != nil {
			failed = append(failed, q.name+": "+oneLine(err))
		}
	}
	if len(failed) > 0 {
		add("token epoch", "fail", "the server refuses what the token epoch is read from: "+strings.Join(failed, "; "),
			"grants need these functions (fence._timeline, fence._epoch); see docs/platforms.md for the service (on Aurora, pg_current_wal_lsn() needs rds.logical_replication = 1)")
	} else {
		add("token epoch", "ok", "system identifier and WAL timeline readable (pg_control_system, pg_current_wal_lsn, pg_walfile_name)", "")
	}

	if prefixes, err := catalog.ManagedServicePrefixes(ctx, pool); err == nil && len(prefixes) > 0 {
		service := strings.Join(prefixes, ",")
		add("managed service", "warn", "settings of "+service+" are defined: "+serviceGuess(service),
			"read docs/platforms.md for what a failover of this service means for tokens")
	}
}

// doctorPoolerCheck tells a direct connection from one through a pooler:
// a pooler answers the startup with a backend key of its own, so the
// process id announced at connect is not the backend's. A second
// connection that holds a transaction open then shows whether the first
// one keeps its backend between transactions (session pooling) or not
// (transaction pooling).
func doctorPoolerCheck(ctx context.Context, pool *pgxpool.Pool, add func(check, status, detail, fix string)) {
	a, err := pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer a.Release()
	pid1, err := sqlfuncs.BackendPID(ctx, a)
	if err != nil {
		return
	}
	if pid1 == a.Conn().PgConn().PID() {
		add("pooler", "ok", "direct connection (the backend is the one announced at connect): session leases, advisory-lock helpers and LISTEN work", "")
		return
	}
	mode := "a pooler in session mode, or one whose transaction mode kept the same backend this time"
	if b, err := pool.Acquire(ctx); err == nil {
		if tx, err := b.Begin(ctx); err == nil {
			if _, err := sqlfuncs.BackendPID(ctx, tx); err == nil {
				if pid3, err := sqlfuncs.BackendPID(ctx, a); err == nil && pid3 != pid1 {
					mode = "a pooler in transaction mode (the backend changed between two transactions of one connection)"
				}
			}
			_ = tx.Rollback(ctx)
		}
		b.Release()
	}
	add("pooler", "warn", "connected through "+mode+"; the CLI, TTL leases, guards and fenced transactions work through it",
		"session leases (gofence LeaseOptions.Session refuses), fence.try_lock/unlock and LISTEN need a direct connection; see README, Behind a connection pooler")
}

// serviceGuess names the service the setting prefixes suggest.
func serviceGuess(prefixes string) string {
	has := func(p string) bool {
		for _, s := range strings.Split(prefixes, ",") {
			if s == p {
				return true
			}
		}
		return false
	}
	switch {
	case has("aurora") || has("apg_plan_mgmt"):
		return "looks like Amazon Aurora PostgreSQL (shared storage: a failover loses no commit; Global Database failover may)"
	case has("rds"):
		return "looks like Amazon RDS for PostgreSQL (Multi-AZ failover is synchronous; promoting an asynchronous read replica moves to a new timeline)"
	case has("alloydb") || has("google_columnar_engine"):
		return "looks like AlloyDB for PostgreSQL"
	case has("cloudsql"):
		return "looks like Cloud SQL for PostgreSQL"
	case has("azure"):
		return "looks like Azure Database for PostgreSQL"
	case has("neon"):
		return "looks like Neon (storage keeps every commit across compute restarts; a branch or restore from an earlier point may give out tokens again: see docs/platforms.md)"
	case has("supautils"):
		return "looks like Supabase"
	}
	return fmt.Sprintf("prefixes %s", prefixes)
}
