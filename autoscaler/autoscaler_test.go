package autoscaler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// step is one scripted tick: time advances by dt, then Decide sees obs and st.
type step struct {
	dt  time.Duration
	obs Observation
	st  State
	// repeat runs the same tick this many times (default once); the wants apply to the last.
	repeat     int
	wantTarget int
	wantPanic  bool
}

// run feeds steps to s on a scripted clock and reports every tick whose answer differs.
func run(t *testing.T, s Scaler, steps []step) {
	t.Helper()
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for i, st := range steps {
		var d Decision
		for range max(st.repeat, 1) {
			now = now.Add(st.dt)
			d = s.Decide(now, st.obs, st.st)
		}
		got := struct {
			Target int
			Panic  bool
		}{d.Target, d.Panic}
		want := struct {
			Target int
			Panic  bool
		}{st.wantTarget, st.wantPanic}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("step %d (%s): decision mismatch (-want +got):\n%s", i, d.Reason, diff)
		}
	}
}

func inflight(n float64) Observation { return Observation{InFlight: n} }

func TestRequestRate(t *testing.T) {
	// SkyServe's semantics with its 20 s decisions: upscale after 60 s (3 decisions), downscale
	// after 120 s (6 decisions).
	sky := Spec{Policy: PolicyRequestRate, Min: 1, Max: 5, TargetQPS: 1, UpscaleDelay: time.Minute,
		DownscaleDelay: 2 * time.Minute, DecisionInterval: 20 * time.Second}
	const tick = 20 * time.Second
	// 60 requests per 20 s tick = 3 QPS once the 60 s window is full.
	busy := Observation{Arrivals: 60}
	tests := map[string]struct {
		spec  Spec
		steps []step
	}{
		"starts at min and holds without load": {sky, []step{
			{dt: tick, repeat: 10, wantTarget: 1},
		}},
		"scale up waits for the upscale delay": {sky, []step{
			{dt: tick, obs: busy, wantTarget: 1}, // qps 1: raw 1
			{dt: tick, obs: busy, wantTarget: 1}, // qps 2: up 1/3
			{dt: tick, obs: busy, wantTarget: 1}, // qps 3: up 2/3
			{dt: tick, obs: busy, wantTarget: 3}, // up 3/3
			{dt: tick, obs: busy, wantTarget: 3},
		}},
		"a decision without change resets the upscale count": {sky, []step{
			// Minute-long ticks: each decision's window holds only its own arrivals.
			{dt: time.Minute, obs: Observation{Arrivals: 180}, repeat: 2, wantTarget: 1}, // up 2/3
			{dt: time.Minute, wantTarget: 1},                                             // raw 1: reset
			{dt: time.Minute, obs: Observation{Arrivals: 180}, repeat: 2, wantTarget: 1}, // up 2/3
			{dt: time.Minute, obs: Observation{Arrivals: 180}, wantTarget: 3},
		}},
		"scale down waits for the downscale delay": {sky, []step{
			{dt: tick, obs: busy, repeat: 4, wantTarget: 3},
			{dt: tick, repeat: 5, wantTarget: 3}, // the window drains (raw 2, 1, 1, ...): down 5/6
			{dt: tick, wantTarget: 1},
		}},
		"max clips and overprovision adds on top": {
			Spec{Policy: PolicyRequestRate, Min: 1, Max: 2, TargetQPS: 1, Overprovision: 1, DecisionInterval: tick},
			[]step{
				{dt: tick, wantTarget: 2},
				{dt: tick, obs: busy, repeat: 3, wantTarget: 3},
			}},
		"from zero jumps at once": {
			Spec{Policy: PolicyRequestRate, Min: 0, Max: 4, TargetQPS: 1, UpscaleDelay: 5 * time.Minute,
				DownscaleDelay: 20 * time.Minute, DecisionInterval: tick},
			[]step{
				{dt: tick, repeat: 3, wantTarget: 0},
				{dt: tick, obs: Observation{Arrivals: 1}, wantTarget: 1},
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, New(tc.spec), tc.steps) })
	}
}

func TestConcurrency(t *testing.T) {
	const sec = time.Second
	base := Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, TargetInflight: 10, StableWindow: 60 * sec,
		PanicWindow: 6 * sec, PanicThreshold: 2, ScaleToZeroGrace: 30 * sec}
	one := State{Ready: 1, Target: 1}
	tests := map[string]struct {
		spec  Spec
		steps []step
	}{
		"steady load settles at in-flight over target": {base, []step{
			{dt: sec, obs: inflight(25), st: State{Ready: 3}, repeat: 60, wantTarget: 3},
		}},
		"a burst enters panic within the panic window": {base, []step{
			{dt: sec, obs: inflight(5), st: one, repeat: 30, wantTarget: 1},
			// 60 in flight = 6 replicas' worth: the 6 s window averages (5×0.5 + 6)/6 = 1.4 after
			// one tick, 2.3 after two — over 2× the single READY replica.
			{dt: sec, obs: inflight(60), st: one, wantTarget: 1},
			{dt: sec, obs: inflight(60), st: one, wantTarget: 3, wantPanic: true},
			{dt: sec, obs: inflight(60), st: one, repeat: 4, wantTarget: 6, wantPanic: true},
		}},
		"panic never scales down and ends a stable window after the last panic tick": {base, []step{
			// Over the threshold against the one READY replica; once the target is 6, 60 in
			// flight is no longer twice the capacity asked for, so the first tick is the last.
			{dt: sec, obs: inflight(60), st: one, repeat: 6, wantTarget: 6, wantPanic: true},
			// Load vanishes; replicas came up. Panic holds 6 for 60 s after that tick.
			{dt: sec, obs: inflight(0), st: State{Ready: 6}, repeat: 54, wantTarget: 6, wantPanic: true},
			{dt: sec, obs: inflight(0), st: State{Ready: 6}, wantTarget: 3},
		}},
		"losing READY replicas is not a burst: panic measures against the target": {base, []step{
			{dt: sec, obs: inflight(60), st: State{Ready: 6}, repeat: 60, wantTarget: 6},
			// A zone is preempted: 3 READY, requests queue on them. 100 in flight is 10
			// replicas' worth, over twice the 3 READY but not twice the 6 asked for: the stable
			// window moves the target by one, panic does not jump it to 10.
			{dt: sec, obs: inflight(100), st: State{Ready: 3, Target: 6}, wantTarget: 7},
		}},
		"scale-down is at most halving per decision": {base, []step{
			{dt: sec, obs: inflight(80), st: State{Ready: 8}, repeat: 60, wantTarget: 8},
			{dt: sec, obs: inflight(0), st: State{Ready: 8}, repeat: 60, wantTarget: 4},
			{dt: sec, obs: inflight(0), st: State{Ready: 4}, wantTarget: 2},
			{dt: sec, obs: inflight(0), st: State{Ready: 2}, wantTarget: 1},
		}},
		"scale-up rate bounds growth per decision": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 100, TargetInflight: 1, MaxScaleUpRate: 2},
			[]step{
				{dt: sec, obs: inflight(50), st: State{Ready: 2}, wantTarget: 4, wantPanic: true},
			}},
		"max clips the target": {base, []step{
			{dt: sec, obs: inflight(1000), st: State{Ready: 20}, repeat: 60, wantTarget: 20, wantPanic: true},
		}},
		"overprovision adds on top": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 5, TargetInflight: 10, Overprovision: 2},
			[]step{{dt: sec, obs: inflight(20), st: State{Ready: 4}, repeat: 60, wantTarget: 4}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, New(tc.spec), tc.steps) })
	}
}

func TestScaleToZero(t *testing.T) {
	const sec = time.Second
	spec := Spec{Policy: PolicyConcurrency, Min: 0, Max: 4, TargetInflight: 10, StableWindow: 60 * sec,
		PanicWindow: 6 * sec, ScaleToZeroGrace: 30 * sec}
	run(t, New(spec), []step{
		// A scale-to-zero service starts with one replica and keeps it for a full idle
		// window plus grace.
		{dt: sec, st: State{Ready: 1}, repeat: 90, wantTarget: 1},
		{dt: sec, st: State{Ready: 1}, wantTarget: 0},
		{dt: sec, repeat: 100, wantTarget: 0},
		// A request held at zero asks for a replica at once.
		{dt: sec, obs: Observation{Arrivals: 1, InFlight: 1}, wantTarget: 1},
		// Served and gone: the replica stays a window plus grace after the last request.
		{dt: sec, st: State{Ready: 1}, repeat: 89, wantTarget: 1},
		{dt: sec, st: State{Ready: 1}, wantTarget: 0},
	})

	t.Run("min above zero never reaches zero", func(t *testing.T) {
		s := spec
		s.Min = 1
		run(t, New(s), []step{{dt: sec, repeat: 500, wantTarget: 1}})
	})
}

func TestLLMDemand(t *testing.T) {
	const sec = time.Second
	spec := Spec{Policy: PolicyLLM, Min: 1, Max: 10, TargetInflight: 10, TargetWaiting: 1, TargetKVCacheUsage: 0.8}
	two := State{Ready: 2}
	tests := map[string]struct {
		obs  Observation
		want int
	}{
		"in-flight alone":             {Observation{InFlight: 20}, 2},
		"queues past target add help": {Observation{InFlight: 20, Engine: &EngineLoad{Waiting: 12}}, 3},
		"queues within target do not": {Observation{InFlight: 5, Engine: &EngineLoad{Waiting: 2}}, 1},
		"KV pressure adds help":       {Observation{InFlight: 12, Engine: &EngineLoad{KVCacheUsage: 0.96}}, 3},
		"low KV use keeps in-flight":  {Observation{InFlight: 12, Engine: &EngineLoad{KVCacheUsage: 0.5}}, 2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			run(t, New(spec), []step{{dt: sec, obs: tc.obs, st: two, repeat: 60, wantTarget: tc.want}})
		})
	}
	t.Run("concurrency ignores engine load", func(t *testing.T) {
		s := spec
		s.Policy = PolicyConcurrency
		run(t, New(s), []step{{dt: sec, obs: Observation{InFlight: 20, Engine: &EngineLoad{Waiting: 40}}, st: two, repeat: 60, wantTarget: 2}})
	})
}

func TestFixed(t *testing.T) {
	run(t, New(Spec{Min: 3, Max: 3}), []step{{dt: time.Second, obs: inflight(1000), st: State{Ready: 3}, repeat: 100, wantTarget: 3}})
}
