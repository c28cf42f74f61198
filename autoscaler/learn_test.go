package autoscaler

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
)

func TestColdStartOf(t *testing.T) {
	const m = time.Minute
	tests := map[string]struct {
		samples []time.Duration
		want    time.Duration
	}{
		"none is unknown":              {nil, 0},
		"non-positive samples ignored": {[]time.Duration{0, -m}, 0},
		"one":                          {[]time.Duration{4 * m}, 4 * m},
		"median, not mean":             {[]time.Duration{3 * m, 30 * m, 4 * m}, 4 * m},
		"even count averages the middle": {[]time.Duration{5 * m, 3 * m, 4 * m, 6 * m},
			4*m + 30*time.Second},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ColdStartOf(tc.samples); got != tc.want {
				t.Errorf("ColdStartOf(%v) = %v, want %v", tc.samples, got, tc.want)
			}
		})
	}
}

func TestErlang(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 0.005 }
	if got := erlangC(1, 0.5); !near(got, 0.5) {
		t.Errorf("erlangC(1, 0.5) = %v, want 0.5 (one server busy half the time)", got)
	}
	if got := erlangC(2, 1); !near(got, 1.0/3) {
		t.Errorf("erlangC(2, 1) = %v, want 1/3", got)
	}
	if got := erlangC(4, 4); got != 1 {
		t.Errorf("erlangC at full load = %v, want 1", got)
	}
	tests := map[string]struct {
		slots, tolerance, want float64
	}{
		"six slots at 1%":       {6, 0.01, 1.758},
		"six slots at 0.3%":     {6, 0.003, 1.368},
		"between six and seven": {6.5, 0.003, 1.601},
		"64 slots run fuller":   {64, 0.01, 46.60},
		"under one slot":        {0.5, 0.01, 0},
		"not a number":          {math.NaN(), 0.01, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := erlangCLoad(tc.slots, tc.tolerance); math.Abs(got-tc.want) > 0.01 {
				t.Errorf("erlangCLoad(%v, %v) = %v, want %v", tc.slots, tc.tolerance, got, tc.want)
			}
		})
	}
	if got := targetInflightFor(2); got != minTargetInflight {
		t.Errorf("targetInflightFor(2) = %v, want the floor %v", got, minTargetInflight)
	}
}

func TestWantsEngineLoad(t *testing.T) {
	tests := map[string]struct {
		spec Spec
		want bool
	}{
		"llm":                             {Spec{Policy: PolicyLLM, TargetInflight: 4}, true},
		"concurrency learning its target": {Spec{Policy: PolicyConcurrency}, true},
		"concurrency with a set target":   {Spec{Policy: PolicyConcurrency, TargetInflight: 4}, false},
		"request_rate":                    {Spec{Policy: PolicyRequestRate}, false},
		"fixed":                           {Spec{}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.spec.WantsEngineLoad(); got != tc.want {
				t.Errorf("WantsEngineLoad = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSpecForLeavesLearnedKnobsUnset(t *testing.T) {
	got := SpecFor(configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 10, Autoscaler: configs.AutoscalerConcurrency})
	if got.TargetInflight != 0 || got.StableWindow != 0 || got.Overprovision != 0 || !got.LearnHeadroom {
		t.Errorf("SpecFor(no knobs) = target %v, window %v, overprovision %d, learn headroom %v; want all learned",
			got.TargetInflight, got.StableWindow, got.Overprovision, got.LearnHeadroom)
	}
	set := SpecFor(configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 10, Autoscaler: configs.AutoscalerConcurrency,
		TargetInflightPerReplica: 2, StableWindowSeconds: 600, NumOverprovision: 1})
	if set.TargetInflight != 2 || set.StableWindow != 10*time.Minute || set.Overprovision != 1 || set.LearnHeadroom {
		t.Errorf("SpecFor(knobs set) = %+v, want them as set and no learned headroom", set)
	}
	none := SpecFor(configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 10, Autoscaler: configs.AutoscalerConcurrency,
		NumOverprovision: 0, NumOverprovisionSet: true})
	if none.LearnHeadroom {
		t.Error("num_overprovision: 0 written explicitly still learns a headroom")
	}
	if set.PanicWindow != DefaultPanicWindow {
		t.Errorf("panic window %v with a set stable window, want %v", set.PanicWindow, DefaultPanicWindow)
	}
	if got.PanicWindow != 0 {
		t.Errorf("panic window %v with a learned stable window, want 0 (learned)", got.PanicWindow)
	}
}

func TestLearnedStableWindow(t *testing.T) {
	const sec = time.Second
	// Four replicas' worth of load for 20 minutes, then one replica's worth: the stable
	// average falls below 3 after a third of the window.
	busy := func(cold time.Duration) Observation { return Observation{InFlight: 40, ColdStart: cold} }
	quiet := func(cold time.Duration) Observation { return Observation{InFlight: 10, ColdStart: cold} }
	four := State{Ready: 4}
	tests := map[string]struct {
		spec  Spec
		cold  time.Duration
		steps func(cold time.Duration) []step
	}{
		// A 4-minute cold start makes the window 20 minutes: 400 s of less load to scale down.
		"five cold starts": {
			spec: Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 10},
			cold: 4 * time.Minute,
			steps: func(cold time.Duration) []step {
				return []step{
					{dt: sec, obs: busy(cold), st: four, repeat: 1200, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 390, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 20, wantTarget: 3},
				}
			},
		},
		// No replica has been READY yet: Knative's 60 s, 20 s to scale down.
		"unknown cold start is Knative's window": {
			spec: Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 10},
			steps: func(cold time.Duration) []step {
				return []step{
					{dt: sec, obs: busy(cold), st: four, repeat: 60, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 15, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 10, wantTarget: 3},
				}
			},
		},
		// A fast cold start never shortens the window below 60 s.
		"fast cold starts keep 60 s": {
			spec: Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 10},
			cold: 2 * time.Second,
			steps: func(cold time.Duration) []step {
				return []step{
					{dt: sec, obs: busy(cold), st: four, repeat: 60, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 15, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 10, wantTarget: 3},
				}
			},
		},
		// A set stable window is kept whatever the cold start.
		"a set window wins": {
			spec: Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 10, StableWindow: 60 * sec},
			cold: 4 * time.Minute,
			steps: func(cold time.Duration) []step {
				return []step{
					{dt: sec, obs: busy(cold), st: four, repeat: 60, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 15, wantTarget: 4},
					{dt: sec, obs: quiet(cold), st: four, repeat: 10, wantTarget: 3},
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, New(tc.spec), tc.steps(tc.cold)) })
	}

	t.Run("a learned window waits to fill before scaling down", func(t *testing.T) {
		// The cold start becomes known after a minute of load: the window grows to 20
		// minutes, and the scaler holds its target until it has seen them.
		s := New(Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 10})
		run(t, s, []step{
			{dt: sec, obs: busy(0), st: four, repeat: 60, wantTarget: 4},
			{dt: sec, obs: Observation{ColdStart: 4 * time.Minute}, st: four, repeat: 1100, wantTarget: 4},
			{dt: sec, obs: Observation{ColdStart: 4 * time.Minute}, st: four, repeat: 100, wantTarget: 2},
		})
	})

	t.Run("scale to zero waits a learned window", func(t *testing.T) {
		s := New(Spec{Policy: PolicyConcurrency, Min: 0, Max: 4, TargetInflight: 10})
		idle := Observation{ColdStart: time.Minute} // window 5 minutes, grace 30 s
		run(t, s, []step{
			{dt: sec, obs: idle, st: State{Ready: 1}, repeat: 330, wantTarget: 1},
			{dt: sec, obs: idle, st: State{Ready: 1}, wantTarget: 0},
		})
	})
}

func TestLearnedPanicWindow(t *testing.T) {
	const sec = time.Second
	spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 50, TargetInflight: 1}
	cold := 4 * time.Minute // a 20-minute stable window, a 2-minute panic window
	steady := Observation{InFlight: 10, ColdStart: cold}
	ten := State{Ready: 10}
	tests := map[string]struct {
		spec  Spec
		steps []step
	}{
		// Knative's 6 s: four seconds of three times the load are a burst.
		"unknown cold start: 6 s": {spec, []step{
			{dt: sec, obs: inflight(10), st: ten, repeat: 120, wantTarget: 10},
			{dt: sec, obs: inflight(30), st: ten, repeat: 4, wantTarget: 24, wantPanic: true},
		}},
		// A tenth of 20 minutes: four seconds of four times the load only nudge the stable
		// average; a minute of it is a burst (the 2-minute average, 25, is twice the 12 the
		// stable window asks for by then).
		"learned: a tenth of the stable window": {spec, []step{
			{dt: sec, obs: steady, st: ten, repeat: 1200, wantTarget: 10},
			{dt: sec, obs: Observation{InFlight: 40, ColdStart: cold}, st: ten, repeat: 4, wantTarget: 11},
			{dt: sec, obs: Observation{InFlight: 40, ColdStart: cold}, st: ten, repeat: 56, wantTarget: 25, wantPanic: true},
		}},
		"a set panic window is kept": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 50, TargetInflight: 1, PanicWindow: 6 * sec},
			[]step{
				{dt: sec, obs: steady, st: ten, repeat: 1200, wantTarget: 10},
				{dt: sec, obs: Observation{InFlight: 30, ColdStart: cold}, st: ten, repeat: 4, wantTarget: 24, wantPanic: true},
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, New(tc.spec), tc.steps) })
	}
}

func TestLearnedTargetInflight(t *testing.T) {
	const sec = time.Second
	// Four replicas report 12 requests running with half their KV caches full: a full cache
	// holds 6 requests, and Erlang's formula allows 1.368 in flight per replica at 0.3%.
	engine := &EngineLoad{Running: 12, KVCacheUsage: 0.5, Replicas: 4}
	obs := Observation{InFlight: 16, Engine: engine}
	four := State{Ready: 4}
	tests := map[string]struct {
		spec  Spec
		steps []step
	}{
		"learned after a minute of samples": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, StableWindow: 10 * sec, PanicThreshold: 100},
			[]step{
				// Until then DefaultTargetInflight: 16 / 8 = 2.
				{dt: sec, obs: obs, st: four, repeat: 59, wantTarget: 2},
				// Then 16 / 1.368 = 11.7 replicas, averaged in over the 10 s window.
				{dt: sec, obs: obs, st: four, repeat: 20, wantTarget: 12},
			},
		},
		"the llm policy learns it too": {
			Spec{Policy: PolicyLLM, Min: 1, Max: 20, StableWindow: 10 * sec, PanicThreshold: 100},
			[]step{{dt: sec, obs: obs, st: four, repeat: 80, wantTarget: 12}},
		},
		"a set target ignores the engines": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, TargetInflight: 8, StableWindow: 10 * sec, PanicThreshold: 100},
			[]step{{dt: sec, obs: obs, st: four, repeat: 80, wantTarget: 2}},
		},
		"near-empty caches teach nothing": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, StableWindow: 10 * sec, PanicThreshold: 100},
			[]step{{dt: sec, obs: Observation{InFlight: 16, Engine: &EngineLoad{Running: 1, KVCacheUsage: 0.01, Replicas: 4}},
				st: four, repeat: 80, wantTarget: 2}},
		},
		"no engine metrics keep the default": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, StableWindow: 10 * sec, PanicThreshold: 100},
			[]step{{dt: sec, obs: inflight(16), st: four, repeat: 80, wantTarget: 2}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, New(tc.spec), tc.steps) })
	}
}

func TestHeadroom(t *testing.T) {
	start := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	const cold = time.Minute
	// feed drives a headroom second by second through targets, one per second, and returns
	// its answer after the last.
	feed := func(h *headroom, from time.Time, coldStart time.Duration, targets []int) (int, time.Time) {
		got := 0
		for i, n := range targets {
			got = h.record(from.Add(time.Duration(i)*time.Second), n, coldStart)
		}
		return got, from.Add(time.Duration(len(targets)) * time.Second)
	}
	// steps is a target that steps from lo to hi once per minute for minutes minutes (each
	// step a growth of hi − lo within the cold start), then stays at lo.
	steps := func(lo, hi, minutes int) []int {
		var out []int
		for range minutes {
			for s := range 60 {
				out = append(out, map[bool]int{true: lo, false: hi}[s < 30])
			}
		}
		return out
	}
	flat := func(n, seconds int) []int {
		out := make([]int, seconds)
		for i := range out {
			out[i] = n
		}
		return out
	}

	t.Run("no cold start, no headroom", func(t *testing.T) {
		if got, _ := feed(newHeadroom(), start, 0, steps(10, 15, 30)); got != 0 {
			t.Errorf("headroom %d without a cold start, want 0", got)
		}
	})
	// quiet is a day without growth, the scaler called once an hour (each skipped minute
	// counts as one without growth).
	quiet := func(h *headroom, at time.Time, hours int) time.Time {
		for range hours {
			at = at.Add(time.Hour)
			h.record(at, 10, cold)
		}
		return at
	}
	t.Run("a new service covers the growth it has seen", func(t *testing.T) {
		// 16 minutes seen, 14 of them growing by 5: the day's 1% is no minute yet.
		if got, _ := feed(newHeadroom(), start, cold, append(steps(10, 15, 14), flat(10, 120)...)); got != 5 {
			t.Errorf("headroom %d after 14 of 16 minutes grew by 5, want 5", got)
		}
	})
	t.Run("growth in fewer than 1% of a day's minutes is not covered", func(t *testing.T) {
		h := newHeadroom()
		at := quiet(h, start, 24)
		if got, _ := feed(h, at, cold, append(steps(10, 15, 13), flat(10, 120)...)); got != 0 {
			t.Errorf("headroom %d after 13 minutes of growth in a day, want 0", got)
		}
	})
	t.Run("growth in more than 1% is, and a day later it is forgotten", func(t *testing.T) {
		h := newHeadroom()
		at := quiet(h, start, 24)
		got, at := feed(h, at, cold, append(steps(10, 12, 16), flat(10, 120)...))
		if got != 2 {
			t.Errorf("headroom %d after 16 minutes of growth by 2, want 2", got)
		}
		// Growth by 5 in a few minutes does not raise it.
		if got, at = feed(h, at, cold, append(steps(10, 15, 3), flat(10, 120)...)); got != 2 {
			t.Errorf("headroom %d after a short spike, want 2", got)
		}
		at = quiet(h, at, 25)
		if got, _ = feed(h, at, cold, flat(10, 120)); got != 0 {
			t.Errorf("headroom %d a day later, want 0", got)
		}
	})
	t.Run("growth is measured over one cold start", func(t *testing.T) {
		// A target that grows by one every two minutes grows by at most one within a
		// one-minute cold start, but by two within a four-minute one.
		var ramp []int
		for i := range 30 {
			ramp = append(ramp, flat(10+i, 120)...)
		}
		if got, _ := feed(newHeadroom(), start, cold, ramp); got != 1 {
			t.Errorf("headroom %d with a one-minute cold start, want 1", got)
		}
		if got, _ := feed(newHeadroom(), start, 4*time.Minute, ramp); got != 2 {
			t.Errorf("headroom %d with a four-minute cold start, want 2", got)
		}
	})

	t.Run("the scaler adds it and says so", func(t *testing.T) {
		spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 50, TargetInflight: 1, StableWindow: 2 * time.Second,
			PanicThreshold: 100, MaxScaleDownRate: 100, LearnHeadroom: true}
		s := New(spec)
		now := start
		var d Decision
		for range 16 {
			for i := range 60 {
				now = now.Add(time.Second)
				load := map[bool]float64{true: 10, false: 13}[i < 30]
				d = s.Decide(now, Observation{InFlight: load, ColdStart: cold}, State{Ready: 20})
			}
		}
		for range 5 {
			now = now.Add(time.Second)
			d = s.Decide(now, Observation{InFlight: 10, ColdStart: cold}, State{Ready: 20})
		}
		if want := (Decision{Target: 13, Overprovision: 3}); d.Target != want.Target || d.Overprovision != want.Overprovision {
			t.Errorf("decision %+v, want target 10 + headroom 3", d)
		}
		spec.Overprovision = 1
		if d := New(spec).Decide(now, Observation{InFlight: 10, ColdStart: cold}, State{Ready: 20}); d.Overprovision != 1 {
			t.Errorf("a set num_overprovision gave overprovision %d, want 1", d.Overprovision)
		}
	})
}

func TestBacklogAfterLoss(t *testing.T) {
	const sec = time.Second
	// Ten replicas carry 10 in flight at 5 arrivals/s: 2 s in the system. Then half of them
	// are preempted: their queue grows on the survivors while arrivals stay the same.
	whole := step{dt: sec, obs: Observation{Arrivals: 5, InFlight: 10}, st: State{Ready: 10}, repeat: 120, wantTarget: 10}
	shortfall := step{dt: sec, obs: Observation{Arrivals: 5, InFlight: 30}, st: State{Ready: 5}, repeat: 30, wantTarget: 10}
	learned := Spec{Policy: PolicyConcurrency, Min: 1, Max: 50, TargetInflight: 1}
	tests := map[string]struct {
		spec  Spec
		steps []step
	}{
		"a loss's queue is not a burst": {learned, []step{
			{dt: sec, obs: whole.obs, st: whole.st, repeat: 121, wantTarget: 10},
			shortfall,
			// Replacements READY, the queue drains.
			{dt: sec, obs: Observation{Arrivals: 5, InFlight: 25}, st: State{Ready: 10}, repeat: 5, wantTarget: 10},
			{dt: sec, obs: whole.obs, st: whole.st, repeat: 5, wantTarget: 10},
		}},
		"a burst during a loss still panics": {learned, []step{
			{dt: sec, obs: whole.obs, st: whole.st, repeat: 121, wantTarget: 10},
			// Four times the arrivals: 40 in flight's worth, twice the target, once the panic
			// window holds only the burst's arrivals (and more in flight than they imply is
			// the loss's queue).
			{dt: sec, obs: Observation{Arrivals: 20, InFlight: 60}, st: State{Ready: 5}, repeat: 12, wantTarget: 40, wantPanic: true},
		}},
		"a fleet that is only growing is not capped": {learned, []step{
			{dt: sec, obs: whole.obs, st: whole.st, repeat: 121, wantTarget: 10},
			// More in flight per replica at the same arrivals (longer requests), while the new
			// replicas start: no replica was lost, so the in-flight is the load's.
			{dt: sec, obs: Observation{Arrivals: 5, InFlight: 30}, st: State{Ready: 10}, repeat: 6, wantTarget: 30, wantPanic: true},
		}},
		"with a set stable window the loss's queue panics (Knative's behaviour)": {
			Spec{Policy: PolicyConcurrency, Min: 1, Max: 50, TargetInflight: 1, StableWindow: 60 * sec},
			[]step{
				{dt: sec, obs: whole.obs, st: whole.st, repeat: 121, wantTarget: 10},
				{dt: sec, obs: shortfall.obs, st: shortfall.st, repeat: 6, wantTarget: 30, wantPanic: true},
			}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, New(tc.spec), tc.steps) })
	}
}

// TestLearnedDefaultsDecision is the whole default spec on a short scripted run: the reason
// names what was learned.
func TestLearnedDefaultsDecision(t *testing.T) {
	s := New(SpecFor(configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 20, Autoscaler: configs.AutoscalerLLM}))
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	var d Decision
	for range 120 {
		now = now.Add(time.Second)
		d = s.Decide(now, Observation{Arrivals: 2, InFlight: 8, ColdStart: 4 * time.Minute,
			Engine: &EngineLoad{Running: 9, KVCacheUsage: 0.25, Replicas: 6}}, State{Ready: 6})
	}
	// Six slots per replica: 1.368 in flight; five 4-minute cold starts.
	if want := "(learned: 1.37 in flight per replica, 20m0s window)"; !strings.Contains(d.Reason, want) {
		t.Errorf("reason %q lacks %q", d.Reason, want)
	}
}
