package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/bench/sim"
)

func init() { register(newSimCmd) }

// newSimCmd is `ferry sim`: scaling policies scored against a request trace and spot traces.
func newSimCmd() *cobra.Command {
	opts := sim.DefaultOptions()
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate scaling policies on a request trace and spot-capacity traces, and score SLO, availability and cost",
		Long: `sim replays a request trace (by default the Azure LLM conversation trace, looped over the
horizon) and per-zone spot availability traces (by default 9 AWS zones of p3.2xlarge) against
Ferry's own autoscaler and SpotHedge placer, with simulated V100 replicas that batch like vLLM.

It compares Ferry as shipped (autoscaler: concurrency with nothing tuned, so the in-flight
target, the stable window and the headroom are learned from the replicas; spot with on-demand
fallback and SpotHedge; replacements started at EC2's 2-minute interruption notice; requests
held while no replica is READY; also with the llm autoscaler, without notices, and with
Knative's fixed knobs) with SkyServe's
request-rate autoscaler with and without SpotHedge, a fixed on-demand fleet sized for the peak,
and Ferry's autoscaler on on-demand only. The --ferry-* flags set the ferry policies' knobs as a
YAML would. For each it reports SLO attainment, availability (30 s ticks with the target READY),
replica-hours and cost at catalog prices, preemptions, scale events and TTFT percentiles, as a
table on stdout and as summary.md, results.json and sim.svg (load and READY replicas over time)
in --out.

Inputs default to files under DATA, which is $FERRY_DATA or else ../shared/data beside the
repository. bench/README.md ("ferry sim") documents the model's constants, how the data are read,
and results.`,
		Example: `  # every policy over 24 simulated hours (about 10 s on 2 cores)
  ferry sim

  # the same with knobs set by hand instead of learned
  ferry sim --ferry-target-inflight 1.75 --ferry-stable-window 20m --ferry-overprovision 2

  # twice the load, two policies, a 6-hour horizon starting 3 days into the spot traces
  ferry sim --time-scale 2 --policies ferry,skyserve-spothedge --duration 6h --spot-offset 72h

  # your own trace and a tighter SLO, report into ./out
  ferry sim --trace my-trace.csv --slo-ttft 1s --slo-tpot 50ms --out ./out`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, err := sim.Run(ctx, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			return err
		},
	}
	opts.RegisterFlags(cmd.Flags())
	return cmd
}
