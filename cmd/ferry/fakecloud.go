package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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
	// interruptionNotice is how long a spot VM in a zone the trace takes down runs after its
	// interruption warning.
	interruptionNotice time.Duration
}

// preemptPath is fakecloud's control endpoint, on the Compute listener.
const preemptPath = "/_fakecloud/preempt"

// preemptFake preempts a VM given its Ferry instance id (aws/REGION/ID or gcp/ZONE/NAME). An
// EC2 VM gets EC2's interruption warning notice before it is reclaimed (EC2 gives
// fakeec2.InterruptionNotice; 0 reclaims at once). A Compute Engine VM takes no notice here:
// its preemption comes with its own 30 s one.
func preemptFake(ec2 *fakeec2.Server, gce *fakecompute.Server, id string, notice time.Duration) error {
	infra, rest, _ := strings.Cut(id, "/")
	name := rest[strings.LastIndex(rest, "/")+1:]
	switch {
	case notice < 0:
		return fmt.Errorf("notice %v is negative", notice)
	case name == "":
		return fmt.Errorf("%q is not an instance id (aws/REGION/ID or gcp/ZONE/NAME)", id)
	case infra == "aws":
		return ec2.PreemptWithNotice(name, notice)
	case infra == "gcp" && notice != 0:
		return fmt.Errorf("--notice is for EC2 VMs only: Compute Engine gives %s its own 30 s shutdown notice when preempted; leave --notice out", id)
	case infra == "gcp":
		return gce.Preempt(name)
	}
	return fmt.Errorf("%q is not on a fake cloud", id)
}

// preemptedLine says what preemptFake did.
func preemptedLine(id string, notice time.Duration) string {
	if notice > 0 {
		return fmt.Sprintf("interruption warning to %s, reclaimed in %v", id, notice)
	}
	return "preempted " + id
}

func newFakeCloudPreemptCmd() *cobra.Command {
	var (
		control string
		notice  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "preempt INSTANCE_ID",
		Short: "Preempt a spot VM on a running ferry fakecloud",
		Long: `preempt takes a spot VM away. By default it is reclaimed at once. With --notice an EC2 VM first
gets EC2's interruption warning, on its spot request (DescribeSpotInstanceRequests shows it), and
keeps running that long; EC2 gives two minutes. Compute Engine VMs take no --notice: their
preemption comes with its own 30 s shutdown notice.`,
		Example: `  ferry serve status --json | grep instance_id
  ferry fakecloud preempt aws/us-east-1/i-0123456789abcdef0
  ferry fakecloud preempt --notice 2m aws/us-east-1/i-0123456789abcdef0`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if notice < 0 {
				return fmt.Errorf("--notice must not be negative, got %v", notice)
			}
			if control == "" {
				set, err := openInfras()
				if err != nil {
					return err
				}
				set.Close()
				if set.Config.GCP == nil || set.Config.GCP.Endpoint == "" {
					return errors.New("no gcp endpoint in config.yaml to find fakecloud by; pass --control URL")
				}
				control = set.Config.GCP.Endpoint
			}
			q := url.Values{"instance": {args[0]}, "notice": {notice.String()}}
			resp, err := http.Post(strings.TrimSuffix(control, "/")+preemptPath+"?"+q.Encode(), "text/plain", nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("fakecloud: %s", strings.TrimSpace(string(body)))
			}
			fmt.Fprint(cmd.OutOrStdout(), string(body))
			return nil
		},
	}
	cmd.Flags().StringVar(&control, "control", "", "fakecloud's Compute endpoint (default: the gcp endpoint in config.yaml)")
	cmd.Flags().DurationVar(&notice, "notice", 0, "EC2 only: give the interruption warning this long before reclaiming the VM (EC2 gives 2m); 0 reclaims at once")
	return cmd
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
launches there fail with InsufficientInstanceCapacity and its spot VMs get EC2's interruption
warning, then are reclaimed --interruption-notice later. That notice is wall-clock time, not
trace time: it is how long Ferry has to react, and Ferry (like the VMs' boots) runs at wall-clock
speed whatever --speedup is.`,
		Example: `  ferry fakecloud
  ferry fakecloud --spot-trace ../shared/data/spot-traces/availability/1-node/aws-02-15-2023 --speedup 300
  ferry fakecloud --spot-trace ../shared/data/spot-traces/availability/1-node/aws-02-15-2023 --interruption-notice 0`,
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
	fl.DurationVar(&f.interruptionNotice, "interruption-notice", fakeec2.InterruptionNotice,
		"with --spot-trace, how long a spot VM runs after its interruption warning (wall-clock time, not scaled by --speedup; 0 reclaims at once)")
	cmd.AddCommand(newFakeCloudPreemptCmd())
	return cmd
}

func runFakeCloud(ctx context.Context, out io.Writer, f fakeCloudFlags) error {
	if f.speedup <= 0 {
		return fmt.Errorf("--speedup must be positive, got %v", f.speedup)
	}
	if f.interruptionNotice < 0 {
		return fmt.Errorf("--interruption-notice must not be negative, got %v", f.interruptionNotice)
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
	mux := http.NewServeMux()
	mux.Handle("/", gce)
	mux.HandleFunc("POST "+preemptPath, func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("instance")
		var notice time.Duration
		if v := r.URL.Query().Get("notice"); v != "" {
			var err error
			if notice, err = time.ParseDuration(v); err != nil {
				http.Error(w, fmt.Sprintf("notice: %v", err), http.StatusBadRequest)
				return
			}
		}
		if err := preemptFake(ec2, gce, id, notice); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(out, "%s (by command)\n", preemptedLine(id, notice))
		fmt.Fprintln(w, preemptedLine(id, notice))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
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

Preempt a spot VM by hand with 'ferry fakecloud preempt [--notice 2m] INSTANCE_ID' (ids: ferry serve status --json).
Ctrl-C stops the fakes and every VM.
`, ec2.URL(), ln.Addr(), dir, ec2.URL(), f.project, ln.Addr())

	if len(traces) > 0 {
		return replaySpotTraces(ctx, out, ec2, traces, f.speedup, f.interruptionNotice)
	}
	<-ctx.Done()
	return nil
}

// replaySpotTraces turns each zone's availability on and off as its trace says. When a zone
// loses capacity, its spot VMs get EC2's interruption warning and are reclaimed notice later
// (wall-clock time: see the fakecloud command's help).
func replaySpotTraces(ctx context.Context, out io.Writer, ec2 *fakeec2.Server, traces []*sim.SpotTrace, speedup float64, notice time.Duration) error {
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
				warned := in.SpotStatus == fakeec2.StatusNoCapacity || in.SpotStatus == fakeec2.StatusMarkedForTermination
				if !in.Spot || in.ZoneName != tr.Zone || warned || (in.State != "running" && in.State != "pending") {
					continue
				}
				if err := ec2.PreemptWithNotice(in.ID, notice); err != nil {
					continue
				}
				if notice > 0 {
					fmt.Fprintf(out, "%s: interruption warning to %s in %s, reclaimed in %v\n", time.Duration(at)*time.Second, in.ID, tr.Zone, notice)
				} else {
					fmt.Fprintf(out, "%s: preempted %s in %s\n", time.Duration(at)*time.Second, in.ID, tr.Zone)
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
