package autoscaler

import "github.com/ferryserve/ferry/configs"

// Mix is a replica count per kind: the placement layer launches Spot replicas on spot capacity
// and OnDemand on on-demand capacity.
type Mix struct {
	Spot, OnDemand int
}

// Total is Spot + OnDemand.
func (m Mix) Total() int { return m.Spot + m.OnDemand }

// MixSpec is the spot part of a replica_policy.
type MixSpec struct {
	// UseSpot is resources.use_spot; without it every replica is on-demand.
	UseSpot bool
	// BaseOnDemand is base_ondemand_fallback_replicas: on-demand replicas that always run.
	BaseOnDemand int
	// DynamicFallback is dynamic_ondemand_fallback: on-demand replicas stand in for spot
	// replicas that are wanted but not READY (preempted, or no capacity), and go once spot
	// replicas are READY again.
	DynamicFallback bool
}

// Split divides a target between spot and on-demand with SkyServe's fallback semantics: spot
// = target − base on-demand; on-demand = base + (dynamic ? spot wanted − spot READY : 0), at
// most target. readySpot is the number of READY spot replicas.
func Split(target int, m MixSpec, readySpot int) Mix {
	target = max(target, 0)
	if !m.UseSpot {
		return Mix{OnDemand: target}
	}
	base := min(m.BaseOnDemand, target)
	spot := target - base
	onDemand := base
	if m.DynamicFallback {
		onDemand += max(0, spot-readySpot)
	}
	return Mix{Spot: spot, OnDemand: min(onDemand, target)}
}

// MixFor reads the spot part of a task: use_spot from its resources (every candidate agrees,
// configs checks that) and the fallback fields of its replica policy.
func MixFor(r configs.Resources, p configs.ReplicaPolicy) MixSpec {
	return MixSpec{UseSpot: r.UseSpot, BaseOnDemand: p.BaseOndemandFallbackReplicas, DynamicFallback: p.DynamicOndemandFallback}
}
