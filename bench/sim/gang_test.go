package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLifetimes(t *testing.T) {
	tr := &SpotTrace{Gap: 10, Data: []float64{0, 1, 1, 0, 1, 0, 0, 1, 1, 1}}
	// Two instances ended (20 s and 10 s); the last is still alive at the end.
	if diff := cmp.Diff([]float64{20, 10}, lifetimes(tr)); diff != "" {
		t.Errorf("lifetimes (-want +got):\n%s", diff)
	}
}

// A short form of `ferry sim gang` on a slice of the real preemption traces (testdata): both shapes are priced from
// the catalog, the spot gang is interrupted, and the flip price is where the costs meet.
func TestRunGangShort(t *testing.T) {
	o := DefaultGangOptions()
	o.SpotDir = "gangdata/spot-preempt"
	o.GPUs, o.Steps, o.Speeds = []int{4}, 6000, []float64{1, 4}
	var out strings.Builder
	results, err := RunGang(o, &out)
	if err != nil {
		t.Fatal(err)
	}
	r := results[0]
	// p3.8xlarge on-demand is 12.24 $/h in every us-east-1 AZ of the catalog.
	hours := (o.Restart.Seconds() + float64(o.Steps)*o.StepTime.Seconds()) / 3600
	if math.Abs(r.OnDemand.Cost-12.24*hours) > 1e-9 || r.OnDemand.Interruptions != 0 {
		t.Errorf("on-demand %+v: want 12.24 $/h × %.3f h, uninterrupted", r.OnDemand, hours)
	}
	if !r.Spot.Finished || r.Spot.Interruptions == 0 || r.Spot.Hours <= hours {
		t.Errorf("spot %+v: want a finished, interrupted, slower run", r.Spot)
	}
	if got := r.Spot.Cost * r.FlipSpotPrice / r.SpotPrice; math.Abs(got-r.OnDemand.Cost) > 1e-6 {
		t.Errorf("spot cost at the flip price = %v, want the on-demand cost %v", got, r.OnDemand.Cost)
	}
	for _, want := range []string{"| 4 | 4×1 V100 spot (p3.2xlarge) |", "| 4 | 1×4 V100 on-demand (p3.8xlarge) |", "flips at spot $/h"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	o.GPUs = []int{3}
	if _, err := RunGang(o, &out); err == nil {
		t.Error("3 GPUs: want an error (no on-demand type with 3 V100s)")
	}
	o.GPUs, o.Checkpoint = []int{4}, 0
	if _, err := RunGang(o, &out); err == nil {
		t.Error("checkpoint 0: want an error")
	}
}
