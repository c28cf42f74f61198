package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/internal/privnet"
)

func init() { register(newNetnsCmd) }

// newNetnsCmd is the hidden `ferry local-netns SOCKET`, the helper of the private network in
// which local replicas listen (internal/privnet). The local provider starts it in a new user
// and network namespace.
func newNetnsCmd() *cobra.Command {
	return &cobra.Command{
		Use:                privnet.HelperCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		Run: func(_ *cobra.Command, args []string) {
			os.Exit(privnet.Serve(args))
		},
	}
}
