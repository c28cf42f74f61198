package fakeec2

import (
	"slices"
	"strconv"
	"strings"
)

func (s *Server) describeAvailabilityZones(m meta, reg *region, p params) (any, *APIError) {
	names, ids := p.list("ZoneName"), p.list("ZoneId")
	out := &describeAvailabilityZonesResponse{meta: m}
	for _, n := range names {
		if !slices.ContainsFunc(reg.zones, func(z zone) bool { return z.name == n }) {
			return nil, apiErr("InvalidParameterValue", "The zone '%s' does not exist.", n)
		}
	}
	for _, z := range reg.zones {
		if (len(names) > 0 || len(ids) > 0) && !slices.Contains(names, z.name) && !slices.Contains(ids, z.id) {
			continue
		}
		out.Zones = append(out.Zones, xmlZone{
			ZoneName: z.name, ZoneID: z.id, ZoneState: "available", RegionName: reg.name, GroupName: reg.name,
			NetworkBorderGroup: reg.name, OptInStatus: "opt-in-not-required", ZoneType: "availability-zone",
		})
	}
	return out, nil
}

// describeSpotPriceHistory returns the current price of each instance type in each zone
// (the fake has no history: one point per type and zone, stamped now).
func (s *Server) describeSpotPriceHistory(m meta, reg *region, p params) (any, *APIError) {
	types := p.list("InstanceType")
	zoneName := p.get("AvailabilityZone")
	products := p.list("ProductDescription")
	if len(products) > 0 && !slices.ContainsFunc(products, func(d string) bool { return strings.HasPrefix(d, "Linux/UNIX") }) {
		return &describeSpotPriceHistoryResponse{meta: m}, nil
	}
	now := timestamp(s.opts.Now())
	out := &describeSpotPriceHistoryResponse{meta: m}
	for _, z := range reg.zones {
		if zoneName != "" && z.name != zoneName {
			continue
		}
		var keys []string
		for k := range s.spotPrices {
			if strings.HasPrefix(k, z.id+"/") {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			itype := strings.TrimPrefix(k, z.id+"/")
			if len(types) > 0 && !slices.Contains(types, itype) {
				continue
			}
			out.Prices = append(out.Prices, xmlSpotPrice{
				AvailabilityZone: z.name, AvailabilityZoneID: z.id, InstanceType: itype, ProductDescription: "Linux/UNIX",
				SpotPrice: strconv.FormatFloat(s.spotPrices[k], 'f', 6, 64), Timestamp: now,
			})
		}
	}
	return out, nil
}

func (s *Server) createPlacementGroup(m meta, reg *region, p params) (any, *APIError) {
	name, strategy := p.get("GroupName"), p.get("Strategy")
	if name == "" {
		return nil, apiErr("MissingParameter", "The request must contain the parameter GroupName")
	}
	switch strategy {
	case "cluster", "spread", "partition":
	default:
		return nil, apiErr("InvalidParameterValue", "Invalid placement group strategy %q", strategy)
	}
	if reg.placement[name] != nil {
		return nil, apiErr("InvalidPlacementGroup.Duplicate", "The Placement Group '%s' already exists.", name)
	}
	tags, aerr := p.tags("placement-group")
	if aerr != nil {
		return nil, aerr
	}
	g := &placementGroup{id: newID("pg-"), name: name, strategy: strategy, tags: tags}
	reg.placement[name] = g
	return &createPlacementGroupResponse{meta: m, PlacementGroup: g.xml()}, nil
}

func (g *placementGroup) xml() xmlPlacementGroup {
	return xmlPlacementGroup{GroupName: g.name, GroupID: g.id, Strategy: g.strategy, State: "available", TagSet: tagSet(g.tags)}
}

func (s *Server) describePlacementGroups(m meta, reg *region, p params) (any, *APIError) {
	names := p.list("GroupName")
	out := &describePlacementGroupsResponse{meta: m}
	for _, n := range names {
		if reg.placement[n] == nil {
			return nil, apiErr("InvalidPlacementGroup.Unknown", "The Placement Group '%s' is unknown.", n)
		}
	}
	keys := make([]string, 0, len(reg.placement))
	for k := range reg.placement {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if len(names) == 0 || slices.Contains(names, k) {
			out.Groups = append(out.Groups, reg.placement[k].xml())
		}
	}
	return out, nil
}

func (s *Server) deletePlacementGroup(m meta, reg *region, p params) (any, *APIError) {
	name := p.get("GroupName")
	if reg.placement[name] == nil {
		return nil, apiErr("InvalidPlacementGroup.Unknown", "The Placement Group '%s' is unknown.", name)
	}
	for _, in := range s.instances {
		if in.region == reg.name && in.placementGroup == name && in.state != "terminated" {
			return nil, apiErr("InvalidPlacementGroup.InUse", "The Placement Group '%s' is in use and may not be deleted.", name)
		}
	}
	delete(reg.placement, name)
	return &returnResponse{XMLName: xmlName("DeletePlacementGroupResponse"), meta: m, Return: true}, nil
}

// PlacementGroups returns region's placement group names, for tests.
func (s *Server) PlacementGroups(regionName string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if reg := s.regions[regionName]; reg != nil {
		for k := range reg.placement {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// getSpotPlacementScores scores each region (or zone, with SingleAvailabilityZone) 1–10 by
// how much of the requested spot capacity its free capacity covers: unlimited capacity scores
// 10, an injected error 1.
func (s *Server) getSpotPlacementScores(m meta, p params) (any, *APIError) {
	types := p.list("InstanceType")
	target, err := strconv.Atoi(p.get("TargetCapacity"))
	if err != nil || target < 1 {
		return nil, apiErr("InvalidParameterValue", "TargetCapacity must be a positive integer")
	}
	if len(types) == 0 {
		return nil, apiErr("MissingParameter", "The request must contain the parameter InstanceTypes")
	}
	single := p.get("SingleAvailabilityZone") == "true"
	regionsWanted := p.list("RegionName")
	score := func(z zone) int {
		if s.zoneErrors[z.id] != nil {
			return 1
		}
		free := 0
		for _, t := range types {
			c, ok := s.capacity[z.id+"/"+t]
			if !ok && s.opts.DefaultCapacity == 0 {
				return 10
			}
			if !ok {
				c = s.opts.DefaultCapacity
			}
			for _, in := range s.instances {
				if in.live() && in.zone.id == z.id && in.instanceType == t {
					c--
				}
			}
			free += max(c, 0)
		}
		return min(10, max(1, 1+9*free/target))
	}
	out := &getSpotPlacementScoresResponse{meta: m}
	names := make([]string, 0, len(s.regions))
	for n := range s.regions {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if len(regionsWanted) > 0 && !slices.Contains(regionsWanted, n) {
			continue
		}
		best := 0
		for _, z := range s.regions[n].zones {
			sc := score(z)
			if single {
				out.Scores = append(out.Scores, xmlSpotPlacementScore{Region: n, AvailabilityZoneID: z.id, Score: sc})
			}
			best = max(best, sc)
		}
		if !single {
			out.Scores = append(out.Scores, xmlSpotPlacementScore{Region: n, Score: best})
		}
	}
	return out, nil
}
