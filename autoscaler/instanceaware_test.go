package autoscaler

import (
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
)

func TestInstanceAwareTarget(t *testing.T) {
	targets := map[string]float64{"H100": 10, "L4": 2}
	tests := map[string]struct {
		qps         float64
		live, ready []string
		want        int
	}{
		// Capacity 10+2 = 12; 20 qps is 8 over, at the largest target 10: one more.
		"up by the largest target": {qps: 20, live: []string{"H100", "L4"}, ready: []string{"H100", "L4"}, want: 3},
		"at capacity adds none":    {qps: 12, live: []string{"H100", "L4"}, ready: []string{"H100", "L4"}, want: 2},
		// Below capacity: the H100 alone (10) covers 9 qps, so one replica suffices.
		"down keeps the strongest": {qps: 9, live: []string{"L4", "H100", "L4"}, ready: []string{"L4", "H100", "L4"}, want: 1},
		// 11 qps needs more than the H100: H100 + L4 = 12 > 11.
		"down adds the next":     {qps: 11, live: []string{"L4", "H100", "L4"}, ready: []string{"L4", "H100", "L4"}, want: 2},
		"nothing live":           {qps: 25, want: 3},
		"unknown is the weakest": {qps: 5, live: []string{"TPU", "TPU"}, ready: []string{"TPU", "TPU"}, want: 3},
		"case and count keys":    {qps: 9, live: []string{"h100"}, ready: []string{"h100"}, want: 1},
		// Live but none READY, below capacity: one replica of the largest target.
		"none ready": {qps: 3, live: []string{"H100"}, want: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := instanceAwareTarget(targets, tc.qps, State{LiveAccelerators: tc.live, ReadyAccelerators: tc.ready})
			if got != tc.want {
				t.Errorf("target = %d, want %d", got, tc.want)
			}
		})
	}
}

// Through SpecFor, Observe and Decide as the scale loop runs them: a service of two L4s and
// an H100 under 30 qps grows to four replicas, where the smallest-target rule asked for 15.
func TestRequestRatePerAccelerator(t *testing.T) {
	p := configs.ReplicaPolicy{Autoscaler: PolicyRequestRate, MinReplicas: 1, MaxReplicas: 20,
		TargetQPSPerAccelerator: map[string]float64{"H100": 16, "L4": 2}, UpscaleDelaySeconds: 1, DownscaleDelaySeconds: 1}
	spec := SpecFor(p)
	s := New(spec)
	start := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	fleet := []Replica{{Ready: true, Live: true, Accelerator: "H100"}, {Ready: true, Live: true, Accelerator: "L4"}, {Ready: true, Live: true, Accelerator: "L4"}}
	var d Decision
	for i := range 120 {
		obs, st := Observe(spec, Sample{Arrivals: 30, Replicas: fleet, Target: 3})
		d = s.Decide(start.Add(time.Duration(i)*time.Second), obs, st)
	}
	// 30 qps against 16+2+2 = 20 of capacity: 10 over, one more at the largest target.
	if d.Target != 4 {
		t.Errorf("target %d (%s), want 4", d.Target, d.Reason)
	}
	old := configs.ReplicaPolicy{Autoscaler: PolicyRequestRate, MinReplicas: 1, MaxReplicas: 20, TargetQPSPerReplica: 2}
	if got := ceilReplicas(30 / SpecFor(old).TargetQPS); got != 15 {
		t.Errorf("smallest-target rule gives %d, want 15 (the comparison's premise)", got)
	}
}
