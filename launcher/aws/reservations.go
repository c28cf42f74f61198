package aws

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// Reserved capacity on EC2: Capacity Reservations, which Ferry uses but never creates.
//
//   - On-Demand Capacity Reservations (ODCRs, type "default"): capacity in one zone, billed at
//     the on-demand rate whether used or not. An open one takes any matching on-demand launch
//     by itself; a targeted one only launches that name it.
//   - Capacity Blocks for ML (type "capacity-block"): GPU instances bought up front for a fixed
//     window (capacityblocks.go). Always targeted; launches need market type capacity-block;
//     EC2 terminates what still runs in a block 30 minutes before its end.
//
// A placement with Reservation "cr-…" launches into that reservation; a task whose
// resources.capacity names one (or `any`) and whose placement does not gets one resolved here.
// A block that has not started yet is a wait (launcher.ErrQueued), not a failure.

// Reservation states worth offering: those that hold capacity now or will.
var liveReservationStates = []string{"active", "scheduled", "payment-pending"}

// reservationOffer maps an EC2 Capacity Reservation to the launcher's view. A capacity block's
// End is when EC2 begins terminating its instances (its end date less
// Options.CapacityBlockTerminationLead), the end that matters to whatever runs in it.
func (p *Provider) reservationOffer(region string, cr types.CapacityReservation) launcher.ReservationOffer {
	r := launcher.ReservationOffer{
		ID: awssdk.ToString(cr.CapacityReservationId), Infra: InfraName, Region: region,
		Zone: awssdk.ToString(cr.AvailabilityZone), InstanceType: awssdk.ToString(cr.InstanceType),
		Count: int(awssdk.ToInt32(cr.TotalInstanceCount)), Kind: launcher.KindAWSODCR,
	}
	for _, t := range cr.Tags {
		if awssdk.ToString(t.Key) == tagName {
			r.Name = awssdk.ToString(t.Value)
		}
	}
	if cr.State == types.CapacityReservationStateActive {
		r.InUse = r.Count - int(awssdk.ToInt32(cr.AvailableInstanceCount))
	}
	if cr.StartDate != nil && cr.State != types.CapacityReservationStateActive {
		r.Start = *cr.StartDate
	}
	if cr.EndDate != nil {
		r.End = *cr.EndDate
	}
	if cr.ReservationType == types.CapacityReservationTypeCapacityBlock {
		r.Kind = launcher.KindAWSCapacityBlock
		if !r.End.IsZero() {
			r.End = r.End.Add(-p.opts.CapacityBlockTerminationLead)
		}
	}
	if row, ok := catalogRow(r.InstanceType); ok {
		r.Accelerator = row.Accelerator
	}
	return r
}

// catalogRow is any catalog row of an AWS instance type, for its shape.
func catalogRow(instanceType string) (catalog.Row, bool) {
	for _, row := range catalog.Default().Rows() {
		if row.Cloud == catalog.AWS && row.InstanceType == instanceType {
			return row, true
		}
	}
	return catalog.Row{}, false
}

// describeReservations pages through region's Capacity Reservations in liveReservationStates
// (or those in ids, whatever their state).
func (p *Provider) describeReservations(ctx context.Context, region string, ids []string) ([]types.CapacityReservation, error) {
	in := &ec2.DescribeCapacityReservationsInput{CapacityReservationIds: ids}
	if len(ids) == 0 {
		in.Filters = []types.Filter{{Name: awssdk.String("state"), Values: liveReservationStates}}
		in.MaxResults = awssdk.Int32(1000)
	}
	var out []types.CapacityReservation
	pages := ec2.NewDescribeCapacityReservationsPaginator(p.clients[region], in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err, "describe capacity reservations in "+region)
		}
		out = append(out, page.CapacityReservations...)
	}
	return out, nil
}

// Reservations lists the account's live Capacity Reservations and Capacity Blocks in every
// configured region, with how many instances run in each (launcher.Reserver). The
// credentials need ec2:DescribeCapacityReservations. The regions are asked at once; a region
// that fails is left out, named in a launcher.PartialList error returned with the others'
// reservations (regions.go).
func (p *Provider) Reservations(ctx context.Context) ([]launcher.ReservationOffer, error) {
	out, gaps := perRegion(ctx, p.opts.Regions, func(ctx context.Context, region string) ([]launcher.ReservationOffer, error) {
		crs, err := p.describeReservations(ctx, region, nil)
		if err != nil {
			return nil, err
		}
		var offers []launcher.ReservationOffer
		for _, cr := range crs {
			offers = append(offers, p.reservationOffer(region, cr))
		}
		return offers, nil
	})
	return out, p.regionsError(gaps)
}

// Offerings are the account's reservations as places to launch (launcher.Offerer): one per
// Capacity Reservation or Capacity Block that is active or scheduled, with its window and
// free room, shaped from the catalog, at PricePerHour 0 (paid for whether used or not; the
// optimizer ranks them first). Zone is the reservation's AZ ID, as the catalog's zones are.
// A block close to its end is offered too: the optimizer leaves out, for a service, windows
// shorter than the replicas' window lead (saying so), and a job may use a block to its end.
// On-demand and spot shapes stay the catalog's. As with Reservations, a region that fails is a gap in a launcher.PartialList
// error returned with the other regions' offerings.
func (p *Provider) Offerings(ctx context.Context) ([]launcher.Offering, error) {
	now := time.Now()
	out, gaps := perRegion(ctx, p.opts.Regions, func(ctx context.Context, region string) ([]launcher.Offering, error) {
		crs, err := p.describeReservations(ctx, region, nil)
		if err != nil {
			return nil, err
		}
		var offers []launcher.Offering
		for _, cr := range crs {
			r := p.reservationOffer(region, cr)
			if !r.End.IsZero() && !now.Before(r.End) {
				continue // over
			}
			o := launcher.Offering{InstanceType: r.InstanceType, Region: region, Zone: awssdk.ToString(cr.AvailabilityZoneId), Total: -1, Free: -1, Reservation: &r}
			if o.Zone == "" {
				o.Zone = r.Zone
			}
			if row, ok := catalogRow(r.InstanceType); ok {
				o.Accelerator, o.AcceleratorCount, o.VCPUs, o.MemoryGiB = row.Accelerator, float64(row.AcceleratorCount), row.VCPUs, row.MemoryGiB
				o.Total, o.Free = r.Count*row.AcceleratorCount, r.Free()*row.AcceleratorCount
			}
			offers = append(offers, o)
		}
		return offers, nil
	})
	return out, p.regionsError(gaps)
}

// reservedLaunch is what a launch into a reservation needs.
type reservedLaunch struct {
	id    string
	block bool
	zone  string // the reservation's zone name
	end   time.Time
}

// resolveReservation decides which reservation, if any, a launch of spec in region goes
// into: the placement's, else the one resources.capacity names, else (`any`) an active one of
// the placement's instance type, in its zone if it has one, with room. A reservation that has
// not started is a wait (launcher.ErrQueued) until its start; one that ended, is full, or is
// for another instance type or zone is no capacity here, so the provisioner tries elsewhere.
func (p *Provider) resolveReservation(ctx context.Context, spec launcher.Spec, region, zone string) (*reservedLaunch, error) {
	want := spec.Placement.Reservation
	capacity := spec.Resources.Capacity
	if want == "" && !spec.Placement.Spot && capacity != nil && capacity.Mode == configs.CapacityReserved {
		want = capacity.Reservation
		if want == "" {
			want = configs.ReservationAny
		}
	}
	if want == "" {
		return nil, nil
	}
	var ids []string
	if want != configs.ReservationAny {
		if !strings.HasPrefix(want, "cr-") {
			return nil, fmt.Errorf("%w: %s: reservation %q is not a Capacity Reservation id (cr-...)", launcher.ErrInvalid, InfraName, want)
		}
		ids = []string{want}
	}
	crs, err := p.describeReservations(ctx, region, ids)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var waitFor *types.CapacityReservation
	for i := range crs {
		cr := &crs[i]
		if awssdk.ToString(cr.InstanceType) != spec.Placement.InstanceType ||
			zone != "" && zone != awssdk.ToString(cr.AvailabilityZone) && zone != awssdk.ToString(cr.AvailabilityZoneId) {
			continue
		}
		r := p.reservationOffer(region, *cr)
		switch {
		case cr.State == types.CapacityReservationStateActive && r.Free() > 0 && (r.End.IsZero() || now.Before(r.End)):
			return &reservedLaunch{id: r.ID, block: r.Kind == launcher.KindAWSCapacityBlock, zone: r.Zone, end: r.End}, nil
		case slices.Contains([]types.CapacityReservationState{"scheduled", "payment-pending"}, cr.State) && r.Free() > 0:
			if waitFor == nil || cr.StartDate != nil && waitFor.StartDate != nil && cr.StartDate.Before(*waitFor.StartDate) {
				waitFor = cr
			}
		}
	}
	if waitFor != nil {
		since := now
		if waitFor.CreateDate != nil {
			since = *waitFor.CreateDate
		}
		return nil, launcher.Queued(since, "%s: capacity reservation %s (%s) starts at %s", InfraName, awssdk.ToString(waitFor.CapacityReservationId),
			waitFor.ReservationType, awssdk.ToTime(waitFor.StartDate).UTC().Format(time.RFC3339))
	}
	where := region
	if zone != "" {
		where = zone
	}
	return nil, fmt.Errorf("%w: %s: no active capacity reservation %s for %s in %s with room", launcher.ErrNoCapacity, InfraName, want, spec.Placement.InstanceType, where)
}

// setWindow sets WindowEnd on instances launched into a capacity block: when EC2 begins
// terminating them.
func (lp *launchPlan) setWindow(insts []launcher.Instance) {
	if lp.reservation == nil || !lp.reservation.block {
		return
	}
	for i := range insts {
		insts[i].WindowEnd = lp.reservation.end
	}
}

// reserve aims a RunInstances call at a reservation: a capacity block also needs its market
// type, and only targeted launches may enter it.
func reserve(in *ec2.RunInstancesInput, r *reservedLaunch) {
	in.CapacityReservationSpecification = &types.CapacityReservationSpecification{
		CapacityReservationTarget: &types.CapacityReservationTarget{CapacityReservationId: awssdk.String(r.id)},
	}
	if r.block {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeCapacityBlock}
	}
}

// blockEndTTL is how long a capacity block's end is trusted once read: fixed once bought, it
// moves only if the block is extended.
const blockEndTTL = 5 * time.Minute

// windowCache holds capacity blocks' ends (when EC2 begins terminating their instances) by
// reservation id, so that List reports Instance.WindowEnd without a call per pass.
type windowCache struct {
	mu sync.Mutex
	m  map[string]cachedEnd
}

type cachedEnd struct {
	end, read time.Time
}

// blockInstance is an instance of List's answer that runs in a capacity block.
type blockInstance struct {
	index               int
	region, reservation string
}

// setWindowEnds fills Instance.WindowEnd for the instances List found in capacity blocks, so
// that a replica in one is replaced its lead before EC2 terminates it (replicas/window.go).
// An end that cannot be read is left zero and logged: Notices still warns of it.
func (p *Provider) setWindowEnds(ctx context.Context, out []launcher.Instance, found []blockInstance) {
	now := time.Now()
	p.windows.mu.Lock()
	if p.windows.m == nil {
		p.windows.m = map[string]cachedEnd{}
	}
	stale := map[string][]string{} // region -> reservation ids to read
	for _, b := range found {
		if c, ok := p.windows.m[b.reservation]; !ok || now.Sub(c.read) > blockEndTTL {
			if !slices.Contains(stale[b.region], b.reservation) {
				stale[b.region] = append(stale[b.region], b.reservation)
			}
		}
	}
	p.windows.mu.Unlock()
	for region, ids := range stale {
		crs, err := p.describeReservations(ctx, region, ids)
		if err != nil {
			p.log.Warn("read capacity block ends", zap.String("region", region), zap.Strings("reservations", ids), zap.Error(err))
			continue
		}
		p.windows.mu.Lock()
		for _, cr := range crs {
			p.windows.m[awssdk.ToString(cr.CapacityReservationId)] = cachedEnd{end: p.reservationOffer(region, cr).End, read: now}
		}
		p.windows.mu.Unlock()
	}
	p.windows.mu.Lock()
	defer p.windows.mu.Unlock()
	for _, b := range found {
		out[b.index].WindowEnd = p.windows.m[b.reservation].end
	}
}
