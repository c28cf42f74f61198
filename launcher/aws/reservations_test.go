package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
)

func reservedSpec(name, reservation string) launcher.Spec {
	s := spec(name, "exec sleep 300", false)
	s.Placement.Zone = ""
	s.Placement.Reservation = reservation
	return s
}

// TestLaunchIntoCapacityBlock: a launch into a block that has not started waits
// (launcher.ErrQueued, saying until when); one into an active block lands in its zone and
// counts against it; Notices warns of the block's end ReservationNoticeLead ahead, with At when
// EC2 begins terminating its instances, 30 minutes before the end; and once EC2 has, List
// reports the instance preempted by its block. At the first block's start, its launch goes in.
func TestLaunchIntoCapacityBlock(t *testing.T) {
	clock := &fakeClock{}
	e := newEnv(t, fakeec2.Options{Now: clock.now}, goodKey)
	e.p.opts.ReservationNoticeLead = 10 * time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	notices := e.p.Notices(ctx)
	stopWatcher(t, cancel, notices)
	now := clock.now().Truncate(time.Second)
	later, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 1,
		Type: fakeec2.ReservationTypeCapacityBlock, Start: now.Add(time.Hour), End: now.Add(25 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Launch(ctx, reservedSpec("chat-later", later))
	q, ok := launcher.AsQueued(err)
	if !errors.Is(err, launcher.ErrQueued) || !ok || !strings.Contains(q.Reason, later) || !strings.Contains(q.Reason, now.Add(time.Hour).UTC().Format(time.RFC3339)) {
		t.Fatalf("launch into a scheduled block: %v, want ErrQueued until its start", err)
	}

	// Active now; EC2 terminates its instances 5 minutes from now, inside the notice lead.
	end := now.Add(fakeec2.DefaultCapacityBlockTerminationLead + 5*time.Minute)
	block, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 1,
		Type: fakeec2.ReservationTypeCapacityBlock, Start: now.Add(-time.Minute), End: end})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := e.p.Launch(ctx, reservedSpec("chat-block", block))
	if err != nil {
		t.Fatal(err)
	}
	terminates := end.Add(-fakeec2.DefaultCapacityBlockTerminationLead)
	listed, err := e.p.List(ctx, map[string]string{launcher.LabelReplicaID: "chat-block"})
	if err != nil || len(listed) != 1 || !listed[0].WindowEnd.Equal(terminates) || !inst.WindowEnd.Equal(terminates) {
		t.Fatalf("window end: launched %v, listed %+v (%v); want %v", inst.WindowEnd, listed, err, terminates)
	}
	fi := fakeInstance(t, e.fake, inst.ID)
	if fi.Reservation != block || !fi.CapacityBlock || fi.ZoneID != testZoneID {
		t.Fatalf("instance in %q (block %v) in %s, want block %s in %s", fi.Reservation, fi.CapacityBlock, fi.ZoneID, block, testZoneID)
	}
	if _, err := e.p.Launch(ctx, reservedSpec("chat-full", block)); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("launch into a full block: %v, want ErrNoCapacity", err)
	}
	n := nextNotice(t, notices)
	if n.InstanceID != inst.ID || !n.At.Equal(terminates) {
		t.Fatalf("notice %+v, want %s at %s", n, inst.ID, terminates)
	}

	clock.advance(6 * time.Minute)
	waitFor(t, testTimeout, "List to show the block's end", func() (bool, string) {
		got, err := e.p.List(ctx, map[string]string{launcher.LabelReplicaID: "chat-block"})
		if err != nil || len(got) != 1 {
			return false, fmt.Sprint(got, err)
		}
		return got[0].State == launcher.StatePreempted && strings.Contains(got[0].Reason, "capacity block "+block), fmt.Sprintf("%+v", got[0])
	})

	// The first block's start: the waiting launch goes in.
	clock.advance(time.Hour)
	started, err := e.p.Launch(ctx, reservedSpec("chat-later", later))
	if err != nil {
		t.Fatalf("launch once the block started: %v", err)
	}
	if fi := fakeInstance(t, e.fake, started.ID); fi.Reservation != later {
		t.Fatalf("instance in %q, want %s", fi.Reservation, later)
	}
}

// TestReservationsAndOfferings: the account's live reservations are listed with their use,
// kind and window (a block's end moved to its termination), and offered with the catalog's
// shape at no hourly price; a block that ends within the notice lead is not offered, and an
// expired one not listed.
func TestReservationsAndOfferings(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	now := time.Now()
	odcr, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 2, Match: fakeec2.MatchTargeted})
	if err != nil {
		t.Fatal(err)
	}
	end := now.Add(48 * time.Hour).Truncate(time.Second)
	block, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 4,
		Type: fakeec2.ReservationTypeCapacityBlock, Start: now.Add(24 * time.Hour).Truncate(time.Second), End: end})
	if err != nil {
		t.Fatal(err)
	}
	ending, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 1,
		Type: fakeec2.ReservationTypeCapacityBlock, Start: now.Add(-time.Hour), End: now.Add(35 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 1,
		Type: fakeec2.ReservationTypeCapacityBlock, Start: now.Add(-2 * time.Hour), End: now.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Launch(ctx, reservedSpec("chat-odcr", odcr)); err != nil {
		t.Fatal(err)
	}
	rs, err := e.p.Reservations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]launcher.ReservationOffer{}
	for _, r := range rs {
		byID[r.ID] = r
	}
	if len(rs) != 3 {
		t.Fatalf("listed %d reservations, want the ODCR and two live blocks: %+v", len(rs), rs)
	}
	if r := byID[odcr]; r.Kind != launcher.KindAWSODCR || r.Count != 2 || r.InUse != 1 || !r.End.IsZero() || r.Accelerator != "A10G" || r.Zone == "" {
		t.Errorf("ODCR listed as %+v", r)
	}
	if r := byID[block]; r.Kind != launcher.KindAWSCapacityBlock || r.Count != 4 || r.InUse != 0 || !r.End.Equal(end.Add(-30*time.Minute)) || r.Start.IsZero() {
		t.Errorf("scheduled block listed as %+v", r)
	}
	offers, err := e.p.Offerings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]launcher.Offering{}
	for _, o := range offers {
		got[o.Reservation.ID] = o
	}
	// The block that ends soon is offered too, with its end: the optimizer leaves it out for a
	// service (windows shorter than the replicas' lead) and lets a job run to its end.
	if o, ok := got[ending]; !ok || len(got) != 3 || o.Reservation.End.After(now.Add(10*time.Minute)) {
		t.Fatalf("offerings %+v: want the ODCR, the scheduled block and the block ending in 5 minutes", offers)
	}
	if o := got[odcr]; o.Zone != testZoneID || o.Accelerator != "A10G" || o.PricePerHour != 0 || o.Total != 2 || o.Free != 1 || o.InstanceType != testType {
		t.Errorf("ODCR offered as %+v", o)
	}
}

// TestReservedCapacityAny: a task in mode reserved with reservation `any` and no reservation
// in its placement gets an active one of its type with room, and no capacity once none is left.
func TestReservedCapacityAny(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	cr, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 1, Match: fakeec2.MatchTargeted})
	if err != nil {
		t.Fatal(err)
	}
	s := reservedSpec("chat-any", "")
	s.Resources.Capacity = &configs.Capacity{Mode: configs.CapacityReserved, Reservation: configs.ReservationAny}
	inst, err := e.p.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if fi := fakeInstance(t, e.fake, inst.ID); fi.Reservation != cr {
		t.Fatalf("instance in %q, want %s", fi.Reservation, cr)
	}
	s.Name = "chat-any-2"
	if _, err := e.p.Launch(ctx, s); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("second launch: %v, want ErrNoCapacity", err)
	}
	s.Resources.Capacity.Reservation = "r-bogus"
	if _, err := e.p.Launch(ctx, s); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("launch into %q: %v, want ErrInvalid", s.Resources.Capacity.Reservation, err)
	}
}

// TestBuyCapacityBlock: offerings are searched with EC2's duration rule, and a purchase
// returns the new block's reservation, scheduled for the offering's window.
func TestBuyCapacityBlock(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	start := time.Now().Add(2 * time.Hour).Truncate(time.Second)
	if _, err := e.fake.OfferCapacityBlock(fakeec2.BlockOffering{Zone: testZoneID, InstanceType: "p5.48xlarge", InstanceCount: 2,
		Start: start, End: start.Add(24 * time.Hour), UpfrontFee: 100}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{0, 36 * time.Hour, 15 * 24 * time.Hour, 189 * 24 * time.Hour} {
		if err := CheckBlockDuration(d); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("duration %v: %v, want ErrInvalid", d, err)
		}
	}
	for _, d := range []time.Duration{24 * time.Hour, 14 * 24 * time.Hour, 21 * 24 * time.Hour, 182 * 24 * time.Hour} {
		if err := CheckBlockDuration(d); err != nil {
			t.Errorf("duration %v: %v", d, err)
		}
	}
	offers, err := e.p.CapacityBlockOfferings(ctx, BlockQuery{InstanceType: "p5.48xlarge", Count: 2, Duration: 24 * time.Hour})
	if err != nil || len(offers) != 1 || offers[0].UpfrontFee != "100.00" || !offers[0].Start.Equal(start) {
		t.Fatalf("offerings: %v %+v", err, offers)
	}
	r, err := e.p.PurchaseCapacityBlock(ctx, "", offers[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "cr-") || r.Kind != launcher.KindAWSCapacityBlock || !r.Start.Equal(start) || r.Count != 2 || r.Accelerator != "H100" {
		t.Fatalf("bought %+v", r)
	}
}

// TestGangInCapacityBlock: a gang in a block goes without a placement group (the block's
// instances are placed together already), all in the block, each with its window end; a gang
// the block has no room for is rolled back.
func TestGangInCapacityBlock(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	now := time.Now().Truncate(time.Second)
	end := now.Add(2 * time.Hour)
	block, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 2,
		Type: fakeec2.ReservationTypeCapacityBlock, Start: now.Add(-time.Minute), End: end})
	if err != nil {
		t.Fatal(err)
	}
	before := len(e.fake.PlacementGroups(testRegion))
	insts, err := launcher.LaunchGang(ctx, e.p, reservedSpec("train", block), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		fi := fakeInstance(t, e.fake, in.ID)
		if fi.Reservation != block || fi.PlacementGroup != "" || !in.WindowEnd.Equal(end.Add(-fakeec2.DefaultCapacityBlockTerminationLead)) {
			t.Fatalf("node %s: reservation %q, placement group %q, window end %v", in.Name, fi.Reservation, fi.PlacementGroup, in.WindowEnd)
		}
	}
	if after := len(e.fake.PlacementGroups(testRegion)); after != before {
		t.Fatalf("placement groups %d → %d, want none made for a gang in a block", before, after)
	}
	// One slot free again: a gang of two starts a node, fails on the second, and is rolled back.
	if err := e.p.Terminate(ctx, insts[1].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := launcher.LaunchGang(ctx, e.p, reservedSpec("more", block), 2); !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("a gang of 2 into a block with room for 1: %v, want ErrNoCapacity", err)
	}
	started := 0
	for _, fi := range e.fake.Instances() {
		if strings.HasPrefix(fi.Tags[tagName], "more-") {
			started++
			if fi.State != "shutting-down" && fi.State != "terminated" {
				t.Fatalf("the failed gang's node %s is %s, not rolled back", fi.ID, fi.State)
			}
		}
	}
	if started != 1 {
		t.Fatalf("%d nodes of the failed gang were started, want 1 (the one the block had room for)", started)
	}
}
