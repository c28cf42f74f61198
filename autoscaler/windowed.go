package autoscaler

import (
	"cmp"
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
//
// A spec that leaves a knob unset gets it learned from the service's replicas (learn.go):
// target_inflight_per_replica from how many requests a replica holds; stable_window_seconds
// from their cold start, and with a learned window the panic window is a tenth of it and the
// queue a lost replica leaves behind is not read as new load (backlog); num_overprovision
// (with Spec.LearnHeadroom) from how much the target grows within one cold start.
type windowed struct {
	spec   Spec
	demand func(Observation, State) float64
	// stableWin and panicWin hold the demand of the last stable and panic window.
	stableWin, panicWin *window

	// coldStart is the latest cold start observed (0: none yet).
	coldStart time.Duration
	// capacity learns the replicas' capacity when the spec has no TargetInflight.
	capacity *capacity
	// headroom learns the replicas to run above the target (Spec.LearnHeadroom);
	// headroomAsked is what it added to the previous decision.
	headroom      *headroom
	headroomAsked int
	// backlog keeps the demand from counting the queue behind lost replicas, with a learned
	// stable window: that window, which a panic lasts, is then long enough (several cold
	// starts) for an over-bought fleet to cost more than the shortfall it answers.
	backlog *backlog
	// targetInflight is the in-flight target of this decision; slots the capacity it was
	// derived from, kept so that Erlang's formula is evaluated only when the capacity moves.
	targetInflight, slots float64

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
	w := &windowed{spec: spec, stableWin: newWindow(cmp.Or(spec.StableWindow, DefaultStableWindow)),
		panicWin: newWindow(cmp.Or(spec.PanicWindow, DefaultPanicWindow)), target: spec.InitialTarget() - spec.Overprovision,
		targetInflight: cmp.Or(spec.TargetInflight, DefaultTargetInflight)}
	if spec.TargetInflight == 0 {
		w.capacity = newCapacity()
	}
	if spec.StableWindow == 0 {
		w.backlog = newBacklog(spec.DecisionInterval)
	}
	if spec.LearnHeadroom && spec.Overprovision == 0 {
		w.headroom = newHeadroom()
	}
	w.demand = w.concurrencyDemand
	if spec.Policy == PolicyLLM {
		w.demand = w.llmDemand
	}
	return w
}

// stableWindow is the spec's, or the one learned from the cold start.
func (w *windowed) stableWindow() time.Duration {
	if w.spec.StableWindow > 0 {
		return w.spec.StableWindow
	}
	return stableWindowFor(w.coldStart)
}

// panicWindow is the spec's, or PanicWindowShare of a learned stable window.
func (w *windowed) panicWindow() time.Duration {
	if w.spec.PanicWindow > 0 {
		return w.spec.PanicWindow
	}
	return time.Duration(PanicWindowShare * float64(w.stableWindow()))
}

// learn takes in what the observation says about the replicas: the cold start, which sets a
// learned stable window (a longer window waits until it has filled before scaling down, as a
// fresh scaler does), and the engines' load, which sets a learned in-flight target.
func (w *windowed) learn(now time.Time, obs Observation) {
	if obs.ColdStart > 0 {
		w.coldStart = obs.ColdStart
	}
	w.stableWin.span = w.stableWindow()
	w.panicWin.span = w.panicWindow()
	if w.backlog != nil {
		w.backlog.recent.span = w.panicWin.span
	}
	if w.capacity == nil {
		return
	}
	w.capacity.record(now, obs.Engine)
	slots := w.capacity.perReplica(now)
	switch {
	case slots == 0:
		w.targetInflight = DefaultTargetInflight
	case math.Abs(slots-w.slots) > 0.01:
		w.targetInflight = targetInflightFor(slots)
	default:
		return
	}
	w.slots = slots
}

func (w *windowed) concurrencyDemand(obs Observation, _ State) float64 {
	return obs.InFlight / w.targetInflight
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
		d = max(d, ready+excess/w.targetInflight)
	}
	if e.KVCacheUsage > w.spec.TargetKVCacheUsage {
		d = max(d, ready*e.KVCacheUsage/w.spec.TargetKVCacheUsage)
	}
	return d
}

// nearZero applies scale to zero and from it to a desired count: no replica until the service
// has been idle a full stable window plus the grace (one until then), and one as soon as a
// request arrives at zero.
func (w *windowed) nearZero(now time.Time, obs Observation, stableWindow time.Duration, desired int, reason string) (int, string) {
	s := w.spec
	if desired == 0 {
		idle := now.Sub(w.lastActive)
		switch {
		case s.Min > 0:
		case w.target == 0:
			reason += ", at zero"
		case idle >= stableWindow+s.ScaleToZeroGrace:
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
	return desired, reason
}

func (w *windowed) Decide(now time.Time, obs Observation, st State) Decision {
	s := w.spec
	if w.started.IsZero() {
		w.started, w.lastActive = now, now
	}
	w.learn(now, obs)
	stableWindow := w.stableWindow()
	demand := w.demand(obs, st)
	if math.IsNaN(demand) || demand < 0 {
		demand = 0
	}
	if w.backlog != nil {
		demand = w.backlog.correct(now, obs, st, w.target, w.targetInflight, demand)
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
	// A learned headroom's replicas are not capacity the load was given: counted, a headroom
	// as large as the target would keep scale-down from ever halving below it.
	ready := float64(max(st.Ready-w.headroomAsked, w.target, 1))
	if panicAvg/ready >= s.PanicThreshold {
		w.panicking = true
		w.panicUntil = now.Add(stableWindow)
	} else if w.panicking && !now.Before(w.panicUntil) {
		w.panicking, w.panicMax = false, 0
	}

	maxUp := ceilReplicas(s.MaxScaleUpRate * ready)
	maxDown := int(math.Floor(ready / s.MaxScaleDownRate))
	desired := clip(ceilReplicas(stable), maxDown, maxUp)
	reason := fmt.Sprintf("demand %.2f stable, %.2f panic", stable, panicAvg)
	if w.capacity != nil || s.StableWindow == 0 {
		reason += fmt.Sprintf(" (learned: %.3g in flight per replica, %v window)", w.targetInflight, stableWindow)
	}
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
	desired, reason = w.nearZero(now, obs, stableWindow, desired, reason)
	w.target = clip(desired, s.Min, s.Max)
	over := s.Overprovision
	if w.headroom != nil {
		// At most as many as the target: headroom never more than doubles a fleet.
		over = min(w.headroom.record(now, w.target, w.coldStart), w.target)
		w.headroomAsked = over
		if over > 0 {
			reason += fmt.Sprintf(", headroom %d", over)
		}
	}
	if w.target == 0 {
		over = 0
	}
	return Decision{Target: w.target + over, Overprovision: over, Panic: w.panicking, Reason: reason}
}
