package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/migrations"
)

// finding is one line of pgfence doctor.
type finding struct {
	Check  string `json:"check"`
	Status string `json:"status"` // ok, warn, fail
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

func newDoctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check the connection, the kit, privileges and the settings fencing depends on",
		Long: `doctor checks, each with a fix when something is off:
  connection          the server answers and lets the role in (the fix
                      matches the cause)
  server version      PostgreSQL 13 or newer
  writable            the server is a primary, not a standby in recovery
  clock               this machine's clock against the server's
  migrations          the kit installed, at which version, not dirty, recorded
                      in fence_schema_migrations (else: migrate baseline)
  privileges          what the current role may do with the kit (or what
                      keeps it from installing it)
  protected tables    disabled guards (or replica-only ones), other roles
                      with TRIGGER, guards of migration 2
  settings            the durability settings below are readable
  synchronous_commit  off or on
  standbys            asynchronous ones (and what that means for tokens)
  promotion           setups in which two promotions can take the same
                      timeline and grant the same tokens
  idle_in_transaction_session_timeout
                      0: a paused holder makes grants wait
  pooler              a connection pooler in front, and its mode
  token epoch         the functions grants read the epoch from
  token budget        what is left of the token space (epochs, counter
                      moves, grants: fence.token_budget, version 9)
  managed service     which one the server's settings suggest
  server log          refused writes reach it with their SQLSTATE and
                      statement

Exit code 1 when a check fails.

doctor only reads: it creates nothing (not even golang-migrate's version
table), so it is safe to run as any role, before or after installing.`,
		Example: `  pgfence doctor
  pgfence doctor --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			var fs []finding
			add := func(check, status, detail, fix string) {
				fs = append(fs, finding{check, status, detail, fix})
			}
			pool, err := g.connect(ctx)
			var cerr *connectError
			if errors.As(err, &cerr) {
				add("connection", "fail", cerr.cause, cerr.fix)
			} else if err != nil {
				add("connection", "fail", oneLine(err), "check --database-url / DATABASE_URL / PG* variables")
			} else {
				defer closePool(pool)
				doctorChecks(ctx, pool, add)
				doctorPlatformChecks(ctx, pool, add) // doctor_platform.go
				doctorServerLog(ctx, pool, add)      // doctor_log.go
			}
			failed := false
			for _, f := range fs {
				failed = failed || f.Status == "fail"
			}
			err = g.emit(fs, func(w io.Writer) error {
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				for _, f := range fs {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", map[string]string{"ok": "ok", "warn": "WARN", "fail": "FAIL"}[f.Status], f.Check, f.Detail)
					if f.Fix != "" {
						fmt.Fprintf(tw, "\t\tfix: %s\n", f.Fix)
					}
				}
				return tw.Flush()
			})
			if err != nil {
				return err
			}
			if failed {
				return exitError{ExitError, nil}
			}
			return nil
		},
	}
}

func doctorChecks(ctx context.Context, pool *pgxpool.Pool, add func(check, status, detail, fix string)) {
	sent := time.Now()
	srv, err := catalog.ReadServerInfo(ctx, pool)
	if err != nil {
		add("connection", "fail", err.Error(), "check the role and database in the connection string")
		return
	}
	rtt := time.Since(sent)
	cfg := pool.Config().ConnConfig
	add("connection", "ok", fmt.Sprintf("%s@%s:%d/%s, round trip %s", srv.User, cfg.Host, cfg.Port, cfg.Database, rtt.Round(time.Microsecond)), "")
	if srv.VersionNum < 130000 {
		add("server version", "fail", "PostgreSQL "+srv.Version, "pgfence needs PostgreSQL 13 or newer")
	} else {
		add("server version", "ok", "PostgreSQL "+srv.Version, "")
	}
	if srv.InRecovery {
		add("writable", "fail", "the server is a standby in recovery: no grant can be made here", "point pgfence at the primary")
	}

	// Clock: expiry is decided by the server's clock alone; a large offset
	// only makes "expires in" shown here differ from this machine's view.
	offset := srv.Now.Sub(sent.Add(rtt / 2))
	if offset < 0 {
		offset = -offset
	}
	if offset > time.Second {
		add("clock", "warn", fmt.Sprintf("this machine's clock and the server's differ by %s", offset.Round(time.Millisecond)),
			"run NTP on both; pgfence decides expiry by the server's clock only, so this is safe, but times shown here and in logs will disagree")
	} else {
		add("clock", "ok", fmt.Sprintf("this machine and the server agree within %s", offset.Round(time.Millisecond)), "")
	}

	database := cfg.Database
	k, err := readKit(ctx, pool)
	if err != nil {
		add("migrations", "fail", err.Error(), "")
	} else {
		database = k.Database
		doctorKit(ctx, pool, k, add)
		doctorGuards(ctx, pool, k, srv.VersionNum, add)
		if k.Installed && k.VersionKnown && (k.Usage || k.Super) {
			doctorBudget(ctx, pool, k.Version, add) // budget.go
		}
	}

	settings, err := catalog.ReadDurabilitySettings(ctx, pool)
	if err != nil {
		add("settings", "fail", err.Error(), "")
		return
	}
	syncCommit, idleTimeout := settings.SynchronousCommit, settings.IdleInTransactionSessionTimeout
	asyncStandbys, standbys := settings.AsyncStandbys, settings.Standbys
	if syncCommit == "off" {
		add("synchronous_commit", "warn", "off for this role/database",
			"grants and renewals force it on for their own transaction, so tokens stay safe; your own writes may be lost in a crash: consider 'on'")
	} else {
		add("synchronous_commit", "ok", syncCommit, "")
	}
	switch {
	case asyncStandbys > 0:
		add("standbys", "warn", fmt.Sprintf("%d of %d standby(s) asynchronous, or of a state this role cannot read (pg_read_all_stats)", asyncStandbys, standbys),
			"tokens stay monotonic across the promotion of one standby (the epoch follows the WAL timeline; see the promotion check for two), but writes acknowledged here and not yet replicated are lost at failover; use synchronous_standby_names for zero loss")
	case standbys > 0:
		add("standbys", "ok", fmt.Sprintf("%d synchronous standby(s)", standbys), "")
	default:
		add("standbys", "ok", "none seen from this role (pg_stat_replication)", "")
	}
	doctorPromotion(ctx, pool, add)
	if idleTimeout == "0" {
		add("idle_in_transaction_session_timeout", "warn", "0 (disabled)",
			fmt.Sprintf("a paused holder with an open guarded transaction makes grants wait (fence.grant_wait) and report busy until it ends; set it, e.g. as the database's owner: ALTER DATABASE %s SET idle_in_transaction_session_timeout = '1min'", quoteIdent(database)))
	} else {
		add("idle_in_transaction_session_timeout", "ok", idleTimeout, "")
	}
}

// doctorKit reports the migrations and privileges checks from the catalogs
// (readKit writes nothing), each fix addressed to the role that ran doctor:
// GRANTs on the database and schema only for a role that would install the
// kit, fence.grant_usage for a role that would use it.
func doctorKit(ctx context.Context, pool *pgxpool.Pool, k kitState, add func(check, status, detail, fix string)) {
	if !k.Installed {
		add("migrations", "fail", "schema fence is not installed", "pgfence migrate up, as the role that will own the kit")
		if fixes := k.obstacles(true); len(fixes) > 0 {
			add("privileges", "warn", fmt.Sprintf("role %s cannot install the kit", k.User), strings.Join(fixes, "; "))
		} else {
			add("privileges", "ok", fmt.Sprintf("role %s can install the kit (pgfence migrate up)", k.User), "")
		}
		return
	}
	upgrade := "pgfence migrate up"
	if !k.IsKitOwner && !k.Super {
		upgrade = fmt.Sprintf("ask the kit's owner to run pgfence migrate up (as role %s)", k.KitOwner)
	}
	switch {
	case !k.VersionKnown:
		add("migrations", "fail", fmt.Sprintf("schema fence exists (owner %s), but role %s can read neither %s nor fence.version()", k.KitOwner, k.User, migrations.Table),
			grantUsageFix(k, false))
	case k.Unrecorded:
		add("migrations", "fail", fmt.Sprintf("version %d (from fence.version()) is not recorded: the kit was installed without golang-migrate, and %s.%s does not exist, so pgfence migrate and the upstream migrate CLI would take the database for an empty one", k.Version, k.Schema, migrations.Table),
			fmt.Sprintf("pgfence migrate baseline (records version %d), as role %s", k.Version, k.User))
	case k.Dirty:
		add("migrations", "fail", fmt.Sprintf("version %d is dirty: a migration failed half-way", k.Version),
			fmt.Sprintf("as role %s: repair by hand, then %s", k.KitOwner, k.forceFix()))
	case k.Version < migrations.Latest:
		add("migrations", "warn", fmt.Sprintf("version %d installed, %d available", k.Version, migrations.Latest), upgrade)
	case k.Version > migrations.Latest:
		add("migrations", "warn", fmt.Sprintf("version %d installed, newer than this build (%d)", k.Version, migrations.Latest), "use a pgfence build that carries it")
	case !k.DirtyKnown:
		add("migrations", "ok", fmt.Sprintf("version %d (from fence.version(); %s is the owner's)", k.Version, migrations.Table), "")
	default:
		add("migrations", "ok", fmt.Sprintf("version %d, clean", k.Version), "")
	}

	grant := grantUsageFix(k, false)
	if !k.Usage && !k.Super {
		add("privileges", "fail", fmt.Sprintf("role %s cannot use the kit (no usage on schema fence)", k.User), grant)
		return
	}
	priv, err := catalog.ReadKitPrivileges(ctx, pool)
	if err != nil {
		add("privileges", "fail", err.Error(), "")
		return
	}
	usage, acquire, check, revoke := priv.Usage, priv.Acquire, priv.Check, priv.Revoke
	if !usage || !acquire || !check {
		add("privileges", "fail", fmt.Sprintf("role %s cannot use the kit (schema usage %v, acquire %v, check %v)", k.User, usage, acquire, check), grant)
		return
	}
	detail := fmt.Sprintf("role %s can hold leases and write under tokens", k.User)
	if revoke {
		detail += ", and revoke"
	}
	switch {
	case k.Super:
		detail += " (superuser)"
	case k.IsKitOwner:
		detail += " (the kit's owner)"
	}
	add("privileges", "ok", detail, "")
}
