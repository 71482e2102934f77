package cli

import "github.com/spf13/cobra"

// commands lists every subcommand of pgfence, one per line.
func commands(g *globals) []*cobra.Command {
	return []*cobra.Command{
		newMigrateCmd(g),
		newDemoCmd(g),
		newBenchCmd(g),
		newAcquireCmd(g),
		newRenewCmd(g),
		newReleaseCmd(g),
		newRevokeCmd(g),
		newStatusCmd(g),
		newProtectCmd(g),
		newUnprotectCmd(g),
		newRunCmd(g),
		newDoctorCmd(g),
	}
}
