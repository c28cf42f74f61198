package aws

import (
	"context"
	"fmt"
	"strconv"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// Capacity Blocks for ML ("Capacity Blocks for ML", EC2 User Guide): GPU instances reserved
// for a fixed window, paid up front. EC2's rules Ferry follows:
//
//   - Durations are whole days up to 14 days, then whole weeks up to 182 days; a block holds up
//     to 64 instances ("Find and purchase Capacity Blocks"). Every block ends at 11:30 UTC.
//   - A bought block is a targeted Capacity Reservation of type capacity-block, scheduled until
//     its start (no instance may launch before it: ReservationCapacityExceeded), then active.
//     Launches name it and use market type capacity-block ("Launch instances using Capacity
//     Blocks").
//   - "Thirty minutes before the reservation expires, we begin to terminate any instances that
//     are still running in the Capacity Block" ("Work with Capacity Blocks"); EC2's EventBridge
//     warning comes 10 minutes before that ("Monitor Capacity Blocks").
//
// Ferry never buys a block by itself: a purchase is a non-refundable charge. It lists
// offerings and buys one only when a person asks (CapacityBlockOfferings, PurchaseCapacityBlock),
// and otherwise uses the blocks the account holds. Notices announces each of Ferry's instances
// in a block Options.ReservationNoticeLead before EC2 terminates it, so that a service replica
// is replaced while it still serves.

// DefaultCapacityBlockTerminationLead is how long before a capacity block's end EC2 starts
// terminating its instances.
const DefaultCapacityBlockTerminationLead = 30 * time.Minute

// CheckBlockDuration reports whether d is a duration EC2 sells capacity blocks for: whole days
// up to 14, whole weeks up to 182 days.
func CheckBlockDuration(d time.Duration) error {
	const day = 24 * time.Hour
	if d <= 0 || d%day != 0 || d > 14*day && (d%(7*day) != 0 || d > 182*day) {
		return fmt.Errorf("%w: %s: a capacity block lasts whole days up to 14 days, then whole weeks up to 182 days, not %v", launcher.ErrInvalid, InfraName, d)
	}
	return nil
}

// BlockOffering is one capacity block EC2 offers for sale.
type BlockOffering struct {
	ID, Region, Zone, InstanceType string
	Count                          int
	Start, End                     time.Time
	// UpfrontFee is the whole block's price in Currency, as EC2 quotes it.
	UpfrontFee, Currency string
}

// BlockQuery is what CapacityBlockOfferings searches for.
type BlockQuery struct {
	Region, InstanceType string
	Count                int
	Duration             time.Duration
	// From and To bound the window's start and end; zero is EC2's default (from now).
	From, To time.Time
}

// CapacityBlockOfferings asks EC2 which capacity blocks it would sell for q. It costs nothing.
func (p *Provider) CapacityBlockOfferings(ctx context.Context, q BlockQuery) ([]BlockOffering, error) {
	if q.Region == "" {
		q.Region = p.opts.Regions[0]
	}
	c, err := p.client(q.Region)
	if err != nil {
		return nil, err
	}
	if err := CheckBlockDuration(q.Duration); err != nil {
		return nil, err
	}
	if q.Count < 1 || q.Count > 64 || q.InstanceType == "" {
		return nil, fmt.Errorf("%w: %s: a capacity block is 1 to 64 instances of one type", launcher.ErrInvalid, InfraName)
	}
	in := &ec2.DescribeCapacityBlockOfferingsInput{
		CapacityDurationHours: awssdk.Int32(int32(q.Duration / time.Hour)), InstanceType: awssdk.String(q.InstanceType),
		InstanceCount: awssdk.Int32(int32(q.Count)),
	}
	if !q.From.IsZero() {
		in.StartDateRange = awssdk.Time(q.From)
	}
	if !q.To.IsZero() {
		in.EndDateRange = awssdk.Time(q.To)
	}
	var out []BlockOffering
	pages := ec2.NewDescribeCapacityBlockOfferingsPaginator(c, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err, "describe capacity block offerings in "+q.Region)
		}
		for _, o := range page.CapacityBlockOfferings {
			out = append(out, BlockOffering{
				ID: awssdk.ToString(o.CapacityBlockOfferingId), Region: q.Region, Zone: awssdk.ToString(o.AvailabilityZone),
				InstanceType: awssdk.ToString(o.InstanceType), Count: int(awssdk.ToInt32(o.InstanceCount)),
				Start: awssdk.ToTime(o.StartDate), End: awssdk.ToTime(o.EndDate), UpfrontFee: awssdk.ToString(o.UpfrontFee), Currency: awssdk.ToString(o.CurrencyCode),
			})
		}
	}
	return out, nil
}

// PurchaseCapacityBlock buys the offering (a Linux/UNIX block) and returns its reservation.
// It charges the account the offering's upfront fee: call it only on a person's explicit
// request.
func (p *Provider) PurchaseCapacityBlock(ctx context.Context, region, offeringID string) (launcher.ReservationOffer, error) {
	if region == "" {
		region = p.opts.Regions[0]
	}
	c, err := p.client(region)
	if err != nil {
		return launcher.ReservationOffer{}, err
	}
	out, err := c.PurchaseCapacityBlock(ctx, &ec2.PurchaseCapacityBlockInput{
		CapacityBlockOfferingId: awssdk.String(offeringID), InstancePlatform: types.CapacityReservationInstancePlatformLinuxUnix,
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeCapacityReservation,
			Tags: []types.Tag{{Key: awssdk.String(launcher.LabelOwner), Value: awssdk.String("true")}}}},
	})
	if err != nil {
		return launcher.ReservationOffer{}, classify(err, "purchase capacity block "+offeringID)
	}
	if out.CapacityReservation == nil {
		return launcher.ReservationOffer{}, fmt.Errorf("%s: purchase capacity block %s: EC2 returned no reservation", InfraName, offeringID)
	}
	r := p.reservationOffer(region, *out.CapacityReservation)
	p.log.Info("purchased capacity block", zap.String("offering", offeringID), zap.String("reservation", r.ID),
		zap.Time("start", r.Start), zap.Time("terminates", r.End))
	return r, nil
}

// blockEnds adds region's Ferry instances in capacity blocks whose termination is within
// Options.ReservationNoticeLead, reclaimed when EC2 begins terminating them.
func (p *Provider) blockEnds(ctx context.Context, region string, now time.Time, reclaims map[string]time.Time) error {
	filters := []types.Filter{
		{Name: awssdk.String("tag:" + launcher.LabelOwner), Values: []string{"true"}},
		{Name: awssdk.String("instance-lifecycle"), Values: []string{string(types.InstanceLifecycleTypeCapacityBlock)}},
		{Name: awssdk.String("instance-state-name"), Values: []string{"pending", "running"}},
	}
	byReservation := map[string][]string{}
	err := p.describe(ctx, region, filters, func(in types.Instance) {
		if cr := awssdk.ToString(in.CapacityReservationId); cr != "" {
			byReservation[cr] = append(byReservation[cr], InfraName+"/"+region+"/"+awssdk.ToString(in.InstanceId))
		}
	})
	if err != nil || len(byReservation) == 0 {
		return err
	}
	ids := make([]string, 0, len(byReservation))
	for id := range byReservation {
		ids = append(ids, id)
	}
	crs, err := p.describeReservations(ctx, region, ids)
	if err != nil {
		return err
	}
	for _, cr := range crs {
		r := p.reservationOffer(region, cr)
		if r.End.IsZero() || now.Before(r.End.Add(-p.opts.ReservationNoticeLead)) {
			continue
		}
		for _, id := range byReservation[r.ID] {
			if at, ok := reclaims[id]; !ok || r.End.Before(at) {
				reclaims[id] = r.End
			}
		}
	}
	return nil
}

// blockReason is an instance's Reason once its capacity block ended it.
func blockReason(in types.Instance) string {
	return "capacity block " + awssdk.ToString(in.CapacityReservationId) + " ended (" + strconv.Quote(awssdk.ToString(in.StateTransitionReason)) + ")"
}
