package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
)

// doctorGuards reports what can get around the guards of protected tables:
// roles other than the owner with the TRIGGER privilege (they can add a
// trigger that rewrites rows after the guard), disabled guard triggers,
// guard triggers that fire in replica mode only (ordinary sessions skip
// them), tables that still carry migration 002's guard, guards that do
// not fire in replica mode while a role other than a superuser may choose
// it (SET on session_replication_role, PostgreSQL 15+), and protected
// partitions with a token column whose siblings are not protected.
func doctorGuards(ctx context.Context, pool *pgxpool.Pool, k kitState, serverVersionNum int, add func(check, status, detail, fix string)) {
	if !k.Installed || !k.VersionKnown || k.Version < 3 || !(k.Usage || k.Super) {
		return
	}
	tables, err := catalog.ProtectedTables(ctx, pool)
	if err != nil {
		add("protected tables", "fail", err.Error(), "")
		return
	}
	setters, err := catalog.ReplicaModeSetters(ctx, pool, serverVersionNum)
	if err != nil {
		add("protected tables", "fail", err.Error(), "")
		return
	}
	clean := 0
	for _, t := range tables {
		replica := len(setters) > 0 && !t.FiresAlways
		if replica {
			fix := fmt.Sprintf("as the owner of %s: SELECT fence.fire_always('%s') (or REVOKE SET ON PARAMETER session_replication_role FROM %s)",
				t.Table, strings.ReplaceAll(t.Table, "'", "''"), strings.Join(setters, ", "))
			if k.Version < 7 {
				fix = fmt.Sprintf("REVOKE SET ON PARAMETER session_replication_role FROM %s, or migrate to version 7 and, as the owner of %s, SELECT fence.fire_always('%s')",
					strings.Join(setters, ", "), t.Table, strings.ReplaceAll(t.Table, "'", "''"))
			}
			add("protected tables", "warn", fmt.Sprintf("%s may set session_replication_role = replica, and then the guards of %s do not fire: its writes there are not fenced",
				strings.Join(setters, ", "), t.Table), fix)
		}
		roles := strings.Join(t.TriggerRoles, ", ")
		if t.GuardDisabled {
			again := "fence.protect"
			if t.Form == "rows" {
				again = "fence.protect_rows"
			}
			add("protected tables", "fail", fmt.Sprintf("a guard trigger of %s is disabled: writes to it are not fenced", t.Table),
				fmt.Sprintf("as the owner of %s: ALTER TABLE %s ENABLE TRIGGER USER (or SELECT %s again)", t.Table, t.Table, again))
		}
		if t.GuardReplicaOnly {
			again := "fence.protect"
			if t.Form == "rows" {
				again = "fence.protect_rows"
			}
			add("protected tables", "fail", fmt.Sprintf("a guard trigger of %s fires in replica mode only (ENABLE REPLICA TRIGGER): ordinary sessions skip it, and their writes to it are not fenced", t.Table),
				fmt.Sprintf("as the owner of %s: SELECT %s again (it re-creates the guards as they were meant), or ALTER TABLE %s ENABLE TRIGGER USER", t.Table, again, t.Table))
		}
		if roles != "" {
			add("protected tables", "warn", fmt.Sprintf("roles other than the owner can create triggers on %s: %s; such a trigger can rewrite rows after the guard checked them", t.Table, roles),
				fmt.Sprintf("as the owner of %s: REVOKE TRIGGER ON %s FROM %s (grant SELECT, INSERT, UPDATE, DELETE instead of ALL)", t.Table, t.Table, roles))
		}
		if t.LegacyGuard {
			lit := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
			protect := "SELECT fence.protect(" + lit(t.Table) + ", " + lit(t.Resource)
			if t.TokenColumn != "" {
				protect += ", " + lit(t.TokenColumn)
			}
			protect += ")"
			add("protected tables", "warn", fmt.Sprintf("%s keeps the guard of migration 2 (made fail-closed by migration 3, but slower, and an UPDATE that re-assigns the row's own token needs fence.use_token)", t.Table),
				"as the owner of "+t.Table+": "+protect)
		}
		moved := t.TokenColumn != "" && len(t.UnprotectedSiblings) > 0
		if moved {
			add("protected tables", "warn", fmt.Sprintf("%s is a partition whose siblings %s are not protected: a row moved from one of them into %s (an UPDATE of the partition key through the parent) keeps the token it carries without presenting one (docs/security.md, Known limits)",
				t.Table, strings.Join(t.UnprotectedSiblings, ", "), t.Table),
				fmt.Sprintf("detach %s, or protect each sibling before attaching it (DETACH PARTITION, fence.protect, ATTACH PARTITION; fence.protect refuses partitions)", t.Table))
		}
		if !t.GuardDisabled && !t.GuardReplicaOnly && roles == "" && !t.LegacyGuard && !replica && !moved {
			clean++
		}
	}
	switch {
	case len(tables) == 0:
		add("protected tables", "ok", "none yet (fence.protect, fence.protect_rows)", "")
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
	p, err := catalog.ReadPromotionSetup(ctx, pool)
	if err != nil {
		add("promotion", "fail", err.Error(), "")
		return
	}
	standby, failing, timeline, standbys := p.InRecovery, p.ArchiverFailing, p.Timeline, p.Standbys
	archiveMode, archiver, restore, targetTimeline := p.ArchiveMode, p.Archiver, p.RestoreCommand, p.RecoveryTargetTimeline
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
