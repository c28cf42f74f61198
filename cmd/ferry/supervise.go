package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/launcher/local"
)

func init() { register(newSuperviseCmd) }

// newSuperviseCmd is the hidden `ferry local-supervise`, which the local provider starts for a
// replica on a fixed port (launcher/local/supervise.go). Its command line is the provider's
// own, passed whole: it ends the process as the replica's program ended.
func newSuperviseCmd() *cobra.Command {
	return &cobra.Command{
		Use:                local.SuperviseCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		Run: func(_ *cobra.Command, args []string) {
			os.Exit(local.Supervise(args))
		},
	}
}
