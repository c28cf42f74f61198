package gcp

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/fakefault"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// insertReservation makes a specific reservation through the provider's own client.
func (e *env) insertReservation(t *testing.T, zone, name, machineType string, count int64) {
	t.Helper()
	ctx := testCtx(t)
	op, err := e.prov.reservations.Insert(ctx, &computepb.InsertReservationRequest{Project: project, Zone: zone, ReservationResource: &computepb.Reservation{
		Name: proto.String(name), SpecificReservationRequired: proto.Bool(true),
		SpecificReservation: &computepb.AllocationSpecificSKUReservation{Count: proto.Int64(count),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String(machineType)}}}})
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// insertFuture asks for a calendar-mode future reservation of count VMs from start to end,
// whose reservation is named name+"-res".
func (e *env) insertFuture(t *testing.T, zone, name, machineType string, count int64, start, end time.Time) {
	t.Helper()
	ctx := testCtx(t)
	op, err := e.prov.futureRes.Insert(ctx, &computepb.InsertFutureReservationRequest{Project: project, Zone: zone, FutureReservationResource: &computepb.FutureReservation{
		Name: proto.String(name), ReservationName: proto.String(name + "-res"), ReservationMode: proto.String("CALENDAR"),
		TimeWindow: &computepb.FutureReservationTimeWindow{StartTime: proto.String(start.UTC().Format(time.RFC3339)), EndTime: proto.String(end.UTC().Format(time.RFC3339))},
		SpecificSkuProperties: &computepb.FutureReservationSpecificSKUProperties{TotalCount: proto.Int64(count),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String(machineType)}}}})
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Reservations and Offerings show a delivered reservation (with its use) and a future one
// (with its window), with the shape the catalog gives their machine type; a full reservation is
// not offered.
func TestReservationsAndOfferings(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	end := start.Add(48 * time.Hour)
	e.insertReservation(t, "us-central1-a", "h100s", "a3-highgpu-8g", 1)
	e.insertFuture(t, "us-central1-b", "block", "a3-highgpu-8g", 4, start, end)

	got, err := e.prov.Reservations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b launcher.ReservationOffer) int { return strings.Compare(a.Zone, b.Zone) })
	want := []launcher.ReservationOffer{
		{ID: "h100s", Name: "h100s", Kind: launcher.KindGCPReservation, Count: 1, Infra: "gcp", Region: "us-central1", Zone: "us-central1-a", InstanceType: "a3-highgpu-8g", Accelerator: "H100"},
		{ID: "block-res", Name: "block", Kind: launcher.KindGCPFutureReservation, Count: 4, Start: start, End: end, Infra: "gcp", Region: "us-central1", Zone: "us-central1-b", InstanceType: "a3-highgpu-8g", Accelerator: "H100"},
	}
	if !slices.EqualFunc(got, want, func(a, b launcher.ReservationOffer) bool {
		return a.ID == b.ID && a.Name == b.Name && a.Kind == b.Kind && a.Count == b.Count && a.InUse == b.InUse &&
			a.Start.Equal(b.Start) && a.End.Equal(b.End) && a.Zone == b.Zone && a.Region == b.Region && a.InstanceType == b.InstanceType && a.Accelerator == b.Accelerator
	}) {
		t.Fatalf("Reservations =\n%+v\nwant\n%+v", got, want)
	}
	offers, err := e.prov.Offerings(ctx)
	queued := slices.DeleteFunc(slices.Clone(offers), func(o launcher.Offering) bool { return o.QueueWait == 0 })
	if !slices.ContainsFunc(queued, func(o launcher.Offering) bool { return o.InstanceType == "a3-highgpu-8g" && o.Zone == "us-central1-a" }) ||
		slices.ContainsFunc(queued, func(o launcher.Offering) bool {
			return !flexCapable(o.InstanceType) || !slices.Contains(testZones, o.Zone)
		}) {
		t.Errorf("flex-start offerings %+v: want the allowed zones' accelerator-optimized machines only", queued)
	}
	offers = slices.DeleteFunc(offers, func(o launcher.Offering) bool { return o.QueueWait > 0 })
	if err != nil || len(offers) != 2 {
		t.Fatalf("Offerings = %+v, %v", offers, err)
	}
	for _, o := range offers {
		if o.Reservation == nil || o.Accelerator != "H100" || o.AcceleratorCount != 8 || o.InstanceType != "a3-highgpu-8g" {
			t.Errorf("offering %+v", o)
		}
	}

	// A VM in the reservation uses it up: listed in use, no longer offered.
	s := spec("in-res", launcher.Placement{Zone: "us-central1-a", InstanceType: "a3-highgpu-8g", Reservation: "h100s"})
	in, err := e.prov.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	vm, _, _ := e.fake.Instance(in.Name)
	if ra := vm.GetReservationAffinity(); ra.GetConsumeReservationType() != "SPECIFIC_RESERVATION" || !slices.Equal(ra.GetValues(), []string{"h100s"}) {
		t.Errorf("reservation affinity %v", ra)
	}
	got, _ = e.prov.Reservations(ctx)
	if i := slices.IndexFunc(got, func(o launcher.ReservationOffer) bool { return o.ID == "h100s" }); i < 0 || got[i].InUse != 1 {
		t.Errorf("after a launch: %+v", got)
	}
	offers, _ = e.prov.Offerings(ctx)
	offers = slices.DeleteFunc(offers, func(o launcher.Offering) bool { return o.QueueWait > 0 })
	if len(offers) != 1 || offers[0].Reservation.ID != "block-res" {
		t.Errorf("a full reservation is still offered: %+v", offers)
	}
	_, err = e.prov.Launch(ctx, spec("second", launcher.Placement{Zone: "us-central1-a", InstanceType: "a3-highgpu-8g", Reservation: "h100s"}))
	checkError(t, err, launcher.ErrNoCapacity)
	_, err = e.prov.Launch(ctx, spec("typo", launcher.Placement{Zone: "us-central1-a", InstanceType: "a3-highgpu-8g", Reservation: "h100z"}))
	checkError(t, err, launcher.ErrInvalid)
}

// watchNotices starts the provider's notice watcher until the test ends, and waits for it to
// stop before the provider's clients close.
func (e *env) watchNotices(t *testing.T) <-chan launcher.Notice {
	ctx, cancel := context.WithCancel(context.Background())
	ch := e.prov.Notices(ctx)
	out := make(chan launcher.Notice, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := range ch {
			select {
			case out <- n:
			default: // the test reads only the first
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return out
}

// reservedJob is a job node that asks for the named reservation (resources.capacity).
func reservedJob(name, zone, reservation, run string, grace time.Duration) launcher.Spec {
	s := jobSpecFor(name, "", run, false)
	s.Placement.Zone, s.Placement.InstanceType = zone, "a3-highgpu-8g"
	s.Resources.Capacity = &configs.Capacity{Mode: configs.CapacityReserved, Reservation: reservation}
	s.Job.Grace = grace
	return s
}

// Before a future reservation's window the launch waits (ErrQueued, saying when it starts); in
// the window the node is reservation-bound to it; its end is noticed ahead of time.
func TestFutureReservationQueuesUntilWindow(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	end := start.Add(2 * time.Hour)
	e.insertFuture(t, "us-central1-b", "later", "a3-highgpu-8g", 2, start, end)

	s := reservedJob("early", "us-central1-b", "later", "exec sleep 300", 10*time.Second)
	_, err := e.prov.Launch(ctx, s)
	q, ok := launcher.AsQueued(err)
	if !ok || !strings.Contains(q.Reason, "starts at "+start.Format(time.RFC3339)) || q.Since.IsZero() {
		t.Fatalf("launch before the window: %v; want ErrQueued saying when it starts", err)
	}
	if vms, _ := e.prov.List(ctx, nil); len(vms) != 0 {
		t.Fatalf("a queued launch made VMs: %+v", vms)
	}

	if err := e.fake.StartWindow("us-central1-b", "later"); err != nil {
		t.Fatal(err)
	}
	notices := e.watchNotices(t)
	in, err := e.prov.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	vm, _, _ := e.fake.Instance(in.Name)
	if vm.GetScheduling().GetProvisioningModel() != "RESERVATION_BOUND" || !slices.Equal(vm.GetReservationAffinity().GetValues(), []string{"later-res"}) {
		t.Errorf("node scheduling %v, affinity %v", vm.GetScheduling(), vm.GetReservationAffinity())
	}
	if got := vmjobtest.Listed(t, e.prov, in.ID); !got.WindowEnd.Equal(end) {
		t.Errorf("listed with WindowEnd %s, want the window's end %s", got.WindowEnd, end)
	}
	select {
	case n := <-notices:
		if n.InstanceID != in.ID || !n.At.Equal(end) {
			t.Errorf("notice %+v, want %s at the window's end %s", n, in.ID, end)
		}
	case <-ctx.Done():
		t.Fatal("no notice of the window's end")
	}
	// The window's end takes the VM (instanceTerminationAction DELETE).
	if err := e.fake.EndWindow("us-central1-b", "later"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the VM deleted at the window's end", func() bool { _, _, ok := e.fake.Instance(in.Name); return !ok })
}

// A job node in a reservation whose window ends soon gets SIGTERM its grace period before the
// end, with the seconds left in the preemption file, checkpoints while the VM still runs, and
// the VM goes at the end.
func TestJobStoppedBeforeWindowEnd(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	const grace = 4 * time.Second
	end := time.Now().Add(12 * time.Second).UTC().Truncate(time.Second)
	e.insertFuture(t, "us-central1-b", "short", "a3-highgpu-8g", 1, time.Now().Add(-time.Second), end)
	var in launcher.Instance
	waitFor(t, "the window open", func() bool {
		var err error
		in, err = e.prov.Launch(ctx, reservedJob("short", "us-central1-b", "short-res", vmjobtest.PreemptibleRun, grace))
		return err == nil
	})
	c := e.cloud()
	vmjobtest.WaitTraining(t, c, in)
	left := vmjobtest.WaitWarned(t, c, in)
	if left < 0 || left > int(grace/time.Second) {
		t.Fatalf("%d s left at SIGTERM, want at most the grace period %v", left, grace)
	}
	waitFor(t, "checkpointed", func() bool { return strings.Contains(c.Console(in), "checkpointed") })
	if _, _, ok := e.fake.Instance(in.Name); !ok {
		t.Fatal("the VM was gone before its program checkpointed")
	}
	waitFor(t, "the VM deleted at the window's end", func() bool { _, _, ok := e.fake.Instance(in.Name); return !ok })
	if strings.Contains(c.Console(in), vmnode.ExitMarker) {
		t.Error("a node stopped for its window's end marked an exit status")
	}
}

// A job's run limit (max_run_duration) reaches its node's program as SIGTERM its grace
// period before the limit, counted from the node's boot, when that comes before the end of
// its window.
func TestJobRunLimitSIGTERM(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	s := jobSpecFor("limited", "", vmjobtest.PreemptibleRun, false)
	s.Resources.Capacity = &configs.Capacity{Mode: configs.CapacityOnDemand, MaxRunDuration: 4 * time.Second}
	s.Job.Grace = 2 * time.Second
	s.Placement.WindowEnd = time.Now().Add(time.Hour)
	in, err := e.prov.Launch(testCtx(t), s)
	if err != nil {
		t.Fatal(err)
	}
	c := e.cloud()
	vmjobtest.WaitTraining(t, c, in)
	if left := vmjobtest.WaitWarned(t, c, in); left < 0 || left > 2 {
		t.Fatalf("%d s left at SIGTERM, want at most the 2 s grace (the run limit, not the window's end)", left)
	}
	waitFor(t, "checkpointed", func() bool { return strings.Contains(c.Console(in), "checkpointed") })
}

// flexJob is a job spec that queues for capacity on an a3 machine.
func flexJob(name, run string, capacity configs.Capacity) launcher.Spec {
	s := jobSpecFor(name, "", run, false)
	s.Placement.InstanceType, s.Placement.Queued = "a3-highgpu-8g", true
	s.Resources.Capacity = &capacity
	return s
}

// A queued gang waits (ErrQueued, no second set of VMs when asked again), then starts when
// the queue gives all its VMs at once; each node learns every node's address.
func TestFlexStartGang(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	e.fake.SetCapacity("us-central1-b", "a3-highgpu-8g", 0) // no on-demand capacity at all
	s := flexJob("flex", `echo "peers: $(echo $SKYPILOT_NODE_IPS)"; exit 0`,
		configs.Capacity{Mode: configs.CapacityQueued, MaxWait: time.Hour, MaxRunDuration: 3 * time.Hour})
	for range 2 {
		_, err := e.prov.LaunchGang(ctx, s, 2)
		if q, ok := launcher.AsQueued(err); !ok || !strings.Contains(q.Reason, "2 of 2") {
			t.Fatalf("LaunchGang = %v; want ErrQueued for both VMs", err)
		}
		if n := e.fake.FlexQueued("us-central1-b"); n != 2 {
			t.Fatalf("%d VMs queued, want 2", n)
		}
	}
	if n := e.fake.FulfilFlexStart("us-central1-b"); n != 2 {
		t.Fatalf("fulfilled %d", n)
	}
	var insts []launcher.Instance
	waitFor(t, "the gang running", func() bool {
		var err error
		insts, err = e.prov.LaunchGang(ctx, s, 2)
		if err != nil && !errors.Is(err, launcher.ErrQueued) {
			t.Fatal(err)
		}
		return err == nil
	})
	if len(insts) != 2 || insts[0].Labels[launcher.LabelNodeRank] != "0" {
		t.Fatalf("gang %+v", insts)
	}
	vm, _, _ := e.fake.Instance(insts[1].Name)
	sch := vm.GetScheduling()
	if sch.GetProvisioningModel() != "FLEX_START" || sch.GetMaxRunDuration().GetSeconds() != 3*3600 ||
		sch.GetInstanceTerminationAction() != "DELETE" || vm.GetParams().GetRequestValidForDuration().GetSeconds() != 3600 {
		t.Errorf("flex-start VM scheduling %v, params %v", sch, vm.GetParams())
	}
	peers := "peers: " + insts[0].IP + " " + insts[1].IP
	for _, in := range insts {
		waitFor(t, in.Name+" knows its peers", func() bool { return strings.Contains(e.fake.SerialOutput(in.Zone, in.Name), peers) })
	}
}

// A flex-start request GCE gives up on (max_wait passed) fails the launch with ErrNoCapacity
// and leaves no VM; a run limit beyond GCE's 7 days is refused.
func TestFlexStartExpires(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	s := flexJob("expiring", "exit 0", configs.Capacity{Mode: configs.CapacityQueued, MaxWait: time.Second, MaxRunDuration: time.Hour})
	_, err := e.prov.LaunchGang(ctx, s, 2)
	if !errors.Is(err, launcher.ErrQueued) {
		t.Fatalf("LaunchGang = %v", err)
	}
	waitFor(t, "the request expired", func() bool {
		_, err = e.prov.LaunchGang(ctx, s, 2)
		return !errors.Is(err, launcher.ErrQueued)
	})
	checkError(t, err, launcher.ErrNoCapacity)
	waitFor(t, "its VMs deleted", func() bool { vms, _ := e.prov.List(ctx, nil); return len(vms) == 0 })

	long := flexJob("long", "exit 0", configs.Capacity{Mode: configs.CapacityQueued, MaxRunDuration: 8 * 24 * time.Hour})
	_, err = e.prov.LaunchGang(ctx, long, 1)
	checkError(t, err, launcher.ErrInvalid)
}

// A flex-start VM's run limit is noticed ahead of time, at its start plus maxRunDuration.
func TestFlexStartRunLimitNoticed(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	notices := e.watchNotices(t)
	s := flexJob("limited", "exec sleep 300", configs.Capacity{Mode: configs.CapacityQueued, MaxRunDuration: time.Hour})
	if _, err := e.prov.Launch(ctx, s); !errors.Is(err, launcher.ErrQueued) {
		t.Fatalf("Launch = %v", err)
	}
	e.fake.FulfilFlexStart("us-central1-b")
	var in launcher.Instance
	waitFor(t, "running", func() bool {
		var err error
		in, err = e.prov.Launch(ctx, s)
		return err == nil
	})
	vm, _, _ := e.fake.Instance(in.Name)
	started, _ := time.Parse(time.RFC3339, vm.GetLastStartTimestamp())
	select {
	case n := <-notices:
		if n.InstanceID != in.ID || n.At.Sub(started) < 59*time.Minute || n.At.Sub(started) > 61*time.Minute {
			t.Errorf("notice %+v; want %s about an hour after its start %s", n, in.ID, started)
		}
	case <-ctx.Done():
		t.Fatal("no notice of the run limit")
	}
}

// A queued request is withdrawn (its VMs deleted) when the job's gang runs elsewhere, and
// whatever is left of a job goes when it ends.
func TestFlexStartWithdrawn(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	s := flexJob("withdrawn", "exit 0", configs.Capacity{Mode: configs.CapacityQueued, MaxRunDuration: time.Hour})
	if _, err := e.prov.LaunchGang(ctx, s, 2); !errors.Is(err, launcher.ErrQueued) {
		t.Fatalf("LaunchGang = %v", err)
	}
	other := spec("other-job", launcher.Placement{Zone: "us-central1-a"})
	other.Labels = map[string]string{launcher.LabelJob: "8", launcher.LabelAttempt: "1"}
	if _, err := e.prov.Launch(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := e.prov.WithdrawQueued(ctx, vmjobtest.Job, 1); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.FlexQueued("us-central1-b"); n != 0 {
		t.Fatalf("%d VMs still queued after the withdrawal", n)
	}
	if err := e.prov.CleanupJob(ctx, "8"); err != nil {
		t.Fatal(err)
	}
	if vms, _ := e.prov.List(ctx, nil); len(vms) != 0 {
		t.Fatalf("left after CleanupJob: %+v", vms)
	}
}

// TestOneFailingZoneHidesNoReservations: a zone whose reservations cannot be listed is a gap;
// the other zones' reservations and offerings are still returned with it (before, the error
// was a plain join, which the planner could not tell from GCP failing whole, and every zone's
// reservations were dropped).
func TestOneFailingZoneHidesNoReservations(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	e.insertReservation(t, "us-central1-a", "h100s", "a3-highgpu-8g", 1)
	e.fake.Outages().Set(fakefault.Fault{Status: 503, Zone: "us-central1-b"})
	got, err := e.prov.Reservations(ctx)
	gaps, partial := launcher.Partial(err)
	if !partial || len(gaps) != 1 || gaps[0].Zone != "us-central1-b" {
		t.Fatalf("Reservations error %v: want a partial list with one gap, us-central1-b", err)
	}
	if len(got) != 1 || got[0].ID != "h100s" {
		t.Fatalf("Reservations = %+v, want h100s from the zone that answered", got)
	}
	offers, err := e.prov.Offerings(ctx)
	if _, partial := launcher.Partial(err); !partial {
		t.Fatalf("Offerings error %v: want a partial list", err)
	}
	if !slices.ContainsFunc(offers, func(o launcher.Offering) bool { return o.Reservation != nil && o.Reservation.ID == "h100s" }) {
		t.Errorf("Offerings %+v lack h100s", offers)
	}
}
