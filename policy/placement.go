package policy

import (
	"cmp"
	"slices"
)

// This file is placement: what kind of capacity the next replica goes on (spot or on-demand:
// Split) and in which zone (SpotHedge: PlaceSpot, Zones, SpotOrder), as opposed to which
// replica gets a request. Like the pickers it is pure over a snapshot; the caller keeps the
// zone states. The replica manager asks Split how many of each kind to run, and the
// provisioner asks SpotOrder which zone to try first; ferry sim asks the same two.

// Mix is a replica count per kind: the placement layer launches Spot replicas on spot capacity
// and OnDemand on on-demand capacity.
type Mix struct {
	Spot, OnDemand int
}

// Total is Spot + OnDemand.
func (m Mix) Total() int { return m.Spot + m.OnDemand }

// MixSpec is the spot part of a service's replica_policy.
type MixSpec struct {
	// UseSpot is resources.use_spot; without it every replica is on-demand.
	UseSpot bool
	// BaseOnDemand is base_ondemand_fallback_replicas: on-demand replicas that always run.
	BaseOnDemand int
	// DynamicFallback is dynamic_ondemand_fallback: on-demand replicas stand in for spot
	// replicas that are wanted but not READY (preempted, or no capacity), with one more
	// against the next loss (Split), and go once spot replicas are READY again.
	DynamicFallback bool
}

// Spare is what a service runs beyond its target against the next spot loss (Split).
type Spare struct {
	// Spot is how many spare spot replicas run beyond the target: Losses.Spare.
	Spot int
	// SpotFailing is set while the service's spot launches fail (one has failed since its
	// last spot replica came READY). Only then does on-demand stand in for a spare that the
	// target's READY spot replicas leave missing.
	SpotFailing bool
}

// Split divides a target between spot and on-demand: spot = target − base on-demand + spare;
// on-demand = base + (dynamic and spot READY short of the target's spot ? the shortfall and
// one more : 0) + (a spare missing while spot launches fail ? the spare : 0), at most the
// target and the spare. readySpot is the number of READY spot replicas.
//
// The one more is SpotHedge's spare (N_extra), held only while it is needed. Reclaims come in
// runs: a zone that took one instance back often takes more within minutes (the counted AWS
// traces drop a zone's capacity over several ticks; a probed zone takes every instance at
// once), and a replacement needs a whole cold start. So while spot falls short the fallback
// covers the shortfall and the next loss, on capacity that is not reclaimed; once spot is
// READY again it goes with the rest of the fallback. SkyServe keeps its spare all the time, on
// spot, and when spot runs short stands on-demand in for it too: Ferry pays for the spare
// only while spot is short (docs/measurements.md, "Spot serving: `ferry sim --sweep`",
// compares the two), or while the zones hold no more spot than the service runs there
// (Losses.Spare): then the spare stands all the time, on spot.
//
// With the target's spot READY, a spare that is missing (the loss it stood against, or the
// one it is) is launched on spot; on-demand stands in for it only once a spot launch has
// failed. Launched beside the spot replica, a stand-in would come READY with it, after the
// same cold start, and serve nothing a spare does not: SkyServe's does, and pays a cold start
// of on-demand for every loss its spare absorbs.
func Split(target int, m MixSpec, readySpot int, spare Spare) Mix {
	target = max(target, 0)
	if !m.UseSpot {
		return Mix{OnDemand: target}
	}
	extra := max(spare.Spot, 0)
	base := min(m.BaseOnDemand, target)
	spot := target - base
	onDemand := base
	if m.DynamicFallback {
		switch {
		case readySpot < spot:
			// The shortfall and one more, or the spare (the same count).
			onDemand += spot + max(extra, 1) - readySpot
		case readySpot < spot+extra && spare.SpotFailing:
			onDemand += spot + extra - readySpot
		}
	}
	return Mix{Spot: spot + extra, OnDemand: min(onDemand, target+extra)}
}

// ZoneState is one zone a spot replica may be placed in, as a placer sees it.
type ZoneState struct {
	Name string
	// SpotPrice is $/hour for one replica on spot capacity in this zone.
	SpotPrice float64
	// Active is false after a preemption or a failed spot launch in the zone (SpotHedge).
	Active bool
	// Spot is how many live spot replicas the zone holds now.
	Spot int
}

// PlaceSpot is SkyServe's SpotHedge placer (`spot_placer: dynamic_fallback`): the cheapest
// active zone that holds no spot replica yet, so that one zone's preemption takes out as few
// replicas as possible; when every active zone holds one, the active zone with the fewest,
// cheapest first. It reports false when no zone is active (the caller resets, see Zones).
func PlaceSpot(zones []ZoneState) (string, bool) {
	best := -1
	for i, z := range zones {
		if !z.Active {
			continue
		}
		if best < 0 || placeBefore(z, zones[best]) {
			best = i
		}
	}
	if best < 0 {
		return "", false
	}
	return zones[best].Name, true
}

// placeBefore orders zones by spot replicas held, then price, then name (for replayable ties).
func placeBefore(a, b ZoneState) bool {
	if c := cmp.Compare(a.Spot, b.Spot); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(a.SpotPrice, b.SpotPrice); c != 0 {
		return c < 0
	}
	return a.Name < b.Name
}

// Zones keeps SpotHedge's active/preempted state per zone. It is not safe for concurrent use.
type Zones struct {
	states []ZoneState
}

// NewZones starts with every zone active.
func NewZones(zones []ZoneState) *Zones {
	z := &Zones{states: slices.Clone(zones)}
	for i := range z.states {
		z.states[i].Active = true
	}
	return z
}

// Preempted marks a zone after a preemption or a failed spot launch there. When fewer than two
// zones stay active every zone becomes active again: SpotHedge needs at least two zones to
// spread over, and capacity that was gone may have come back.
func (z *Zones) Preempted(name string) {
	active := 0
	for i := range z.states {
		if z.states[i].Name == name {
			z.states[i].Active = false
		}
		if z.states[i].Active {
			active++
		}
	}
	if active < 2 {
		for i := range z.states {
			z.states[i].Active = true
		}
	}
}

// Ready marks a zone active again: a spot replica became READY there.
func (z *Zones) Ready(name string) {
	for i := range z.states {
		if z.states[i].Name == name {
			z.states[i].Active = true
		}
	}
}

// Place picks the zone for a new spot replica given how many live spot replicas each zone holds.
func (z *Zones) Place(spotByZone map[string]int) (string, bool) {
	for i := range z.states {
		z.states[i].Spot = spotByZone[z.states[i].Name]
	}
	return PlaceSpot(z.states)
}

// Snapshot returns a copy of the zone states.
func (z *Zones) Snapshot() []ZoneState { return slices.Clone(z.states) }

// SpotOrder is the order SpotHedge tries placements in, for a launcher that fails over down a
// list: active zones before preempted ones, then zones holding fewer of the service's spot
// replicas, then cheaper; ties keep their given order (the optimizer's). Its first active entry
// is PlaceSpot's choice. It returns indexes into zones.
func SpotOrder(zones []ZoneState) []int {
	order := make([]int, len(zones))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		za, zb := zones[a], zones[b]
		if za.Active != zb.Active {
			if za.Active {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(za.Spot, zb.Spot); c != 0 {
			return c
		}
		return cmp.Compare(za.SpotPrice, zb.SpotPrice)
	})
	return order
}
