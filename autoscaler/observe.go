package autoscaler

import "time"

// This file is the one place where what a service's data plane and fleet show becomes an
// Observation and a State. The scale loop (loop.go) and the simulator (bench/sim) both call
// Observe, so that `ferry sim` scores the decisions the controller would make on the same facts.

// Replica is one replica as an observation reads it.
type Replica struct {
	// LaunchedAt is when its instance was launched; ReadyAt the first time it was READY (zero
	// if never). Together they give the service's cold start.
	LaunchedAt, ReadyAt time.Time
	// Ready is true while it is READY.
	Ready bool
	// Live is true while it counts toward the target (launching, starting, READY or not ready
	// for a while); a scale loop with no target yet resumes from the live count.
	Live bool
	// Accelerator is the GPU type it was placed with ("" when unknown), for a per-accelerator
	// target_qps_per_replica.
	Accelerator string
}

// Sample is what a scale loop read during one decision interval.
type Sample struct {
	// Arrivals is how many requests arrived since the previous decision, held ones too.
	Arrivals int
	// InFlight is the service's concurrency now (requests being served plus requests held),
	// and InFlightMean its mean over the interval (0 when it was not sampled): a burst that
	// came and went between two decisions shows in the mean, a step up at the last moment in
	// the instant value, and the observation takes the larger.
	InFlight, InFlightMean float64
	// Engines are the last scraped metrics of the replicas the proxy routes to, one per
	// replica (Replicas 1 each); empty when none was scraped.
	Engines []EngineLoad
	// Replicas are every replica the service has: the terminal ones it still shows too, as
	// their cold start is as good a sample as a live one's.
	Replicas []Replica
	// Target is the replica count currently asked for.
	Target int
}

// Observe turns one interval's sample into what Decide takes. The engines' load is summed
// only for a spec that reads it (Spec.WantsEngineLoad).
func Observe(spec Spec, s Sample) (Observation, State) {
	obs := Observation{Arrivals: s.Arrivals, InFlight: max(s.InFlight, s.InFlightMean)}
	if spec.WantsEngineLoad() {
		obs.Engine = sumEngines(s.Engines)
	}
	st := State{Target: s.Target}
	var coldStarts []time.Duration
	for _, r := range s.Replicas {
		if !r.LaunchedAt.IsZero() && r.ReadyAt.After(r.LaunchedAt) {
			coldStarts = append(coldStarts, r.ReadyAt.Sub(r.LaunchedAt))
		}
		if r.Ready {
			st.Ready++
		}
		if len(spec.TargetQPSPerAccelerator) == 0 {
			continue
		}
		if r.Ready {
			st.ReadyAccelerators = append(st.ReadyAccelerators, r.Accelerator)
		}
		if r.Live {
			st.LiveAccelerators = append(st.LiveAccelerators, r.Accelerator)
		}
	}
	obs.ColdStart = ColdStartOf(coldStarts)
	return obs, st
}

// sumEngines adds up per-replica engine loads: queues and batches summed, KV-cache use the mean
// over the replicas that reported. Nil when none did.
func sumEngines(engines []EngineLoad) *EngineLoad {
	var e EngineLoad
	for _, r := range engines {
		n := max(r.Replicas, 1)
		e.Waiting += r.Waiting
		e.Running += r.Running
		e.KVCacheUsage += r.KVCacheUsage * float64(n)
		e.Replicas += n
	}
	if e.Replicas == 0 {
		return nil
	}
	e.KVCacheUsage /= float64(e.Replicas)
	return &e
}

// liveCount is how many of replicas count toward the target.
func liveCount(replicas []Replica) int {
	n := 0
	for _, r := range replicas {
		if r.Live {
			n++
		}
	}
	return n
}
