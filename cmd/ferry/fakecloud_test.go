package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/ferryserve/ferry/bench/sim"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/gcp"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

// syncBuffer is a bytes.Buffer safe for the replay goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newReplayEnv is a fake EC2, a provider on it, and a spot VM in us-east-1a.
func newReplayEnv(t *testing.T) (*fakeec2.Server, *aws.Provider, launcher.Spec, launcher.Instance) {
	t.Helper()
	ec2, prov := newEC2Env(t)
	spec := launcher.Spec{Name: "svc-1", Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc"}, Run: "exec sleep 60", Port: 8080,
		Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "g5.xlarge", Spot: true}}
	inst, err := prov.Launch(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return ec2, prov, spec, inst
}

// newEC2Env is a fake EC2 and a provider on it.
func newEC2Env(t *testing.T) (*fakeec2.Server, *aws.Provider) {
	t.Helper()
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ec2.Close() })
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx := context.Background()
	prov, err := aws.New(ctx, aws.Options{Endpoint: ec2.URL(), AMIs: map[string]string{"us-east-1": "ami-0fa4ec10ad"},
		Credentials: awssdk.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""))})
	if err != nil {
		t.Fatal(err)
	}
	return ec2, prov
}

// startReplay replays traces on cloud (a tick every 100 ms) until the test ends.
func startReplay(t *testing.T, cloud spotCloud, traces []*sim.SpotTrace) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- replaySpotTraces(ctx, &out, cloud, traces, 600) }()
	t.Cleanup(func() { cancel(); <-done })
	return &out
}

// waitOutput polls the replay's output until it contains want.
func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("replay did not say %q; it said:\n%s", want, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// downOnce: us-east-1a is up for one tick, down for two, then up; another zone always up.
// (Long enough that the replay does not wrap around during a test.)
func downOnce() []*sim.SpotTrace {
	updown := append([]float64{1, 0, 0}, slices.Repeat([]float64{1}, 1000)...)
	return []*sim.SpotTrace{{Zone: "us-east-1a", Provider: sim.AWS, Gap: 60, Data: updown, Probe: true},
		{Zone: "us-east-1b", Provider: sim.AWS, Gap: 60, Data: []float64{1}, Probe: true}}
}

// TestReplaySpotTraces: with no interruption notice, a zone whose trace drops to zero
// preempts the spot VMs there at once and refuses launches until its capacity returns.
func TestReplaySpotTraces(t *testing.T) {
	ec2, prov, spec, inst := newReplayEnv(t)
	ctx := context.Background()
	out := startReplay(t, ec2Cloud{ec2, 0}, downOnce())
	waitOutput(t, out, "preempted")
	got, err := prov.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if err != nil || len(got) != 1 || got[0].ID != inst.ID || got[0].State != launcher.StatePreempted {
		t.Fatalf("after the zone went down: %+v, %v; want the instance preempted", got, err)
	}
	spec.Name = "svc-2"
	if _, err := prov.Launch(ctx, spec); !errors.Is(err, launcher.ErrNoCapacity) && strings.Count(out.String(), "us-east-1a has spot capacity\n") < 2 {
		t.Fatalf("launch into the downed zone: %v, want ErrNoCapacity", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), "us-east-1a has spot capacity\n") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("capacity never came back; replay said:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	spec.Name = "svc-3"
	if _, err := prov.Launch(ctx, spec); err != nil {
		t.Fatalf("launch after capacity returned: %v", err)
	}
}

// TestReplaySpotTracesGivesNotice: a zone that loses capacity gives its spot VMs EC2's
// interruption warning; they run out the notice (in wall-clock time), then are reclaimed.
func TestReplaySpotTracesGivesNotice(t *testing.T) {
	ec2, prov, _, inst := newReplayEnv(t)
	ctx := context.Background()
	const notice = 3 * time.Second
	out := startReplay(t, ec2Cloud{ec2, notice}, downOnce())
	waitOutput(t, out, "interruption warning to ")
	var fi fakeec2.Instance
	for _, in := range ec2.Instances() {
		if strings.HasSuffix(inst.ID, "/"+in.ID) {
			fi = in
		}
	}
	if fi.State != "running" || fi.SpotStatus != fakeec2.StatusNoCapacity {
		t.Fatalf("at the warning the VM is %s with request status %q, want running and %s", fi.State, fi.SpotStatus, fakeec2.StatusNoCapacity)
	}
	if !strings.Contains(out.String(), "reclaimed in 3s") {
		t.Fatalf("replay said:\n%s", out.String())
	}
	deadline := time.Now().Add(notice + 10*time.Second)
	for {
		got, err := prov.List(ctx, map[string]string{launcher.LabelService: "svc"})
		if err == nil && len(got) == 1 && got[0].State == launcher.StatePreempted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reclaimed after the notice: %+v, %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := strings.Count(out.String(), "interruption warning to "); n != 1 {
		t.Fatalf("%d warnings, want 1; replay said:\n%s", n, out.String())
	}
}

// TestReplaySpotTracesCounts: a counted zone refuses the spot VM beyond its count (not an
// on-demand one), and a drop reclaims exactly the excess, the newest. Ticks are replayed by
// hand.
func TestReplaySpotTracesCounts(t *testing.T) {
	ec2, prov := newEC2Env(t)
	ctx := context.Background()
	launch := func(name string, spot bool) (launcher.Instance, error) {
		return prov.Launch(ctx, launcher.Spec{Name: name, Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc", launcher.LabelReplicaID: name},
			Run: "exec sleep 60", Port: 8080, Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "g5.xlarge", Spot: spot}})
	}
	traces := []*sim.SpotTrace{{Zone: "us-east-1a", Provider: sim.AWS, Gap: 300, Data: []float64{2, 1}}}
	var out bytes.Buffer
	capacity := map[string]int{}
	replayTick(&out, ec2Cloud{ec2, 0}, traces, 0, capacity)
	older, err := launch("svc-1", true)
	if err != nil {
		t.Fatal(err)
	}
	newer, err := launch("svc-2", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := launch("svc-3", true); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("a third spot VM in a zone of capacity 2: %v, want ErrNoCapacity", err)
	}
	if _, err := launch("svc-4", false); err != nil {
		t.Fatalf("an on-demand VM in the full zone: %v", err)
	}
	replayTick(&out, ec2Cloud{ec2, 0}, traces, 300, capacity)
	got, err := prov.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]launcher.State{}
	for _, in := range got {
		states[in.ID] = in.State
	}
	if states[older.ID] != launcher.StateRunning || states[newer.ID] != launcher.StatePreempted {
		t.Fatalf("after the drop to 1: older %s, newer %s; want the newer (only) preempted\n%s", states[older.ID], states[newer.ID], out.String())
	}
	want := "0s: us-east-1a has spot capacity for 2\n5m0s: us-east-1a has spot capacity for 1\n5m0s: preempted " + strings.TrimPrefix(newer.ID, "aws/us-east-1/") + " in us-east-1a\n"
	if out.String() != want {
		t.Errorf("replay said:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestReplaySpotTracesGCP: a GCP set's zones are served as GCP writes them; a zone that loses
// capacity starts the preemption of its Spot VM (the operation Ferry's watcher reads), keeps
// it running through the notice, and takes no new Spot VM. Ticks are replayed by hand.
func TestReplaySpotTracesGCP(t *testing.T) {
	traces, err := sim.LoadSpotTraces(filepath.Join(simTestdata, "spot-gcp"))
	if err != nil {
		t.Fatal(err)
	}
	zones := []string{"us-central1-a", "us-east1-b"}
	gce := fakecompute.New(fakecompute.Options{Project: "p", Zones: zones, Dir: t.TempDir(), OpDelay: -1})
	srv := httptest.NewServer(gce)
	t.Cleanup(gce.Close)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	prov, err := gcp.New(ctx, gcp.Options{Project: "p", Endpoint: srv.URL, Zones: zones, PollInterval: 10 * time.Millisecond, LaunchTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.Close)
	launch := func(name, zone string) (launcher.Instance, error) {
		return prov.Launch(ctx, launcher.Spec{Name: name, Labels: map[string]string{launcher.LabelService: "svc", launcher.LabelReplicaID: name},
			Run: "exec sleep 60", Port: 8080, Placement: launcher.Placement{Infra: gcp.InfraName, Region: "us-central1", Zone: zone, InstanceType: "n1-standard-4", Spot: true}})
	}
	inst, err := launch("svc-0", "us-central1-a")
	if err != nil {
		t.Fatal(err)
	}
	name := inst.ID[strings.LastIndex(inst.ID, "/")+1:]
	// Tick 0 of the slice: both zones down.
	var out bytes.Buffer
	replayTick(&out, gceCloud{gce, time.Hour}, traces, 0, map[string]int{})
	want := "0s: us-central1-a has no spot capacity\n0s: preemption of " + name + ", stopped in 1h0m0s in us-central1-a\n0s: us-east1-b has no spot capacity\n"
	if out.String() != want {
		t.Errorf("replay said:\n%s\nwant:\n%s", out.String(), want)
	}
	if vm, _, ok := gce.Instance(name); !ok || vm.GetStatus() != "STOPPING" {
		t.Errorf("%s is %q during its notice, want STOPPING, as GCE shows it", name, vm.GetStatus())
	}
	if _, err := launch("svc-1", "us-central1-a"); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Errorf("a Spot VM in a zone without capacity: %v, want ErrNoCapacity", err)
	}
}

// TestFakeCloudPreemptCommand runs `ferry fakecloud` and preempts its spot VMs with
// `ferry fakecloud preempt`: at once, and with --notice, which EC2 VMs take as the
// interruption warning the AWS provider's Notices reads, and Compute Engine VMs refuse.
func TestFakeCloudPreemptCommand(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runFakeCloud(ctx, &out, fakeCloudFlags{gcpListen: "127.0.0.1:0", project: "ferry-fake", dir: t.TempDir(), speedup: 60})
	}()
	defer func() { cancel(); <-done }()
	re := regexp.MustCompile(`Fake EC2 on (\S+) and Compute Engine on (\S+);`)
	var m []string
	deadline := time.Now().Add(10 * time.Second)
	for m = re.FindStringSubmatch(out.String()); m == nil; m = re.FindStringSubmatch(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("fakecloud did not start:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	prov, err := aws.New(ctx, aws.Options{Endpoint: m[1], AMIs: map[string]string{"us-east-1": "ami-0fa4ec10ad"}, NoticeInterval: 20 * time.Millisecond,
		Credentials: awssdk.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""))})
	if err != nil {
		t.Fatal(err)
	}
	launch := func(name string) launcher.Instance {
		t.Helper()
		inst, err := prov.Launch(ctx, launcher.Spec{Name: name, Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc", launcher.LabelReplicaID: name},
			Run: "exec sleep 60", Port: 8080, Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1", InstanceType: "g5.xlarge", Spot: true}})
		if err != nil {
			t.Fatal(err)
		}
		return inst
	}
	preempt := func(args ...string) (string, error) {
		cmd := newRootCmd()
		var stdout bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(append([]string{"fakecloud", "preempt", "--control", m[2]}, args...))
		err := cmd.ExecuteContext(ctx)
		return stdout.String(), err
	}
	state := func(name string) launcher.State {
		t.Helper()
		got, err := prov.List(ctx, map[string]string{launcher.LabelReplicaID: name})
		if err != nil || len(got) != 1 {
			t.Fatalf("List(%s) = %+v, %v", name, got, err)
		}
		return got[0].State
	}

	inst := launch("svc-1")
	if said, err := preempt(inst.ID); err != nil || said != "preempted "+inst.ID+"\n" {
		t.Fatalf("fakecloud preempt said %q, %v", said, err)
	}
	if st := state("svc-1"); st != launcher.StatePreempted {
		t.Fatalf("after fakecloud preempt the VM is %s, want preempted", st)
	}

	warned := launch("svc-2")
	notices := prov.Notices(ctx)
	sent := time.Now()
	said, err := preempt("--notice", "2m", warned.ID)
	if err != nil || said != "interruption warning to "+warned.ID+", reclaimed in 2m0s\n" {
		t.Fatalf("fakecloud preempt --notice 2m said %q, %v", said, err)
	}
	timeout := time.After(10 * time.Second)
	for announced := false; !announced; {
		select {
		case n := <-notices:
			if n.InstanceID != warned.ID {
				continue // svc-1, preempted above
			}
			if n.At.Before(sent.Add(aws.InterruptionNotice-time.Second)) || n.At.After(time.Now().Add(aws.InterruptionNotice)) {
				t.Fatalf("notice At %v, want two minutes after %v", n.At, sent)
			}
			announced = true
		case <-timeout:
			t.Fatalf("no notice for %s", warned.ID)
		}
	}
	if st := state("svc-2"); st != launcher.StateRunning {
		t.Fatalf("during the notice the VM is %s, want running", st)
	}
	if !strings.Contains(out.String(), "interruption warning to "+warned.ID+", reclaimed in 2m0s (by command)") {
		t.Fatalf("fakecloud said:\n%s", out.String())
	}

	for name, tc := range map[string]struct {
		args    []string
		wantErr string
	}{
		"foreign id":      {args: []string{"azure/x/y"}, wantErr: "not on a fake cloud"},
		"gcp with notice": {args: []string{"--notice", "30s", "gcp/us-central1-a/vm-1"}, wantErr: "--notice is for EC2 VMs only"},
		"negative notice": {args: []string{"--notice", "-1s", warned.ID}, wantErr: "must not be negative"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := preempt(tc.args...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("fakecloud preempt %v: %v, want an error saying %q", tc.args, err, tc.wantErr)
			}
		})
	}
}

// fakeCloudRun is a `ferry fakecloud` command running until the test ends, and what it said.
type fakeCloudRun struct {
	out *syncBuffer
	// config is the config.yaml it printed, parsed; control its control endpoint.
	config  *configs.FerryConfig
	control string
}

// startFakeCloud runs `ferry fakecloud ARGS...` through the root command, as a user would,
// and waits for it to print its config.
func startFakeCloud(t *testing.T, args ...string) *fakeCloudRun {
	t.Helper()
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx, cancel := context.WithCancel(context.Background())
	run := &fakeCloudRun{out: &syncBuffer{}}
	cmd := newRootCmd()
	cmd.SetOut(run.out)
	cmd.SetErr(run.out)
	cmd.SetArgs(append([]string{"fakecloud", "--gcp-listen", "127.0.0.1:0", "--dir", t.TempDir()}, args...))
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fakecloud: %v", err)
		}
	})
	re := regexp.MustCompile(`(?s)Add to \$FERRY_HOME/config.yaml:\n\n(.*?)\n\nand give`)
	deadline := time.Now().Add(30 * time.Second)
	var m []string
	for m = re.FindStringSubmatch(run.out.String()); m == nil; m = re.FindStringSubmatch(run.out.String()) {
		select {
		case err := <-done:
			t.Fatalf("fakecloud ended: %v\n%s", err, run.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fakecloud did not start:\n%s", run.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cfg, err := configs.ParseFerryConfig("printed", []byte(m[1]))
	if err != nil {
		t.Fatalf("the printed config does not parse: %v\n%s", err, m[1])
	}
	if cfg.GCP == nil || cfg.AWS == nil {
		t.Fatalf("the printed config lacks a cloud:\n%s", m[1])
	}
	run.config, run.control = cfg, cfg.GCP.Endpoint
	return run
}

// gcpProvider is the GCP provider as the printed config sets it up.
func (r *fakeCloudRun) gcpProvider(t *testing.T) *gcp.Provider {
	t.Helper()
	c := r.config.GCP
	prov, err := gcp.New(context.Background(), gcp.Options{Project: c.Project, Regions: c.Regions, Endpoint: c.Endpoint, RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.Close)
	return prov
}

// fault runs `ferry fakecloud fault ARGS...` against the running fakecloud.
func (r *fakeCloudRun) fault(args ...string) (string, error) {
	cmd := newRootCmd()
	var stdout bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(append([]string{"fakecloud", "fault", "--control", r.control}, args...))
	err := cmd.ExecuteContext(context.Background())
	return stdout.String(), err
}

// TestFakeCloudPrintsWhatItServes: the config `ferry fakecloud` prints parses, and Ferry's
// providers set up from it find every zone of every region it names served: the GCP provider
// lists us-central1-f too (the fake used to lack it, and every List failed), and a GCP trace's
// regions are served whole.
func TestFakeCloudPrintsWhatItServes(t *testing.T) {
	for name, args := range map[string][]string{
		"default":   nil,
		"gcp trace": {"--spot-trace", filepath.Join(simTestdata, "spot-gcp")},
	} {
		t.Run(name, func(t *testing.T) {
			run := startFakeCloud(t, args...)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			prov := run.gcpProvider(t)
			if err := prov.Check(ctx); err != nil {
				t.Fatalf("GCP as printed (regions %v): %v\n%s", run.config.GCP.Regions, err, run.out.String())
			}
			if _, err := prov.List(ctx, nil); err != nil {
				t.Fatalf("GCP List as printed (regions %v): %v", run.config.GCP.Regions, err)
			}
			if !strings.Contains(run.out.String(), "us-central1-f") {
				t.Errorf("the printed config does not say the fake serves us-central1-f:\n%s", run.out.String())
			}
			a := run.config.AWS
			awsProv, err := aws.New(ctx, aws.Options{Regions: a.Regions, Endpoint: a.Endpoint, AMIs: a.AMIs,
				Credentials: awssdk.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""))})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := awsProv.List(ctx, nil); err != nil {
				t.Fatalf("AWS List as printed (regions %v): %v", a.Regions, err)
			}
			for _, region := range a.Regions {
				if a.AMIs[region] == "" {
					t.Errorf("the printed config has no AMI for %s", region)
				}
			}
		})
	}
	regions, zones := gcpServed(nil)
	if !slices.Equal(regions, []string{"us-central1"}) || !slices.Contains(zones, "us-central1-f") {
		t.Fatalf("gcpServed() = %v, %v; want us-central1 with every catalog zone", regions, zones)
	}
}

// TestFakeCloudFaults: `ferry fakecloud --fault` breaks the fakes from the start; `ferry
// fakecloud fault` sets, lists and clears faults while it runs; what GCP answers follows.
// (Whether fake EC2 honours its switch is fakeec2's business; here its switch holds the
// fault.)
func TestFakeCloudFaults(t *testing.T) {
	run := startFakeCloud(t, "--fault", "gcp=503,zone=us-central1-f", "--fault", "aws=throttle,rate=0.5",
		"--fault", "gcp=404,zone=us-central1-b,for=1h")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if !strings.Contains(run.out.String(), "Faults set: aws=throttle,rate=0.5 gcp=503,zone=us-central1-f gcp=404,zone=us-central1-b,for=") {
		t.Errorf("fakecloud did not say which faults it set:\n%s", run.out.String())
	}
	prov := run.gcpProvider(t)
	gapsOf := func() map[string]error {
		t.Helper()
		_, err := prov.List(ctx, nil)
		gaps, ok := launcher.Partial(err)
		if !ok {
			t.Fatalf("List: %v, want a partial list", err)
		}
		out := map[string]error{}
		for _, g := range gaps {
			out[g.Zone] = g.Err
		}
		return out
	}
	gaps := gapsOf()
	if len(gaps) != 2 || !errors.Is(gaps["us-central1-f"], launcher.ErrUnavailable) || !errors.Is(gaps["us-central1-b"], launcher.ErrNotFound) {
		t.Fatalf("with --fault set, List's gaps are %v; want us-central1-f unavailable and us-central1-b not found", gaps)
	}

	list, err := run.fault("list")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^aws=throttle,rate=0.5\ngcp=503,zone=us-central1-f\ngcp=404,zone=us-central1-b,for=(59m5\ds|1h0m0s)\n$`).MatchString(list) {
		t.Fatalf("fault list said:\n%s", list)
	}

	// set replaces the named clouds' faults, and says what is set now.
	said, err := run.fault("set", "gcp=hang,ops=instances.insert", "aws=503")
	if err != nil || said != "aws=503\ngcp=hang,ops=instances.insert\n" {
		t.Fatalf("fault set said %q, %v", said, err)
	}
	if _, err := prov.List(ctx, nil); err != nil {
		t.Fatalf("with only inserts hanging, List: %v", err)
	}
	if said, err := run.fault("set", "gcp=503,region=us-central1"); err != nil || said != "aws=503\ngcp=503,region=us-central1\n" {
		t.Fatalf("fault set gcp said %q, %v (aws's fault should stay)", said, err)
	}
	// Every zone of the provider's region failing is GCP failing: one gap naming each zone.
	if gaps := gapsOf(); len(gaps) != 1 || gaps[""] == nil || !strings.Contains(gaps[""].Error(), "us-central1-f") {
		t.Fatalf("with us-central1 down, gaps %v; want the whole infra, naming its 4 zones", gaps)
	}

	for name, tc := range map[string]struct {
		args    []string
		wantErr string
	}{
		"unknown cloud":   {[]string{"set", "gcp=500", "azure=503"}, "CLOUD aws or gcp"},
		"no cloud":        {[]string{"set", "503"}, "CLOUD aws or gcp"},
		"bad spec":        {[]string{"set", "gcp=bogus"}, "kind must be"},
		"bad key":         {[]string{"set", "gcp=503,colour=red"}, "unknown key"},
		"nothing to set":  {[]string{"set"}, "requires at least 1 arg"},
		"clear an azure":  {[]string{"clear", "azure"}, "no fake cloud"},
		"list takes none": {[]string{"list", "gcp"}, "unknown command"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := run.fault(tc.args...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("fault %v: %v, want an error saying %q", tc.args, err, tc.wantErr)
			}
		})
	}
	if list, err := run.fault("list"); err != nil || list != "aws=503\ngcp=503,region=us-central1\n" {
		t.Fatalf("after refused commands the faults are %q, %v; want them unchanged", list, err)
	}

	if said, err := run.fault("clear", "gcp"); err != nil || said != "aws=503\n" {
		t.Fatalf("fault clear gcp said %q, %v", said, err)
	}
	if _, err := prov.List(ctx, nil); err != nil {
		t.Fatalf("after fault clear gcp, List: %v", err)
	}
	if said, err := run.fault("clear"); err != nil || said != "no faults set\n" {
		t.Fatalf("fault clear said %q, %v", said, err)
	}
	if list, err := run.fault("list"); err != nil || list != "no faults set\n" {
		t.Fatalf("fault list after clear: %q, %v", list, err)
	}
	if !strings.Contains(run.out.String(), "faults set: gcp=hang,ops=instances.insert aws=503 (by command)") ||
		!strings.Contains(run.out.String(), "faults cleared on every cloud (by command)") {
		t.Errorf("fakecloud did not log the commands:\n%s", run.out.String())
	}
}

// TestFakeCloudFaultFlagRefused: a wrong --fault stops fakecloud before it serves.
func TestFakeCloudFaultFlagRefused(t *testing.T) {
	for spec, wantErr := range map[string]string{
		"gcp=bogus":   "kind must be",
		"azure=503":   "CLOUD aws or gcp",
		"503":         "CLOUD aws or gcp",
		"aws=slow":    "slow needs delay",
		"gcp=503,x=1": "unknown key",
	} {
		err := runFakeCloud(context.Background(), io.Discard, fakeCloudFlags{gcpListen: "127.0.0.1:0", project: "p", dir: t.TempDir(), speedup: 60, faults: []string{spec}})
		if err == nil || !strings.Contains(err.Error(), "--fault") || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("--fault %s: %v, want an error saying %q", spec, err, wantErr)
		}
	}
}

// TestFakeCloudFaultHelp: the fault flag and command explain the spec with examples.
func TestFakeCloudFaultHelp(t *testing.T) {
	for _, args := range [][]string{{"fakecloud", "--help"}, {"fakecloud", "fault", "--help"}, {"fakecloud", "fault", "set", "--help"}} {
		cmd := newRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"gcp=503", "Example"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v does not show %q:\n%s", args, want, out.String())
			}
		}
	}
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"fakecloud", "fault", "--help"})
	_ = cmd.Execute()
	for _, want := range []string{"hang", "throttle", "zone=", "for=", "instances.list", "DescribeInstances", "fault clear gcp"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("fakecloud fault --help does not explain %q:\n%s", want, out.String())
		}
	}
}
