package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
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
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/fakefault"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

func init() { register(newFakeCloudCmd) }

type fakeCloudFlags struct {
	gcpListen, project, dir, spotTrace string
	speedup                            float64
	// faults are --fault's CLOUD=SPEC, set when the fakes start.
	faults []string
	// interruptionNotice is how long an EC2 spot VM the trace reclaims runs after its
	// interruption warning, and preemptionNotice how long a Compute Engine Spot VM runs after
	// its preemption starts.
	interruptionNotice, preemptionNotice time.Duration
}

// fakecloud's control endpoints, on the Compute listener (never faulted themselves).
const (
	preemptPath = "/_fakecloud/preempt"
	faultsPath  = "/_fakecloud/faults"
)

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
			q := url.Values{"instance": {args[0]}, "notice": {notice.String()}}
			body, err := callFakeCloud(cmd.Context(), control, http.MethodPost, preemptPath+"?"+q.Encode(), nil)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), body)
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
--speedup is.

The printed config names only regions whose every zone (in Ferry's catalog) the fakes serve,
so that Ferry never asks them for a zone they do not have.

--fault CLOUD=SPEC (repeatable) breaks a fake from the start, the way real endpoints fail;
'ferry fakecloud fault' sets and clears faults while it runs. ` + faultSpecHelp,
		Example: `  ferry fakecloud
  ferry fakecloud --fault gcp=503
  ferry fakecloud --fault gcp=404,zone=us-central1-f --fault aws=throttle,rate=0.5
  ferry fakecloud --fault aws=hang --fault gcp=503,for=60s
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
	fl.StringArrayVar(&f.faults, "fault", nil, "CLOUD=SPEC: break the aws or gcp fake from the start (repeatable; see above)")
	cmd.AddCommand(newFakeCloudPreemptCmd(), newFakeCloudFaultCmd())
	return cmd
}

func runFakeCloud(ctx context.Context, out io.Writer, f fakeCloudFlags) error {
	if f.speedup <= 0 {
		return fmt.Errorf("--speedup must be positive, got %v", f.speedup)
	}
	if f.interruptionNotice < 0 || f.preemptionNotice < 0 {
		return fmt.Errorf("--interruption-notice and --preemption-notice must not be negative, got %v and %v", f.interruptionNotice, f.preemptionNotice)
	}
	startFaults, err := parseCloudFaults(f.faults)
	if err != nil {
		return fmt.Errorf("--fault: %w", err)
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
	gcpRegions, zones := gcpServed(traces)
	gce := fakecompute.New(fakecompute.Options{Project: f.project, Zones: zones, Dir: filepath.Join(dir, "gcp"), Env: vmEnv})
	defer gce.Close()
	outages := cloudOutages{"aws": ec2.Outages(), "gcp": gce.Outages()}
	for cloud, faults := range startFaults {
		outages[cloud].Set(faults...)
	}
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
	outages.route(mux, out)
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
  regions: [%s]  # zones served: %s
  endpoint: http://%s

and give the controller (its first start) any static AWS credentials:

  export AWS_ACCESS_KEY_ID=AKIAFAKE AWS_SECRET_ACCESS_KEY=fake AWS_EC2_METADATA_DISABLED=true

Preempt a spot VM by hand with 'ferry fakecloud preempt [--notice 2m] INSTANCE_ID' (ids: ferry serve status --json).
Break a cloud with 'ferry fakecloud fault set gcp=503' (clear: 'ferry fakecloud fault clear').
Ctrl-C stops the fakes and every VM.
`, ec2.URL(), ln.Addr(), dir, ec2.URL(), f.project, strings.Join(gcpRegions, ", "), strings.Join(zonesIn(zones, gcpRegions), ", "), ln.Addr())
	if set := outages.list(); len(set) > 0 {
		fmt.Fprintf(out, "Faults set: %s\n", strings.Join(set, " "))
	}

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

// gcpServed is what the fake Compute Engine serves: the regions the printed config names
// (us-central1 and a GCP trace's) and the zones it serves, which include every catalog zone
// of those regions — Ferry's GCP provider lists and launches in each of them — and every zone
// a trace replays.
func gcpServed(traces []*sim.SpotTrace) (regions, zones []string) {
	regions = []string{configs.DefaultGCPRegion}
	zones = slices.Clone(fakecompute.DefaultZones)
	for _, tr := range traces {
		if tr.Provider != sim.GCP {
			continue
		}
		if !slices.Contains(zones, tr.Zone) {
			zones = append(zones, tr.Zone)
		}
		if !slices.Contains(regions, tr.Region) {
			regions = append(regions, tr.Region)
		}
	}
	for _, r := range catalog.Default().Rows() {
		if r.Cloud == catalog.GCP && r.Zone != "" && slices.Contains(regions, r.Region) && !slices.Contains(zones, r.Zone) {
			zones = append(zones, r.Zone)
		}
	}
	slices.Sort(zones)
	return regions, zones
}

// zonesIn are the zones in regions.
func zonesIn(zones, regions []string) []string {
	var out []string
	for _, z := range zones {
		if slices.Contains(regions, fakefault.RegionOf(z)) {
			out = append(out, z)
		}
	}
	return out
}

// faultSpecHelp explains CLOUD=SPEC, for --fault and `fakecloud fault set`.
const faultSpecHelp = `A fault is CLOUD=SPEC, CLOUD aws or gcp:

  SPEC = KIND[,zone=Z][,region=R][,ops=A|B][,rate=0.5][,for=60s][,code=C][,message=M][,delay=2s]

KIND is an HTTP error status (503 unavailable, 500, 404 not found, 403 ...) answered in the
cloud's own error format, "throttle" (EC2 RequestLimitExceeded, Compute Engine 429
rateLimitExceeded), "hang" (the request is accepted and never answered until the fault is
cleared or ends) or "slow" (answered after delay=). zone= and region= limit it to requests
about that place; ops= to the API's operations (EC2 actions such as DescribeInstances or
RunInstances; Compute Engine methods such as instances.list, instances.insert,
zoneOperations.wait); rate= to that share of requests; for= ends it by itself (a cloud that
recovers); code= overrides the error code or reason.`

// cloudOutages are the fakes' outage switches by cloud name, as --fault and
// `fakecloud fault` name them.
type cloudOutages map[string]*fakefault.Switch

// parseCloudFaults reads CLOUD=SPEC strings into faults by cloud, all or none.
func parseCloudFaults(specs []string) (map[string][]fakefault.Fault, error) {
	out := map[string][]fakefault.Fault{}
	for _, s := range specs {
		cloud, spec, ok := strings.Cut(strings.TrimSpace(s), "=")
		if !ok || (cloud != "aws" && cloud != "gcp") {
			return nil, fmt.Errorf("%q: want CLOUD=SPEC with CLOUD aws or gcp, such as gcp=503 or aws=hang", s)
		}
		f, err := fakefault.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cloud, err)
		}
		out[cloud] = append(out[cloud], f)
	}
	return out, nil
}

// list is every fault in force as CLOUD=SPEC, by cloud, with what is left of each For.
func (o cloudOutages) list() []string {
	var out []string
	for _, cloud := range slices.Sorted(maps.Keys(o)) {
		for _, f := range o[cloud].Faults() {
			out = append(out, cloud+"="+f.String())
		}
	}
	return out
}

// set replaces the faults of each cloud specs name (others keep theirs); nothing changes if a
// spec is wrong.
func (o cloudOutages) set(specs []string) error {
	if len(specs) == 0 {
		return errors.New("no fault given: want CLOUD=SPEC, such as gcp=503")
	}
	faults, err := parseCloudFaults(specs)
	if err != nil {
		return err
	}
	for cloud, fs := range faults {
		o[cloud].Set(fs...)
	}
	return nil
}

// clear removes the faults of cloud, or of every cloud for "", releasing hung requests.
func (o cloudOutages) clear(cloud string) error {
	if cloud == "" {
		for _, sw := range o {
			sw.Clear()
		}
		return nil
	}
	sw, ok := o[cloud]
	if !ok {
		return fmt.Errorf("no fake cloud %q: aws or gcp", cloud)
	}
	sw.Clear()
	return nil
}

// route serves the switches on fakecloud's control endpoint: GET lists the faults (one
// CLOUD=SPEC a line), POST sets the form's fault=CLOUD=SPEC values, DELETE clears ?cloud= (or
// every cloud). What changes is also said on out.
func (o cloudOutages) route(mux *http.ServeMux, out io.Writer) {
	lines := func(w http.ResponseWriter) {
		for _, l := range o.list() {
			fmt.Fprintln(w, l)
		}
	}
	mux.HandleFunc("GET "+faultsPath, func(w http.ResponseWriter, r *http.Request) { lines(w) })
	mux.HandleFunc("POST "+faultsPath, func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		specs := r.PostForm["fault"]
		if err := o.set(specs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(out, "faults set: %s (by command)\n", strings.Join(specs, " "))
		lines(w)
	})
	mux.HandleFunc("DELETE "+faultsPath, func(w http.ResponseWriter, r *http.Request) {
		cloud := r.URL.Query().Get("cloud")
		if err := o.clear(cloud); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		what := "every cloud"
		if cloud != "" {
			what = cloud
		}
		fmt.Fprintf(out, "faults cleared on %s (by command)\n", what)
		lines(w)
	})
}

// fakeCloudControl is the running fakecloud's control URL: control, else the gcp endpoint in
// config.yaml (the Compute listener serves the control endpoints).
func fakeCloudControl(control string) (string, error) {
	if control != "" {
		return strings.TrimSuffix(control, "/"), nil
	}
	set, err := openInfras()
	if err != nil {
		return "", err
	}
	set.Close()
	if set.Config.GCP == nil || set.Config.GCP.Endpoint == "" {
		return "", errors.New("no gcp endpoint in config.yaml to find fakecloud by; pass --control URL")
	}
	return strings.TrimSuffix(set.Config.GCP.Endpoint, "/"), nil
}

// callFakeCloud sends a request to a control endpoint of the running fakecloud and returns
// its answer; a refusal is an error with fakecloud's words.
func callFakeCloud(ctx context.Context, control, method, path string, form url.Values) (string, error) {
	base, err := fakeCloudControl(control)
	if err != nil {
		return "", err
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return "", err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("fakecloud at %s: %w", base, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("fakecloud: %s", strings.TrimSpace(string(answer)))
	}
	return string(answer), nil
}

func newFakeCloudFaultCmd() *cobra.Command {
	var control string
	cmd := &cobra.Command{
		Use:   "fault",
		Short: "Set, clear and list the faults of a running ferry fakecloud",
		Long: `fault breaks the fake clouds of a running 'ferry fakecloud' the way real endpoints fail, or
mends them, to see what Ferry does when a cloud, a region or a zone misbehaves. It talks to
fakecloud's control endpoint, found at the gcp endpoint in config.yaml or --control.

` + faultSpecHelp,
		Example: `  ferry fakecloud fault set gcp=503
  ferry fakecloud fault set gcp=404,zone=us-central1-f aws=throttle,rate=0.5
  ferry fakecloud fault set aws=hang gcp=503,for=60s
  ferry fakecloud fault list
  ferry fakecloud fault clear gcp
  ferry fakecloud fault clear`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.PersistentFlags().StringVar(&control, "control", "", "fakecloud's Compute endpoint (default: the gcp endpoint in config.yaml)")
	// printFaults prints what fakecloud says is set.
	printFaults := func(cmd *cobra.Command, answer string) {
		if answer == "" {
			answer = "no faults set\n"
		}
		fmt.Fprint(cmd.OutOrStdout(), answer)
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "set CLOUD=SPEC...",
		Short: "Replace the faults of each cloud named (the others keep theirs)",
		Example: `  ferry fakecloud fault set gcp=503
  ferry fakecloud fault set gcp=404,zone=us-central1-f gcp=503,zone=us-east1-b,ops=instances.insert
  ferry fakecloud fault set aws=slow,delay=3s`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := parseCloudFaults(args); err != nil {
				return err
			}
			answer, err := callFakeCloud(cmd.Context(), control, http.MethodPost, faultsPath, url.Values{"fault": args})
			if err != nil {
				return err
			}
			printFaults(cmd, answer)
			return nil
		},
	}, &cobra.Command{
		Use:     "clear [CLOUD]",
		Short:   "Clear the faults of a cloud (aws or gcp), or of both; hung requests are answered",
		Example: "  ferry fakecloud fault clear gcp\n  ferry fakecloud fault clear",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q := url.Values{}
			if len(args) == 1 {
				q.Set("cloud", args[0])
			}
			answer, err := callFakeCloud(cmd.Context(), control, http.MethodDelete, faultsPath+"?"+q.Encode(), nil)
			if err != nil {
				return err
			}
			printFaults(cmd, answer)
			return nil
		},
	}, &cobra.Command{
		Use:     "list",
		Short:   "List the faults in force, one CLOUD=SPEC a line (for= is what is left)",
		Example: "  ferry fakecloud fault list",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			answer, err := callFakeCloud(cmd.Context(), control, http.MethodGet, faultsPath, nil)
			if err != nil {
				return err
			}
			printFaults(cmd, answer)
			return nil
		},
	})
	return cmd
}
