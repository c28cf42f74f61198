package fakeec2

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
}

func runInBlock(ctx context.Context, c *ec2.Client, cr, market string, n int32) (*ec2.RunInstancesOutput, error) {
	in := &ec2.RunInstancesInput{
		ImageId: awssdk.String("ami-0123"), InstanceType: types.InstanceType("p5.48xlarge"), MinCount: awssdk.Int32(n), MaxCount: awssdk.Int32(n),
		CapacityReservationSpecification: &types.CapacityReservationSpecification{
			CapacityReservationTarget: &types.CapacityReservationTarget{CapacityReservationId: awssdk.String(cr)},
		},
	}
	if market != "" {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketType(market)}
	}
	return c.RunInstances(ctx, in)
}

func describeCR(t *testing.T, c *ec2.Client, id string) types.CapacityReservation {
	t.Helper()
	out, err := c.DescribeCapacityReservations(context.Background(), &ec2.DescribeCapacityReservationsInput{CapacityReservationIds: []string{id}})
	if err != nil || len(out.CapacityReservations) != 1 {
		t.Fatalf("describe %s: %v, %d reservations", id, err, len(out.CapacityReservations))
	}
	return out.CapacityReservations[0]
}

// TestCapacityBlockLifecycle drives a capacity block through the SDK: an offering found by
// duration and count, bought, refused while scheduled, launched into while active up to its
// count, its instances terminated its termination lead before the end, then expired.
func TestCapacityBlockLifecycle(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: t0}
	s := newServer(t, Options{Now: clock.Now, CapacityBlockTerminationLead: 5 * time.Minute})
	c := client(s, "AKID")
	ctx := context.Background()
	var zoneName string
	for _, name := range s.ZoneNames("us-east-1") {
		zoneName = max(zoneName, name)
	}
	start, end := t0.Add(time.Hour), t0.Add(25*time.Hour)
	if _, err := s.OfferCapacityBlock(BlockOffering{Zone: zoneName, InstanceType: "p5.48xlarge", InstanceCount: 2, Start: start, End: end, UpfrontFee: 1234.5}); err != nil {
		t.Fatal(err)
	}
	_, err := c.DescribeCapacityBlockOfferings(ctx, &ec2.DescribeCapacityBlockOfferingsInput{CapacityDurationHours: awssdk.Int32(25), InstanceType: awssdk.String("p5.48xlarge"), InstanceCount: awssdk.Int32(2)})
	wantCode(t, err, "InvalidParameterValue")
	none, err := c.DescribeCapacityBlockOfferings(ctx, &ec2.DescribeCapacityBlockOfferingsInput{CapacityDurationHours: awssdk.Int32(24), InstanceType: awssdk.String("p5.48xlarge"), InstanceCount: awssdk.Int32(4)})
	if err != nil || len(none.CapacityBlockOfferings) != 0 {
		t.Fatalf("offerings of 4: %v, %+v", err, none)
	}
	offers, err := c.DescribeCapacityBlockOfferings(ctx, &ec2.DescribeCapacityBlockOfferingsInput{
		CapacityDurationHours: awssdk.Int32(24), InstanceType: awssdk.String("p5.48xlarge"), InstanceCount: awssdk.Int32(2), StartDateRange: awssdk.Time(t0),
	})
	if err != nil || len(offers.CapacityBlockOfferings) != 1 {
		t.Fatalf("offerings: %v, %+v", err, offers)
	}
	o := offers.CapacityBlockOfferings[0]
	if awssdk.ToString(o.UpfrontFee) != "1234.50" || !awssdk.ToTime(o.StartDate).Equal(start) || awssdk.ToInt32(o.CapacityBlockDurationHours) != 24 || awssdk.ToString(o.AvailabilityZone) != zoneName {
		t.Fatalf("offering %+v", o)
	}
	bought, err := c.PurchaseCapacityBlock(ctx, &ec2.PurchaseCapacityBlockInput{CapacityBlockOfferingId: o.CapacityBlockOfferingId, InstancePlatform: types.CapacityReservationInstancePlatformLinuxUnix})
	if err != nil {
		t.Fatal(err)
	}
	cr := awssdk.ToString(bought.CapacityReservation.CapacityReservationId)
	if bought.CapacityReservation.ReservationType != types.CapacityReservationTypeCapacityBlock || bought.CapacityReservation.State != types.CapacityReservationStateScheduled ||
		len(bought.CapacityBlocks) != 1 || bought.CapacityBlocks[0].CapacityReservationIds[0] != cr {
		t.Fatalf("purchase: %+v %+v", bought.CapacityReservation, bought.CapacityBlocks)
	}
	_, err = c.PurchaseCapacityBlock(ctx, &ec2.PurchaseCapacityBlockInput{CapacityBlockOfferingId: o.CapacityBlockOfferingId, InstancePlatform: types.CapacityReservationInstancePlatformLinuxUnix})
	wantCode(t, err, "InvalidParameterValue") // bought once

	_, err = runInBlock(ctx, c, cr, "capacity-block", 1)
	wantCode(t, err, "ReservationCapacityExceeded") // scheduled: nothing available yet
	clock.set(start)
	_, err = runInBlock(ctx, c, cr, "", 1)
	wantCode(t, err, "InvalidParameterCombination") // a block needs its market type
	run, err := runInBlock(ctx, c, cr, "capacity-block", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range run.Instances {
		if in.InstanceLifecycle != types.InstanceLifecycleTypeCapacityBlock || awssdk.ToString(in.CapacityReservationId) != cr || awssdk.ToString(in.Placement.AvailabilityZone) != zoneName {
			t.Fatalf("instance %s: lifecycle %q reservation %q zone %q", awssdk.ToString(in.InstanceId), in.InstanceLifecycle, awssdk.ToString(in.CapacityReservationId), awssdk.ToString(in.Placement.AvailabilityZone))
		}
	}
	if got := describeCR(t, c, cr); got.State != types.CapacityReservationStateActive || awssdk.ToInt32(got.AvailableInstanceCount) != 0 {
		t.Fatalf("active block: %s, %d available", got.State, awssdk.ToInt32(got.AvailableInstanceCount))
	}
	_, err = runInBlock(ctx, c, cr, "capacity-block", 1)
	wantCode(t, err, "ReservationCapacityExceeded") // full

	clock.set(end.Add(-5 * time.Minute))
	for _, in := range s.Instances() {
		if in.State != "shutting-down" || in.StateReason != ReasonCapacityBlockEnded || !in.CapacityBlock {
			t.Fatalf("at the termination lead: %s %s (%s)", in.ID, in.State, in.StateReason)
		}
	}
	clock.set(end)
	if got := describeCR(t, c, cr); got.State != types.CapacityReservationStateExpired {
		t.Fatalf("after its end the block is %s", got.State)
	}
}

// TestOpenAndTargetedODCRs: an open ODCR takes matching on-demand launches until full, a
// targeted one only launches that name it, and preference none stays out of both.
func TestOpenAndTargetedODCRs(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "AKID")
	ctx := context.Background()
	var zoneName string
	for _, name := range s.ZoneNames("us-east-1") {
		zoneName = max(zoneName, name)
	}
	open, err := s.AddReservation(Reservation{Zone: zoneName, InstanceType: "g5.xlarge", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	targeted, err := s.AddReservation(Reservation{Zone: zoneName, InstanceType: "g5.xlarge", Count: 1, Match: MatchTargeted})
	if err != nil {
		t.Fatal(err)
	}
	launch := func(pref types.CapacityReservationPreference, target string) (string, error) {
		in := &ec2.RunInstancesInput{ImageId: awssdk.String("ami-0123"), InstanceType: types.InstanceTypeG5Xlarge, MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
			Placement: &types.Placement{AvailabilityZone: awssdk.String(zoneName)}}
		if pref != "" || target != "" {
			in.CapacityReservationSpecification = &types.CapacityReservationSpecification{CapacityReservationPreference: pref}
			if target != "" {
				in.CapacityReservationSpecification.CapacityReservationTarget = &types.CapacityReservationTarget{CapacityReservationId: awssdk.String(target)}
			}
		}
		out, err := c.RunInstances(ctx, in)
		if err != nil {
			return "", err
		}
		return awssdk.ToString(out.Instances[0].CapacityReservationId), nil
	}
	for i, want := range []string{open, ""} {
		got, err := launch("", "")
		if err != nil || got != want {
			t.Fatalf("untargeted launch %d went into %q (%v), want %q", i, got, err, want)
		}
	}
	if got, err := launch(types.CapacityReservationPreferenceNone, ""); err != nil || got != "" {
		t.Fatalf("preference none went into %q (%v)", got, err)
	}
	if got, err := launch("", targeted); err != nil || got != targeted {
		t.Fatalf("targeted launch went into %q (%v)", got, err)
	}
	_, err = launch("", targeted)
	wantCode(t, err, "ReservationCapacityExceeded")
	_, err = launch("", "cr-00000000000000000")
	wantCode(t, err, "InvalidCapacityReservationId.NotFound")
	list, err := c.DescribeCapacityReservations(ctx, &ec2.DescribeCapacityReservationsInput{
		Filters: []types.Filter{{Name: awssdk.String("instance-match-criteria"), Values: []string{"targeted"}}},
	})
	if err != nil || len(list.CapacityReservations) != 1 || awssdk.ToString(list.CapacityReservations[0].CapacityReservationId) != targeted {
		t.Fatalf("targeted reservations: %v %+v", err, list)
	}
}
