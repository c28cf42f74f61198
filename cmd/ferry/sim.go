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
		Short: "Simulate serving policies on a request trace and spot-capacity traces, and score availability, cost and SLO",
		Long: `sim replays a request trace (by default the Azure LLM conversation trace, looped over the
horizon) and one set of per-zone spot capacity traces (by default the counted 4-node AWS set)
against Ferry's own autoscaler, spot/on-demand split and zone order, with simulated V100
replicas that batch like vLLM, and scores them against SkyServe+SpotHedge (one spare, as in its
paper, and none) and all on-demand.

The spot model: a counted set's value is how many spot instances a zone holds, so a launch
beyond it is refused and a drop reclaims exactly the excess, newest first; a 0/1 set's 1 is
read as capacity for any number (as SpotHedge's artifact reads it). Each cloud warns only the
instances it reclaims: EC2 two minutes ahead, Compute Engine 30 s (--aws-notice, --gcp-notice).
GCP zones are named and priced (regionally) as GCP does.

Every policy runs with min_replicas --fleet, and the load is scaled so that its busiest minute
needs that many replicas. Availability is SpotHedge's: the share of 30 s ticks with at least
--fleet READY replicas, the same for every policy. Cost counts every replica, spares included,
at catalog prices and under SpotHedge's convention (on-demand = 3 × spot). Results go to stdout
and to summary.md, results.json and sim.svg in --out.

--sweep runs every set under --spot-root (../shared/data/spot-traces) at every fleet of
--fleets (3, 4, 5, 6, 8, 12, 16, 24) in one pool and writes one table (sweep.md) and one plot (sweep.svg).
After the sets on disk it runs derived/gcp-04-30-2023-counted, a counted GCP set built from the
0/1 GCP probes by a fixed rule (4 staggered copies per zone, 150 s ticks, priced as
a2-highgpu-8g; bench/sim/derived.go); --sets runs only the sets it names, and --spot-traces
takes that name too.

Inputs default to files under DATA, which is $FERRY_DATA or else ../shared/data beside the
repository. bench/README.md ("ferry sim") documents the model's constants, how the data are read,
and results.`,
		Example: `  # the fleet-size sweep over every spot trace in ../shared/data (8-12 minutes on 2 cores)
  ferry sim --sweep

  # one set, one fleet size, 48 simulated hours
  ferry sim --spot-traces ../shared/data/spot-traces/availability/16-node/aws-08-27-2023 --fleet 12

  # a GCP set, with a Spot VM warned 30 s ahead (the default) or not at all
  ferry sim --spot-traces ../shared/data/spot-traces/preemption/1-node/gcp-04-30-2023 --gcp-notice 0

  # only the derived GCP counted set, at every fleet size
  ferry sim --sweep --sets derived/gcp-04-30-2023-counted

  # one traced instance of a directory that holds several
  ferry sim --spot-traces '../shared/data/spot-traces/availability/1-node/aws-10-26-2022/*_v100_1.json'

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
	cmd.AddCommand(newSimGangCmd())
	return cmd
}

// newSimGangCmd is `ferry sim gang`: N×1-GPU spot against 1×N-GPU on-demand for a
// data-parallel job, on the spot preemption traces.
func newSimGangCmd() *cobra.Command {
	o := sim.DefaultGangOptions()
	cmd := &cobra.Command{
		Use:   "gang",
		Short: "Compare N one-GPU spot instances with one N-GPU on-demand instance for a data-parallel job",
		Long: `gang replays the spot preemption traces (by default the 1-node V100 set, p3.2xlarge) under a
gang of N one-V100 spot nodes and prices the same job on one N-V100 on-demand instance, from
the embedded catalog. It prints $/step, completion time and interruptions for each shape, and
where the choice flips: the spot price, and the interruption rate (the traces replayed faster).
bench/sim/gang.go states the model.`,
		Example: `  ferry sim gang
  ferry sim gang --gpus 8 --checkpoint 10m --restart 5m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := sim.RunGang(o, cmd.OutOrStdout())
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.SpotDir, "spot-traces", o.SpotDir, "preemption traces (default DATA/spot-traces/preemption/1-node/aws-04-22-2023)")
	fl.IntSliceVar(&o.GPUs, "gpus", o.GPUs, "gang sizes N (an on-demand type with N V100s must exist: 1, 4, 8)")
	fl.IntVar(&o.Steps, "steps", o.Steps, "steps the job needs")
	fl.DurationVar(&o.StepTime, "step-time", o.StepTime, "one step on N GPUs")
	fl.DurationVar(&o.Checkpoint, "checkpoint", o.Checkpoint, "computing time between checkpoints")
	fl.DurationVar(&o.Restart, "restart", o.Restart, "from every node alive to computing again")
	fl.Float64SliceVar(&o.Speeds, "speeds", o.Speeds, "trace replay speeds tried for the interruption-rate flip point")
	return cmd
}
