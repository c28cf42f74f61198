package policy

// Spreading spot replicas again. SpotHedge spreads a service's spot replicas over zones only as
// it launches them. After a loss the replacements go wherever capacity is then, often the one
// zone still up, and stay there when the other zones come back. The next reclaim of that zone
// takes every spot replica at once, and the service has nothing READY until a replacement's
// cold start ends. On the spot traces that is most of the time a service spends with no
// replica READY (docs/measurements.md, "Where the no-READY spells come from"). A move undoes
// it for the price of one spot replica's cold start: one more spot replica is launched in a
// zone holding fewer, and once it is READY scale-down takes one from the crowded zone
// (replicas' scale-down order drains the most crowded zone's spot replicas first).
//
// A move is due when one zone holds more than half of the spot replicas, the half rounded up
// (two of three, or two of four, stay put; three of four move): were it reclaimed, the rest
// could not carry the load. It spreads over two zones at least, not over all: every zone a
// replica sits in is one more whose reclaim leaves the fleet short, so spreading wider buys
// little and costs availability. The replica goes to an active zone holding at least two fewer (one fewer
// would only swap which zone is crowded), in SpotOrder's order.

// Crowded returns the index of the zone that holds more than half of the spot replicas, the
// half rounded up (see above), if one does. zones' Spot are the live spot replicas in each zone.
func Crowded(zones []ZoneState) (int, bool) {
	total, big := 0, -1
	for i, z := range zones {
		total += z.Spot
		if big < 0 || z.Spot > zones[big].Spot {
			big = i
		}
	}
	if big < 0 || 2*zones[big].Spot <= total+1 {
		return -1, false
	}
	return big, true
}

// SpreadTargets are the zones a move out of zone from may go to (TakesMove), best first, in
// SpotOrder's order. It returns indexes into zones.
func SpreadTargets(zones []ZoneState, from int) []int {
	var out []int
	for _, i := range SpotOrder(zones) {
		if i != from && TakesMove(zones[from], zones[i]) {
			out = append(out, i)
		}
	}
	return out
}

// TakesMove reports whether zone to may take a spot replica moved out of zone from: it is
// active and holds at least two fewer (one fewer would only swap which zone is crowded).
func TakesMove(from, to ZoneState) bool {
	return to.Active && to.Spot <= from.Spot-2
}
