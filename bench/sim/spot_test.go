package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/policy"
)

// spotRunner is a runner of a fixed spot-only fleet of n over zones, noticing reclaims when
// notices is set, with a one-minute cold start.
func spotRunner(n int, notices bool, zones ...Zone) *runner {
	m := testModel()
	m.ColdStart = time.Minute
	w := &World{Model: m, Zones: zones, Notice: DefaultOptions().Notice, MinReady: n, OnDemandPrice: 3,
		Duration: time.Hour, SLO: SLO{TTFT: time.Second, TPOT: time.Second}, Seed: 1}
	p := Policy{Name: "fixed", Spec: autoscaler.Spec{Min: n, Max: n}.WithDefaults(), Mix: policy.MixSpec{UseSpot: true},
		Placer: PlaceCheapest, Hold: true, DrainTimeout: time.Minute, Notices: notices}
	return w.newRunner(p)
}

// upTo runs whole seconds from..to of r.
func upTo(r *runner, from, to int) {
	for s := from; s <= to; s++ {
		r.second(s)
	}
}

// spotIDs are the ids of r's live spot replicas in zone i, and of those the cloud warned.
func spotIDs(r *runner, i int) (live, warned []int) {
	for _, rep := range r.live {
		if rep.spot && rep.zone == i {
			live = append(live, rep.id)
			if rep.warned {
				warned = append(warned, rep.id)
			}
		}
	}
	return live, warned
}

// TestSimSpotModel: the capacity counts and notices of the spot traces, as the simulator
// applies them to a policy's instances.
func TestSimSpotModel(t *testing.T) {
	t.Run("a zone at capacity refuses a launch", func(t *testing.T) {
		r := spotRunner(3, false, scriptedZone("a", 1, 2))
		upTo(r, 0, 0)
		live, _ := spotIDs(r, 0)
		if len(live) != 2 || r.res.RefusedSpotLaunches != 1 {
			t.Fatalf("a zone of capacity 2 holds %v and refused %d launches; want 2 held and the third refused", live, r.res.RefusedSpotLaunches)
		}
		upTo(r, 1, 10)
		if live, _ := spotIDs(r, 0); len(live) != 2 || r.res.RefusedSpotLaunches != 11 {
			t.Errorf("after 10 more decisions: %v held, %d refused; want 2 and one refusal a decision", live, r.res.RefusedSpotLaunches)
		}
	})
	t.Run("a drop preempts exactly the excess, newest first", func(t *testing.T) {
		// Capacity 5, then 2 from 60 s; no notice on this cloud.
		z := scriptedZone("a", 1, 5, 2)
		r := spotRunner(4, false, z)
		r.w.Notice = map[Provider]time.Duration{AWS: 0}
		upTo(r, 0, 59)
		if live, _ := spotIDs(r, 0); !slices.Equal(live, []int{0, 1, 2, 3}) {
			t.Fatalf("held %v before the drop, want 4", live)
		}
		upTo(r, 60, 60)
		live, _ := spotIDs(r, 0)
		if r.preempted == nil || len(r.preempted) != 2 || !slices.Equal(live, []int{0, 1}) {
			t.Errorf("after the drop to 2: %d preempted, %v held; want the 2 newest (2, 3) preempted and 0, 1 held", len(r.preempted), live)
		}
	})
	t.Run("a notice reaches only the instances held", func(t *testing.T) {
		// Zone a drops from 3 to 1 at 60 s while the policy holds 2 there; zone b, where it
		// holds nothing, drops to 0 at the same time.
		r := spotRunner(2, true, scriptedZone("a", 1, 3, 1), scriptedZone("b", 2, 5, 0))
		upTo(r, 0, 60)
		live, warned := spotIDs(r, 0)
		if !slices.Equal(live, []int{0, 1}) || !slices.Equal(warned, []int{1}) {
			t.Fatalf("zone a: held %v, warned %v; want 0 and 1 held, the newest (1) warned", live, warned)
		}
		for _, rep := range r.live {
			if rep.warned && rep.zone != 0 {
				t.Errorf("replica %d in zone %d warned; the policy held nothing in b", rep.id, rep.zone)
			}
		}
		if got := r.live[1]; !got.noticed || got.reclaimAt != 60+120 {
			t.Errorf("warned replica: noticed %v, reclaim at %v; want noticed, at 180 s (EC2's 2 minutes)", got.noticed, got.reclaimAt)
		}
	})
	t.Run("a drop before any instance is held warns nobody", func(t *testing.T) {
		r := spotRunner(1, true, scriptedZone("a", 1, 0, 1))
		upTo(r, 0, 30)
		if len(r.live) != 0 || r.res.Preemptions != 0 {
			t.Errorf("a zone without capacity: %d live, %d preemptions", len(r.live), r.res.Preemptions)
		}
	})
	for name, tc := range map[string]struct {
		zone       Zone
		wantNotice float64
	}{
		"the GCP notice is 30 s":  {Zone{Name: "us-central1-a", Provider: GCP, SpotPrice: 1, Trace: &SpotTrace{Zone: "us-central1-a", Provider: GCP, Gap: 60, Data: []float64{1, 0}}}, 30},
		"the AWS notice is 120 s": {scriptedZone("us-east-1a", 1, 1, 0), 120},
	} {
		t.Run(name, func(t *testing.T) {
			r := spotRunner(1, false, tc.zone)
			upTo(r, 0, 60)
			if len(r.live) != 1 || !r.live[0].warned || r.live[0].reclaimAt != 60+tc.wantNotice {
				t.Fatalf("at the drop: %d live, warned %v, reclaim at %v; want the replica warned, reclaimed at %v", len(r.live), len(r.live) == 1 && r.live[0].warned, r.live[0].reclaimAt, 60+tc.wantNotice)
			}
			upTo(r, 61, 60+int(tc.wantNotice)-1)
			if len(r.live) != 1 {
				t.Fatalf("reclaimed before the notice ran out: %d live at %v s", len(r.live), 60+tc.wantNotice-1)
			}
			upTo(r, 60+int(tc.wantNotice), 60+int(tc.wantNotice))
			if len(r.live) != 0 {
				t.Errorf("still %d live when the notice ran out", len(r.live))
			}
		})
	}
}

// TestSimGCPZones: GCP zones are read as GCP writes them, and priced at their region's rows,
// host + one attached GPU.
func TestSimGCPZones(t *testing.T) {
	zones, err := LoadSpotTraces("testdata/spot-gcp")
	if err != nil {
		t.Fatal(err)
	}
	type zone struct {
		Zone, Region string
		Provider     Provider
		Probe        bool
	}
	var got []zone
	for _, z := range zones {
		got = append(got, zone{z.Zone, z.Region, z.Provider, z.Probe})
	}
	want := []zone{{"us-central1-a", "us-central1", GCP, true}, {"us-east1-b", "us-east1", GCP, true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("zones (-want +got):\n%s", diff)
	}
	rows, err := LoadCatalog("testdata/catalog/gcp_gpu.csv")
	if err != nil {
		t.Fatal(err)
	}
	p, err := MatchGCPZones(rows, "n1-standard-8+n1-attach-V100", zones)
	if err != nil {
		t.Fatal(err)
	}
	// us-east1-b has an n1-standard-8 row and no V100 one: us-east1-c's, the region's, prices it.
	for _, z := range p.Zones {
		if diff := cmp.Diff(0.0963+0.992, z.SpotPrice, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
			t.Errorf("%s spot price (-want +got):\n%s", z.Name, diff)
		}
	}
	if len(p.Zones) != 2 || p.OnDemand < 2.86-1e-9 || p.OnDemand > 2.86+1e-9 {
		t.Errorf("%d zones priced, on-demand %v; want both, 0.38 + 2.48", len(p.Zones), p.OnDemand)
	}
	if _, err := MatchGCPZones(rows, "n1-standard-8+n1-attach-A100", zones); err == nil || !strings.Contains(err.Error(), "n1-attach-A100") {
		t.Errorf("a GPU the catalog lacks: %v", err)
	}
}

// TestSimCapacityReading: counted sets are counts, 0/1 sets are probes of unbounded capacity.
func TestSimCapacityReading(t *testing.T) {
	counted := &SpotTrace{Gap: 60, Data: []float64{4, 0, 2}}
	probe := &SpotTrace{Gap: 60, Data: []float64{1, 0}, Probe: true}
	got := []int{counted.Capacity(0), counted.Capacity(60), counted.Capacity(120), counted.Capacity(180), probe.Capacity(0), probe.Capacity(60)}
	if want := []int{4, 0, 2, 4, Unbounded, 0}; !slices.Equal(got, want) {
		t.Errorf("capacities %v, want %v", got, want)
	}
	for name, tc := range map[string]struct {
		zone   string
		want   Provider
		region string
	}{
		"aws":      {"us-east-1a", AWS, "us-east-1"},
		"gcp":      {"us-central1-a", GCP, "us-central1"},
		"gcp asia": {"asia-northeast1-a", GCP, "asia-northeast1"},
	} {
		p, region, _, ok := ParseZone(tc.zone)
		if !ok || p != tc.want || region != tc.region {
			t.Errorf("%s: ParseZone(%s) = %s, %s, %v", name, tc.zone, p, region, ok)
		}
	}
	if _, _, _, ok := ParseZone("moon-1"); ok {
		t.Error("ParseZone accepted moon-1")
	}
}

// TestSimCapacityFloor: the least a fleet can cost is the zones' capacity on spot, cheapest
// first, and on-demand for the rest.
func TestSimCapacityFloor(t *testing.T) {
	pr := &Prices{OnDemand: 3, Zones: []Zone{scriptedZone("dear", 2, 1), scriptedZone("cheap", 1, 1)}}
	o := Options{Duration: time.Hour}
	f := capacityFloor(pr, o, 3)
	// Each minute: 1 × $1 + 1 × $2 on spot and 1 × $3 on-demand, of 3 × $3; normalized
	// 1 + 1 + 3 of 3 × 3. Spot never holds all 3.
	if f.dollars < 6.0/9-1e-9 || f.dollars > 6.0/9+1e-9 || f.norm < 5.0/9-1e-9 || f.norm > 5.0/9+1e-9 || f.covers != 0 {
		t.Errorf("floor %+v; want 6/9 and 5/9, spot covering none of it", f)
	}
	if f := capacityFloor(pr, o, 1); f.dollars != 1.0/3 || f.norm != 1.0/3 || f.covers != 1 {
		t.Errorf("one replica's floor %+v; want the cheapest zone's 1/3 and 1/3, spot covering all of it", f)
	}
}
