package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/bench/trainsim"
)

func init() { register(newTrainSimCmd) }

// newTrainSimCmd is `ferry train-sim`: a distributed training stand-in for job examples and
// tests, launched the way torchrun is.
func newTrainSimCmd() *cobra.Command {
	cfg := trainsim.Config{}
	cmd := &cobra.Command{
		Use:   "train-sim",
		Short: "Run a stand-in for distributed training: ranks rendezvous over TCP, all-reduce, checkpoint, resume",
		Long: `train-sim behaves like one node of a torchrun job without a GPU: rank 0 listens on
--master-addr:--master-port, the other ranks connect, every step all-reduces a number, and rank 0
checkpoints to --checkpoint-dir (every --checkpoint-every steps and on SIGTERM) and resumes from
it. Defaults come from SkyPilot's variables, so a job's run line needs no flags. A lost peer
exits 1; SIGTERM checkpoints and exits 143.`,
		Example: `  # in a job's run:, as SkyPilot's torchrun examples launch training
  ferry train-sim --master-port 8008 --steps 300`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Out = cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			err := trainsim.Run(ctx, cfg)
			switch {
			case err == nil:
				return nil
			case errors.Is(err, context.Canceled):
				return exitCodeError{code: 143, msg: "stopped by SIGTERM; checkpoint saved"}
			}
			return err
		},
	}
	envInt := func(name string, def int) int {
		if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
			return n
		}
		return def
	}
	master, _, _ := strings.Cut(os.Getenv("SKYPILOT_NODE_IPS"), "\n")
	if master == "" {
		master = "127.0.0.1"
	}
	f := cmd.Flags()
	f.IntVar(&cfg.NNodes, "nnodes", envInt("SKYPILOT_NUM_NODES", 1), "nodes in the run ($SKYPILOT_NUM_NODES)")
	f.IntVar(&cfg.NodeRank, "node-rank", envInt("SKYPILOT_NODE_RANK", 0), "this node's rank ($SKYPILOT_NODE_RANK)")
	f.StringVar(&cfg.MasterAddr, "master-addr", master, "rank 0's address (the first line of $SKYPILOT_NODE_IPS)")
	f.IntVar(&cfg.MasterPort, "master-port", 29500, "rank 0's port")
	f.IntVar(&cfg.Steps, "steps", 100, "steps to train")
	f.DurationVar(&cfg.StepTime, "step-time", 50*time.Millisecond, "time one step takes")
	f.StringVar(&cfg.CheckpointDir, "checkpoint-dir", os.Getenv("FERRY_CHECKPOINT_DIR"), "where rank 0 checkpoints and resumes from ($FERRY_CHECKPOINT_DIR)")
	f.IntVar(&cfg.CheckpointEvery, "checkpoint-every", 10, "steps between checkpoints")
	f.DurationVar(&cfg.RendezvousTimeout, "rendezvous-timeout", 2*time.Minute, "how long ranks wait for each other")
	return cmd
}
