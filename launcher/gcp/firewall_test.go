package gcp

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

// rules is what a test checks of a firewall rule.
type rules struct {
	Description       string
	Priority          int32
	Allowed, Denied   string
	SourceRanges, Tag []string
	TargetTags        []string
}

func ruleOf(t *testing.T, fake *fakecompute.Server, name string) *rules {
	t.Helper()
	fw, ok := fake.Firewall(name)
	if !ok {
		return nil
	}
	ports := func(proto string, ps []string) string { return proto + ":" + strings.Join(ps, ",") }
	r := &rules{Description: fw.GetDescription(), Priority: fw.GetPriority(), SourceRanges: fw.GetSourceRanges(), Tag: fw.GetSourceTags(), TargetTags: fw.GetTargetTags()}
	for _, a := range fw.GetAllowed() {
		r.Allowed = ports(a.GetIPProtocol(), a.GetPorts())
	}
	for _, d := range fw.GetDenied() {
		r.Denied = ports(d.GetIPProtocol(), d.GetPorts())
	}
	return r
}

func routeSource(t *testing.T, endpoint string) string {
	t.Helper()
	host, _, _ := strings.Cut(endpoint, ":")
	src, err := launcher.RouteSource(host)
	if err != nil {
		t.Fatal(err)
	}
	return src.String()
}

var denyRule = &rules{Description: descDeny, Priority: denyPriority, Denied: "tcp:18080", SourceRanges: []string{"0.0.0.0/0"}, TargetTags: []string{"ferry-port-18080"}}

// TestFirewallAdmitsOnlyTheController: with no proxy source configured, the allow rule admits
// the controller's own address (not the private ranges), and a deny rule of the next
// priority closes the port to everyone else (the default network's default-allow-internal
// would admit the whole network).
func TestFirewallAdmitsOnlyTheController(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	inst, err := e.prov.Launch(ctx, spec("fw-1", launcher.Placement{InstanceType: "n1-standard-4"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.prov.Launch(ctx, spec("fw-2", launcher.Placement{InstanceType: "n1-standard-4", Spot: true})); err != nil {
		t.Fatal(err)
	}
	want := &rules{Description: descController, Priority: allowPriority, Allowed: "tcp:18080",
		SourceRanges: []string{routeSource(t, inst.Endpoint)}, TargetTags: []string{"ferry-port-18080"}}
	if d := cmp.Diff(want, ruleOf(t, e.fake, "ferry-allow-18080")); d != "" {
		t.Errorf("allow rule (-want +got):\n%s", d)
	}
	if d := cmp.Diff(denyRule, ruleOf(t, e.fake, "ferry-deny-18080")); d != "" {
		t.Errorf("deny rule (-want +got):\n%s", d)
	}
}

// TestFirewallFromConfiguredSources: configured ranges and tags are exactly what the port
// admits, set before the first VM is inserted; a rule a controller without them had made is
// replaced.
func TestFirewallFromConfiguredSources(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	if _, err := e.prov.Launch(ctx, spec("cfg-1", launcher.Placement{InstanceType: "n1-standard-4"})); err != nil {
		t.Fatal(err)
	}
	p, err := New(ctx, Options{Project: project, Endpoint: e.url, Zones: testZones, IngressCIDRs: []string{"10.20.0.7/24"}, IngressTags: []string{"ferry-proxy"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.fake.InjectFault("us-central1-a", fakecompute.Fault{Code: fakecompute.CodeZoneResourcePoolExhausted, HTTP: true, Times: 1})
	if _, err := p.Launch(ctx, spec("cfg-2", launcher.Placement{InstanceType: "n1-standard-4"})); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("launch into a full zone: %v, want ErrNoCapacity", err)
	}
	want := &rules{Description: descConfigured, Priority: allowPriority, Allowed: "tcp:18080",
		SourceRanges: []string{"10.20.0.0/24"}, Tag: []string{"ferry-proxy"}, TargetTags: []string{"ferry-port-18080"}}
	if d := cmp.Diff(want, ruleOf(t, e.fake, "ferry-allow-18080")); d != "" {
		t.Errorf("allow rule (-want +got):\n%s", d)
	}
	for name, opts := range map[string]Options{"cidr": {IngressCIDRs: []string{"10.0.0.0/33"}}, "tag": {IngressTags: []string{"Proxy"}}} {
		opts.Project, opts.Endpoint = project, e.url
		if _, err := New(ctx, opts); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
}

// oldRule is the allow rule Ferry made before it narrowed ingress.
func oldRule(ranges ...string) *computepb.Firewall {
	return &computepb.Firewall{
		Name: proto.String("ferry-allow-18080"), Description: proto.String(descLegacy), Network: proto.String("global/networks/default"),
		Direction: proto.String("INGRESS"), Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{"18080"}}},
		SourceRanges: ranges, TargetTags: []string{"ferry-port-18080"},
	}
}

// insertOldRule and insertOldVM make a firewall rule or a VM as an earlier controller left
// it, without Launch.
func (e *env) insertOldRule(t *testing.T, fw *computepb.Firewall) {
	t.Helper()
	ctx := testCtx(t)
	op, err := e.prov.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: project, FirewallResource: fw})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.prov.waitGlobalOp(ctx, op.Proto()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) insertOldVM(t *testing.T, s launcher.Spec) {
	t.Helper()
	ctx := testCtx(t)
	vm, err := e.prov.instanceFor(context.Background(), s, "us-central1-a")
	if err != nil {
		t.Fatal(err)
	}
	op, err := e.prov.instances.Insert(ctx, &computepb.InsertInstanceRequest{Project: project, Zone: "us-central1-a", InstanceResource: vm})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.prov.waitZoneOp(ctx, "us-central1-a", op.Proto()); err != nil {
		t.Fatal(err)
	}
}

// TestFirewallNarrowsTheOldRule: a controller upgraded from one whose rule admitted every
// private range replaces it with its own address and closes the port to the rest when it
// adopts the old VMs, before any launch.
func TestFirewallNarrowsTheOldRule(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	e.insertOldRule(t, oldRule("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
	e.insertOldVM(t, spec("old-1", launcher.Placement{InstanceType: "n1-standard-4"}))
	ctx := testCtx(t)
	var adopted []launcher.Instance
	waitFor(t, "the old VM is adopted running", func() bool {
		var err error
		adopted, err = e.prov.List(ctx, map[string]string{launcher.LabelReplicaID: "old-1"})
		return err == nil && len(adopted) == 1 && adopted[0].State == launcher.StateRunning
	})
	want := &rules{Description: descController, Priority: allowPriority, Allowed: "tcp:18080",
		SourceRanges: []string{routeSource(t, adopted[0].Endpoint)}, TargetTags: []string{"ferry-port-18080"}}
	if d := cmp.Diff(want, ruleOf(t, e.fake, "ferry-allow-18080")); d != "" {
		t.Errorf("allow rule (-want +got):\n%s", d)
	}
	if d := cmp.Diff(denyRule, ruleOf(t, e.fake, "ferry-deny-18080")); d != "" {
		t.Errorf("deny rule (-want +got):\n%s", d)
	}
}

// TestFirewallFailsSafe: when the controller's address cannot be told, the old wide rule is
// deleted rather than kept, no rule without sources is made (GCP would read it as
// 0.0.0.0/0), the port is closed to everyone, and the log says what to configure.
func TestFirewallFailsSafe(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	core, logs := observer.New(zap.InfoLevel)
	e.prov.log = zap.New(core)
	e.prov.routeSource = func(string) (netip.Prefix, error) { return netip.Prefix{}, errors.New("no route") }
	e.insertOldRule(t, oldRule("0.0.0.0/0"))
	if _, err := e.prov.Launch(testCtx(t), spec("fs-1", launcher.Placement{InstanceType: "n1-standard-4"})); err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Firewalls(); !cmp.Equal(got, []string{"ferry-deny-18080"}) {
		t.Fatalf("firewall rules %v, want only the deny rule", got)
	}
	if got := logs.FilterLevelExact(zap.ErrorLevel).FilterMessageSnippet("gcp.proxy_cidrs").Len(); got != 1 {
		t.Fatalf("%d error logs naming gcp.proxy_cidrs, want 1: %v", got, logs.All())
	}
}
