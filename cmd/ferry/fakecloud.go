package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/bench/sim"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

func init() { register(newFakeCloudCmd) }

type fakeCloudFlags struct {
	gcpListen, project, dir, spotTrace string
	speedup                            float64
}

func newFakeCloudCmd() *cobra.Command {
	var f fakeCloudFlags
	cmd := &cobra.Command{
		Use:   "fakecloud",
		Short: "Run fake EC2 and Compute Engine endpoints whose VMs run locally, for demos and tests",
		Long: `fakecloud serves the subset of EC2's Query API and Compute Engine's REST API that Ferry's AWS
and GCP providers call, through their real SDKs. A VM "boots" by running its user-data or
startup script as a local process on a loopback address of its own, so replicas on the fake
clouds really serve traffic. Zones, vCPUs and spot prices come from the embedded catalog.

It prints the config.yaml sections and environment that point Ferry at it. With --spot-trace
it replays a directory of spot availability traces (../shared/data/spot-traces/availability/
1-node/aws-02-15-2023, files named after their zone): while a zone's trace shows no capacity,
launches there fail with InsufficientInstanceCapacity and its spot VMs are preempted.`,
		Example: `  ferry fakecloud
  ferry fakecloud --spot-trace ../shared/data/spot-traces/availability/1-node/aws-02-15-2023 --speedup 300`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runFakeCloud(ctx, cmd.OutOrStdout(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.gcpListen, "gcp-listen", "127.0.0.1:0", "address of the fake Compute endpoint (the EC2 one takes a free loopback port)")
	fl.StringVar(&f.project, "project", "ferry-fake", "the GCP project the fake serves")
	fl.StringVar(&f.dir, "dir", "", "where VMs keep their scripts and logs (default: a temporary directory)")
	fl.StringVar(&f.spotTrace, "spot-trace", "", "directory of AWS spot availability traces to replay (zone-named JSON files)")
	fl.Float64Var(&f.speedup, "speedup", 60, "trace seconds per wall-clock second when replaying --spot-trace")
	return cmd
}

func runFakeCloud(ctx context.Context, out io.Writer, f fakeCloudFlags) error {
	if f.speedup <= 0 {
		return fmt.Errorf("--speedup must be positive, got %v", f.speedup)
	}
	dir := f.dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ferry-fakecloud-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	var traces []*sim.SpotTrace
	if f.spotTrace != "" {
		var err error
		if traces, err = sim.LoadSpotTraces(f.spotTrace); err != nil {
			return err
		}
	}
	// VMs find this ferry binary (for `ferry replica-sim` in their scripts) first on PATH.
	path := append(binDir(), os.Getenv("PATH"))
	vmEnv := []string{"PATH=" + strings.Join(path, string(os.PathListSeparator))}
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: filepath.Join(dir, "aws"), Env: vmEnv})
	if err != nil {
		return err
	}
	defer ec2.Close()
	gce := fakecompute.New(fakecompute.Options{Project: f.project, Dir: filepath.Join(dir, "gcp"), Env: vmEnv})
	defer gce.Close()
	ln, err := net.Listen("tcp", f.gcpListen)
	if err != nil {
		return fmt.Errorf("gcp listen: %w", err)
	}
	srv := &http.Server{Handler: gce, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	fmt.Fprintf(out, `Fake EC2 on %s and Compute Engine on http://%s; VM logs under %s.
Add to $FERRY_HOME/config.yaml:

aws:
  regions: [us-east-1, us-east-2, us-west-2]
  endpoint: %s
  amis: {us-east-1: ami-0fa4ec10ad, us-east-2: ami-0fa4ec10ad, us-west-2: ami-0fa4ec10ad}
gcp:
  project: %s
  regions: [us-central1]
  endpoint: http://%s

and give the controller (its first start) any static AWS credentials:

  export AWS_ACCESS_KEY_ID=AKIAFAKE AWS_SECRET_ACCESS_KEY=fake AWS_EC2_METADATA_DISABLED=true

Ctrl-C stops the fakes and every VM.
`, ec2.URL(), ln.Addr(), dir, ec2.URL(), f.project, ln.Addr())

	if len(traces) > 0 {
		return replaySpotTraces(ctx, out, ec2, traces, f.speedup)
	}
	<-ctx.Done()
	return nil
}

// replaySpotTraces turns each zone's availability on and off as its trace says.
func replaySpotTraces(ctx context.Context, out io.Writer, ec2 *fakeec2.Server, traces []*sim.SpotTrace, speedup float64) error {
	gap := traces[0].Gap
	tick := time.Duration(gap / speedup * float64(time.Second))
	fmt.Fprintf(out, "Replaying %d zones' spot availability, a %v trace tick every %v.\n", len(traces), time.Duration(gap)*time.Second, tick)
	available := map[string]bool{}
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; i++ {
		at := float64(i) * gap
		for _, tr := range traces {
			up := tr.Available(at)
			if was, seen := available[tr.Zone]; seen && was == up {
				continue
			}
			available[tr.Zone] = up
			if up {
				ec2.ClearZone(tr.Zone)
				fmt.Fprintf(out, "%s: %s has spot capacity\n", time.Duration(at)*time.Second, tr.Zone)
				continue
			}
			ec2.FailZone(tr.Zone, "InsufficientInstanceCapacity")
			for _, in := range ec2.Instances() {
				if in.Spot && in.ZoneName == tr.Zone && (in.State == "running" || in.State == "pending") {
					if err := ec2.Preempt(in.ID); err == nil {
						fmt.Fprintf(out, "%s: preempted %s in %s\n", time.Duration(at)*time.Second, in.ID, tr.Zone)
					}
				}
			}
			fmt.Fprintf(out, "%s: %s has no spot capacity\n", time.Duration(at)*time.Second, tr.Zone)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
