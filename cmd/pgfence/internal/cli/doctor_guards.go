package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Queries of the guard and promotion checks of doctor: catalogs, settings and
// statistics views only, all readable by an ordinary role.
const (
	// One row per protected table: its name, resource, token column, the
	// roles other than its owner that can create triggers on it, whether it
	// still has the guard trigger of migration 002, and whether a guard
	// trigger of it is disabled.
	doctorProtectedSQL = `SELECT p.tbl::text, p.resource, coalesce(p.token_column::text, ''),
		coalesce(array_to_string(p.trigger_roles, ', '), ''),
		EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid = p.tbl AND t.tgname = 'zz_fence_guard_row'),
		EXISTS (SELECT FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc f ON f.oid = t.tgfoid
		         WHERE t.tgrelid = p.tbl AND f.pronamespace = 'fence'::pg_catalog.regnamespace AND t.tgenabled = 'D')
		FROM fence.protected p ORDER BY 1`
	// What decides whether two promotions can land on one timeline
	// (docs/design.md, "Two promotions from one timeline").
	doctorPromotionSQL = `SELECT pg_is_in_recovery(),
		CASE WHEN pg_is_in_recovery() THEN 0
		     ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
		current_setting('archive_mode'),
		coalesce(nullif(current_setting('archive_library', true), ''), current_setting('archive_command')),
		current_setting('restore_command'),
		current_setting('recovery_target_timeline'),
		(SELECT count(*) FROM pg_stat_replication),
		coalesce((SELECT a.last_failed_time > coalesce(a.last_archived_time, '-infinity') FROM pg_stat_archiver a), false)`
)

// doctorGuards reports what can get around the guards of protected tables:
// roles other than the owner with the TRIGGER privilege (they can add a
// trigger that rewrites rows after the guard), disabled guard triggers, and
// tables that still carry migration 002's guard.
func doctorGuards(ctx context.Context, pool *pgxpool.Pool, k kitState, add func(check, status, detail, fix string)) {
	if !k.Installed || !k.VersionKnown || k.Version < 3 || !(k.Usage || k.Super) {
		return
	}
	rows, err := pool.Query(ctx, doctorProtectedSQL)
	if err != nil {
		add("protected tables", "fail", err.Error(), "")
		return
	}
	type table struct {
		name, resource, column, roles string
		legacy, disabled              bool
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var t table
		err := r.Scan(&t.name, &t.resource, &t.column, &t.roles, &t.legacy, &t.disabled)
		return t, err
	})
	if err != nil {
		add("protected tables", "fail", err.Error(), "")
		return
	}
	clean := 0
	for _, t := range tables {
		if t.disabled {
			add("protected tables", "fail", fmt.Sprintf("a guard trigger of %s is disabled: writes to it are not fenced", t.name),
				fmt.Sprintf("as the owner of %s: ALTER TABLE %s ENABLE TRIGGER USER (or SELECT fence.protect again)", t.name, t.name))
		}
		if t.roles != "" {
			add("protected tables", "warn", fmt.Sprintf("roles other than the owner can create triggers on %s: %s; such a trigger can rewrite rows after the guard checked them", t.name, t.roles),
				fmt.Sprintf("as the owner of %s: REVOKE TRIGGER ON %s FROM %s (grant SELECT, INSERT, UPDATE, DELETE instead of ALL)", t.name, t.name, t.roles))
		}
		if t.legacy {
			lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
			protect := "SELECT fence.protect(" + lit(t.name) + ", " + lit(t.resource)
			if t.column != "" {
				protect += ", " + lit(t.column)
			}
			protect += ")"
			add("protected tables", "warn", fmt.Sprintf("%s keeps the guard of migration 2 (made fail-closed by migration 3, but slower, and an UPDATE that re-assigns the row's own token needs fence.use_token)", t.name),
				"as the owner of "+t.name+": "+protect)
		}
		if !t.disabled && t.roles == "" && !t.legacy {
			clean++
		}
	}
	switch {
	case len(tables) == 0:
		add("protected tables", "ok", "none yet (fence.protect)", "")
	case clean > 0:
		add("protected tables", "ok", fmt.Sprintf("%d of %d with the current guard, no trigger roles but the owner", clean, len(tables)), "")
	}
}

// doctorPromotion reports setups in which two servers promoted from one
// timeline can take the same new timeline, and so grant the same tokens:
// no WAL archive shared by the servers, an archiver that fails, a standby
// without restore_command or not following the latest timeline
// (docs/design.md, "Two promotions from one timeline"). What one server
// cannot see: standbys of an old primary connected to nothing.
func doctorPromotion(ctx context.Context, pool *pgxpool.Pool, add func(check, status, detail, fix string)) {
	var standby, failing bool
	var timeline, standbys int
	var archiveMode, archiver, restore, targetTimeline string
	if err := pool.QueryRow(ctx, doctorPromotionSQL).Scan(&standby, &timeline, &archiveMode, &archiver, &restore, &targetTimeline, &standbys, &failing); err != nil {
		add("promotion", "fail", err.Error(), "")
		return
	}
	const share = "archive WAL where every standby can restore from it (archive_mode, archive_command; restore_command and recovery_target_timeline = 'latest' on the standbys), or re-point every other standby at a newly promoted server before promoting another (docs/design.md, Two promotions from one timeline)"
	noArchive := archiveMode == "off" || strings.TrimSpace(archiver) == ""
	switch {
	case standby && restore == "":
		add("promotion", "warn", "this standby has no restore_command: promoted after a sibling was, it cannot see the sibling's timeline and can take the same one, granting the same tokens", share)
	case standby && targetTimeline != "latest":
		add("promotion", "warn", fmt.Sprintf("this standby follows recovery_target_timeline = %s, not latest", targetTimeline), share)
	case standby:
		add("promotion", "ok", "this standby restores from an archive and follows the latest timeline", "")
	case noArchive && (standbys > 0 || timeline > 1):
		why := fmt.Sprintf("%d standby(s) connected", standbys)
		if timeline > 1 {
			why = fmt.Sprintf("this server is on timeline %d (it was promoted; standbys of the old primary may still exist)", timeline)
		}
		add("promotion", "warn", "no WAL archive and "+why+": two standbys promoted one after the other can take the same timeline and grant the same tokens", share)
	case failing:
		add("promotion", "warn", "the WAL archiver is failing: a promotion's timeline history may not reach the archive, and a second promotion can take the same timeline", "fix archive_command (see pg_stat_archiver and the server log)")
	case noArchive:
		add("promotion", "ok", "no standby seen and timeline 1: a promotion cannot repeat a timeline here", "")
	default:
		add("promotion", "ok", fmt.Sprintf("WAL archive set (archive_mode = %s)", archiveMode), "")
	}
}
