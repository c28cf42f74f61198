package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/launcher/privnet"
	"github.com/ferryserve/ferry/proxy"
)

func init() {
	register(newNetnsCmd)
	// Local replicas listen in the private network: the controller's proxies and attached
	// proxies (`ferry proxy --attach`, beside the controller) dial them through its helper.
	proxy.SetPrivateDial(privnet.Private, privnet.Dial)
}

// newNetnsCmd is the hidden `ferry local-netns SOCKET`, the helper of the private network in
// which local replicas listen (launcher/privnet). The local provider starts it in a new user
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
