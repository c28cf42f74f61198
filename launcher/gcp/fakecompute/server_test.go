package fakecompute

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

// newClients serves a fake and returns the real REST clients aimed at it.
func newClients(t *testing.T, opts Options) (*Server, *compute.InstancesClient, *compute.ZoneOperationsClient) {
	t.Helper()
	opts.Dir = t.TempDir()
	fake := New(opts)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	t.Cleanup(fake.Close) // first: it drops requests a hang holds, which srv.Close waits for
	ctx := context.Background()
	copts := []option.ClientOption{option.WithEndpoint(srv.URL), option.WithoutAuthentication()}
	ic, err := compute.NewInstancesRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	oc, err := compute.NewZoneOperationsRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ic.Close(); oc.Close() })
	return fake, ic, oc
}

func vmResource(name string) *computepb.Instance {
	return &computepb.Instance{Name: proto.String(name), MachineType: proto.String("zones/us-central1-a/machineTypes/n1-standard-4")}
}

// TestOperationErrorThroughClientWait checks the path the client library's own Operation.Wait
// takes: a DONE operation with httpErrorStatusCode becomes an *apierror.APIError carrying the
// HTTP status, while the operation proto keeps error.errors[].code.
func TestOperationErrorThroughClientWait(t *testing.T) {
	fake, ic, _ := newClients(t, Options{Project: "p", OpDelay: -1})
	fake.InjectFault("us-central1-a", Fault{Code: CodeZoneResourcePoolExhausted})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: "us-central1-a", InstanceResource: vmResource("vm-1")})
	if err != nil {
		t.Fatal(err)
	}
	err = op.Wait(ctx)
	var aerr *apierror.APIError
	if !errors.As(err, &aerr) || aerr.HTTPCode() != http.StatusServiceUnavailable {
		t.Fatalf("Wait = %v, want an APIError with 503", err)
	}
	if got := op.Proto().GetError().GetErrors()[0].GetCode(); got != CodeZoneResourcePoolExhausted {
		t.Errorf("operation error code = %q", got)
	}
	if _, _, ok := fake.Instance("vm-1"); ok {
		t.Error("a failed insert left an instance")
	}
}

func TestHTTPErrorEnvelope(t *testing.T) {
	fake, ic, _ := newClients(t, Options{Project: "p", DeniedTokens: map[string]int{"": http.StatusForbidden}})
	_ = fake
	_, err := ic.Get(context.Background(), &computepb.GetInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "x"})
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) || gerr.Code != 403 || len(gerr.Errors) != 1 || gerr.Errors[0].Reason != "forbidden" {
		t.Fatalf("err = %#v", err)
	}
}

func TestListFilterAndWait(t *testing.T) {
	fake, ic, oc := newClients(t, Options{Project: "p"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"a", "b"} {
		vm := vmResource(name)
		vm.Labels = map[string]string{"ferry-service": name}
		op, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: "us-central1-a", InstanceResource: vm})
		if err != nil {
			t.Fatal(err)
		}
		if op.Done() {
			t.Fatal("insert operation is DONE at once with a positive OpDelay")
		}
		done, err := oc.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: "p", Zone: "us-central1-a", Operation: op.Name()})
		if err != nil || done.GetStatus() != computepb.Operation_DONE {
			t.Fatalf("wait = %v, %v", done, err)
		}
	}
	it := ic.List(ctx, &computepb.ListInstancesRequest{Project: "p", Zone: "us-central1-a", Filter: proto.String(`(labels.ferry-service = "b")`)})
	var names []string
	for {
		vm, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, vm.GetName()+"/"+vm.GetStatus())
	}
	if len(names) != 1 || names[0] != "b/RUNNING" {
		t.Fatalf("filtered list = %v", names)
	}
	_ = fake
	_, err := ic.List(ctx, &computepb.ListInstancesRequest{Project: "p", Zone: "us-central1-a", Filter: proto.String(`labels.a = "b" OR name = "x"`)}).Next()
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) || gerr.Code != 400 {
		t.Fatalf("unsupported filter: %v", err)
	}
}

// TestFirewalls: insert, update (PUT replaces every field) and delete through the real client,
// with GCP's validation and its default of 0.0.0.0/0 for an ingress rule with no source.
func TestFirewalls(t *testing.T) {
	fake := New(Options{Project: "p", Dir: t.TempDir()})
	srv := httptest.NewServer(fake)
	t.Cleanup(fake.Close)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	fc, err := compute.NewFirewallsRESTClient(ctx, option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fc.Close() })
	rule := func(ranges, tags []string) *computepb.Firewall {
		return &computepb.Firewall{Name: proto.String("fw"), Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{"8080"}}},
			SourceRanges: ranges, SourceTags: tags, TargetTags: []string{"t"}}
	}
	wait := func(op *compute.Operation, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if err := op.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wait(fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "p", FirewallResource: rule(nil, nil)}))
	if fw, _ := fake.Firewall("fw"); len(fw.GetSourceRanges()) != 1 || fw.GetSourceRanges()[0] != "0.0.0.0/0" || fw.GetPriority() != 1000 || fw.GetDirection() != "INGRESS" {
		t.Fatalf("a rule with no source: %v; want 0.0.0.0/0, priority 1000, INGRESS", fw)
	}
	wait(fc.Update(ctx, &computepb.UpdateFirewallRequest{Project: "p", Firewall: "fw", FirewallResource: rule(nil, []string{"proxy"})}))
	if fw, _ := fake.Firewall("fw"); len(fw.GetSourceRanges()) != 0 || len(fw.GetSourceTags()) != 1 || fw.GetId() == 0 {
		t.Fatalf("after update: %v; want the tag only, same id", fw)
	}
	var gerr *googleapi.Error
	if _, err := fc.Insert(ctx, &computepb.InsertFirewallRequest{Project: "p", FirewallResource: rule([]string{"10.0.0.0/33"}, nil)}); !errors.As(err, &gerr) || gerr.Code != 400 {
		t.Errorf("a malformed range: %v, want 400", err)
	}
	if _, err := fc.Update(ctx, &computepb.UpdateFirewallRequest{Project: "p", Firewall: "nope", FirewallResource: rule([]string{"10.0.0.0/8"}, nil)}); !errors.As(err, &gerr) || gerr.Code != 404 {
		t.Errorf("updating a missing rule: %v, want 404", err)
	}
	wait(fc.Delete(ctx, &computepb.DeleteFirewallRequest{Project: "p", Firewall: "fw"}))
	if names := fake.Firewalls(); len(names) != 0 {
		t.Fatalf("firewalls after delete: %v", names)
	}
}

func spotVM(name string) *computepb.Instance {
	vm := vmResource(name)
	vm.Scheduling = &computepb.Scheduling{ProvisioningModel: proto.String("SPOT")}
	return vm
}

// TestSpotCapacityAndNotice: a zone's Spot capacity refuses the Spot VM beyond it (and no
// on-demand one), and a preemption with notice records its operation at once, keeps the VM
// RUNNING and frees its place in the zone's capacity.
func TestSpotCapacityAndNotice(t *testing.T) {
	fake, ic, oc := newClients(t, Options{Project: "p", OpDelay: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const zone = "us-central1-a"
	insert := func(vm *computepb.Instance) error {
		op, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: zone, InstanceResource: vm})
		if err != nil {
			return err
		}
		return op.Wait(ctx)
	}
	fake.SetSpotCapacity(zone, 1)
	if err := insert(spotVM("spot-1")); err != nil {
		t.Fatal(err)
	}
	if err := insert(spotVM("spot-2")); err == nil {
		t.Fatal("a second Spot VM fit a zone of Spot capacity 1")
	}
	if err := insert(vmResource("standard-1")); err != nil {
		t.Fatalf("Spot capacity refused a standard VM: %v", err)
	}

	if err := fake.PreemptWithNotice("spot-1", time.Hour); err != nil {
		t.Fatal(err)
	}
	vm, _, _ := fake.Instance("spot-1")
	if vm.GetStatus() != "STOPPING" {
		t.Errorf("spot-1 is %s during its notice, want STOPPING, as GCE shows it", vm.GetStatus())
	}
	ops := oc.List(ctx, &computepb.ListZoneOperationsRequest{Project: "p", Zone: zone})
	preempted := 0
	for {
		op, err := ops.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if op.GetOperationType() == PreemptedOperation && op.GetTargetLink() != "" {
			preempted++
		}
	}
	if preempted != 1 {
		t.Errorf("%d preempted operations at the notice, want 1", preempted)
	}
	if err := fake.PreemptWithNotice("spot-1", 0); err == nil {
		t.Error("a second preemption of spot-1 during its notice was accepted")
	}
	if got := fake.SpotVMs(); len(got) != 1 || !got[0].Preempting {
		t.Errorf("SpotVMs = %+v, want spot-1 preempting", got)
	}
	if err := insert(spotVM("spot-3")); err != nil {
		t.Fatalf("the place of a VM being preempted was not freed: %v", err)
	}
	if err := fake.Preempt("spot-3"); err != nil {
		t.Fatal(err)
	}
	if vm, _, _ := fake.Instance("spot-3"); vm.GetStatus() != "TERMINATED" {
		t.Errorf("spot-3 is %s after a preemption without notice", vm.GetStatus())
	}
}
