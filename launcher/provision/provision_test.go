package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// scripted is a provider whose launches fail with the errors queued for it, then succeed.
type scripted struct {
	infra string
	mu    sync.Mutex
	fail  []error
	tries []launcher.Placement
	insts []launcher.Instance
	term  []string
	lsErr error
	// lsHang, when set, makes List wait for it to close or for its ctx to end.
	lsHang chan struct{}
	// termErr fails Terminate.
	termErr error
	// hold, when set, makes Launch wait for it to close (launches under way at once).
	hold chan struct{}
}

func (s *scripted) Launch(_ context.Context, spec launcher.Spec) (launcher.Instance, error) {
	if s.hold != nil {
		<-s.hold
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tries = append(s.tries, spec.Placement)
	if len(s.fail) > 0 {
		err := s.fail[0]
		s.fail = s.fail[1:]
		if err != nil {
			return launcher.Instance{}, err
		}
	}
	sep := "/"
	if s.infra == configs.InfraLocal {
		sep = "-"
	}
	inst := launcher.Instance{ID: fmt.Sprintf("%s%s%s", s.infra, sep, spec.Name), Name: spec.Name, Labels: spec.Labels, State: launcher.StateRunning, Zone: spec.Placement.Zone}
	s.insts = append(s.insts, inst)
	return inst, nil
}

func (s *scripted) Terminate(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.termErr != nil {
		return s.termErr
	}
	s.term = append(s.term, id)
	return nil
}

func (s *scripted) List(ctx context.Context, sel map[string]string) ([]launcher.Instance, error) {
	s.mu.Lock()
	hang := s.lsHang
	s.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lsErr != nil {
		return nil, s.lsErr
	}
	var out []launcher.Instance
	for _, in := range s.insts {
		if launcher.Matches(in.Labels, sel) {
			out = append(out, in)
		}
	}
	return out, nil
}

var (
	k8sA100 = launcher.Placement{Infra: "kubernetes/test", Accelerator: "A100", AcceleratorCount: 1}
	awsZ1   = launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1", InstanceType: "p4d.24xlarge", Accelerator: "A100", AcceleratorCount: 8, PricePerHour: 32.77}
	gcpZ1   = launcher.Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a", InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1, PricePerHour: 3.67}
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTest(t *testing.T, places []launcher.Placement) (*Provisioner, map[string]*scripted, *clock) {
	t.Helper()
	clk := &clock{t: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)}
	provs := map[string]*scripted{}
	var infras []Infra
	for _, name := range []string{"kubernetes/test", "aws", "gcp", configs.InfraLocal} {
		provs[name] = &scripted{infra: name}
		infras = append(infras, Infra{Name: name, Provider: provs[name]})
	}
	p, err := New(Options{
		Infras:   infras,
		Planner:  PlannerFunc(func(context.Context, configs.Resources) ([]launcher.Placement, error) { return places, nil }),
		BlockFor: time.Minute,
		Now:      clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, provs, clk
}

func spec(name string) launcher.Spec {
	return launcher.Spec{Name: name, Labels: map[string]string{launcher.LabelService: "svc"}, Run: "x"}
}

func TestLaunchFailsOverAndBlocks(t *testing.T) {
	ctx := context.Background()
	p, provs, clk := newTest(t, []launcher.Placement{k8sA100, gcpZ1, awsZ1})
	provs["kubernetes/test"].fail = []error{fmt.Errorf("%w: pod unschedulable", launcher.ErrNoCapacity)}

	inst, err := p.Launch(ctx, spec("svc-1"))
	if err != nil {
		t.Fatal(err)
	}
	if inst.Infra != "gcp" || inst.Zone != "us-central1-a" || inst.PricePerHour != 3.67 {
		t.Fatalf("launched %+v, want the gcp placement filled in", inst)
	}

	// The cluster is blocked: the next launch starts with gcp, and the plan says why.
	choices, err := p.Plan(ctx, configs.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if got := choices[len(choices)-1]; got.Infra != "kubernetes/test" || !strings.Contains(got.BlockedBecause, "unschedulable") {
		t.Fatalf("last choice %+v, want the blocked cluster with its reason", got)
	}
	if _, err := p.Launch(ctx, spec("svc-2")); err != nil {
		t.Fatal(err)
	}
	if n := len(provs["kubernetes/test"].tries); n != 1 {
		t.Fatalf("cluster tried %d times while blocked, want 1", n)
	}

	// Once the block ends, the cluster is first again.
	clk.t = clk.t.Add(time.Minute + time.Second)
	inst, err = p.Launch(ctx, spec("svc-3"))
	if err != nil {
		t.Fatal(err)
	}
	if inst.Infra != "kubernetes/test" {
		t.Fatalf("after the block: launched on %s, want the cluster", inst.Infra)
	}
}

func TestLaunchQuotaAndOtherErrorsFailOver(t *testing.T) {
	ctx := context.Background()
	p, provs, _ := newTest(t, []launcher.Placement{awsZ1, gcpZ1})
	provs["aws"].fail = []error{fmt.Errorf("%w: VcpuLimitExceeded", launcher.ErrQuota)}
	inst, err := p.Launch(ctx, spec("svc-1"))
	if err != nil || inst.Infra != "gcp" {
		t.Fatalf("got %+v, %v; want gcp after the aws quota error", inst, err)
	}
	if got := provs["gcp"].tries[0]; got != gcpZ1 {
		t.Fatalf("gcp got placement %+v, want %+v", got, gcpZ1)
	}
}

func TestLaunchInvalidAtOneInfraFailsOver(t *testing.T) {
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100, gcpZ1})
	provs["kubernetes/test"].fail = []error{fmt.Errorf("%w: image_id ami-123: Kubernetes runs container images", launcher.ErrInvalid)}
	inst, err := p.Launch(context.Background(), spec("svc-1"))
	if err != nil || inst.Infra != "gcp" {
		t.Fatalf("got %+v, %v; want gcp after the cluster found the request invalid", inst, err)
	}
	// Invalid everywhere: the error says so (ErrInvalid), so the caller does not treat it as
	// a passing shortage.
	provs["kubernetes/test"].fail = []error{fmt.Errorf("%w: no", launcher.ErrInvalid)}
	provs["gcp"].fail = []error{fmt.Errorf("%w: no either", launcher.ErrInvalid)}
	if _, err := p.Launch(context.Background(), spec("svc-2")); !errors.Is(err, launcher.ErrInvalid) || errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("invalid everywhere: %v, want ErrInvalid", err)
	}
}

func TestUnauthorizedBlocksTheWholeInfra(t *testing.T) {
	awsZ2 := awsZ1
	awsZ2.Zone = "use1-az2"
	p, provs, _ := newTest(t, []launcher.Placement{awsZ1, awsZ2, gcpZ1})
	provs["aws"].fail = []error{fmt.Errorf("%w: AuthFailure", launcher.ErrUnauthorized)}
	for i := range 2 {
		inst, err := p.Launch(context.Background(), spec(fmt.Sprintf("svc-%d", i)))
		if err != nil || inst.Infra != "gcp" {
			t.Fatalf("launch %d: %+v, %v; want gcp", i, inst, err)
		}
	}
	if n := len(provs["aws"].tries); n != 1 {
		t.Fatalf("aws tried %d times with bad credentials, want once", n)
	}
}

func TestLaunchEveryLocationFails(t *testing.T) {
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100, gcpZ1})
	provs["kubernetes/test"].fail = []error{fmt.Errorf("%w: 0/2 nodes are available", launcher.ErrNoCapacity), fmt.Errorf("%w: again", launcher.ErrNoCapacity)}
	provs["gcp"].fail = []error{fmt.Errorf("%w: ZONE_RESOURCE_POOL_EXHAUSTED", launcher.ErrNoCapacity), nil}
	_, err := p.Launch(context.Background(), spec("svc-1"))
	if !errors.Is(err, launcher.ErrNoCapacity) || !errors.Is(err, launcher.ErrCapacityRefused) {
		t.Fatalf("err = %v, want ErrNoCapacity marked ErrCapacityRefused (every location refused for capacity)", err)
	}
	for _, want := range []string{"kubernetes/test", "0/2 nodes", "gcp us-central1-a a2-highgpu-1g", "ZONE_RESOURCE_POOL_EXHAUSTED"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// With everything blocked the next launch still tries, in the planner's order.
	inst, err := p.Launch(context.Background(), spec("svc-2"))
	if err != nil || inst.Infra != "gcp" {
		t.Fatalf("got %+v, %v; want gcp on the second attempt", inst, err)
	}
}

// A launch that some location failed for another reason than capacity (its infra unavailable)
// is not marked as refused everywhere: what those places hold is not known.
func TestLaunchFailedNotOnlyForCapacity(t *testing.T) {
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100, gcpZ1})
	provs["kubernetes/test"].fail = []error{fmt.Errorf("%w: 0/2 nodes are available", launcher.ErrNoCapacity)}
	provs["gcp"].fail = []error{fmt.Errorf("%w: 503 from compute.googleapis.com", launcher.ErrUnavailable)}
	_, err := p.Launch(context.Background(), spec("svc-1"))
	if !errors.Is(err, launcher.ErrNoCapacity) || errors.Is(err, launcher.ErrCapacityRefused) {
		t.Fatalf("err = %v: want ErrNoCapacity, not marked ErrCapacityRefused", err)
	}
}

func TestNoEnabledInfra(t *testing.T) {
	p, _, _ := newTest(t, []launcher.Placement{{Infra: "kubernetes/other"}})
	_, err := p.Launch(context.Background(), spec("svc-1"))
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "no enabled infra") {
		t.Fatalf("err = %v", err)
	}
}

func TestTerminateAndListRoute(t *testing.T) {
	ctx := context.Background()
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100})
	inst, err := p.Launch(ctx, spec("svc-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{inst.ID}, provs["kubernetes/test"].term); diff != "" {
		t.Fatalf("terminations (-want +got):\n%s", diff)
	}
	if err := p.Terminate(ctx, "azure/x"); !errors.Is(err, launcher.ErrNotFound) {
		t.Fatalf("unknown infra: err = %v", err)
	}
	provs[configs.InfraLocal].insts = []launcher.Instance{{ID: "local-svc-9-abcdef", Labels: map[string]string{launcher.LabelService: "svc"}}}
	if err := p.Terminate(ctx, "local-svc-9-abcdef"); err != nil || len(provs[configs.InfraLocal].term) != 1 {
		t.Fatalf("local id not routed to local: %v", err)
	}
	got, err := p.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if err != nil || len(got) != 2 {
		t.Fatalf("List = %v, %v; want the pod and the local process", got, err)
	}
	provs["aws"].lsErr = errors.New("RequestLimitExceeded")
	got, err = p.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if gaps, partial := launcher.Partial(err); !partial || len(gaps) != 1 || gaps[0].Infra != "aws" || len(got) != 2 {
		t.Fatalf("List with aws failing = %v, %v; want the pod and the local process, and aws as a gap", got, err)
	}
	// A service that may only run in the cluster does not wait on aws.
	scoped := p.Scope(configs.Resources{Infra: "kubernetes"})
	if got, err := scoped.List(ctx, nil); err != nil || len(got) != 1 {
		t.Fatalf("scoped List = %v, %v", got, err)
	}
}

func TestInfraMatches(t *testing.T) {
	for _, tc := range []struct {
		filter, name string
		want         bool
	}{
		{"", "aws", true},
		{"", configs.InfraLocal, true},
		{"*", "kubernetes/test", true},
		{"*", configs.InfraLocal, false},
		{configs.InfraLocal, configs.InfraLocal, true},
		{configs.InfraLocal, "aws", false},
		{"kubernetes", "kubernetes/test", true},
		{"kubernetes", "aws", false},
		{"kubernetes/test", "kubernetes/test", true},
		{"kubernetes/test", "kubernetes/prod", false},
		{"aws/us-east-1", "aws", true},
		{"aws/us-east-1/us-east-1a", "aws", true},
		{"aws", "gcp", false},
	} {
		if got := InfraMatches(tc.filter, tc.name); got != tc.want {
			t.Errorf("InfraMatches(%q, %q) = %v, want %v", tc.filter, tc.name, got, tc.want)
		}
	}
}

func TestRank(t *testing.T) {
	p, _, _ := newTest(t, []launcher.Placement{k8sA100, gcpZ1, awsZ1, {Infra: "gcp", Zone: "us-central1-b"}})
	got, err := p.Rank(context.Background(), configs.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{"kubernetes/test": 0, "gcp": 1, "aws": 2}, got); diff != "" {
		t.Fatalf("rank (-want +got):\n%s", diff)
	}
}

func TestLaunchGangStaysInOneLocation(t *testing.T) {
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100, gcpZ1})
	// The cluster fits two of three nodes: the gang is rolled back there and lands whole on gcp.
	provs["kubernetes/test"].fail = []error{nil, nil, fmt.Errorf("%w: 0/2 nodes are available", launcher.ErrNoCapacity)}
	insts, err := launcher.LaunchGang(context.Background(), p, spec("job-1"), 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.Infra != "gcp" {
			t.Errorf("node %s on %s, want every node on gcp", in.Name, in.Infra)
		}
	}
	if got := len(provs["kubernetes/test"].term); got != 2 {
		t.Errorf("cluster terminated %d nodes of the partial gang, want 2", got)
	}
}

func TestSpreadAndPreemptedZones(t *testing.T) {
	ctx := context.Background()
	z := func(zone string, price float64, spot bool) launcher.Placement {
		return launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: zone, InstanceType: "g5.xlarge", Spot: spot, PricePerHour: price}
	}
	p, provs, _ := newTest(t, []launcher.Placement{z("use1-az1", 0.4, true), z("use1-az2", 0.5, true), z("use1-az4", 0.6, true)})
	seq := 0
	launch := func(spread map[string]string) launcher.Instance {
		t.Helper()
		seq++
		s := spec(fmt.Sprintf("svc-%d", seq))
		s.Spread = spread
		inst, err := p.Launch(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		return inst
	}
	// SpotHedge: the cheapest zone that holds none of the service's spot replicas.
	first := launch(map[string]string{})
	if first.Zone != "use1-az1" {
		t.Fatalf("first spot replica in %s, want the cheapest zone", first.Zone)
	}
	// The caller's view may not show the first yet: the provisioner remembers it.
	if got := launch(map[string]string{}); got.Zone != "use1-az2" {
		t.Fatalf("second spot replica in %s, want the cheapest empty zone", got.Zone)
	}
	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	// A preemption in az2 makes the next spot replica skip it; az1 is free again.
	p.Preempted(launcher.Instance{Infra: "aws", Region: "us-east-1", Zone: "use1-az2"})
	if got := launch(map[string]string{}); got.Zone != "use1-az1" {
		t.Fatalf("after the preemption and az1's termination: %s, want use1-az1", got.Zone)
	}
	// The caller's view counts too: with az1 held (by an instance the provisioner did not
	// launch), az2 preempted, az4 is next.
	if got := launch(map[string]string{"i-adopted": "aws/use1-az1"}); got.Zone != "use1-az4" {
		t.Fatalf("with az1 held and az2 preempted: %s, want use1-az4", got.Zone)
	}
	// Without Spread the planner's order (price) holds.
	if got := launch(nil); got.Zone != "use1-az1" {
		t.Fatalf("without spreading: %s, want the cheapest", got.Zone)
	}
	if n := len(provs["aws"].tries); n != 5 {
		t.Fatalf("%d launch attempts, want 5 (no failures)", n)
	}
}

func TestPreemptedZoneStillTakesOnDemand(t *testing.T) {
	onDemand := launcher.Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a", InstanceType: "g2-standard-4", PricePerHour: 0.7}
	other := launcher.Placement{Infra: "gcp", Region: "us-east4", Zone: "us-east4-a", InstanceType: "g2-standard-4", PricePerHour: 0.71}
	p, _, _ := newTest(t, []launcher.Placement{onDemand, other})
	p.Preempted(launcher.Instance{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a"})
	inst, err := p.Launch(context.Background(), spec("svc"))
	if err != nil || inst.Zone != "us-central1-a" {
		t.Fatalf("got %+v, %v; a spot preemption must not block on-demand capacity", inst, err)
	}
}

func TestConcurrentSpreadLaunchesTakeDifferentZones(t *testing.T) {
	z := func(zone string, price float64) launcher.Placement {
		return launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: zone, InstanceType: "g5.xlarge", Spot: true, PricePerHour: price}
	}
	p, provs, _ := newTest(t, []launcher.Placement{z("use1-az1", 0.4), z("use1-az2", 0.5), z("use1-az4", 0.6)})
	provs["aws"].hold = make(chan struct{})
	zones := make(chan string, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := spec(fmt.Sprintf("svc-%d", i))
			s.Spread = map[string]string{} // none live yet: every launch of this pass starts at once
			inst, err := p.Launch(context.Background(), s)
			if err != nil {
				t.Error(err)
			}
			zones <- inst.Zone
		}()
	}
	// All three are under way before any finishes.
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.spread.mu.Lock()
		n := 0
		for _, v := range p.spread.inflight {
			n += v
		}
		p.spread.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d launches under way, want 3", n)
		}
		time.Sleep(time.Millisecond)
	}
	close(provs["aws"].hold)
	wg.Wait()
	close(zones)
	seen := map[string]bool{}
	for zone := range zones {
		seen[zone] = true
	}
	if len(seen) != 3 {
		t.Fatalf("concurrent spot launches landed in %v, want 3 different zones", seen)
	}
	if len(p.spread.inflight) != 0 || len(p.spread.placed) != 3 {
		t.Fatalf("in flight %v, placed %v; want none in flight and 3 placed", p.spread.inflight, p.spread.placed)
	}
}

func TestSpreadKeepsTheClusterFirst(t *testing.T) {
	z := func(zone string, price float64) launcher.Placement {
		return launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: zone, InstanceType: "g5.xlarge", Spot: true, PricePerHour: price}
	}
	p, _, _ := newTest(t, []launcher.Placement{k8sA100, z("use1-az1", 0.4), z("use1-az2", 0.5)})
	s := spec("svc-2")
	// The service already has a spot-kind replica in the cluster: still the cluster first.
	s.Spread = map[string]string{"kubernetes/test/ns/svc-1": "kubernetes/test"}
	inst, err := p.Launch(context.Background(), s)
	if err != nil || inst.Infra != "kubernetes/test" {
		t.Fatalf("got %+v, %v; want the cluster, which spreading does not reorder", inst, err)
	}
}

func TestSpreadMoveLeavesTheCrowdedZone(t *testing.T) {
	z := func(zone string, price float64) launcher.Placement {
		return launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: zone, InstanceType: "g5.xlarge", Spot: true, PricePerHour: price}
	}
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100, z("use1-az1", 0.4), z("use1-az2", 0.5), z("use1-az4", 0.6)})
	move := func(view map[string]string) (launcher.Instance, error) {
		s := spec("svc-move")
		s.Spread, s.SpreadFrom = view, "aws/use1-az1"
		return p.Launch(context.Background(), s)
	}
	// Three in az1, one in az2: az4 holds fewest. The cluster, first for any other launch,
	// has no zone to spread to and is not tried.
	view := map[string]string{"i-1": "aws/use1-az1", "i-2": "aws/use1-az1", "i-3": "aws/use1-az1", "i-4": "aws/use1-az2"}
	inst, err := move(view)
	if err != nil || inst.Zone != "use1-az4" {
		t.Fatalf("move = %+v, %v; want use1-az4", inst, err)
	}
	if n := len(provs["kubernetes/test"].tries); n != 0 {
		t.Fatalf("the cluster was tried %d times for a move, want 0", n)
	}
	// az4 preempted: az2, holding two fewer than az1, is the one left.
	p.Preempted(launcher.Instance{Infra: "aws", Region: "us-east-1", Zone: "use1-az4"})
	if inst, err := move(view); err != nil || inst.Zone != "use1-az2" {
		t.Fatalf("move with az4 blocked = %+v, %v; want use1-az2", inst, err)
	}
	// Now az2 holds two (the view and the move just placed): no zone holds two fewer than
	// az1's three but the blocked az4, and the move fails without a launch.
	tries := len(provs["aws"].tries)
	if _, err := move(view); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("move with no zone to take it: %v, want ErrNoCapacity", err)
	}
	if n := len(provs["aws"].tries); n != tries {
		t.Fatalf("%d launch attempts for a move with no zone, want none", n-tries)
	}
}

// TestSpreadMoveFailsRatherThanFallBack: a move whose target zones fail (a capacity error in
// the first, the account throttled in the next) fails; it never fails over to the crowded zone
// or the cluster, where an ordinary launch would go next.
func TestSpreadMoveFailsRatherThanFallBack(t *testing.T) {
	z := func(zone string, price float64) launcher.Placement {
		return launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: zone, InstanceType: "g5.xlarge", Spot: true, PricePerHour: price}
	}
	p, provs, _ := newTest(t, []launcher.Placement{k8sA100, z("use1-az1", 0.4), z("use1-az2", 0.5), z("use1-az4", 0.6)})
	provs["aws"].fail = []error{fmt.Errorf("%w: InsufficientInstanceCapacity", launcher.ErrNoCapacity),
		fmt.Errorf("%w: RequestLimitExceeded", launcher.ErrThrottled)}
	s := spec("svc-move")
	s.Spread = map[string]string{"i-1": "aws/use1-az1", "i-2": "aws/use1-az1", "i-3": "aws/use1-az1"}
	s.SpreadFrom = "aws/use1-az1"
	if inst, err := p.Launch(context.Background(), s); err == nil {
		t.Fatalf("move landed in %s/%s; want it to fail with both of its zones failing", inst.Infra, inst.Zone)
	}
	for _, pl := range provs["aws"].tries {
		if pl.Zone == "use1-az1" {
			t.Errorf("the move was tried in the crowded zone %s", pl.Zone)
		}
	}
	if n := len(provs["kubernetes/test"].tries); n != 0 {
		t.Errorf("the cluster was tried %d times for a move, want 0", n)
	}
	if n := len(provs["aws"].tries); n != 2 {
		t.Errorf("%d launch attempts, want 2 (az4, then az2)", n)
	}
}
