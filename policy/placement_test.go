package policy

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlaceSpot(t *testing.T) {
	zones := func(spot ...int) []ZoneState {
		z := []ZoneState{
			{Name: "a", SpotPrice: 0.9, Active: true},
			{Name: "b", SpotPrice: 0.5, Active: true},
			{Name: "c", SpotPrice: 0.7, Active: true},
		}
		for i, n := range spot {
			z[i].Spot = n
		}
		return z
	}
	tests := map[string]struct {
		zones  []ZoneState
		want   string
		wantOK bool
	}{
		"cheapest empty zone":               {zones(), "b", true},
		"spreads before doubling up":        {zones(0, 1, 0), "c", true},
		"fewest replicas when all hold one": {zones(1, 2, 1), "c", true},
		"skips inactive zones": {func() []ZoneState {
			z := zones()
			z[1].Active = false
			return z
		}(), "c", true},
		"no active zone": {[]ZoneState{{Name: "a"}}, "", false},
		"ties by name":   {[]ZoneState{{Name: "y", Active: true}, {Name: "x", Active: true}}, "x", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := PlaceSpot(tc.zones)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("PlaceSpot = %q, %v; want %q, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestZonesPreemption(t *testing.T) {
	z := NewZones([]ZoneState{{Name: "a", SpotPrice: 1}, {Name: "b", SpotPrice: 2}, {Name: "c", SpotPrice: 3}})
	place := func() string {
		t.Helper()
		name, ok := z.Place(nil)
		if !ok {
			t.Fatal("no zone placed")
		}
		return name
	}
	if got := place(); got != "a" {
		t.Fatalf("first placement %q, want the cheapest zone a", got)
	}
	z.Preempted("a")
	if got := place(); got != "b" {
		t.Fatalf("after a preemption in a: %q, want b", got)
	}
	// Down to one active zone: SpotHedge resets every zone to active.
	z.Preempted("b")
	active := map[string]bool{}
	for _, s := range z.Snapshot() {
		active[s.Name] = s.Active
	}
	if diff := cmp.Diff(map[string]bool{"a": true, "b": true, "c": true}, active); diff != "" {
		t.Fatalf("zones after reset (-want +got):\n%s", diff)
	}
	z.Preempted("c")
	z.Ready("c")
	if got, _ := z.Place(map[string]int{"a": 1, "b": 1}); got != "c" {
		t.Fatalf("zone c became ready again and holds no replica: got %q", got)
	}
}

func TestSpotOrder(t *testing.T) {
	zones := []ZoneState{
		{Name: "a", SpotPrice: 1.0, Active: true, Spot: 1},
		{Name: "b", SpotPrice: 1.2, Active: true},
		{Name: "c", SpotPrice: 0.8, Active: false},
		{Name: "d", SpotPrice: 1.2, Active: true},
		{Name: "e", SpotPrice: 1.1, Active: true},
	}
	got := SpotOrder(zones)
	// Unoccupied active zones by price (b before d: given order on a tie), then the occupied
	// one, then the preempted one however cheap.
	if want := []int{4, 1, 3, 0, 2}; !slices.Equal(got, want) {
		t.Fatalf("SpotOrder = %v, want %v", got, want)
	}
	if name, _ := PlaceSpot(zones); name != zones[got[0]].Name {
		t.Fatalf("PlaceSpot = %s, SpotOrder's first = %s", name, zones[got[0]].Name)
	}
}

func TestSplit(t *testing.T) {
	tests := map[string]struct {
		target, readySpot int
		mix               MixSpec
		want              Mix
		spare             Spare
	}{
		"no spot":                 {4, 0, MixSpec{}, Mix{OnDemand: 4}, Spare{}},
		"spot only":               {4, 1, MixSpec{UseSpot: true}, Mix{Spot: 4}, Spare{}},
		"base on-demand":          {4, 3, MixSpec{UseSpot: true, BaseOnDemand: 1}, Mix{Spot: 3, OnDemand: 1}, Spare{}},
		"base larger than target": {1, 0, MixSpec{UseSpot: true, BaseOnDemand: 2}, Mix{OnDemand: 1}, Spare{}},
		"dynamic covers missing spot and one more": {4, 1, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 4, OnDemand: 4}, Spare{}},
		"dynamic, one spot short":                  {4, 3, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 4, OnDemand: 2}, Spare{}},
		"dynamic with all spot ready":              {4, 4, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 4}, Spare{}},
		"dynamic with more spot ready than wanted": {4, 5, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 4}, Spare{}},
		"dynamic, no spot ready: at most target":   {4, 0, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 4, OnDemand: 4}, Spare{}},
		"dynamic plus base":                        {4, 0, MixSpec{UseSpot: true, BaseOnDemand: 1, DynamicFallback: true}, Mix{Spot: 3, OnDemand: 4}, Spare{}},
		"dynamic plus base, one spot short":        {4, 2, MixSpec{UseSpot: true, BaseOnDemand: 1, DynamicFallback: true}, Mix{Spot: 3, OnDemand: 3}, Spare{}},
		"negative target is zero":                  {-1, 0, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{}, Spare{}},
		// With a spare (Losses.Spare): one more spot replica all the time, which on-demand
		// stands in for once a spot launch has failed, and no one more on top.
		"spare on spot":                                 {4, 5, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5}, Spare{Spot: 1}},
		"spare lost: launched on spot":                  {4, 4, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5}, Spare{Spot: 1}},
		"spare lost, spot failing: on-demand stands in": {4, 4, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5, OnDemand: 1}, Spare{Spot: 1, SpotFailing: true}},
		"spot failing, no spare missing":                {4, 5, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5}, Spare{Spot: 1, SpotFailing: true}},
		"spot failing without a spare":                  {4, 4, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 4}, Spare{SpotFailing: true}},
		"spare, one spot short, spot failing":           {4, 3, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5, OnDemand: 2}, Spare{Spot: 1, SpotFailing: true}},
		"spare, one spot short of target":               {4, 3, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5, OnDemand: 2}, Spare{Spot: 1}},
		"spare, no spot ready":                          {4, 0, MixSpec{UseSpot: true, DynamicFallback: true}, Mix{Spot: 5, OnDemand: 5}, Spare{Spot: 1}},
		"spare without dynamic fallback":                {4, 0, MixSpec{UseSpot: true}, Mix{Spot: 5}, Spare{Spot: 1}},
		"spare with base":                               {4, 3, MixSpec{UseSpot: true, BaseOnDemand: 1, DynamicFallback: true}, Mix{Spot: 4, OnDemand: 1}, Spare{Spot: 1}},
		"spare on an all on-demand service":             {4, 0, MixSpec{}, Mix{OnDemand: 4}, Spare{Spot: 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Split(tc.target, tc.mix, tc.readySpot, tc.spare)); diff != "" {
				t.Errorf("Split mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
