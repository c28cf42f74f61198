package fakeec2

import (
	"encoding/xml"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Capacity Blocks for ML. EC2's rules the fake keeps ("Find and purchase Capacity Blocks",
// EC2 User Guide): DescribeCapacityBlockOfferings takes a duration in hours, in 1-day steps up
// to 14 days and 7-day steps up to 182 days, and an instance count of at most 64 per block; a
// purchase becomes a targeted Capacity Reservation of type capacity-block, scheduled until its
// start and active until its end; and "thirty minutes before the reservation expires, we begin
// to terminate any instances that are still running in the Capacity Block" ("Work with
// Capacity Blocks"), which is Options.CapacityBlockTerminationLead here.
//
// What it does not keep: EC2 makes its own offerings (all ending at 11:30 UTC, up to six per
// query); the fake answers only those a test scripted with OfferCapacityBlock, with the window
// and fee the test chose, so a block can start in seconds and last a minute. A scripted
// offering is returned for any valid duration asked.

// DefaultCapacityBlockTerminationLead is how long before a capacity block's end EC2 terminates
// its instances.
const DefaultCapacityBlockTerminationLead = 30 * time.Minute

// ReasonCapacityBlockEnded is the state reason the fake gives an instance a capacity block's
// end terminated. EC2 does not document its own code for this; it is a Server.* code, as for
// every termination EC2 initiates.
const ReasonCapacityBlockEnded = "Server.CapacityBlockExpired"

// BlockOffering is a capacity block offering a test scripts with OfferCapacityBlock.
type BlockOffering struct {
	// Zone is an AZ ID or name; the offering is in its region.
	Zone          string
	InstanceType  string
	InstanceCount int
	Start, End    time.Time
	// UpfrontFee is the price of the whole block, in USD, as the test chose it.
	UpfrontFee float64
}

type blockOffering struct {
	BlockOffering
	id     string
	zone   zone
	region string
}

// OfferCapacityBlock makes an offering DescribeCapacityBlockOfferings answers until it is
// bought, and returns its id.
func (s *Server) OfferCapacityBlock(o BlockOffering) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	z, reg, ok := s.findZone(o.Zone)
	switch {
	case !ok:
		return "", fmt.Errorf("fakeec2: no zone %q", o.Zone)
	case o.InstanceType == "" || o.InstanceCount < 1 || o.InstanceCount > 64:
		return "", fmt.Errorf("fakeec2: an offering needs an instance type and 1 to 64 instances")
	case !o.End.After(o.Start):
		return "", fmt.Errorf("fakeec2: an offering needs an end after its start")
	}
	off := &blockOffering{BlockOffering: o, id: newID("cb-offer-"), zone: z, region: reg}
	s.book.offerings = append(s.book.offerings, off)
	return off.id, nil
}

// checkBlockDuration applies EC2's rule for CapacityDurationHours.
func checkBlockDuration(v string) *APIError {
	h, err := strconv.Atoi(v)
	if v == "" {
		return apiErr("MissingParameter", "The request must contain the parameter CapacityDurationHours")
	}
	if err != nil || h < 24 || h%24 != 0 || h > 14*24 && (h%(7*24) != 0 || h > 182*24) {
		return apiErr("InvalidParameterValue", "Invalid CapacityDurationHours %q: use 1-day increments up to 14 days and 7-day increments up to 182 days", v)
	}
	return nil
}

func (s *Server) describeCapacityBlockOfferings(m meta, reg *region, p params) (any, *APIError) {
	if aerr := checkBlockDuration(p.get("CapacityDurationHours")); aerr != nil {
		return nil, aerr
	}
	itype := p.get("InstanceType")
	count := 0
	if v := p.get("InstanceCount"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return nil, apiErr("InvalidParameterValue", "Invalid InstanceCount %q: a Capacity Block holds 1 to 64 instances", v)
		}
		count = n
	}
	from, aerr := paramTime(p, "StartDateRange")
	if aerr != nil {
		return nil, aerr
	}
	to, aerr := paramTime(p, "EndDateRange")
	if aerr != nil {
		return nil, aerr
	}
	var found []*blockOffering
	for _, o := range s.book.offerings {
		switch {
		case o.region != reg.name, itype != "" && o.InstanceType != itype, count != 0 && o.InstanceCount != count,
			!from.IsZero() && o.Start.Before(from), !to.IsZero() && o.End.After(to):
			continue
		}
		found = append(found, o)
	}
	start, end, next, aerr := page(p, len(found))
	if aerr != nil {
		return nil, aerr
	}
	out := &describeCapacityBlockOfferingsResponse{meta: m, NextToken: next}
	for _, o := range found[start:end] {
		d := o.End.Sub(o.Start)
		out.Offerings = append(out.Offerings, xmlBlockOffering{
			ID: o.id, InstanceType: o.InstanceType, AvailabilityZone: o.zone.name, InstanceCount: o.InstanceCount,
			StartDate: timestamp(o.Start), EndDate: timestamp(o.End), DurationHours: int(d / time.Hour),
			DurationMinutes: int(d % time.Hour / time.Minute), UpfrontFee: strconv.FormatFloat(o.UpfrontFee, 'f', 2, 64),
			CurrencyCode: "USD", Tenancy: "default",
		})
	}
	return out, nil
}

func paramTime(p params, name string) (time.Time, *APIError) {
	v := p.get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, apiErr("InvalidParameterValue", "Invalid %s %q", name, v)
	}
	return t, nil
}

// purchaseCapacityBlock turns an offering into a capacity-block reservation; the offering is
// gone once bought.
func (s *Server) purchaseCapacityBlock(m meta, reg *region, p params) (any, *APIError) {
	id := p.get("CapacityBlockOfferingId")
	if id == "" {
		return nil, apiErr("MissingParameter", "The request must contain the parameter CapacityBlockOfferingId")
	}
	switch pl := p.get("InstancePlatform"); pl {
	case "":
		return nil, apiErr("MissingParameter", "The request must contain the parameter InstancePlatform")
	case platformLinux:
	default:
		return nil, apiErr("InvalidParameterValue", "fakeec2 reserves %s capacity only, not %q", platformLinux, pl)
	}
	i := slices.IndexFunc(s.book.offerings, func(o *blockOffering) bool { return o.id == id && o.region == reg.name })
	if i < 0 {
		return nil, apiErr("InvalidParameterValue", "The Capacity Block offering %s does not exist or was already purchased", id)
	}
	tags, aerr := p.tags("capacity-reservation")
	if aerr != nil {
		return nil, aerr
	}
	o := s.book.offerings[i]
	now := s.opts.Now()
	if !o.End.After(now) {
		return nil, apiErr("InvalidParameterValue", "The Capacity Block offering %s has ended", id)
	}
	s.book.offerings = slices.Delete(s.book.offerings, i, i+1)
	r := &reservation{Reservation: Reservation{
		ID: newID("cr-"), Region: reg.name, Zone: o.zone.id, InstanceType: o.InstanceType, Count: o.InstanceCount,
		Type: ReservationTypeCapacityBlock, Match: MatchTargeted, Start: o.Start, End: o.End, Tags: tags, BlockID: newID("cb-"),
	}, zone: o.zone, created: now}
	s.book.add(r)
	s.scheduleReservation(&r.Reservation, now)
	out := &purchaseCapacityBlockResponse{meta: m, Reservation: s.xmlReservation(r, now)}
	out.Blocks = []xmlCapacityBlock{{
		ID: r.BlockID, ReservationIDs: []string{r.ID}, AvailabilityZone: o.zone.name, AvailabilityZoneID: o.zone.id,
		StartDate: timestamp(o.Start), EndDate: timestamp(o.End), CreateDate: timestamp(now), State: r.state(now),
	}}
	return out, nil
}

// blockTermination is when EC2 terminates a capacity block's instances; zero for others.
func (s *Server) blockTermination(r *Reservation) time.Time {
	if r.Type != ReservationTypeCapacityBlock || r.End.IsZero() {
		return time.Time{}
	}
	return r.End.Add(-s.opts.CapacityBlockTerminationLead)
}

// endBlocks terminates the live instances of capacity blocks whose termination time has come,
// as EC2 does. Callers hold s.mu (from advance).
func (s *Server) endBlocks(now time.Time) {
	for _, in := range s.instances {
		if in.reservation == "" || !in.live() {
			continue
		}
		r := s.book.byID[in.reservation]
		if at := s.blockTermination(&r.Reservation); !at.IsZero() && !now.Before(at) {
			s.end(in, at, ReasonCapacityBlockEnded, ReasonCapacityBlockEnded+": Capacity Block "+r.ID+" ends at "+timestamp(r.End), "Service initiated")
		}
	}
}

// TerminationTime is when the capacity block with reservation id terminates its instances
// (its end minus Options.CapacityBlockTerminationLead), for tests.
func (s *Server) TerminationTime(id string) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.book.byID[id]
	if r == nil || r.Type != ReservationTypeCapacityBlock {
		return time.Time{}, fmt.Errorf("fakeec2: no capacity block %s", id)
	}
	return s.blockTermination(&r.Reservation), nil
}

type xmlBlockOffering struct {
	ID               string `xml:"capacityBlockOfferingId"`
	InstanceType     string `xml:"instanceType"`
	AvailabilityZone string `xml:"availabilityZone"`
	InstanceCount    int    `xml:"instanceCount"`
	StartDate        string `xml:"startDate"`
	EndDate          string `xml:"endDate"`
	DurationHours    int    `xml:"capacityBlockDurationHours"`
	DurationMinutes  int    `xml:"capacityBlockDurationMinutes"`
	UpfrontFee       string `xml:"upfrontFee"`
	CurrencyCode     string `xml:"currencyCode"`
	Tenancy          string `xml:"tenancy"`
}

type describeCapacityBlockOfferingsResponse struct {
	XMLName xml.Name `xml:"DescribeCapacityBlockOfferingsResponse"`
	meta
	Offerings []xmlBlockOffering `xml:"capacityBlockOfferingSet>item"`
	NextToken string             `xml:"nextToken,omitempty"`
}

type xmlCapacityBlock struct {
	ID                 string   `xml:"capacityBlockId"`
	ReservationIDs     []string `xml:"capacityReservationIdSet>item"`
	AvailabilityZone   string   `xml:"availabilityZone"`
	AvailabilityZoneID string   `xml:"availabilityZoneId"`
	StartDate          string   `xml:"startDate"`
	EndDate            string   `xml:"endDate"`
	CreateDate         string   `xml:"createDate"`
	State              string   `xml:"state"`
}

type purchaseCapacityBlockResponse struct {
	XMLName xml.Name `xml:"PurchaseCapacityBlockResponse"`
	meta
	Blocks      []xmlCapacityBlock     `xml:"capacityBlockSet>item"`
	Reservation xmlCapacityReservation `xml:"capacityReservation"`
}
