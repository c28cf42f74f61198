package aws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

const (
	testRegion  = "us-east-1"
	testZoneID  = "use1-az4"
	testType    = "g5.xlarge"
	goodKey     = "AKIDFERRYTEST"
	badKey      = "AKIDBAD"
	deniedKey   = "AKIDDENIED"
	testTimeout = 30 * time.Second
)

// TestMain builds the ferry binary so that a fake VM's user-data can run `ferry replica-sim`,
// and keeps the SDK off the network and away from the host's AWS configuration.
func TestMain(m *testing.M) {
	if os.Getenv(vmjobtest.EnvGangNode) != "" {
		os.Exit(vmjobtest.GangNode())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "ferry-aws-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "ferry"), "./cmd/ferry")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build ferry: %v\n%s", err, out)
		return 2
	}
	for k, v := range map[string]string{
		"PATH":                        dir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_CONFIG_FILE":             filepath.Join(dir, "no-config"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "no-credentials"),
		"AWS_ACCESS_KEY_ID":           "",
		"AWS_SECRET_ACCESS_KEY":       "",
		"AWS_PROFILE":                 "",
	} {
		os.Setenv(k, v)
	}
	return m.Run()
}

type env struct {
	fake *fakeec2.Server
	p    *Provider
}

func newEnv(t *testing.T, fo fakeec2.Options, key string) env {
	t.Helper()
	fo.BadAccessKeys = append(fo.BadAccessKeys, badKey)
	fo.DeniedAccessKeys = append(fo.DeniedAccessKeys, deniedKey)
	fo.LogDir = t.TempDir()
	fake, err := fakeec2.New(fo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	return env{fake: fake, p: newProvider(t, fake, key)}
}

func newProvider(t *testing.T, fake *fakeec2.Server, key string) *Provider {
	t.Helper()
	p, err := New(context.Background(), Options{
		Regions:        []string{testRegion, "us-west-2"},
		Endpoint:       fake.URL(),
		Credentials:    credentials.NewStaticCredentialsProvider(key, "secret", ""),
		AMIs:           map[string]string{testRegion: "ami-0123456789abcdef0", "us-west-2": "ami-0fedcba9876543210"},
		LaunchTimeout:  testTimeout,
		PollInterval:   10 * time.Millisecond,
		NoticeInterval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func spec(name, run string, spot bool) launcher.Spec {
	return launcher.Spec{
		Name:   name,
		Labels: map[string]string{launcher.LabelService: "chat", launcher.LabelVersion: "1", launcher.LabelReplicaID: name},
		Run:    run,
		Envs:   map[string]string{"GREETING": "it's a test"},
		Port:   8081,
		Placement: launcher.Placement{
			Infra: InfraName, Region: testRegion, Zone: testZoneID, InstanceType: testType, Spot: spot, PricePerHour: 1.006,
		},
	}
}

// waitFor polls cond until it holds or timeout passes; it waits on observed state, not time.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for time.Now().Before(deadline) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
		<-tick.C
	}
	t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, last)
}

func fakeInstance(t *testing.T, fake *fakeec2.Server, id string) fakeec2.Instance {
	t.Helper()
	iid := id[strings.LastIndexByte(id, '/')+1:]
	for _, in := range fake.Instances() {
		if in.ID == iid {
			return in
		}
	}
	t.Fatalf("fake has no instance %s", id)
	return fakeec2.Instance{}
}

func TestLaunchOnDemandServes(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	inst, err := e.p.Launch(ctx, spec("chat-1", `test "$GREETING" = "it's a test" && exec ferry replica-sim`, false))
	if err != nil {
		t.Fatal(err)
	}
	fi := fakeInstance(t, e.fake, inst.ID)
	zoneName := e.fake.ZoneNames(testRegion)[testZoneID]
	want := launcher.Instance{
		ID: "aws/" + testRegion + "/" + fi.ID, Name: "chat-1", Infra: InfraName, Region: testRegion, Zone: zoneName,
		Endpoint: fi.PrivateIP + ":8081", IP: fi.PrivateIP, State: launcher.StateRunning, PricePerHour: 1.006,
		Labels: map[string]string{launcher.LabelService: "chat", launcher.LabelVersion: "1", launcher.LabelReplicaID: "chat-1", launcher.LabelOwner: "true"},
	}
	inst.LaunchedAt = time.Time{}
	if d := cmp.Diff(want, inst); d != "" {
		t.Fatalf("instance (-want +got):\n%s", d)
	}
	if fi.Spot || fi.ZoneID != testZoneID || fi.InstanceType != testType {
		t.Fatalf("fake instance = %+v, want on-demand %s in %s", fi, testType, testZoneID)
	}
	if fi.Tags["Name"] != "chat-1" {
		t.Fatalf("Name tag = %q", fi.Tags["Name"])
	}
	if ports := e.fake.SecurityGroupRules(testRegion, DefaultSecurityGroup); !slices.Contains(ports, 8081) {
		t.Fatalf("security group opens %v, want 8081", ports)
	}

	client := &http.Client{Timeout: time.Second}
	waitFor(t, testTimeout, "replica health", func() (bool, string) {
		resp, err := client.Get("http://" + inst.Endpoint + "/health")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})

	got, err := e.p.List(ctx, map[string]string{launcher.LabelService: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != inst.ID || got[0].State != launcher.StateRunning || got[0].Endpoint != inst.Endpoint {
		t.Fatalf("List = %+v, want the running instance", got)
	}
	if other, err := e.p.List(ctx, map[string]string{launcher.LabelService: "other"}); err != nil || len(other) != 0 {
		t.Fatalf("List(other service) = %v, %v; want nothing", other, err)
	}

	if err := e.p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testTimeout, "instance gone from List", func() (bool, string) {
		got, err := e.p.List(ctx, map[string]string{launcher.LabelService: "chat"})
		if err != nil {
			return false, err.Error()
		}
		return len(got) == 0, fmt.Sprint(got)
	})
	waitFor(t, testTimeout, "replica stopped serving", func() (bool, string) {
		resp, err := client.Get("http://" + inst.Endpoint + "/health")
		if err != nil {
			return true, ""
		}
		resp.Body.Close()
		return false, resp.Status
	})
	if err := e.p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("terminating a terminated instance: %v", err)
	}
	if err := e.p.Terminate(ctx, "aws/"+testRegion+"/i-00000000000000000"); err != nil {
		t.Fatalf("terminating an unknown instance: %v", err)
	}
	if err := e.p.Terminate(ctx, "kubernetes/x/pod"); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("terminating a foreign id: %v, want ErrInvalid", err)
	}
}

func TestSpotPreemption(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx, cancel := context.WithCancel(context.Background())
	notices := e.p.Notices(ctx)
	stopWatcher(t, cancel, notices)
	inst, err := e.p.Launch(ctx, spec("chat-2", "exec sleep 300", true))
	if err != nil {
		t.Fatal(err)
	}
	if !inst.Spot || inst.State != launcher.StateRunning {
		t.Fatalf("instance = %+v, want a running spot instance", inst)
	}
	fi := fakeInstance(t, e.fake, inst.ID)
	if !fi.Spot {
		t.Fatal("fake instance is not spot")
	}
	if err := e.fake.Preempt(fi.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testTimeout, "List to show the preemption", func() (bool, string) {
		got, err := e.p.List(ctx, map[string]string{launcher.LabelReplicaID: "chat-2"})
		if err != nil || len(got) != 1 {
			return false, fmt.Sprint(got, err)
		}
		return got[0].State == launcher.StatePreempted && strings.Contains(got[0].Reason, "Spot instance termination"), fmt.Sprintf("%+v", got[0])
	})
	select {
	case n := <-notices:
		if n.InstanceID != inst.ID || n.At.IsZero() {
			t.Fatalf("notice = %+v, want %s", n, inst.ID)
		}
	case <-time.After(testTimeout):
		t.Fatal("no preemption notice")
	}
	// Still listed as preempted once terminated, so the replica manager replaces it.
	waitFor(t, testTimeout, "terminated and still listed", func() (bool, string) {
		got, err := e.p.List(ctx, map[string]string{launcher.LabelReplicaID: "chat-2"})
		if err != nil || len(got) != 1 {
			return false, fmt.Sprint(got, err)
		}
		return got[0].State == launcher.StatePreempted && strings.HasPrefix(got[0].Reason, "terminated"), got[0].Reason
	})
	cancel()
	// The watcher closes the channel once ctx ends; anything still buffered is drained.
	drained := 0
	for range notices {
		drained++
	}
	if drained > 0 {
		t.Fatalf("%d duplicate notices for one preemption", drained)
	}
}

// fakeClock is wall-clock time plus an offset the test moves, so VMs boot in real time while
// EC2's two-minute notice passes at once.
type fakeClock struct{ offset atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// stopWatcher stops a notice watcher at the end of the test, also one that fails half-way, and
// waits for it: its cleanup runs before the environment's (registered earlier, so run later),
// so the watcher never polls a fake that is being torn down.
func stopWatcher(t *testing.T, cancel context.CancelFunc, notices <-chan launcher.Notice) {
	t.Cleanup(func() {
		cancel()
		for range notices {
		}
	})
}

func nextNotice(t *testing.T, notices <-chan launcher.Notice) launcher.Notice {
	t.Helper()
	select {
	case n, ok := <-notices:
		if !ok {
			t.Fatal("notices closed")
		}
		return n
	case <-time.After(testTimeout):
		t.Fatal("no notice")
	}
	return launcher.Notice{}
}

// TestSpotInterruptionWarning: Notices announces a Ferry spot instance at EC2's two-minute
// warning, while it still runs, and not again when it is reclaimed; an instance reclaimed
// without a warning is announced once; another account user's spot instance is not announced.
func TestSpotInterruptionWarning(t *testing.T) {
	for name, status := range map[string]string{
		"no capacity":            fakeec2.StatusNoCapacity,
		"marked for termination": fakeec2.StatusMarkedForTermination,
	} {
		t.Run(name, func(t *testing.T) {
			clock := &fakeClock{}
			e := newEnv(t, fakeec2.Options{Now: clock.now, InterruptionStatus: status}, goodKey)
			ctx, cancel := context.WithCancel(context.Background())
			notices := e.p.Notices(ctx)
			stopWatcher(t, cancel, notices)
			warned, err := e.p.Launch(ctx, spec("chat-w", "exec sleep 300", true))
			if err != nil {
				t.Fatal(err)
			}
			unwarned, err := e.p.Launch(ctx, spec("chat-u", "exec sleep 300", true))
			if err != nil {
				t.Fatal(err)
			}
			raw := ec2.New(ec2.Options{Region: testRegion, BaseEndpoint: awssdk.String(e.fake.URL()),
				Credentials: credentials.NewStaticCredentialsProvider(goodKey, "secret", "")})
			out, err := raw.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
				InstanceMarketOptions: &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot}})
			if err != nil {
				t.Fatal(err)
			}
			foreign := awssdk.ToString(out.Instances[0].InstanceId)
			if err := e.fake.PreemptWithNotice(foreign, fakeec2.InterruptionNotice); err != nil {
				t.Fatal(err)
			}

			markedAt := clock.now()
			if err := e.fake.PreemptWithNotice(fakeInstance(t, e.fake, warned.ID).ID, fakeec2.InterruptionNotice); err != nil {
				t.Fatal(err)
			}
			n := nextNotice(t, notices)
			if n.InstanceID != warned.ID {
				t.Fatalf("first notice names %s, want %s", n.InstanceID, warned.ID)
			}
			if d := n.At.Sub(markedAt.Add(InterruptionNotice)); d < -time.Second || d > time.Second {
				t.Fatalf("notice At %v, want the warning's time %v plus %v", n.At, markedAt, InterruptionNotice)
			}
			if st := fakeInstance(t, e.fake, warned.ID).State; st != "running" {
				t.Fatalf("instance is %s at its notice, want running", st)
			}

			clock.advance(fakeec2.InterruptionNotice + time.Second)
			waitFor(t, testTimeout, "List to show the reclaim", func() (bool, string) {
				got, err := e.p.List(ctx, map[string]string{launcher.LabelReplicaID: "chat-w"})
				if err != nil || len(got) != 1 {
					return false, fmt.Sprint(got, err)
				}
				return got[0].State == launcher.StatePreempted, fmt.Sprintf("%+v", got[0])
			})
			// The poll that announces the unwarned instance sees the warned one shutting down
			// or terminated too: a duplicate would come first or right after.
			if err := e.fake.Preempt(fakeInstance(t, e.fake, unwarned.ID).ID); err != nil {
				t.Fatal(err)
			}
			n = nextNotice(t, notices)
			if n.InstanceID != unwarned.ID || n.At.After(time.Now()) {
				t.Fatalf("notice %+v, want %s reclaimed by now", n, unwarned.ID)
			}
			cancel()
			for n := range notices {
				t.Errorf("extra notice %+v", n)
			}
		})
	}
}

// TestNoticesWithoutSpotRequestPermission: credentials that may not call
// DescribeSpotInstanceRequests lose the two minutes' warning but not the notice: a preemption is
// announced once, when the instance shuts down, and the refusal is logged once per region, not
// at every poll.
func TestNoticesWithoutSpotRequestPermission(t *testing.T) {
	e := newEnv(t, fakeec2.Options{DeniedActions: []string{"DescribeSpotInstanceRequests"}}, goodKey)
	core, logs := observer.New(zap.WarnLevel)
	e.p.log = zap.New(core)
	ctx, cancel := context.WithCancel(context.Background())
	notices := e.p.Notices(ctx)
	stopWatcher(t, cancel, notices)
	inst, err := e.p.Launch(ctx, spec("chat-d", "exec sleep 300", true))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.fake.Preempt(fakeInstance(t, e.fake, inst.ID).ID); err != nil {
		t.Fatal(err)
	}
	if n := nextNotice(t, notices); n.InstanceID != inst.ID {
		t.Fatalf("notice names %s, want %s", n.InstanceID, inst.ID)
	}
	time.Sleep(10 * e.p.opts.NoticeInterval) // more polls: no second notice, no more warnings
	cancel()
	for n := range notices {
		t.Errorf("extra notice %+v", n)
	}
	refusals := logs.FilterMessageSnippet("interruption warnings unavailable").Len()
	if refusals != 2 { // one per region of newProvider
		t.Errorf("%d refusal warnings logged, want 2 (once per region); all: %v", refusals, logs.All())
	}
	if other := logs.Len() - refusals; other != 0 {
		t.Errorf("%d other warnings logged: %v", other, logs.All())
	}
}

func TestTypedErrors(t *testing.T) {
	zone := testZoneID
	tests := map[string]struct {
		fake    fakeec2.Options
		key     string
		inject  string
		setup   func(*fakeec2.Server)
		spot    bool
		want    error
		wantSub string
	}{
		"insufficient capacity injected": {inject: "InsufficientInstanceCapacity", want: launcher.ErrNoCapacity},
		"insufficient capacity":          {setup: func(f *fakeec2.Server) { f.SetCapacity(zone, testType, 0) }, want: launcher.ErrNoCapacity, wantSub: "InsufficientInstanceCapacity"},
		"insufficient capacity generic":  {inject: "InsufficientCapacity", want: launcher.ErrNoCapacity},
		"spot max price too low":         {inject: "SpotMaxPriceTooLow", spot: true, want: launcher.ErrNoCapacity},
		"spot count limit":               {inject: "MaxSpotInstanceCountExceeded", spot: true, want: launcher.ErrQuota},
		"vcpu limit":                     {fake: fakeec2.Options{VCPULimit: 2}, want: launcher.ErrQuota, wantSub: "VcpuLimitExceeded"},
		"instance limit":                 {inject: "InstanceLimitExceeded", want: launcher.ErrQuota},
		"unauthorized operation":         {key: deniedKey, want: launcher.ErrUnauthorized, wantSub: "UnauthorizedOperation"},
		"auth failure":                   {key: badKey, want: launcher.ErrUnauthorized, wantSub: "AuthFailure"},
		"invalid parameter":              {inject: "InvalidParameterValue", want: launcher.ErrInvalid},
		"invalid parameter combination":  {inject: "InvalidParameterCombination", want: launcher.ErrInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			key := tc.key
			if key == "" {
				key = goodKey
			}
			e := newEnv(t, tc.fake, key)
			if tc.inject != "" {
				e.fake.FailZone(zone, tc.inject)
			}
			if tc.setup != nil {
				tc.setup(e.fake)
			}
			start := time.Now()
			_, err := e.p.Launch(context.Background(), spec("chat-err", "exec sleep 300", tc.spot))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Launch error = %v, want %v", err, tc.want)
			}
			sub := tc.wantSub
			if sub == "" {
				sub = tc.inject
			}
			if !strings.Contains(err.Error(), sub) {
				t.Fatalf("error %q does not name %s", err, sub)
			}
			// Capacity errors come with HTTP 500, which the SDK would retry with backoff;
			// the provider must fail over at once instead.
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("Launch took %v, want no SDK retries", d)
			}
			for _, in := range e.fake.Instances() {
				if in.State == "pending" || in.State == "running" {
					t.Fatalf("failed launch left instance %+v", in)
				}
			}
			if launcher.IsRetryable(err) != (tc.want == launcher.ErrNoCapacity || tc.want == launcher.ErrQuota) {
				t.Fatalf("IsRetryable(%v) wrong", err)
			}
		})
	}
}

func TestQuotaCountsLiveInstances(t *testing.T) {
	e := newEnv(t, fakeec2.Options{SpotInstanceLimit: 1, VCPULimit: 4}, goodKey)
	ctx := context.Background()
	first, err := e.p.Launch(ctx, spec("spot-1", "exec sleep 300", true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Launch(ctx, spec("spot-2", "exec sleep 300", true)); !errors.Is(err, launcher.ErrQuota) || !strings.Contains(err.Error(), "MaxSpotInstanceCountExceeded") {
		t.Fatalf("second spot launch: %v, want MaxSpotInstanceCountExceeded as ErrQuota", err)
	}
	od, err := e.p.Launch(ctx, spec("od-1", "exec sleep 300", false)) // g5.xlarge: 4 vCPUs
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Launch(ctx, spec("od-2", "exec sleep 300", false)); !errors.Is(err, launcher.ErrQuota) {
		t.Fatalf("second on-demand launch: %v, want ErrQuota", err)
	}
	for _, id := range []string{first.ID, od.ID} {
		if err := e.p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.p.Launch(ctx, spec("spot-3", "exec sleep 300", true)); err != nil {
		t.Fatalf("spot launch after terminating: %v", err)
	}
}

func TestGang(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	s := spec("train", `echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"; exec sleep 300`, false)
	insts, err := launcher.LaunchGang(ctx, e.p, s, 3)
	if err != nil {
		t.Fatal(err)
	}
	var names, ranks, groups []string
	for _, in := range insts {
		fi := fakeInstance(t, e.fake, in.ID)
		names = append(names, in.Name)
		ranks = append(ranks, in.Labels[launcher.LabelNodeRank])
		groups = append(groups, fi.PlacementGroup)
		if fi.ZoneID != testZoneID || in.State != launcher.StateRunning {
			t.Fatalf("node %+v not running in %s", fi, testZoneID)
		}
		data, err := os.ReadFile(filepath.Join(filepath.Dir(fi.LogPath), fi.ID+".user-data"))
		if err != nil || !strings.Contains(string(data), "export SKYPILOT_NODE_RANK='"+in.Labels[launcher.LabelNodeRank]+"'") {
			t.Fatalf("user-data of %s lacks its rank: %v\n%s", in.Name, err, data)
		}
	}
	if d := cmp.Diff([]string{"train-0", "train-1", "train-2"}, names); d != "" {
		t.Fatalf("names (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"0", "1", "2"}, ranks); d != "" {
		t.Fatalf("ranks (-want +got):\n%s", d)
	}
	if groups[0] == "" || groups[1] != groups[0] || groups[2] != groups[0] {
		t.Fatalf("placement groups = %v, want one shared group", groups)
	}
	if pgs := e.fake.PlacementGroups(testRegion); !slices.Contains(pgs, groups[0]) {
		t.Fatalf("fake placement groups = %v", pgs)
	}

	// All or nothing: the zone has room for 2 more, the gang needs 3.
	e.fake.SetCapacity(testZoneID, "p4d.24xlarge", 2)
	s = spec("big", "exec sleep 300", false)
	s.Placement.InstanceType = "p4d.24xlarge"
	before := len(e.fake.PlacementGroups(testRegion))
	if _, err := launcher.LaunchGang(ctx, e.p, s, 3); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("gang beyond capacity: %v, want ErrNoCapacity", err)
	}
	var launched int
	for _, in := range e.fake.Instances() {
		if in.InstanceType != "p4d.24xlarge" {
			continue
		}
		launched++
		if in.State != "terminated" {
			t.Fatalf("node of a failed gang is %s, want terminated", in.State)
		}
	}
	if launched != 2 {
		t.Fatalf("%d nodes of the failed gang were launched, want 2 (then rolled back)", launched)
	}
	if n := len(e.fake.PlacementGroups(testRegion)); n != before {
		t.Fatalf("placement groups: %d after a failed gang, want %d (deleted)", n, before)
	}
}

func TestZoneResolution(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	names, err := e.p.ZoneNames(ctx, testRegion)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(e.fake.ZoneNames(testRegion), names); d != "" {
		t.Fatalf("zone names (-want +got):\n%s", d)
	}
	// The fake's names deliberately do not follow ID order.
	if names["use1-az1"] == testRegion+"a" {
		t.Fatal("fake zone names follow ID order; the test would not catch a mix-up")
	}
	for _, zone := range []string{"use1-az2", names["use1-az6"]} {
		s := spec("z", "exec sleep 300", false)
		s.Placement.Zone = zone
		inst, err := e.p.Launch(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		fi := fakeInstance(t, e.fake, inst.ID)
		if fi.ZoneID != zone && fi.ZoneName != zone {
			t.Fatalf("placement zone %s launched in %s (%s)", zone, fi.ZoneID, fi.ZoneName)
		}
		if inst.Zone != fi.ZoneName {
			t.Fatalf("instance zone %q, want the zone name %q", inst.Zone, fi.ZoneName)
		}
	}
	s := spec("z", "exec sleep 300", false)
	s.Placement.Zone = "use1-az99"
	if _, err := e.p.Launch(ctx, s); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("unknown zone: %v, want ErrInvalid", err)
	}
	s.Placement.Zone, s.Placement.Region = "", "eu-west-1"
	if _, err := e.p.Launch(ctx, s); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("region not enabled: %v, want ErrInvalid", err)
	}
	// Another region lists too.
	s.Placement.Region, s.Placement.Zone = "us-west-2", "usw2-az1"
	inst, err := e.p.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inst.ID, "aws/us-west-2/i-") || inst.Region != "us-west-2" {
		t.Fatalf("instance %+v, want one in us-west-2", inst)
	}
	all, err := e.p.List(ctx, nil)
	if err != nil || len(all) != 3 {
		t.Fatalf("List = %v, %v; want 3 instances across regions", all, err)
	}
}

func TestCredentials(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	if err := e.p.Check(context.Background()); err != nil {
		t.Fatalf("Check with good credentials: %v", err)
	}
	bad := newProvider(t, e.fake, badKey)
	if err := bad.Check(context.Background()); !errors.Is(err, launcher.ErrUnauthorized) {
		t.Fatalf("Check with bad credentials: %v, want ErrUnauthorized", err)
	}
	if _, err := bad.List(context.Background(), nil); !errors.Is(err, launcher.ErrUnauthorized) {
		t.Fatalf("List with bad credentials: %v, want ErrUnauthorized", err)
	}
}

func TestSpotPrices(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	want := map[string]float64{}
	for _, r := range catalog.Default().Rows() {
		if r.Cloud == catalog.AWS && r.Region == testRegion && r.InstanceType == testType && r.SpotPerHour > 0 {
			want[r.Zone] = r.SpotPerHour
		}
	}
	if len(want) == 0 {
		t.Fatal("catalog has no spot prices for the test type")
	}
	got, err := e.p.SpotPrices(context.Background(), testRegion, []string{testType})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]map[string]float64{testType: want}, got); d != "" {
		t.Fatalf("spot prices (-want +got):\n%s", d)
	}
	e.fake.SetSpotPrice(testZoneID, testType, 0.123)
	got, err = e.p.SpotPrices(context.Background(), testRegion, []string{testType})
	if err != nil || got[testType][testZoneID] != 0.123 {
		t.Fatalf("after a price change: %v, %v", got[testType], err)
	}
}

func TestSpotPlacementScores(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	e.fake.SetCapacity(testZoneID, testType, 0)
	for id := range e.fake.ZoneNames(testRegion) {
		e.fake.FailZone(id, "InsufficientInstanceCapacity")
	}
	got, err := e.p.SpotPlacementScores(context.Background(), []string{testType}, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]int{testRegion: 1, "us-west-2": 10}, got); d != "" {
		t.Fatalf("scores (-want +got):\n%s", d)
	}
}

func TestSecurityGroupIsReused(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	if _, err := e.p.Launch(ctx, spec("a", "exec sleep 300", false)); err != nil {
		t.Fatal(err)
	}
	// A restarted controller finds the group and the rule and does not fail on duplicates.
	again := newProvider(t, e.fake, goodKey)
	if _, err := again.Launch(ctx, spec("b", "exec sleep 300", false)); err != nil {
		t.Fatal(err)
	}
	if ports := e.fake.SecurityGroupRules(testRegion, DefaultSecurityGroup); !slices.Equal(ports, []int{8081}) {
		t.Fatalf("rules = %v, want one rule for 8081", ports)
	}
}

func TestUserData(t *testing.T) {
	s := spec("x", "echo hi", false)
	s.Envs["BAD-NAME"] = "v"
	if _, err := userData(context.Background(), s, 80, vmnode.BootOptions{}); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("bad env name: %v, want ErrInvalid", err)
	}
	s = spec("x", strings.Repeat("#", 17*1024), false)
	if _, err := userData(context.Background(), s, 80, vmnode.BootOptions{}); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("oversized user-data: %v, want ErrInvalid", err)
	}
}

// TestDefaultImage: with no AMI configured and no image_id, a GPU instance boots AWS's newest
// Deep Learning Base AMI and a CPU one Canonical's newest Ubuntu, found with DescribeImages.
func TestDefaultImage(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	p, err := New(context.Background(), Options{
		Regions:       []string{testRegion},
		Endpoint:      e.fake.URL(),
		Credentials:   credentials.NewStaticCredentialsProvider(goodKey, "secret", ""),
		LaunchTimeout: testTimeout,
		PollInterval:  10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gpu := spec("gpu-1", "exec sleep 30", false)
	gpu.Placement.Accelerator, gpu.Placement.AcceleratorCount = "A10G", 1
	cpu := spec("cpu-1", "exec sleep 30", false)
	for _, s := range []launcher.Spec{gpu, cpu} {
		inst, err := p.Launch(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Terminate(context.Background(), inst.ID) })
	}
	images := map[string]string{}
	for _, in := range e.fake.Instances() {
		images[in.Tags["Name"]] = in.ImageID
	}
	if images["gpu-1"] != "ami-0d1a0000000000002" || images["cpu-1"] != "ami-0c0a0000000000002" {
		t.Fatalf("images %v: want the newest Deep Learning Base AMI for the GPU instance and the newest Ubuntu for the CPU one", images)
	}
}

// TestInstancesRequireIMDSv2: every instance, on-demand, spot and gang node, is launched with
// IMDSv2 required and a hop limit of 1, so its user-data (which carries the task's secrets)
// cannot be read with IMDSv1's plain GETs (SSRF) nor from a container one hop away, whatever
// the account's defaults (here IMDSv1 allowed and a hop limit of 2).
func TestInstancesRequireIMDSv2(t *testing.T) {
	e := newEnv(t, fakeec2.Options{MetadataDefaults: fakeec2.MetadataOptions{HTTPTokens: "optional", HopLimit: 2}}, goodKey)
	ctx := context.Background()
	onDemand, err := e.p.Launch(ctx, spec("imds-od", "exec sleep 300", false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Launch(ctx, spec("imds-spot", "exec sleep 300", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.LaunchGang(ctx, spec("imds-gang", "exec sleep 300", false), 2); err != nil {
		t.Fatal(err)
	}
	// A replica's tags stay out of the metadata service; a job's node reads its gang's
	// addresses there (TestJobGang).
	want := fakeec2.MetadataOptions{HTTPTokens: "required", HopLimit: 1, HTTPEndpoint: "enabled", InstanceMetadataTags: "disabled"}
	insts := e.fake.Instances()
	if len(insts) != 4 {
		t.Fatalf("%d instances, want 4", len(insts))
	}
	for _, in := range insts {
		if in.Metadata != want {
			t.Errorf("%s: metadata options %+v, want %+v", in.Tags["Name"], in.Metadata, want)
		}
	}
	// As EC2 reports them to anyone who describes the instance.
	c := ec2.New(ec2.Options{Region: testRegion, BaseEndpoint: awssdk.String(e.fake.URL()),
		Credentials: credentials.NewStaticCredentialsProvider(goodKey, "secret", "")})
	out, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{fakeInstance(t, e.fake, onDemand.ID).ID}})
	if err != nil {
		t.Fatal(err)
	}
	if mo := out.Reservations[0].Instances[0].MetadataOptions; mo == nil || mo.HttpTokens != types.HttpTokensStateRequired || awssdk.ToInt32(mo.HttpPutResponseHopLimit) != 1 {
		t.Fatalf("described metadata options %+v, want required tokens and hop limit 1", mo)
	}
}
