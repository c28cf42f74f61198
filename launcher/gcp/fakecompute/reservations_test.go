package fakecompute

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

const zoneA = "us-central1-a"

// capacityClients serves a fake (operations DONE at once) and returns the real clients the
// reservation tests use.
func capacityClients(t *testing.T) (*Server, *compute.InstancesClient, *compute.ReservationsClient, *compute.FutureReservationsClient) {
	t.Helper()
	fake := New(Options{Project: "p", OpDelay: -1, Dir: t.TempDir()})
	srv := httptest.NewServer(fake)
	t.Cleanup(fake.Close)
	t.Cleanup(srv.Close)
	ctx := context.Background()
	copts := []option.ClientOption{option.WithEndpoint(srv.URL), option.WithoutAuthentication()}
	ic, err := compute.NewInstancesRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := compute.NewReservationsRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	fc, err := compute.NewFutureReservationsRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ic.Close(); rc.Close(); fc.Close() })
	return fake, ic, rc, fc
}

// reservedVM is an a3 VM that targets the named reservation, bound to it.
func reservedVM(name, reservation string) *computepb.Instance {
	return &computepb.Instance{Name: proto.String(name), MachineType: proto.String("zones/" + zoneA + "/machineTypes/a3-highgpu-8g"),
		Scheduling: &computepb.Scheduling{ProvisioningModel: proto.String("RESERVATION_BOUND"), InstanceTerminationAction: proto.String("DELETE"),
			OnHostMaintenance: proto.String("TERMINATE")},
		ReservationAffinity: &computepb.ReservationAffinity{ConsumeReservationType: proto.String("SPECIFIC_RESERVATION"),
			Key: proto.String(ReservationKey), Values: []string{reservation}}}
}

// insertErr inserts vm and returns the insert's error, synchronous or from its operation.
func insertErr(ctx context.Context, ic *compute.InstancesClient, vm *computepb.Instance) error {
	op, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: zoneA, InstanceResource: vm})
	if err != nil {
		return err
	}
	return op.Wait(ctx)
}

// waitStatus polls the fake until the named VM has status want ("" = gone), for at most 20 s.
func waitStatus(t *testing.T, fake *Server, name, want string) *computepb.Instance {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		vm, _, ok := fake.Instance(name)
		if (!ok && want == "") || (ok && vm.GetStatus() == want) {
			return vm
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: status %q (present %v), want %q", name, vm.GetStatus(), ok, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A calendar-mode future reservation through the real clients: approved but not usable before
// its window, a READY reservation with the reserved count in it, consumed by reservation-bound
// VMs up to that count, and at its end the reservation and its VMs go.
func TestFutureReservationWindow(t *testing.T) {
	fake, ic, rc, fc := capacityClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	end := start.Add(2 * time.Hour)
	op, err := fc.Insert(ctx, &computepb.InsertFutureReservationRequest{Project: "p", Zone: zoneA, FutureReservationResource: &computepb.FutureReservation{
		Name: proto.String("train-block"), ReservationMode: proto.String("CALENDAR"), ReservationName: proto.String("train-res"),
		TimeWindow: &computepb.FutureReservationTimeWindow{StartTime: proto.String(start.Format(time.RFC3339)), EndTime: proto.String(end.Format(time.RFC3339))},
		SpecificSkuProperties: &computepb.FutureReservationSpecificSKUProperties{TotalCount: proto.Int64(1),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String("a3-highgpu-8g")}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	fr, err := fc.Get(ctx, &computepb.GetFutureReservationRequest{Project: "p", Zone: zoneA, FutureReservation: "train-block"})
	if err != nil || fr.GetStatus().GetProcurementStatus() != ProcurementApproved {
		t.Fatalf("future reservation = %v, %v", fr, err)
	}
	if err := insertErr(ctx, ic, reservedVM("early", "train-res")); err == nil {
		t.Fatal("a VM consumed a reservation before its window")
	}

	if err := fake.StartWindow(zoneA, "train-block"); err != nil {
		t.Fatal(err)
	}
	res, err := rc.Get(ctx, &computepb.GetReservationRequest{Project: "p", Zone: zoneA, Reservation: "train-res"})
	if err != nil || res.GetStatus() != "READY" || res.GetSpecificReservation().GetCount() != 1 || res.GetDeleteAtTime() != end.Format(time.RFC3339) {
		t.Fatalf("auto-created reservation = %v, %v", res, err)
	}
	if err := insertErr(ctx, ic, reservedVM("in-window", "train-res")); err != nil {
		t.Fatal(err)
	}
	vm := waitStatus(t, fake, "in-window", "RUNNING")
	if got := vm.GetResourceStatus().GetScheduling().GetTerminationTimestamp(); got != end.Format(time.RFC3339) {
		t.Errorf("terminationTimestamp = %q, want the window's end %s", got, end.Format(time.RFC3339))
	}
	res, _ = rc.Get(ctx, &computepb.GetReservationRequest{Project: "p", Zone: zoneA, Reservation: "train-res"})
	if res.GetSpecificReservation().GetInUseCount() != 1 {
		t.Errorf("inUseCount = %d, want 1", res.GetSpecificReservation().GetInUseCount())
	}
	if err := insertErr(ctx, ic, reservedVM("one-too-many", "train-res")); err == nil {
		t.Error("a VM beyond the reserved count was made")
	}
	other := reservedVM("wrong-shape", "train-res")
	other.MachineType = proto.String("zones/" + zoneA + "/machineTypes/a2-highgpu-1g")
	var gerr *googleapi.Error
	if err := insertErr(ctx, ic, other); !errors.As(err, &gerr) || gerr.Code != http.StatusBadRequest {
		t.Errorf("a VM of another machine type: %v, want 400", err)
	}

	if err := fake.EndWindow(zoneA, "train-block"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, fake, "in-window", "")
	if _, err := rc.Get(ctx, &computepb.GetReservationRequest{Project: "p", Zone: zoneA, Reservation: "train-res"}); !errors.As(err, &gerr) || gerr.Code != http.StatusNotFound {
		t.Errorf("the reservation outlived its window: %v", err)
	}
	fr, _ = fc.Get(ctx, &computepb.GetFutureReservationRequest{Project: "p", Zone: zoneA, FutureReservation: "train-block"})
	if fr.GetStatus().GetProcurementStatus() != ProcurementExpired {
		t.Errorf("procurement status = %q after the window", fr.GetStatus().GetProcurementStatus())
	}
}

// A reservation that is not specificReservationRequired cannot be targeted by name, as on GCP.
func TestReservationMustBeSpecific(t *testing.T) {
	_, ic, rc, _ := capacityClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	op, err := rc.Insert(ctx, &computepb.InsertReservationRequest{Project: "p", Zone: zoneA, ReservationResource: &computepb.Reservation{
		Name: proto.String("open"), SpecificReservation: &computepb.AllocationSpecificSKUReservation{Count: proto.Int64(2),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String("a3-highgpu-8g")}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	var gerr *googleapi.Error
	if err := insertErr(ctx, ic, reservedVM("vm", "open")); !errors.As(err, &gerr) || gerr.Code != http.StatusBadRequest {
		t.Errorf("targeting a non-specific reservation: %v, want 400", err)
	}
	if err := insertErr(ctx, ic, reservedVM("vm", "missing")); err == nil {
		t.Error("a VM consumed a reservation that does not exist")
	}
}

func flexVM(name string, run time.Duration) *computepb.Instance {
	return &computepb.Instance{Name: proto.String(name), MachineType: proto.String("zones/" + zoneA + "/machineTypes/a3-highgpu-8g"),
		Scheduling: &computepb.Scheduling{ProvisioningModel: proto.String("FLEX_START"), InstanceTerminationAction: proto.String("DELETE"),
			OnHostMaintenance: proto.String("TERMINATE"), AutomaticRestart: proto.Bool(false),
			MaxRunDuration: &computepb.Duration{Seconds: proto.Int64(int64(run / time.Second))}},
		ReservationAffinity: &computepb.ReservationAffinity{ConsumeReservationType: proto.String("NO_RESERVATION")},
		Params:              &computepb.InstanceParams{RequestValidForDuration: &computepb.Duration{Seconds: proto.Int64(3600)}}}
}

// Flex-start VMs wait PENDING, start together when the zone's queue is fulfilled, even with
// the zone's on-demand capacity at zero, and are deleted at their maxRunDuration.
func TestFlexStartQueueAndRunLimit(t *testing.T) {
	fake, ic, _, _ := capacityClients(t)
	fake.SetCapacity(zoneA, "a3-highgpu-8g", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"flex-0", "flex-1"} {
		if err := insertErr(ctx, ic, flexVM(name, time.Second)); err != nil {
			t.Fatal(err)
		}
		if vm, _, _ := fake.Instance(name); vm.GetStatus() != "PENDING" {
			t.Fatalf("%s is %s, want PENDING in the queue", name, vm.GetStatus())
		}
	}
	if n := fake.FlexQueued(zoneA); n != 2 {
		t.Fatalf("queued = %d, want 2", n)
	}
	if n := fake.FulfilFlexStart(zoneA); n != 2 {
		t.Fatalf("fulfilled %d, want both at once", n)
	}
	vm := waitStatus(t, fake, "flex-0", "RUNNING")
	if vm.GetResourceStatus().GetScheduling().GetTerminationTimestamp() == "" {
		t.Error("a running flex-start VM has no terminationTimestamp")
	}
	// maxRunDuration is 1 s: both are deleted (instanceTerminationAction DELETE).
	waitStatus(t, fake, "flex-0", "")
	waitStatus(t, fake, "flex-1", "")

	bad := flexVM("no-limit", 0)
	var gerr *googleapi.Error
	if err := insertErr(ctx, ic, bad); !errors.As(err, &gerr) || gerr.Code != http.StatusBadRequest {
		t.Errorf("flex-start without maxRunDuration: %v, want 400", err)
	}
	long := flexVM("eight-days", 8*24*time.Hour)
	if err := insertErr(ctx, ic, long); !errors.As(err, &gerr) || gerr.Code != http.StatusBadRequest {
		t.Errorf("flex-start beyond 7 days: %v, want 400", err)
	}
}

// A flex-start request not fulfilled within requestValidForDuration fails: the VM is
// TERMINATED without having run.
func TestFlexStartRequestExpires(t *testing.T) {
	fake, ic, _, _ := capacityClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vm := flexVM("short-wait", time.Hour)
	vm.Params.RequestValidForDuration.Seconds = proto.Int64(1)
	if err := insertErr(ctx, ic, vm); err != nil {
		t.Fatal(err)
	}
	got := waitStatus(t, fake, "short-wait", "TERMINATED")
	if got.GetLastStartTimestamp() != "" || got.GetStatusMessage() == "" {
		t.Errorf("expired request: %v", got)
	}
	if fake.FulfilFlexStart(zoneA) != 0 {
		t.Error("an expired request was fulfilled")
	}
}

// SetWindow moves a future reservation's window: the old times no longer act, the new ones do.
func TestSetWindow(t *testing.T) {
	fake, _, rc, fc := capacityClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	now := time.Now().UTC()
	op, err := fc.Insert(ctx, &computepb.InsertFutureReservationRequest{Project: "p", Zone: zoneA, FutureReservationResource: &computepb.FutureReservation{
		Name: proto.String("moved"), ReservationMode: proto.String("CALENDAR"),
		TimeWindow: &computepb.FutureReservationTimeWindow{StartTime: proto.String(now.Add(time.Hour).Format(time.RFC3339)), EndTime: proto.String(now.Add(2 * time.Hour).Format(time.RFC3339))},
		SpecificSkuProperties: &computepb.FutureReservationSpecificSKUProperties{TotalCount: proto.Int64(1),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String("a3-highgpu-8g")}},
	}})
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := fake.SetWindow(zoneA, "moved", now.Add(-time.Second), now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	var gerr *googleapi.Error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		fr, err := fc.Get(ctx, &computepb.GetFutureReservationRequest{Project: "p", Zone: zoneA, FutureReservation: "moved"})
		if err != nil {
			t.Fatal(err)
		}
		if fr.GetStatus().GetProcurementStatus() == ProcurementExpired {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the moved window did not end: %v", fr.GetStatus())
		}
	}
	if _, err := rc.Get(ctx, &computepb.GetReservationRequest{Project: "p", Zone: zoneA, Reservation: "moved"}); !errors.As(err, &gerr) || gerr.Code != http.StatusNotFound {
		t.Errorf("reservation after the moved window: %v", err)
	}
	if err := fake.SetWindow(zoneA, "moved", now, now); err == nil {
		t.Error("an empty window was accepted")
	}
}

// Close waits for the processes of VMs it no longer lists: a window's end deletes its VMs at
// once and kills their processes in the background, and a test that ended right after (its
// cleanup removing Options.Dir) found one still writing there.
func TestCloseWaitsForVMsEndedBefore(t *testing.T) {
	fake, ic, _, fc := capacityClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	op, err := fc.Insert(ctx, &computepb.InsertFutureReservationRequest{Project: "p", Zone: zoneA, FutureReservationResource: &computepb.FutureReservation{
		Name: proto.String("block"), ReservationMode: proto.String("CALENDAR"), ReservationName: proto.String("block-res"),
		TimeWindow: &computepb.FutureReservationTimeWindow{StartTime: proto.String(start.Format(time.RFC3339)), EndTime: proto.String(start.Add(time.Hour).Format(time.RFC3339))},
		SpecificSkuProperties: &computepb.FutureReservationSpecificSKUProperties{TotalCount: proto.Int64(1),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String("a3-highgpu-8g")}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fake.StartWindow(zoneA, "block"); err != nil {
		t.Fatal(err)
	}
	vm := reservedVM("busy", "block-res")
	vm.Metadata = &computepb.Metadata{Items: []*computepb.Items{{Key: proto.String("startup-script"),
		Value: proto.String(`echo $$ > "$HOME/pid"; while :; do date > "$HOME/beat"; sleep 0.01; done`)}}}
	if err := insertErr(ctx, ic, vm); err != nil {
		t.Fatal(err)
	}
	var pid int
	for {
		b, err := os.ReadFile(filepath.Join(fake.vmDir(zoneA, "busy"), "pid"))
		if pid, _ = strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the VM's script never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := fake.EndWindow(zoneA, "block"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := fake.Instance("busy"); ok {
		t.Fatal("the VM outlived its window's end")
	}
	fake.Close()
	// The script's shell is fakevm's child, reaped once it has ended: ESRCH then.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the deleted VM's script (pid %d) after Close: signal 0 = %v, want ESRCH", pid, err)
	}
}
