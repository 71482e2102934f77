package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/catalog"
	"github.com/pgfence/pgfence/gofence"
	"github.com/pgfence/pgfence/migrations"
)

// migrateJSON is the --json shape of every migrate action. Dirty is null when
// the role cannot read the version table (the version then comes from
// fence.version()).
type migrateJSON struct {
	Version uint  `json:"version"`
	Dirty   *bool `json:"dirty"`
	// Recorded is false (and present) only for a kit installed without
	// golang-migrate: pgfence migrate baseline records its version.
	Recorded *bool `json:"recorded,omitempty"`
}

func newMigrateCmd(g *globals) *cobra.Command {
	var yes, allowDowngrade bool
	cmd := &cobra.Command{
		Use:   "migrate up | down [N] | goto V | version | force V | baseline",
		Short: "Apply or inspect the kit's migrations (table fence_schema_migrations)",
		Long: `migrate applies the kit's embedded migrations with golang-migrate (version
table fence_schema_migrations, as the upstream migrate CLI with
x-migrations-table=fence_schema_migrations).

version only reads: it never creates the version table, and an application
role that was granted usage sees the installed version through
fence.version(). Every action that changes something first checks what
stands in its way (privileges, a dirty version, protected tables) and
changes nothing when something does, with the fix. down, and goto to a lower
version, ask for confirmation (y/N) unless --yes; without a terminal they
need --yes. Going below version 4 while tables are protected per row is
refused (versions before 4 have no per-row guard): unprotect them, or
protect them table-wide, first. Going below version 3 while fence.lease has
rows (the latest token of every resource) is refused unless
--allow-downgrade: a further step to 0 would forget those tokens, and they
could be granted again.

baseline adopts a kit installed without golang-migrate (its files applied
by psql, or copied into another migration tool): such a kit has
fence.version() but no version table, and golang-migrate would take the
database for an empty one. version and doctor say so; up, down, goto and
force refuse it, creating nothing; baseline creates the version table and
records there the version fence.version() reports, running no migration.
After it, this CLI and the upstream migrate CLI go on from that version.`,
		Example: `  pgfence migrate up          # install or upgrade schema fence
  pgfence migrate version     # print the installed version
  pgfence migrate down        # remove schema fence (refused while tables are protected)
  pgfence migrate force 1     # mark version 1 clean after a failed migration was repaired
  pgfence migrate baseline    # record the version of a kit applied with psql`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("migrate needs an action: up, down [N], goto V, version, force V or baseline")}
			}
			want := map[string][2]int{"up": {1, 1}, "down": {1, 2}, "goto": {2, 2}, "version": {1, 1}, "force": {2, 2}, "baseline": {1, 1}}
			n, ok := want[args[0]]
			switch {
			case !ok:
				return usageError{fmt.Errorf("unknown migrate action %q (want up, down [N], goto V, version, force V or baseline)", args[0])}
			case len(args) < n[0]:
				return usageError{fmt.Errorf("migrate %s needs a number", args[0])}
			case len(args) > n[1]:
				return usageError{fmt.Errorf("migrate %s: unexpected argument %q", args[0], args[n[1]])}
			}
			if len(args) == 2 {
				v, err := strconv.Atoi(args[1])
				if err != nil {
					return usageError{fmt.Errorf("migrate %s: %q is not a number", args[0], args[1])}
				}
				if v < 0 && args[0] != "force" || v < -1 || args[0] == "down" && v == 0 {
					return usageError{fmt.Errorf("migrate %s: %d is out of range", args[0], v)}
				}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			n := 0
			if len(args) == 2 {
				n, _ = strconv.Atoi(args[1]) // checked by Args
			}
			pool, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closePool(pool)
			k, err := readKit(ctx, pool)
			if err != nil {
				return err
			}
			if args[0] != "version" {
				if err := g.migrate(ctx, pool, k, args[0], n, yes, allowDowngrade); err != nil {
					return err
				}
				if k, err = readKit(ctx, pool); err != nil {
					return err
				}
			}
			return g.printVersion(k)
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask before migrating down")
	cmd.Flags().BoolVar(&allowDowngrade, "allow-downgrade", false, "migrate below version 3 although leases exist (sets fence.allow_downgrade for the migration)")
	return cmd
}

// migrate runs one changing action after checking, with the catalogs alone,
// that nothing stands in its way.
func (g *globals) migrate(ctx context.Context, pool *pgxpool.Pool, k kitState, action string, n int, yes, allowDowngrade bool) error {
	if !k.VersionKnown {
		return notReadable(k)
	}
	if action == "baseline" {
		return baseline(ctx, pool, k)
	}
	if k.Unrecorded {
		if action == "up" && k.Version == migrations.Latest {
			return nil // up to date however it was installed; baseline records it when wanted
		}
		return notRecorded(k, action)
	}
	target := int(k.Version)
	switch action {
	case "up":
		target = migrations.Latest
	case "down":
		if n == 0 {
			target = 0
		} else {
			target -= n
		}
	case "goto":
		target = n
	}
	if action == "up" && int(k.Version) == migrations.Latest && !k.Dirty {
		return nil // nothing to do; golang-migrate would still want to write its table
	}
	if target < 0 {
		return fmt.Errorf("migrate down %d: only %d applied (version %d)", n, k.Version, k.Version)
	}
	if target > migrations.Latest {
		return fmt.Errorf("migrate goto %d: this build carries migrations up to %d", target, migrations.Latest)
	}
	if err := k.canMigrate(!k.Installed && target > 0); err != nil {
		return err
	}
	if action == "force" {
		return gofence.ForceMigrationVersion(ctx, pool, n)
	}
	if k.Dirty {
		return fmt.Errorf("version %d is dirty (a migration failed half-way): repair what it left, then %s and try again; nothing was changed", k.Version, k.forceFix())
	}
	if target == int(k.Version) {
		return nil
	}
	if target < int(k.Version) {
		if target == 0 && k.Installed {
			tables, err := catalog.ProtectedTableNames(ctx, pool)
			if err != nil {
				return fmt.Errorf("listing protected tables: %w", err)
			}
			if len(tables) > 0 {
				return fmt.Errorf("cannot remove schema fence while tables are protected (%s): run pgfence unprotect TABLE for each, as its owner, then migrate down again; nothing was changed", strings.Join(tables, ", "))
			}
		}
		if target < 4 && int(k.Version) >= 4 && k.Installed {
			tables, err := catalog.RowsProtectedTableNames(ctx, pool)
			if err != nil {
				return fmt.Errorf("listing tables protected per row: %w", err)
			}
			if len(tables) > 0 {
				return fmt.Errorf("cannot migrate below version 4 while tables are protected per row (%s): versions before 4 have no per-row guard, so their writes would go unchecked; run pgfence unprotect TABLE for each, or protect it table-wide with pgfence protect TABLE --resource RESOURCE, as its owner, then migrate down again; nothing was changed", strings.Join(tables, ", "))
			}
		}
		if target < 3 && int(k.Version) >= 3 && k.Installed {
			leases, err := catalog.HasLeases(ctx, pool)
			if err != nil {
				return fmt.Errorf("reading fence.lease: %w", err)
			}
			if leases && !allowDowngrade {
				return fmt.Errorf("refusing to migrate below version 3 while leases exist: fence.lease keeps every resource's latest token, and migrating on to 0 would forget them so that tokens could be granted again; pass --allow-downgrade to go on anyway; nothing was changed")
			}
			if leases {
				p, err := withSetting(ctx, pool, "fence.allow_downgrade", "on")
				if err != nil {
					return err
				}
				defer closePool(p)
				pool = p
			}
		}
		if err := g.confirm(fmt.Sprintf("migrate schema fence down from version %d to %d%s?", k.Version, target,
			map[bool]string{true: " (removes the kit: every lease and token)"}[target == 0]), yes); err != nil {
			return err
		}
	}
	switch action {
	case "up":
		return gofence.Migrate(ctx, pool)
	case "down":
		if n > 0 {
			return gofence.MigrateSteps(ctx, pool, -n)
		}
	}
	return gofence.MigrateTo(ctx, pool, uint(target))
}

// withSetting opens a second pool like pool whose sessions start with the
// setting name = value (-c in the options connection parameter, as libpq's
// PGOPTIONS).
func withSetting(ctx context.Context, pool *pgxpool.Pool, name, value string) (*pgxpool.Pool, error) {
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["options"] = strings.TrimSpace(cfg.ConnConfig.RuntimeParams["options"] + " -c " + name + "=" + value)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// confirm asks question on stderr and reads y/N from stdin; without a
// terminal on stdin it refuses, so that a script never migrates down by
// accident.
func (g *globals) confirm(question string, yes bool) error {
	if yes {
		return nil
	}
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return exitError{ExitError, fmt.Errorf("%s needs confirmation and stdin is not a terminal: pass --yes; nothing was changed", strings.TrimSuffix(question, "?"))}
	}
	fmt.Fprintf(g.stderr, "pgfence: %s [y/N] ", question)
	answer, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return exitError{ExitError, errors.New("not confirmed (answer y, or pass --yes); nothing was changed")}
}

// baseline records the version of a kit installed without golang-migrate
// (gofence.Baseline), after checking that this role may create the version
// table.
func baseline(ctx context.Context, pool *pgxpool.Pool, k kitState) error {
	if !k.Installed {
		return errors.New("schema fence is not installed, so there is no version to record: pgfence migrate up installs it; nothing was changed")
	}
	if err := k.canMigrate(false); err != nil {
		return err
	}
	_, err := gofence.Baseline(ctx, pool)
	return err
}

// notRecorded is the refusal of every changing action but baseline on a
// kit installed without golang-migrate, with the exact command.
func notRecorded(k kitState, action string) error {
	return fmt.Errorf("schema fence is at version %d (fence.version()) but was installed without golang-migrate: there is no %s.%s, so golang-migrate would take the database for an empty one; run pgfence migrate baseline to record version %d, then pgfence migrate %s again; nothing was changed",
		k.Version, k.Schema, migrations.Table, k.Version, action)
}

func notReadable(k kitState) error {
	return fmt.Errorf("schema fence exists, but role %s can read neither %s nor fence.version(): %s", k.User, migrations.Table, grantUsageFix(k, false))
}

func (g *globals) printVersion(k kitState) error {
	if !k.VersionKnown {
		return notReadable(k)
	}
	out := migrateJSON{Version: k.Version}
	if k.DirtyKnown {
		out.Dirty = &k.Dirty
	}
	if k.Unrecorded {
		out.Recorded = new(bool)
	}
	return g.emit(out, func(w io.Writer) error {
		state := "clean"
		switch {
		case k.Unrecorded:
			state = fmt.Sprintf("not recorded (from fence.version(): the kit was installed without golang-migrate, and %s.%s does not exist; pgfence migrate baseline records version %d)", k.Schema, migrations.Table, k.Version)
		case !k.DirtyKnown:
			state = fmt.Sprintf("from fence.version() (role %s cannot read %s, so a half-failed migration would not show here)", k.User, migrations.Table)
		case k.Dirty:
			state = "dirty (a migration failed half-way: repair, then " + k.forceFix() + ")"
		}
		_, err := fmt.Fprintf(w, "version %d, %s\n", k.Version, state)
		return err
	})
}
