package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/replicas"
)

// Placer says where a new spot replica goes.
type Placer int

const (
	// PlaceNone launches no spot replica (on-demand policies).
	PlaceNone Placer = iota
	// PlaceSpotHedge is SkyServe's dynamic_fallback placer, policy.Zones: the cheapest active
	// zone holding no spot replica yet; a zone that preempts or refuses a launch goes
	// inactive.
	PlaceSpotHedge
	// PlaceCheapest is SkyPilot without a spot placer: the cheapest zone, failing over to the
	// next cheapest when a zone refuses the launch. All replicas end up in the same zone.
	PlaceCheapest
	// PlaceFerry is what Ferry's provisioner does (launcher/provision): zones in
	// policy.SpotOrder, a zone that refused a launch or warned of a reclaim skipped for
	// provision.DefaultBlockFor, the launch failing over down the order.
	PlaceFerry
)

func (p Placer) String() string {
	switch p {
	case PlaceSpotHedge:
		return "spothedge"
	case PlaceCheapest:
		return "cheapest"
	case PlaceFerry:
		return "ferry"
	}
	return "none"
}

// Policy is one way to run the service: an autoscaler, a spot/on-demand split, a spot placer,
// and what the load balancer does.
type Policy struct {
	Name        string
	Description string
	// Spec is the autoscaler's configuration; DecisionInterval is how often it decides.
	Spec autoscaler.Spec
	// Mix splits each target between spot and on-demand: policy.Split for Ferry, SkyServe's
	// own fallback (skyServeSplit) for SkyServe.
	Mix      policy.MixSpec
	SkyServe bool
	Placer   Placer
	// Hold keeps requests at the proxy while no replica is READY (Ferry, up to
	// proxy.DefaultMaxQueuedRequests for proxy.DefaultMaxQueueWait); without it they get 503
	// (SkyServe), which counts as an SLO miss.
	Hold bool
	// LBSync is how often the load balancer refreshes its replica list: a replica that turns
	// READY gets traffic from the next refresh. 0 means at once (Ferry publishes a new snapshot
	// on every change). Replicas that go away leave the list at once in both, as a request to
	// one would be retried elsewhere.
	LBSync time.Duration
	// ReportEvery is how often the load balancer ships its request timestamps to the
	// controller (SkyServe: 20 s, half a decision out of phase); 0 means the controller reads
	// live counters (Ferry).
	ReportEvery time.Duration
	// DrainTimeout bounds how long a scaled-down replica finishes its requests.
	DrainTimeout time.Duration
	// HoldFallback keeps the on-demand fallback while spot losses come in runs
	// (policy.Losses), as the replica manager does.
	HoldFallback bool
	// Notices is true for a policy that acts on a cloud's reclaim warning (EC2's two
	// minutes, Compute Engine's 30 s) as Ferry's replica manager does (replicas.Manager.Notice):
	// the warned replica stops counting and its replacement starts; SkyServe waits for the
	// preemption.
	Notices bool
	// Spread moves spot replicas out of a zone that holds most of them once another zone takes
	// spot again, as the replica manager does (policy.Crowded, policy.SpreadTargets): one more
	// spot replica launched there, and once it is READY scale-down drains one of the crowded
	// zone's.
	Spread bool
	// KVRoom routes a request to the least loaded READY replica with room to start it at once
	// (engine.roomFor: no queue, and KV cache free for its prompt), and only when none has room
	// to the least loaded: what least_ttft does with prompts no replica has cached (its ahead).
	// Without it, least load alone (SkyServe's load balancer).
	KVRoom bool
	// Spare runs one spare spot replica (on-demand while spot cannot take it) while a zone
	// holds as many of the policy's spot replicas as it did when it last refused a launch
	// that no zone took, or when a reclaim left some there (policy.Losses.Spare, Split), as
	// the replica manager does; the held fallback gives way to it.
	Spare bool
}

// SkyServe's defaults (sky/serve/constants.py), which the baselines run with.
const (
	skyServeUpscaleDelay   = 300 * time.Second
	skyServeDownscaleDelay = 1200 * time.Second
	skyServeLBSync         = 20 * time.Second
	skyServeDrain          = 120 * time.Second
	// spotHedgeSpares is SpotHedge's N_extra in the paper and its artifact: one spot replica
	// beyond the target.
	spotHedgeSpares = 1
)

// PolicyParams are the figures the policies are sized with.
type PolicyParams struct {
	// Fleet is every policy's min_replicas.
	Fleet int
	// TargetQPS is SkyServe's target_qps_per_replica (Calibrate).
	TargetQPS float64
	// PeakReplicas is the fixed fleet that carries the trace's busiest minute at TargetQPS.
	PeakReplicas int
	// MaxReplicas is max_replicas of the autoscaled policies, set well above need so that it
	// never binds.
	MaxReplicas int
	// TargetInflight, StableWindow and Overprovision are the ferry policies'
	// target_inflight_per_replica, stable_window_seconds and num_overprovision, as a YAML
	// would set them: 0 leaves each to the autoscaler, which learns it from the replicas.
	TargetInflight float64
	StableWindow   time.Duration
	Overprovision  int
}

// PolicyNames lists the policies in report order.
var PolicyNames = []string{"ferry", "ferry-llm", "ferry-no-hold", "ferry-no-notice", "ferry-no-spread", "ferry-no-kv-room", "ferry-no-spare", "ferry-knative", "skyserve-spothedge", "skyserve-spothedge-0", "skyserve-spot", "fixed-peak", "ondemand"}

// FerryYAML is the service the ferry policies run, as a user writes it: the autoscaler named,
// spot with SkyServe's dynamic on-demand fallback and SpotHedge placer, and nothing tuned. The
// knobs of pp are set only when non-zero, as a YAML that sets them.
func FerryYAML(autoscalerName string, pp PolicyParams) (configs.Resources, configs.ReplicaPolicy) {
	return configs.Resources{UseSpot: true}, configs.ReplicaPolicy{
		MinReplicas:              max(pp.Fleet, 1),
		MaxReplicas:              pp.MaxReplicas,
		Autoscaler:               autoscalerName,
		DynamicOndemandFallback:  true,
		SpotPlacer:               configs.SpotPlacerDynamicFallback,
		TargetInflightPerReplica: pp.TargetInflight,
		StableWindowSeconds:      int(pp.StableWindow / time.Second),
		NumOverprovision:         pp.Overprovision,
	}
}

// Policies builds the named policies.
func Policies(names []string, pp PolicyParams) ([]Policy, error) {
	ferryFor := func(autoscalerName string) Policy {
		res, rp := FerryYAML(autoscalerName, pp)
		return Policy{
			// Exactly what the controller makes of the YAML.
			Spec:         autoscaler.SpecFor(rp),
			Mix:          replicas.MixFor(res, rp),
			Placer:       PlaceFerry,
			Hold:         true,
			DrainTimeout: replicas.DefaultDrainTimeout,
			Notices:      true,
			HoldFallback: true,
			Spread:       rp.SpotPlacer == configs.SpotPlacerDynamicFallback,
			KVRoom:       true,
			Spare:        true,
		}
	}
	ferry := ferryFor(autoscaler.PolicyConcurrency)
	sky := Policy{
		Spec: autoscaler.Spec{
			Policy:           autoscaler.PolicyRequestRate,
			Min:              max(pp.Fleet, 1),
			Max:              pp.MaxReplicas,
			TargetQPS:        pp.TargetQPS,
			UpscaleDelay:     skyServeUpscaleDelay,
			DownscaleDelay:   skyServeDownscaleDelay,
			DecisionInterval: autoscaler.SkyServeDecisionInterval,
		},
		SkyServe:     true,
		LBSync:       skyServeLBSync,
		ReportEvery:  autoscaler.SkyServeDecisionInterval,
		DrainTimeout: skyServeDrain,
	}
	build := map[string]func() Policy{
		"ferry": func() Policy {
			p := ferry
			p.Description = fmt.Sprintf("Ferry's defaults with min_replicas %d: `autoscaler: concurrency` (%s, 1 s decisions), spot + dynamic on-demand fallback as policy.Split divides it, zones in policy.SpotOrder as the provisioner tries them, acts on reclaim warnings, holds requests while no replica is READY", max(pp.Fleet, 1), ferryKnobs(pp))
			return p
		},
		"ferry-llm": func() Policy {
			p := ferryFor(autoscaler.PolicyLLM)
			p.Description = "as ferry with `autoscaler: llm` (in-flight, engine queues and KV-cache use)"
			return p
		},
		"ferry-no-hold": func() Policy {
			p := ferry
			p.HoldFallback = false
			p.Description = "as ferry, releasing the on-demand fallback as soon as spot is READY again, whatever the recent losses (Ferry before policy.Losses)"
			return p
		},
		"ferry-no-spread": func() Policy {
			p := ferry
			p.Spread = false
			p.Description = "as ferry, leaving spot replicas in the zone they landed in (no spread moves: Ferry before policy.Crowded)"
			return p
		},
		"ferry-no-kv-room": func() Policy {
			p := ferry
			p.KVRoom = false
			p.Description = "as ferry, routing by load alone: a replica whose KV cache has no room for the prompt looks as free as one that has (least_ttft before it read the engines' KV use)"
			return p
		},
		"ferry-no-spare": func() Policy {
			p := ferry
			p.Spare = false
			p.Description = "as ferry, with no spare while a zone sits at its capacity ceiling: the fallback's one more only while spot is short (Ferry before policy.Losses.Spare)"
			return p
		},
		"ferry-no-notice": func() Policy {
			p := ferry
			p.Notices = false
			p.Description = "as ferry, replacing a spot replica only once it is reclaimed (an infra that gives no notice)"
			return p
		},
		"ferry-knative": func() Policy {
			p := ferry
			p.Spec = autoscaler.Spec{Policy: autoscaler.PolicyConcurrency, Min: max(pp.Fleet, 1), Max: pp.MaxReplicas,
				TargetInflight: autoscaler.DefaultTargetInflight, StableWindow: autoscaler.DefaultStableWindow}
			p.Description = fmt.Sprintf("as ferry with Knative's fixed knobs, Ferry's defaults before they were learned (target %d in flight, %v stable window, no overprovision)",
				autoscaler.DefaultTargetInflight, autoscaler.DefaultStableWindow)
			return p
		},
		"skyserve-spothedge": func() Policy {
			p := sky
			p.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
			p.Placer = PlaceSpotHedge
			p.Spec.Overprovision = spotHedgeSpares
			p.Description = fmt.Sprintf("SkyServe+SpotHedge as in the paper: request_rate (min_replicas %d, %.2f QPS per replica, 300/1200 s delays, 20 s decisions), num_overprovision %d, use_spot + dynamic_ondemand_fallback + dynamic_fallback placer, 503 while no replica is READY",
				max(pp.Fleet, 1), pp.TargetQPS, spotHedgeSpares)
			return p
		},
		"skyserve-spothedge-0": func() Policy {
			p := sky
			p.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
			p.Placer = PlaceSpotHedge
			p.Description = "as skyserve-spothedge with no spare replica (num_overprovision 0)"
			return p
		},
		"skyserve-spot": func() Policy {
			p := sky
			p.Mix = policy.MixSpec{UseSpot: true}
			p.Placer = PlaceCheapest
			p.Description = "request_rate as skyserve-spothedge-0, spot only, cheapest zone with capacity, no fallback"
			return p
		},
		"fixed-peak": func() Policy {
			p := ferry
			p.Spec = autoscaler.Spec{Min: pp.PeakReplicas, Max: pp.PeakReplicas}
			p.Mix = policy.MixSpec{}
			p.Placer = PlaceNone
			p.Description = fmt.Sprintf("%d on-demand replicas, enough for the busiest minute at %.2f QPS each", pp.PeakReplicas, pp.TargetQPS)
			return p
		},
		"ondemand": func() Policy {
			p := ferry
			p.Spec.Overprovision, p.Spec.LearnHeadroom = 0, false
			p.Mix = policy.MixSpec{}
			p.Placer = PlaceNone
			p.Description = "ferry's autoscaler without overprovision or learned headroom, every replica on-demand (the cost baseline, never preempted)"
			return p
		},
	}
	var out []Policy
	var unknown []string
	for _, n := range names {
		f, ok := build[n]
		if !ok {
			unknown = append(unknown, n)
			continue
		}
		p := f()
		p.Name = n
		p.Spec = p.Spec.WithDefaults()
		out = append(out, p)
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("unknown policies %s: known are %s", strings.Join(unknown, ", "), strings.Join(PolicyNames, ", "))
	}
	return out, nil
}

// ferryKnobs describes the ferry policies' knobs: each set one, or how the autoscaler learns it.
func ferryKnobs(pp PolicyParams) string {
	var knobs []string
	if pp.TargetInflight > 0 {
		knobs = append(knobs, fmt.Sprintf("target %g in flight per replica", pp.TargetInflight))
	} else {
		knobs = append(knobs, "in-flight target learned from the replicas' capacity")
	}
	if pp.StableWindow > 0 {
		knobs = append(knobs, fmt.Sprintf("%v stable window", pp.StableWindow))
	} else {
		knobs = append(knobs, fmt.Sprintf("stable window %d× the observed cold start", autoscaler.StableWindowPerColdStart))
	}
	if pp.Overprovision > 0 {
		knobs = append(knobs, fmt.Sprintf("%d overprovisioned", pp.Overprovision))
	} else {
		knobs = append(knobs, "headroom learned from the target's growth within a cold start")
	}
	return strings.Join(knobs, ", ")
}

// holdLimits are the proxy's, so that the simulated hold gives up when Ferry's would.
var (
	holdMaxQueued = proxy.DefaultMaxQueuedRequests
	holdMaxWait   = proxy.DefaultMaxQueueWait
)

// skyServeSplit is SkyServe's own fallback (sky/serve/autoscalers.py,
// FallbackRequestRateAutoscaler), which the SkyServe policies run: spot = target − base
// on-demand, where the target includes num_overprovision; on-demand = base + (dynamic ? spot
// wanted − spot READY : 0), at most the target. On-demand thus stands in for the spare too.
func skyServeSplit(target int, m policy.MixSpec, readySpot int) policy.Mix {
	target = max(target, 0)
	if !m.UseSpot {
		return policy.Mix{OnDemand: target}
	}
	base := min(m.BaseOnDemand, target)
	spot := target - base
	onDemand := base
	if m.DynamicFallback {
		onDemand += max(0, spot-readySpot)
	}
	return policy.Mix{Spot: spot, OnDemand: min(onDemand, target)}
}
