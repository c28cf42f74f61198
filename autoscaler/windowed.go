package autoscaler

import (
	"fmt"
	"math"
	"time"
)

// windowed is Knative's KPA decider, over a demand measured in replicas:
//
//   - demand per tick: concurrency is in-flight / target_inflight_per_replica; llm is the
//     largest of that, the replicas needed to drain engine queues beyond target_waiting per
//     replica, and the replicas needed to bring KV-cache use down to target_kv_cache_usage.
//   - desired = ceil(average demand over the stable window), or over the panic window while in
//     panic; panic starts when the panic window alone wants panic_threshold × the READY
//     replicas or the current target, whichever is more, and ends a stable window after the
//     last tick that did; in panic the target never goes down.
//   - each decision grows the target to at most max_scale_up_rate × that capacity and shrinks
//     it to no less than the capacity / max_scale_down_rate.
//   - with min_replicas 0 it reaches zero only after a stable window plus grace without a
//     single request; any request at zero (held by the proxy) asks for a replica at once.
type windowed struct {
	spec   Spec
	demand func(Observation, State) float64
	// stableWin and panicWin hold the demand of the last stable and panic window.
	stableWin, panicWin *window

	started    time.Time
	lastActive time.Time
	panicking  bool
	panicUntil time.Time
	panicMax   int
	// target excludes overprovision.
	target int
}

var _ Scaler = (*windowed)(nil)

func newWindowed(spec Spec) *windowed {
	w := &windowed{spec: spec, stableWin: newWindow(spec.StableWindow), panicWin: newWindow(spec.PanicWindow),
		target: spec.InitialTarget() - spec.Overprovision}
	w.demand = w.concurrencyDemand
	if spec.Policy == PolicyLLM {
		w.demand = w.llmDemand
	}
	return w
}

func (w *windowed) concurrencyDemand(obs Observation, _ State) float64 {
	return obs.InFlight / w.spec.TargetInflight
}

// llmDemand adds what the engines say to what the proxy sees. In-flight alone misses a replica
// whose batch is full: its queue grows and time to first token with it while the in-flight
// count looks the same. Queue and KV terms only count once past their targets, so at low load
// they never hold replicas the in-flight term would release.
func (w *windowed) llmDemand(obs Observation, st State) float64 {
	d := w.concurrencyDemand(obs, st)
	e := obs.Engine
	if e == nil || st.Ready == 0 {
		return d
	}
	ready := float64(st.Ready)
	if excess := e.Waiting - w.spec.TargetWaiting*ready; excess > 0 {
		d = max(d, ready+excess/w.spec.TargetInflight)
	}
	if e.KVCacheUsage > w.spec.TargetKVCacheUsage {
		d = max(d, ready*e.KVCacheUsage/w.spec.TargetKVCacheUsage)
	}
	return d
}

func (w *windowed) Decide(now time.Time, obs Observation, st State) Decision {
	s := w.spec
	if w.started.IsZero() {
		w.started, w.lastActive = now, now
	}
	demand := w.demand(obs, st)
	if math.IsNaN(demand) || demand < 0 {
		demand = 0
	}
	if demand > 0 || obs.Arrivals > 0 {
		w.lastActive = now
	}
	w.stableWin.record(now, demand)
	w.panicWin.record(now, demand)
	stable := w.stableWin.average()
	panicAvg := w.panicWin.average()

	// Panic and the rate limits measure demand against the capacity already asked for: the
	// READY replicas, or the current target when replacements (a lost zone's) are on their way.
	// Against READY alone a preemption reads as a burst and panic over-buys.
	ready := float64(max(st.Ready, w.target, 1))
	if panicAvg/ready >= s.PanicThreshold {
		w.panicking = true
		w.panicUntil = now.Add(s.StableWindow)
	} else if w.panicking && !now.Before(w.panicUntil) {
		w.panicking, w.panicMax = false, 0
	}

	maxUp := ceilReplicas(s.MaxScaleUpRate * ready)
	maxDown := int(math.Floor(ready / s.MaxScaleDownRate))
	desired := clip(ceilReplicas(stable), maxDown, maxUp)
	reason := fmt.Sprintf("demand %.2f stable, %.2f panic", stable, panicAvg)
	if w.panicking {
		desired = max(clip(ceilReplicas(panicAvg), maxDown, maxUp), w.panicMax)
		w.panicMax = desired
		reason += ", panic"
	}

	if desired < w.target && !w.stableWin.covered(now, s.DecisionInterval) {
		// A fresh (or restarted) scaler has not seen a stable window yet: an empty history is
		// not evidence of idleness.
		desired = w.target
		reason += ", warming up"
	}
	if desired == 0 {
		idle := now.Sub(w.lastActive)
		switch {
		case s.Min > 0:
		case w.target == 0:
			reason += ", at zero"
		case idle >= s.StableWindow+s.ScaleToZeroGrace:
			reason += fmt.Sprintf(", idle %v: to zero", idle.Round(time.Second))
		default:
			desired = 1 // keep one until the service has been idle a full window plus grace
			reason += fmt.Sprintf(", idle %v", idle.Round(time.Second))
		}
	}
	if w.target == 0 && (obs.Arrivals > 0 || obs.InFlight > 0) {
		desired = max(desired, 1)
		reason += ", from zero"
	}
	w.target = clip(desired, s.Min, s.Max)
	target := w.target
	if target > 0 {
		target += s.Overprovision
	}
	return Decision{Target: target, Panic: w.panicking, Reason: reason}
}
