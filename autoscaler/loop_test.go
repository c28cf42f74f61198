package autoscaler

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// scriptedTicker is a Ticker the test drives: each send is one sample tick at that time.
type scriptedTicker struct{ c chan time.Time }

func (t *scriptedTicker) C() <-chan time.Time { return t.c }
func (t *scriptedTicker) Stop()               {}

// scriptedLoad is a LoadSource whose values the test sets between ticks.
type scriptedLoad struct {
	mu       sync.Mutex
	arrivals uint64
	inflight float64
	engines  []EngineLoad
}

func (s *scriptedLoad) Arrivals() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arrivals
}

func (s *scriptedLoad) InFlight() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight
}

func (s *scriptedLoad) Engines() []EngineLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.engines
}

func (s *scriptedLoad) set(arrive uint64, inflight float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.arrivals += arrive
	s.inflight = inflight
}

// scriptedFleet is a Fleet that is always exactly its target, READY, with a four-minute cold
// start; it records every decision it is given.
type scriptedFleet struct {
	mu        sync.Mutex
	target    int
	known     bool
	decisions []Decision
	// panics makes Replicas panic while it is set.
	panics bool
}

func (f *scriptedFleet) Replicas() []Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics {
		panic("fleet unavailable")
	}
	launched := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	out := make([]Replica, f.target)
	for i := range out {
		out[i] = Replica{LaunchedAt: launched, ReadyAt: launched.Add(4 * time.Minute), Ready: true, Live: true}
	}
	return out
}

func (f *scriptedFleet) Target() (int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.target, f.known
}

func (f *scriptedFleet) SetTarget(d Decision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target, f.known = d.Target, true
	f.decisions = append(f.decisions, d)
}

func (f *scriptedFleet) state() (int, []Decision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.target, append([]Decision(nil), f.decisions...)
}

// loopHarness runs a Loop inside a synctest bubble on a scripted ticker.
type loopHarness struct {
	t      *testing.T
	loop   *Loop
	ticker *scriptedTicker
	load   *scriptedLoad
	fleet  *scriptedFleet
	now    time.Time
	stop   context.CancelFunc
	done   chan error
}

func newLoopHarness(t *testing.T, spec Spec, fleet *scriptedFleet) *loopHarness {
	h := &loopHarness{t: t, ticker: &scriptedTicker{c: make(chan time.Time)}, load: &scriptedLoad{}, fleet: fleet,
		now: time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)}
	h.loop = NewLoop(LoopConfig{Spec: spec, Load: h.load, Fleet: fleet,
		NewTicker: func(time.Duration) Ticker { return h.ticker }, Now: func() time.Time { return h.now }})
	h.start()
	t.Cleanup(h.halt) // a failed test's loop must not outlive the bubble
	return h
}

func (h *loopHarness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.stop, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.loop.Start(ctx) }()
	synctest.Wait()
}

// halt stops the loop; it may be called again.
func (h *loopHarness) halt() {
	if h.stop == nil {
		return
	}
	h.stop()
	h.stop = nil
	if err := <-h.done; err != nil {
		h.t.Fatalf("Start returned %v", err)
	}
}

// seconds sends n decision intervals of sample ticks (one second each), with the load set to
// arrive requests per second and inflight in flight.
func (h *loopHarness) seconds(n int, arrive uint64, inflight float64) {
	for range n {
		h.load.set(arrive, inflight)
		for range SamplesPerDecision {
			h.now = h.now.Add(time.Second / SamplesPerDecision)
			h.ticker.c <- h.now
		}
		synctest.Wait()
	}
}

func TestLoopScalesUpUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 2, StableWindow: 10 * time.Second,
			PanicWindow: 2 * time.Second, PanicThreshold: 100}
		h := newLoopHarness(t, spec, &scriptedFleet{target: 1, known: true})
		h.seconds(1, 0, 1) // one request in flight: 0.5 replicas
		if got, _ := h.fleet.state(); got != 1 {
			t.Fatalf("target at light load = %d, want 1", got)
		}
		// 8 in flight for a whole stable window: 4 replicas of 2 each.
		h.seconds(10, 8, 8)
		got, decisions := h.fleet.state()
		if got != 4 {
			t.Fatalf("target under load = %d, want 4 (decisions %+v)", got, decisions)
		}
		for _, d := range decisions {
			if d.Panic {
				t.Errorf("decision %+v panicked under a threshold of 100", d)
			}
		}
	})
}

func TestLoopPanicMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Knative's windows: a 6 s panic window at 2× the READY replicas.
		spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, TargetInflight: 1, StableWindow: 60 * time.Second}
		h := newLoopHarness(t, spec, &scriptedFleet{target: 2, known: true})
		h.seconds(61, 1, 1)  // a quiet stable window: one replica's worth
		h.seconds(3, 10, 10) // then ten in flight: the panic window wants 5.5, far past 2× one replica
		got, decisions := h.fleet.state()
		if len(decisions) == 0 || !decisions[len(decisions)-1].Panic {
			t.Fatalf("no panic decision under a burst: %+v", decisions)
		}
		if got < 5 {
			t.Fatalf("panic target = %d, want at least the panic window's demand (5)", got)
		}
		// In panic the target never goes down, however quiet it gets.
		h.seconds(5, 0, 0)
		if after, _ := h.fleet.state(); after < got {
			t.Fatalf("target went down in panic: %d → %d", got, after)
		}
	})
}

func TestLoopPokeDecidesAtZero(t *testing.T) {
	tests := map[string]Spec{
		"concurrency":  {Policy: PolicyConcurrency, Min: 0, Max: 3, TargetInflight: 1, StableWindow: time.Minute},
		"request_rate": {Policy: PolicyRequestRate, Min: 0, Max: 3, TargetQPS: 1, UpscaleDelay: time.Minute, DownscaleDelay: time.Minute},
	}
	for name, spec := range tests {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newLoopHarness(t, spec, &scriptedFleet{target: 0, known: true})
				// One request arrives and is held: the proxy pokes, and the loop decides without
				// waiting for a tick.
				h.load.set(1, 1)
				h.loop.Poke()
				synctest.Wait()
				got, decisions := h.fleet.state()
				if got != 1 {
					t.Fatalf("target after a request held at zero = %d, want 1 (decisions %+v)", got, decisions)
				}
				if len(decisions) != 1 {
					t.Fatalf("decisions = %+v, want exactly one", decisions)
				}
			})
		})
	}
}

func TestLoopRestartResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// No in-flight target configured: it is learned from the engines. Four replicas each
		// running 6 requests in 60% of their KV cache hold 10 requests each, which Erlang's
		// formula at 0.3% queueing turns into about 3.4 in flight per replica (the default,
		// until 60 samples back a learned one, is 8). Short windows, so that each phase's
		// demand fills them.
		spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 20, StableWindow: 5 * time.Second, PanicWindow: time.Second,
			PanicThreshold: 100}
		fleet := &scriptedFleet{target: 2, known: true}
		h := newLoopHarness(t, spec, fleet)
		engine := EngineLoad{Running: 6, KVCacheUsage: 0.6, Replicas: 1}
		h.load.mu.Lock()
		h.load.engines = []EngineLoad{engine, engine, engine, engine}
		h.load.mu.Unlock()
		// 12 in flight: 1.5 replicas at the default target, 3.5 at the learned one.
		h.seconds(minCapacitySamples+5, 12, 12)
		got, decisions := fleet.state()
		if got != 4 || !strings.Contains(decisions[len(decisions)-1].Reason, "3.42 in flight per replica") {
			t.Fatalf("target %d after learning (decisions %+v); want 4 from a learned 3.42 in flight per replica", got, decisions)
		}

		// Stopped and started again (a controller that lost and regained its lease, say), the
		// loop keeps what it learned: 20 in flight is 6 replicas at 3.42, where a scaler that
		// started over would want 3 at the default of 8 and keep the 4 it has.
		h.halt()
		h.start()
		h.seconds(10, 20, 20)
		if got, decisions := fleet.state(); got != 6 {
			t.Fatalf("target %d after a restart (decisions %+v); want 6: the learned target was lost", got, decisions)
		}
		h.halt()

		// A new loop over a fleet whose target was saved (a restarted controller) resumes from
		// that target and holds it until it has watched a stable window, rather than reading
		// an empty history as idleness.
		saved, _ := fleet.state()
		fresh := newLoopHarness(t, spec, &scriptedFleet{target: saved, known: true})
		fresh.seconds(4, 0, 0)
		if got, decisions := fresh.fleet.state(); got != saved {
			t.Fatalf("a resumed loop moved the saved target %d to %d within its first stable window (decisions %+v)", saved, got, decisions)
		}
	})
}

func TestLoopResumesFromLiveReplicasWithoutSavedTarget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 1, StableWindow: time.Minute}
		fleet := &scriptedFleet{target: 5} // five live replicas, no target saved
		h := newLoopHarness(t, spec, fleet)
		h.seconds(3, 5, 5)
		if got, decisions := fleet.state(); got != 5 || len(decisions) != 0 {
			t.Fatalf("target = %d after decisions %+v; want the five live replicas kept", got, decisions)
		}
	})
}

func TestLoopRecoversPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec := Spec{Policy: PolicyConcurrency, Min: 1, Max: 10, TargetInflight: 1, StableWindow: 5 * time.Second,
			PanicThreshold: 100}
		fleet := &scriptedFleet{target: 1, known: true, panics: true}
		h := newLoopHarness(t, spec, fleet)
		h.seconds(2, 3, 3) // every decision panics
		fleet.mu.Lock()
		fleet.panics = false
		fleet.mu.Unlock()
		h.seconds(6, 3, 3)
		if got, decisions := fleet.state(); got != 3 {
			t.Fatalf("target = %d after the fleet recovered (decisions %+v), want 3: the loop died with the panic", got, decisions)
		}
	})
}

func TestObserve(t *testing.T) {
	launched := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	replicas := []Replica{
		{LaunchedAt: launched, ReadyAt: launched.Add(2 * time.Minute), Ready: true, Live: true},
		{LaunchedAt: launched, ReadyAt: launched.Add(4 * time.Minute), Live: false}, // failed later: still a sample
		{LaunchedAt: launched, ReadyAt: launched.Add(3 * time.Minute), Ready: true, Live: true},
		{LaunchedAt: launched, Live: true}, // starting
	}
	engines := []EngineLoad{{Waiting: 1, Running: 4, KVCacheUsage: 0.2, Replicas: 1}, {Waiting: 3, Running: 8, KVCacheUsage: 0.6, Replicas: 1}}
	tests := map[string]struct {
		spec      Spec
		sample    Sample
		wantObs   Observation
		wantState State
	}{
		"mean above instant": {
			spec:      Spec{Policy: PolicyConcurrency, TargetInflight: 1},
			sample:    Sample{Arrivals: 7, InFlight: 2, InFlightMean: 3.5, Replicas: replicas, Engines: engines, Target: 3},
			wantObs:   Observation{Arrivals: 7, InFlight: 3.5, ColdStart: 3 * time.Minute},
			wantState: State{Ready: 2, Target: 3},
		},
		"engines summed for llm": {
			spec:      Spec{Policy: PolicyLLM, TargetInflight: 1},
			sample:    Sample{InFlight: 4, Replicas: replicas, Engines: engines, Target: 3},
			wantObs:   Observation{InFlight: 4, ColdStart: 3 * time.Minute, Engine: &EngineLoad{Waiting: 4, Running: 12, KVCacheUsage: 0.4, Replicas: 2}},
			wantState: State{Ready: 2, Target: 3},
		},
		"no engine scraped": {
			spec:      Spec{Policy: PolicyLLM},
			sample:    Sample{Target: 1},
			wantObs:   Observation{},
			wantState: State{Target: 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			obs, st := Observe(tc.spec.WithDefaults(), tc.sample)
			if diff := cmp.Diff(tc.wantObs, obs, cmp.Comparer(func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 })); diff != "" {
				t.Errorf("observation (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantState, st); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}
