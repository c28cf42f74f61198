package fakeec2

import (
	"encoding/xml"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Capacity Reservations, as EC2 has them: On-Demand Capacity Reservations (ODCRs, type
// "default"), open (any matching launch uses them) or targeted (only launches that name them),
// and Capacity Blocks for ML (type "capacity-block", always targeted, with a start and an end;
// capacityblocks.go). A reservation holds TotalInstanceCount instances of one type in one zone;
// instances launched into it count against it while they live ("Launch instances using
// Capacity Blocks": "Launching an instance into a Capacity Block reduces the available capacity
// by the number of instances launched"), and do not count against the zone's capacity or the
// region's on-demand vCPU quota, which the reservation already holds.

// Reservation types and instance match criteria, as EC2 spells them.
const (
	ReservationTypeDefault       = "default"
	ReservationTypeCapacityBlock = "capacity-block"
	MatchOpen                    = "open"
	MatchTargeted                = "targeted"
)

// Reservation is a Capacity Reservation to create with AddReservation, or a snapshot of one.
type Reservation struct {
	// ID is "cr-…"; AddReservation sets it.
	ID string
	// Region and Zone (an AZ ID or name) place it; Region defaults to the zone's.
	Region, Zone string
	InstanceType string
	// Count is TotalInstanceCount.
	Count int
	// Type is ReservationTypeDefault (an ODCR) or ReservationTypeCapacityBlock.
	Type string
	// Match is MatchOpen or MatchTargeted; a capacity block is always targeted.
	Match string
	// Start and End bound it; a zero Start is now, a zero End never (an ODCR without an end
	// date). A capacity block needs both.
	Start, End time.Time
	Tags       map[string]string
	// State and Available are reported on snapshots: EC2's state at the server's clock, and
	// how many more instances it takes now (0 until a capacity block starts).
	State     string
	Available int
	// BlockID is a capacity block's "cb-…" id.
	BlockID string
}

type reservation struct {
	Reservation
	zone    zone
	created time.Time
}

// reservationBook is the server's reservations and capacity block offerings. Callers hold s.mu.
type reservationBook struct {
	byID      map[string]*reservation
	order     []string
	offerings []*blockOffering
}

func (b *reservationBook) add(r *reservation) {
	if b.byID == nil {
		b.byID = map[string]*reservation{}
	}
	b.byID[r.ID] = r
	b.order = append(b.order, r.ID)
}

// state is the reservation's EC2 state at now: a capacity block is scheduled until its start,
// active until its end, then expired; an ODCR is active until its end date, if any.
func (r *reservation) state(now time.Time) string {
	switch {
	case !r.End.IsZero() && !now.Before(r.End):
		return "expired"
	case now.Before(r.Start):
		return "scheduled"
	}
	return "active"
}

// inUse counts the live instances launched into r. Callers hold s.mu.
func (s *Server) inUse(r *reservation) int {
	n := 0
	for _, in := range s.instances {
		if in.reservation == r.ID && in.live() {
			n++
		}
	}
	return n
}

// available is how many more instances r takes now: none unless active ("Before a Capacity
// Block reservation begins, the available capacity appears as zero", "View Capacity Blocks").
func (s *Server) available(r *reservation, now time.Time) int {
	if r.state(now) != "active" {
		return 0
	}
	return max(r.Count-s.inUse(r), 0)
}

// AddReservation creates a Capacity Reservation directly, as the account's owner would in the
// console (an ODCR), or a capacity block already bought (PurchaseCapacityBlock is the API
// way). It returns the reservation's id.
func (s *Server) AddReservation(r Reservation) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errClosed
	}
	z, reg, ok := s.findZone(r.Zone)
	if !ok {
		return "", fmt.Errorf("fakeec2: no zone %q", r.Zone)
	}
	if r.Region != "" && r.Region != reg {
		return "", fmt.Errorf("fakeec2: zone %s is not in %s", r.Zone, r.Region)
	}
	if r.InstanceType == "" || r.Count < 1 {
		return "", fmt.Errorf("fakeec2: a reservation needs an instance type and a positive count")
	}
	now := s.opts.Now()
	if r.Start.IsZero() {
		r.Start = now
	}
	switch r.Type {
	case "", ReservationTypeDefault:
		r.Type = ReservationTypeDefault
		if r.Match == "" {
			r.Match = MatchOpen
		}
	case ReservationTypeCapacityBlock:
		if r.End.IsZero() || !r.End.After(r.Start) {
			return "", fmt.Errorf("fakeec2: a capacity block needs an end after its start")
		}
		r.Match, r.BlockID = MatchTargeted, newID("cb-")
	default:
		return "", fmt.Errorf("fakeec2: unknown reservation type %q", r.Type)
	}
	if r.Match != MatchOpen && r.Match != MatchTargeted {
		return "", fmt.Errorf("fakeec2: unknown instance match criteria %q", r.Match)
	}
	r.Region, r.Zone, r.ID = reg, z.id, newID("cr-")
	s.book.add(&reservation{Reservation: r, zone: z, created: now})
	s.scheduleReservation(&r, now)
	return r.ID, nil
}

// scheduleReservation wakes the server at a reservation's start, at the moment its capacity
// block's instances are terminated, and at its end, so that those happen without an API call.
// Callers hold s.mu.
func (s *Server) scheduleReservation(r *Reservation, now time.Time) {
	for _, at := range []time.Time{r.Start, s.blockTermination(r), r.End} {
		if !at.IsZero() && at.After(now) {
			s.wakeAfter(at.Sub(now))
		}
	}
}

// Reservations returns every reservation, in creation order, as at the server's clock.
func (s *Server) Reservations() []Reservation {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	now := s.opts.Now()
	out := make([]Reservation, 0, len(s.book.order))
	for _, id := range s.book.order {
		out = append(out, s.snapshot(s.book.byID[id], now))
	}
	return out
}

func (s *Server) snapshot(r *reservation, now time.Time) Reservation {
	snap := r.Reservation
	snap.State, snap.Available = r.state(now), s.available(r, now)
	return snap
}

// findZone resolves an AZ ID or zone name to the zone and its region.
func (s *Server) findZone(z string) (zone, string, bool) {
	for name, reg := range s.regions {
		for _, zz := range reg.zones {
			if zz.id == z || zz.name == z {
				return zz, name, true
			}
		}
	}
	return zone{}, "", false
}

// launchReservation reads RunInstances' CapacityReservationSpecification and returns the
// reservation the instances go into, nil for none, checked as EC2 checks it: a targeted
// reservation must exist in the region, match the instance type and zone, be active and have
// room for minCount ("ReservationCapacityExceeded"); a capacity block also needs market type
// capacity-block. Without a target, and with preference open (the default), an on-demand
// launch uses an active open ODCR of its type in its zone that has room. Callers hold s.mu.
func (s *Server) launchReservation(reg *region, p params, z *zone, zoneGiven bool, itype, market string, minCount int) (*reservation, *APIError) {
	pref := p.get("CapacityReservationSpecification.CapacityReservationPreference")
	target := p.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")
	switch pref {
	case "", "open", "none", "capacity-reservations-only":
	default:
		return nil, apiErr("InvalidParameterValue", "Invalid capacity reservation preference %q", pref)
	}
	now := s.opts.Now()
	if target == "" {
		if market == ReservationTypeCapacityBlock {
			return nil, apiErr("InvalidParameterCombination", "The capacity-block market type requires a capacity reservation target")
		}
		if pref == "capacity-reservations-only" {
			return nil, apiErr("InvalidParameterCombination", "capacity-reservations-only requires a capacity reservation target")
		}
		if pref == "none" || market != "" {
			return nil, nil
		}
		for _, id := range s.book.order {
			r := s.book.byID[id]
			if r.Match == MatchOpen && r.Region == reg.name && r.zone.id == z.id && r.InstanceType == itype && s.available(r, now) >= minCount {
				return r, nil
			}
		}
		return nil, nil
	}
	if !strings.HasPrefix(target, "cr-") {
		return nil, apiErr("InvalidCapacityReservationId.Malformed", "Invalid id: %q (expecting \"cr-...\")", target)
	}
	r := s.book.byID[target]
	if r == nil || r.Region != reg.name {
		return nil, apiErr("InvalidCapacityReservationId.NotFound", "The Capacity Reservation ID '%s' does not exist", target)
	}
	block := r.Type == ReservationTypeCapacityBlock
	switch {
	case block && market != ReservationTypeCapacityBlock:
		return nil, apiErr("InvalidParameterCombination", "Capacity Block %s can only be launched into with market type capacity-block", target)
	case !block && market != "":
		return nil, apiErr("InvalidParameterCombination", "Market type %s cannot launch into Capacity Reservation %s", market, target)
	case r.InstanceType != itype:
		return nil, apiErr("InvalidParameterValue", "Capacity Reservation %s is for %s, not %s", target, r.InstanceType, itype)
	case zoneGiven && r.zone.id != z.id:
		return nil, apiErr("InvalidParameterCombination", "Capacity Reservation %s is in %s, not %s", target, r.zone.name, z.name)
	}
	if avail := s.available(r, now); avail < minCount {
		return nil, apiErr("ReservationCapacityExceeded", "The requested reservation does not have sufficient compatible and available capacity for this request (%s is %s with %d of %d available).",
			target, r.state(now), avail, r.Count)
	}
	*z = r.zone
	return r, nil
}

func (s *Server) describeCapacityReservations(m meta, reg *region, p params) (any, *APIError) {
	ids := p.list("CapacityReservationId")
	for _, id := range ids {
		if !strings.HasPrefix(id, "cr-") {
			return nil, apiErr("InvalidCapacityReservationId.Malformed", "Invalid id: %q", id)
		}
		if r := s.book.byID[id]; r == nil || r.Region != reg.name {
			return nil, apiErr("InvalidCapacityReservationId.NotFound", "The Capacity Reservation ID '%s' does not exist", id)
		}
	}
	filters := p.filters()
	for name := range filters {
		switch {
		case strings.HasPrefix(name, "tag:"), name == "tag-key", name == "instance-type", name == "availability-zone",
			name == "state", name == "instance-match-criteria", name == "owner-id", name == "instance-platform":
		default:
			return nil, apiErr("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
	}
	now := s.opts.Now()
	var found []*reservation
	for _, id := range s.book.order {
		r := s.book.byID[id]
		if r.Region != reg.name || len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		ok := matches(filters, func(name string) []string {
			switch name {
			case "instance-type":
				return []string{r.InstanceType}
			case "availability-zone":
				return []string{r.zone.name}
			case "state":
				return []string{r.state(now)}
			case "instance-match-criteria":
				return []string{r.Match}
			case "owner-id":
				return []string{ownerID}
			case "instance-platform":
				return []string{platformLinux}
			}
			return tagValues(name, r.Tags)
		})
		if ok {
			found = append(found, r)
		}
	}
	start, end, next, aerr := page(p, len(found))
	if aerr != nil {
		return nil, aerr
	}
	out := &describeCapacityReservationsResponse{meta: m, NextToken: next}
	for _, r := range found[start:end] {
		out.Reservations = append(out.Reservations, s.xmlReservation(r, now))
	}
	return out, nil
}

// page reads NextToken and MaxResults (5 to 1000) over n results.
func page(p params, n int) (start, end int, next string, err *APIError) {
	end = n
	if tok := p.get("NextToken"); tok != "" {
		v, perr := strconv.Atoi(tok)
		if perr != nil || v < 0 || v > n {
			return 0, 0, "", apiErr("InvalidParameterValue", "Invalid NextToken")
		}
		start = v
	}
	if mr := p.get("MaxResults"); mr != "" {
		v, perr := strconv.Atoi(mr)
		if perr != nil || v < 1 || v > 1000 {
			return 0, 0, "", apiErr("InvalidParameterValue", "MaxResults must be between 1 and 1000")
		}
		if start+v < end {
			end = start + v
			next = strconv.Itoa(end)
		}
	}
	return start, end, next, nil
}

const platformLinux = "Linux/UNIX"

func (s *Server) xmlReservation(r *reservation, now time.Time) xmlCapacityReservation {
	x := xmlCapacityReservation{
		ID: r.ID, Arn: "arn:aws:ec2:" + r.Region + ":" + ownerID + ":capacity-reservation/" + r.ID, OwnerID: ownerID,
		InstanceType: r.InstanceType, InstancePlatform: platformLinux, AvailabilityZone: r.zone.name, AvailabilityZoneID: r.zone.id,
		Tenancy: "default", TotalInstanceCount: r.Count, AvailableInstanceCount: s.available(r, now),
		State: r.state(now), StartDate: timestamp(r.Start), EndDateType: "unlimited", InstanceMatchCriteria: r.Match,
		CreateDate: timestamp(r.created), ReservationType: r.Type, CapacityBlockID: r.BlockID, TagSet: tagSet(r.Tags),
	}
	if !r.End.IsZero() {
		x.EndDate, x.EndDateType = timestamp(r.End), "limited"
	}
	return x
}

type xmlCapacityReservation struct {
	ID                     string   `xml:"capacityReservationId"`
	Arn                    string   `xml:"capacityReservationArn"`
	OwnerID                string   `xml:"ownerId"`
	InstanceType           string   `xml:"instanceType"`
	InstancePlatform       string   `xml:"instancePlatform"`
	AvailabilityZone       string   `xml:"availabilityZone"`
	AvailabilityZoneID     string   `xml:"availabilityZoneId"`
	Tenancy                string   `xml:"tenancy"`
	TotalInstanceCount     int      `xml:"totalInstanceCount"`
	AvailableInstanceCount int      `xml:"availableInstanceCount"`
	State                  string   `xml:"state"`
	StartDate              string   `xml:"startDate"`
	EndDate                string   `xml:"endDate,omitempty"`
	EndDateType            string   `xml:"endDateType"`
	InstanceMatchCriteria  string   `xml:"instanceMatchCriteria"`
	CreateDate             string   `xml:"createDate"`
	ReservationType        string   `xml:"reservationType"`
	CapacityBlockID        string   `xml:"capacityBlockId,omitempty"`
	TagSet                 []xmlTag `xml:"tagSet>item"`
}

type describeCapacityReservationsResponse struct {
	XMLName xml.Name `xml:"DescribeCapacityReservationsResponse"`
	meta
	Reservations []xmlCapacityReservation `xml:"capacityReservationSet>item"`
	NextToken    string                   `xml:"nextToken,omitempty"`
}
