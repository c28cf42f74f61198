// Package autoscaler decides how many replicas each service needs now. It never launches
// anything itself: its scale loop (loop.go) hands the answer to a Fleet (the controller's adapter
// over the replica manager), and `ferry sim` drives the very same Observe and Decide against
// traces.
//
// A Scaler is fed one Observation per decision (the loop decides every second, observe.go builds
// the observation) and answers with a Decision. Its answer depends only on the sequence of (now, observation, state) it was given,
// never on the wall clock or I/O, so tests script time and the simulator replays weeks in
// seconds. Three policies share that contract:
//
//   - request_rate: SkyServe's autoscaler, semantics for semantics (QPS over 60 s, target QPS per
//     replica, upscale/downscale delays counted in decisions, jump from zero), so a SkyServe YAML
//     behaves as its author expects.
//   - concurrency: Knative's KPA (in-flight per replica, stable and panic windows, panic
//     threshold, bounded scale-up and scale-down rates, scale to zero after an idle window).
//   - llm: the KPA's windows over a demand that also counts the engines' own queues and KV-cache
//     use, so a replica whose queue grows gets help before its latency does.
//
// Knative's constants suit pods that start in seconds; a GPU replica takes minutes. So when a
// YAML leaves them unset, concurrency and llm learn their in-flight target, their windows and a
// headroom from what the replicas do (learn.go), through the same Observation: the engines'
// load and the replicas' cold start.
package autoscaler

import (
	"math"
	"time"
)

// Observation is what the data plane saw during one tick.
type Observation struct {
	// Arrivals is how many requests arrived since the previous observation (held ones too).
	Arrivals int
	// InFlight is the service's concurrency: requests being served plus requests held while
	// no replica is READY, averaged over the tick if the caller samples more often.
	InFlight float64
	// Engine is the replicas' own view, summed over READY replicas; nil when not scraped.
	// The llm policy scales on it; both windowed policies learn their in-flight target from
	// it when target_inflight_per_replica is unset (Spec.WantsEngineLoad).
	Engine *EngineLoad
	// ColdStart is how long the service's replicas take from launch to READY: ColdStartOf
	// over the replicas that have been READY. 0 means unknown (none has been READY yet); the
	// scaler then keeps the last value it was given. A windowed policy without a
	// stable_window_seconds sizes its window from it.
	ColdStart time.Duration
}

// EngineLoad is what READY replicas report on their /metrics (vLLM or TGI names), summed.
type EngineLoad struct {
	// Waiting is requests queued inside the engines (vllm:num_requests_waiting, tgi_queue_size).
	Waiting float64
	// Running is requests in the engines' batches (vllm:num_requests_running,
	// tgi_batch_current_size).
	Running float64
	// KVCacheUsage is the mean KV-cache use over the replicas that reported, 0..1.
	KVCacheUsage float64
	// Replicas is how many replicas reported: the sums above are over them.
	Replicas int
}

// State is what the replica manager has now.
type State struct {
	// Ready is the number of READY replicas.
	Ready int
	// Target is the replica count currently asked for (the previous decision's Target).
	Target int
	// LiveAccelerators and ReadyAccelerators are the accelerator of each live (launching,
	// starting or READY) and each READY replica, for a per-accelerator QPS target.
	LiveAccelerators, ReadyAccelerators []string
}

// Decision is a Scaler's answer for one tick.
type Decision struct {
	// Target is how many replicas the service should have, overprovision included, within
	// [min_replicas, max_replicas + num_overprovision].
	Target int
	// Overprovision is the part of Target above what the load asks for: num_overprovision,
	// or the learned headroom (Spec.LearnHeadroom). Availability is owed Target − Overprovision.
	Overprovision int
	// Panic is true while the concurrency and llm policies are in panic mode.
	Panic bool
	// Reason says in a few words why Target is what it is, for logs and `serve status`.
	Reason string
}

// Scaler decides replica counts for one service. It keeps the windows it needs between calls;
// Decide must be called with non-decreasing now.
type Scaler interface {
	Decide(now time.Time, obs Observation, st State) Decision
}

// New returns the Scaler for spec's policy; a fixed spec (Policy "") gets one that always answers
// its replica count.
func New(spec Spec) Scaler {
	spec = spec.WithDefaults()
	switch spec.Policy {
	case PolicyRequestRate:
		return newRequestRate(spec)
	case PolicyConcurrency, PolicyLLM:
		return newWindowed(spec)
	default:
		return fixed{n: spec.Min}
	}
}

// fixed is a service without load-based scaling.
type fixed struct{ n int }

func (f fixed) Decide(time.Time, Observation, State) Decision {
	return Decision{Target: f.n, Reason: "fixed"}
}

// ceilReplicas rounds a replica demand up, forgiving float noise so that 2.0000000001 is 2.
func ceilReplicas(x float64) int {
	if x <= 0 || math.IsNaN(x) {
		return 0
	}
	if math.IsInf(x, 1) || x > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(math.Ceil(x - 1e-9))
}

// clip bounds n to [lo, hi].
func clip(n, lo, hi int) int { return max(lo, min(hi, n)) }

// Resume returns a Scaler for a service that already runs current replicas (a restarted
// controller): it starts from that count instead of the initial target, and, like a fresh
// Scaler, does not scale down before it has watched a full stable window. What a windowed
// policy learns starts over; a learned headroom in current is kept as target until then.
func Resume(spec Spec, current int) Scaler {
	spec = spec.WithDefaults()
	base := clip(current-spec.Overprovision, spec.Min, spec.Max)
	switch spec.Policy {
	case PolicyRequestRate:
		r := newRequestRate(spec)
		r.target = base
		return r
	case PolicyConcurrency, PolicyLLM:
		w := newWindowed(spec)
		w.target = base
		return w
	}
	return New(spec)
}
