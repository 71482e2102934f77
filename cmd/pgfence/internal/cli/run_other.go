//go:build !unix

package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// newRunCmd: run needs process groups and POSIX signals, which only Unix has.
func newRunCmd(_ *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "run RESOURCE -- COMMAND [ARGS...]",
		Short: "Run a command under a lease (Unix only)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("pgfence run needs a Unix system (process groups and POSIX signals)")
		},
	}
}
