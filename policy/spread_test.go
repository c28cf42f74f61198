package policy

import "testing"

// spreadMove is Crowded and the first of SpreadTargets by name, as the simulator and the
// provisioner use them: the zone to move a spot replica out of, and the zone to move it to.
func spreadMove(zones []ZoneState) (from, to string, ok bool) {
	big, crowded := Crowded(zones)
	if !crowded {
		return "", "", false
	}
	targets := SpreadTargets(zones, big)
	if len(targets) == 0 {
		return "", "", false
	}
	return zones[big].Name, zones[targets[0]].Name, true
}

func TestSpreadMove(t *testing.T) {
	zone := func(name string, price float64, active bool, spot int) ZoneState {
		return ZoneState{Name: name, SpotPrice: price, Active: active, Spot: spot}
	}
	tests := map[string]struct {
		zones    []ZoneState
		from, to string
		ok       bool
	}{
		"every replica in one zone moves one to the cheapest empty zone": {
			zones: []ZoneState{zone("a", 1, true, 4), zone("b", 3, true, 0), zone("c", 2, true, 0)},
			from:  "a", to: "c", ok: true,
		},
		"a zone holding fewer goes before a cheaper one": {
			zones: []ZoneState{zone("a", 1, true, 5), zone("b", 3, true, 0), zone("c", 2, true, 1)},
			from:  "a", to: "b", ok: true,
		},
		"a zone that refused or took instances back lately is not a target": {
			zones: []ZoneState{zone("a", 1, true, 4), zone("b", 3, false, 0)},
		},
		// Up to half of the replicas in one zone, the half rounded up: the others carry the
		// load if it goes. Spreading wider only adds zones whose reclaim leaves the fleet short.
		"three of four in one zone still moves": {
			zones: []ZoneState{zone("a", 1, true, 3), zone("b", 2, true, 1)},
			from:  "a", to: "b", ok: true,
		},
		"two of four in one zone stays": {
			zones: []ZoneState{zone("a", 1, true, 2), zone("b", 2, true, 1), zone("c", 2, true, 1)},
		},
		"two of three in one zone stays": {
			zones: []ZoneState{zone("a", 1, true, 2), zone("b", 2, true, 1), zone("c", 3, true, 0)},
		},
		"a lone replica stays": {
			zones: []ZoneState{zone("a", 1, true, 1), zone("b", 2, true, 0)},
		},
		// Moving one replica from 3 to 2 changes nothing: the target must hold two fewer.
		"no zone two below the crowded one": {
			zones: []ZoneState{zone("a", 1, true, 3), zone("b", 2, true, 2)},
		},
		"no zones":    {},
		"no replicas": {zones: []ZoneState{zone("a", 1, true, 0), zone("b", 2, true, 0)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			from, to, ok := spreadMove(tc.zones)
			if from != tc.from || to != tc.to || ok != tc.ok {
				t.Errorf("spreadMove = %q, %q, %v; want %q, %q, %v", from, to, ok, tc.from, tc.to, tc.ok)
			}
		})
	}
}
