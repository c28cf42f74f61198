// Command ferry is Ferry's one binary: the CLI, the controller daemon, the standalone proxy and
// the replica simulator.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// subcommands are added by each command's file in init, so that files do not collide.
var subcommands []func() *cobra.Command

func register(f func() *cobra.Command) { subcommands = append(subcommands, f) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "ferry",
		Short: "Ferry: one YAML file, one OpenAI-compatible endpoint, replicas wherever capacity is cheapest",
		Long: `Ferry is a serving gateway and autoscaling load balancer for LLM inference.

Write a task YAML with a service: section (SkyServe's shape), run 'ferry serve up', and get one
OpenAI-compatible endpoint in front of replicas that Ferry launches, probes, balances and replaces.`,
		Example:       "  ferry serve up configs/examples/quickstart.yaml\n  ferry serve status -v",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	for _, f := range subcommands {
		root.AddCommand(f())
	}
	return root
}

func main() {
	if err := newRootCmd().Execute(); err != nil {
		var ec exitCodeError
		if errors.As(err, &ec) {
			if ec.msg != "" {
				fmt.Fprintln(os.Stderr, "ferry:", ec.msg)
			}
			os.Exit(ec.code)
		}
		fmt.Fprintln(os.Stderr, "ferry:", err)
		os.Exit(1)
	}
}

// exitCodeError makes the command exit with code (jobs launch exits with the job's status).
type exitCodeError struct {
	code int
	msg  string
}

func (e exitCodeError) Error() string { return e.msg }
