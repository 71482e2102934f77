package cli

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/gofence"
)

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate up | down [N] | goto V | version | force V",
		Short: "Apply or inspect the kit's migrations (table fence_schema_migrations)",
		Example: `  pgfence migrate up          # install or upgrade schema fence
  pgfence migrate version     # print the installed version
  pgfence migrate down        # remove schema fence (refused while tables are protected)
  pgfence migrate force 1     # mark version 1 clean after a failed migration was repaired`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			arg := func() (int, error) {
				if len(args) < 2 {
					return 0, usageError{fmt.Errorf("migrate %s needs a number", args[0])}
				}
				n, err := strconv.Atoi(args[1])
				if err != nil {
					return 0, usageError{fmt.Errorf("migrate %s: %q is not a number", args[0], args[1])}
				}
				return n, nil
			}
			pool, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			switch args[0] {
			case "up":
				err = gofence.Migrate(ctx, pool)
			case "down":
				if len(args) == 2 {
					var n int
					if n, err = arg(); err == nil {
						err = gofence.MigrateSteps(ctx, pool, -n)
					}
				} else {
					err = gofence.MigrateTo(ctx, pool, 0)
				}
			case "goto":
				var v int
				if v, err = arg(); err == nil {
					if v < 0 {
						return usageError{fmt.Errorf("migrate goto: version must be 0 or more")}
					}
					err = gofence.MigrateTo(ctx, pool, uint(v))
				}
			case "force":
				var v int
				if v, err = arg(); err == nil {
					err = gofence.ForceMigrationVersion(ctx, pool, v)
				}
			case "version":
			default:
				return usageError{fmt.Errorf("unknown migrate action %q (want up, down, goto, version or force)", args[0])}
			}
			if err != nil {
				return err
			}
			v, dirty, err := gofence.MigrationVersion(ctx, pool)
			if err != nil {
				return err
			}
			out := struct {
				Version uint `json:"version"`
				Dirty   bool `json:"dirty"`
			}{v, dirty}
			return g.emit(out, func(w io.Writer) error {
				state := "clean"
				if dirty {
					state = "dirty (a migration failed half-way: repair, then pgfence migrate force VERSION)"
				}
				_, err := fmt.Fprintf(w, "version %d, %s\n", v, state)
				return err
			})
		},
	}
	return cmd
}
