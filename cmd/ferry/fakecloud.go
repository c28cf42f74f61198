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
	"slices"
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
	// interruptionNotice is how long an EC2 spot VM the trace reclaims runs after its
	// interruption warning, and preemptionNotice how long a Compute Engine Spot VM runs after
	// its preemption starts.
	interruptionNotice, preemptionNotice time.Duration
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
it replays one set of spot capacity traces (a directory of zone-named files under
../shared/data/spot-traces, or a pattern such as DIR/*_v100_1.json), AWS or GCP, read as
ferry sim reads them: a counted set's value is how many spot VMs the zone holds, so a spot launch
beyond it fails (InsufficientInstanceCapacity on EC2, ZONE_RESOURCE_POOL_EXHAUSTED on Compute
Engine) and a drop below what runs there reclaims exactly the excess, newest first; a 0/1 set's 1
is capacity for any number and its 0 reclaims every spot VM in the zone. Only spot VMs that run
are warned: EC2's get the interruption warning and are reclaimed --interruption-notice later,
Compute Engine's get the preempted operation and are stopped --preemption-notice later.
On-demand launches are never refused. A notice is wall-clock time, not trace time: it is how
long Ferry has to react, and Ferry (like the VMs' boots) runs at wall-clock speed whatever
--speedup is.`,
		Example: `  ferry fakecloud
  ferry fakecloud --spot-trace ../shared/data/spot-traces/preemption/4-node/aws-08-03-2023 --speedup 300
  ferry fakecloud --spot-trace ../shared/data/spot-traces/preemption/1-node/gcp-04-30-2023
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
	fl.StringVar(&f.spotTrace, "spot-trace", "", "one set of AWS or GCP spot capacity traces to replay: a directory of zone-named JSON files, or a pattern such as DIR/*_v100_1.json")
	fl.Float64Var(&f.speedup, "speedup", 60, "trace seconds per wall-clock second when replaying --spot-trace")
	fl.DurationVar(&f.interruptionNotice, "interruption-notice", fakeec2.InterruptionNotice,
		"with --spot-trace, how long an EC2 spot VM runs after its interruption warning (wall-clock time, not scaled by --speedup; 0 reclaims at once)")
	fl.DurationVar(&f.preemptionNotice, "preemption-notice", fakecompute.PreemptionNotice,
		"with --spot-trace, how long a Compute Engine Spot VM runs after its preemption starts (wall-clock time; 0 stops it at once)")
	cmd.AddCommand(newFakeCloudPreemptCmd())
	return cmd
}

func runFakeCloud(ctx context.Context, out io.Writer, f fakeCloudFlags) error {
	if f.speedup <= 0 {
		return fmt.Errorf("--speedup must be positive, got %v", f.speedup)
	}
	if f.interruptionNotice < 0 || f.preemptionNotice < 0 {
		return fmt.Errorf("--interruption-notice and --preemption-notice must not be negative, got %v and %v", f.interruptionNotice, f.preemptionNotice)
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
	zones, gcpRegions := slices.Clone(fakecompute.DefaultZones), []string{"us-central1"}
	for _, tr := range traces {
		if tr.Provider != sim.GCP {
			continue
		}
		if !slices.Contains(zones, tr.Zone) {
			zones = append(zones, tr.Zone)
		}
		if !slices.Contains(gcpRegions, tr.Region) {
			gcpRegions = append(gcpRegions, tr.Region)
		}
	}
	gce := fakecompute.New(fakecompute.Options{Project: f.project, Zones: zones, Dir: filepath.Join(dir, "gcp"), Env: vmEnv})
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
  regions: [%s]
  endpoint: http://%s

and give the controller (its first start) any static AWS credentials:

  export AWS_ACCESS_KEY_ID=AKIAFAKE AWS_SECRET_ACCESS_KEY=fake AWS_EC2_METADATA_DISABLED=true

Preempt a spot VM by hand with 'ferry fakecloud preempt [--notice 2m] INSTANCE_ID' (ids: ferry serve status --json).
Ctrl-C stops the fakes and every VM.
`, ec2.URL(), ln.Addr(), dir, ec2.URL(), f.project, strings.Join(gcpRegions, ", "), ln.Addr())

	if len(traces) > 0 {
		var cloud spotCloud = ec2Cloud{ec2, f.interruptionNotice}
		if traces[0].Provider == sim.GCP {
			cloud = gceCloud{gce, f.preemptionNotice}
		}
		return replaySpotTraces(ctx, out, cloud, traces, f.speedup)
	}
	<-ctx.Done()
	return nil
}

// spotCloud is a fake cloud as the replay drives it.
type spotCloud interface {
	// setSpotCapacity limits the spot VMs zone holds; negative is unlimited.
	setSpotCapacity(zone string, n int)
	// held lists the zone's running spot VMs not yet warned, oldest first.
	held(zone string) []string
	// reclaim warns a VM and takes it back after the cloud's notice; it returns what it did.
	reclaim(id string) (string, error)
}

// ec2Cloud is fake EC2: a reclaim is the interruption warning, then the reclaim notice later.
type ec2Cloud struct {
	s      *fakeec2.Server
	notice time.Duration
}

func (c ec2Cloud) setSpotCapacity(zone string, n int) { c.s.SetSpotCapacity(zone, n) }

func (c ec2Cloud) held(zone string) []string {
	var out []string
	for _, in := range c.s.Instances() { // launch order
		warned := in.SpotStatus == fakeec2.StatusNoCapacity || in.SpotStatus == fakeec2.StatusMarkedForTermination
		if in.Spot && in.ZoneName == zone && !warned && (in.State == "running" || in.State == "pending") {
			out = append(out, in.ID)
		}
	}
	return out
}

func (c ec2Cloud) reclaim(id string) (string, error) {
	if err := c.s.PreemptWithNotice(id, c.notice); err != nil {
		return "", err
	}
	if c.notice > 0 {
		return fmt.Sprintf("interruption warning to %s, reclaimed in %v", id, c.notice), nil
	}
	return "preempted " + id, nil
}

// gceCloud is fake Compute Engine: a reclaim is a preemption, the VM stopped notice later.
type gceCloud struct {
	s      *fakecompute.Server
	notice time.Duration
}

func (c gceCloud) setSpotCapacity(zone string, n int) { c.s.SetSpotCapacity(zone, n) }

func (c gceCloud) held(zone string) []string {
	var out []string
	for _, vm := range c.s.SpotVMs() { // oldest first
		if vm.Zone == zone && !vm.Preempting {
			out = append(out, vm.Name)
		}
	}
	return out
}

func (c gceCloud) reclaim(name string) (string, error) {
	if err := c.s.PreemptWithNotice(name, c.notice); err != nil {
		return "", err
	}
	if c.notice > 0 {
		return fmt.Sprintf("preemption of %s, stopped in %v", name, c.notice), nil
	}
	return "preempted " + name, nil
}

// replaySpotTraces sets each zone's spot capacity as its trace says, tick after tick. Where a
// zone now holds fewer spot VMs than run there, the cloud reclaims exactly the excess, newest
// first, each with its cloud's notice (wall-clock time: see the fakecloud command's help).
func replaySpotTraces(ctx context.Context, out io.Writer, cloud spotCloud, traces []*sim.SpotTrace, speedup float64) error {
	gap := traces[0].Gap
	tick := time.Duration(gap / speedup * float64(time.Second))
	reading := "counts"
	if traces[0].Probe {
		reading = "0/1 probes, 1 read as unlimited"
	}
	fmt.Fprintf(out, "Replaying %d %s zones' spot capacity (%s), a %v trace tick every %v.\n",
		len(traces), strings.ToUpper(string(traces[0].Provider)), reading, time.Duration(gap)*time.Second, tick)
	capacity := map[string]int{}
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; i++ {
		replayTick(out, cloud, traces, float64(i)*gap, capacity)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// replayTick applies the traces at trace time at: each zone's capacity, and the reclaim of
// what it no longer holds. capacity is the last capacity set per zone, to report changes.
func replayTick(out io.Writer, cloud spotCloud, traces []*sim.SpotTrace, at float64, capacity map[string]int) {
	stamp := time.Duration(at) * time.Second
	for _, tr := range traces {
		c := tr.Capacity(at)
		if was, seen := capacity[tr.Zone]; !seen || was != c {
			capacity[tr.Zone] = c
			switch {
			case c == sim.Unbounded:
				cloud.setSpotCapacity(tr.Zone, -1)
				fmt.Fprintf(out, "%s: %s has spot capacity\n", stamp, tr.Zone)
			case c == 0:
				cloud.setSpotCapacity(tr.Zone, 0)
				fmt.Fprintf(out, "%s: %s has no spot capacity\n", stamp, tr.Zone)
			default:
				cloud.setSpotCapacity(tr.Zone, c)
				fmt.Fprintf(out, "%s: %s has spot capacity for %d\n", stamp, tr.Zone, c)
			}
		}
		held := cloud.held(tr.Zone)
		if len(held) <= c {
			continue
		}
		for _, id := range held[c:] {
			did, err := cloud.reclaim(id)
			if err != nil {
				continue
			}
			fmt.Fprintf(out, "%s: %s in %s\n", stamp, did, tr.Zone)
		}
	}
}
