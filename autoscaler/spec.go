package autoscaler

import (
	"cmp"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// Policy names, the values of `replica_policy.autoscaler`.
const (
	PolicyRequestRate = configs.AutoscalerRequestRate
	PolicyConcurrency = configs.AutoscalerConcurrency
	PolicyLLM         = configs.AutoscalerLLM
)

// Defaults for Spec's zero values. Knative's constants assume pods that start in seconds and
// serve a hundred requests at once; an LLM replica on a GPU takes minutes to start and holds a
// handful of sequences. So the windowed policies learn what depends on that from the service's
// own replicas when the spec leaves it unset (learn.go): the in-flight target from how many
// requests a replica holds, the stable and panic windows from the cold start, and a headroom
// from how much the target grows within one cold start. The constants below are what those
// are derived with, and what applies until there is something to learn from.
const (
	// DefaultTargetInflight is the in-flight target per replica until the replicas' capacity
	// is known (the engines report running requests and KV-cache use; see targetInflightFor),
	// and for replicas that never report it. Knative's 70 (100 × 0.7) suits web servers; an
	// LLM replica's time to first token climbs as soon as requests queue behind a full batch,
	// which happens far sooner. A replica that holds fewer requests than this shows it by
	// queueing, and the learned target takes over.
	DefaultTargetInflight = 8
	// DefaultQueueingTolerance is the share of requests that may find their replica full when
	// the in-flight target is learned (targetInflightFor). A request that queues behind a full
	// batch waits for a running one to finish, seconds for an LLM, and misses any time-to-
	// first-token SLO, so this is the part of a 99% SLO's 1% of misses that the target spends
	// on queueing. The rest is left to what scaling cannot prevent: requests lost with a
	// preempted replica and queued on the survivors until replacements finish their cold
	// start, and load that grows faster than a cold start. On the spot traces' worst day in
	// `ferry sim` those take well over half of the budget, and 0.5% here misses the 99% by a
	// hair (bench/README.md, "ferry sim", has the sweep). It is a share of an SLO budget, not a
	// property of any GPU: Erlang's formula turns it into a target for whatever capacity is
	// learned.
	DefaultQueueingTolerance = 0.003
	// HeadroomObjective is the share of time a learned headroom keeps the target READY through
	// the target's growth (SpotHedge scores availability as the share of time the target is
	// READY); see headroom.
	HeadroomObjective = 0.99
	// DefaultStableWindow is Knative's 60 s: the stable window until a replica's cold start has
	// been seen, and the shortest a learned one gets.
	DefaultStableWindow = 60 * time.Second
	// StableWindowPerColdStart is how many observed cold starts a learned stable window spans.
	StableWindowPerColdStart = 5
	// MaxStableWindow is the longest learned stable window (and stable_window_seconds' bound).
	MaxStableWindow = time.Hour
	// DefaultPanicWindow is Knative's 6 s (10% of its stable window), for a set stable window.
	DefaultPanicWindow = 6 * time.Second
	// PanicWindowShare is the panic window's share of a learned stable window when
	// panic_window_seconds is unset: Knative's panic-window-percentage, 10%. Against a
	// 20-minute window that is 2 minutes, which still reacts well within a cold start and no
	// longer mistakes a few seconds of Poisson noise at a small fleet for a burst; a panic
	// then holds its fleet for the whole (long) stable window.
	PanicWindowShare = 0.1
	// DefaultPanicThreshold: panic when the panic window alone wants 2× the ready replicas.
	DefaultPanicThreshold = 2.0
	// DefaultMaxScaleUpRate and DefaultMaxScaleDownRate are Knative's: grow at most 1000× per
	// decision (unbounded in practice), shrink at most by half.
	DefaultMaxScaleUpRate   = 1000.0
	DefaultMaxScaleDownRate = 2.0
	// DefaultScaleToZeroGrace is Knative's grace after a full idle stable window.
	DefaultScaleToZeroGrace = 30 * time.Second
	// DefaultTargetWaiting is engine-queued requests per replica the llm policy tolerates.
	DefaultTargetWaiting = 1.0
	// DefaultTargetKVCacheUsage is the mean KV-cache use the llm policy steers to.
	DefaultTargetKVCacheUsage = 0.8
	// DefaultDecisionInterval is how often the controller decides; SkyServe decides every 20 s.
	DefaultDecisionInterval = time.Second
	// SkyServeDecisionInterval is SkyServe's, which its delays are counted in.
	SkyServeDecisionInterval = 20 * time.Second
	// qpsWindow is SkyServe's QPS window.
	qpsWindow = 60 * time.Second

	// capacityWindow is how much engine history the learned capacity averages: long enough
	// to hold every kind of request the service gets many times, short enough to follow a
	// change of model or traffic mix within the hour.
	capacityWindow = time.Hour
	// minCapacitySamples is how many one-second samples the learned capacity needs before
	// it replaces DefaultTargetInflight.
	minCapacitySamples = 60
	// minCapacityKVUsage is the least mean KV-cache use a capacity sample needs.
	minCapacityKVUsage = 0.05
	// minTargetInflight is the least learned in-flight target per replica.
	minTargetInflight = 1.0
	// headroomWindow is how much history the learned headroom reads: a day, the period of
	// most services' load.
	headroomWindow = 24 * time.Hour
	// maxErlangServers bounds the capacity the Erlang formula is evaluated for.
	maxErlangServers = 1024
)

// Spec is a service's scaling configuration with every default resolved.
type Spec struct {
	// Policy is PolicyRequestRate, PolicyConcurrency, PolicyLLM, or "" for a fixed count.
	Policy string
	Min    int
	Max    int
	// Overprovision replicas are added on top of the computed target (SkyServe).
	Overprovision int
	// LearnHeadroom, for concurrency and llm with no Overprovision, adds a learned number of
	// replicas on top of the target instead: as many as the target grew by within one cold
	// start, at HeadroomObjective of the last day's minutes (learn.go). SpecFor sets it when
	// num_overprovision is 0.
	LearnHeadroom bool

	// request_rate. TargetQPSPerAccelerator, when set, is the per-accelerator form: the
	// target follows the live replicas' own targets (instanceaware.go); TargetQPS is then the
	// smallest of them, the fallback.
	TargetQPSPerAccelerator map[string]float64
	TargetQPS               float64
	UpscaleDelay            time.Duration
	DownscaleDelay          time.Duration
	// DecisionInterval is how often Decide is called; request_rate counts its delays in
	// decisions of this length (SkyServe: 20 s, Ferry: 1 s).
	DecisionInterval time.Duration

	// concurrency and llm. TargetInflight and StableWindow stay 0 after WithDefaults when
	// unset: the scaler learns them from the replicas (learn.go) and falls back to
	// DefaultTargetInflight and DefaultStableWindow until it can. PanicWindow stays 0 too with
	// a learned stable window, and is PanicWindowShare of it.
	TargetInflight   float64
	StableWindow     time.Duration
	PanicWindow      time.Duration
	PanicThreshold   float64
	MaxScaleUpRate   float64
	MaxScaleDownRate float64
	ScaleToZeroGrace time.Duration

	// llm.
	TargetWaiting      float64
	TargetKVCacheUsage float64
}

// WithDefaults fills zero fields with the defaults above, except TargetInflight, StableWindow
// and (with StableWindow unset) PanicWindow, which the windowed policies learn when unset.
func (s Spec) WithDefaults() Spec {
	set := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	setF := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	s.Max = max(s.Max, s.Min)
	set(&s.DecisionInterval, DefaultDecisionInterval)
	s.StableWindow = max(s.StableWindow, 0)
	s.PanicWindow = max(s.PanicWindow, 0)
	if s.StableWindow > 0 {
		set(&s.PanicWindow, DefaultPanicWindow)
	}
	if s.PanicWindow > 0 {
		// A learned stable window is never shorter than DefaultStableWindow.
		s.PanicWindow = min(s.PanicWindow, cmp.Or(s.StableWindow, DefaultStableWindow))
	}
	set(&s.ScaleToZeroGrace, DefaultScaleToZeroGrace)
	s.TargetInflight = max(s.TargetInflight, 0)
	setF(&s.PanicThreshold, DefaultPanicThreshold)
	setF(&s.MaxScaleUpRate, DefaultMaxScaleUpRate)
	setF(&s.MaxScaleDownRate, DefaultMaxScaleDownRate)
	setF(&s.TargetWaiting, DefaultTargetWaiting)
	setF(&s.TargetKVCacheUsage, DefaultTargetKVCacheUsage)
	return s
}

// SpecFor turns a service's replica_policy into a Spec. A service with a fixed count (or a
// policy min == max with no autoscaler named) gets a fixed Spec.
func SpecFor(p configs.ReplicaPolicy) Spec {
	s := Spec{
		Policy:             p.Autoscaler,
		Min:                p.MinReplicas,
		Max:                p.MaxReplicas,
		Overprovision:      p.NumOverprovision,
		LearnHeadroom:      p.NumOverprovision == 0 && !p.NumOverprovisionSet,
		TargetQPS:          p.TargetQPSPerReplica,
		UpscaleDelay:       seconds(p.UpscaleDelaySeconds),
		DownscaleDelay:     seconds(p.DownscaleDelaySeconds),
		TargetInflight:     p.TargetInflightPerReplica,
		StableWindow:       seconds(p.StableWindowSeconds),
		PanicWindow:        seconds(p.PanicWindowSeconds),
		PanicThreshold:     p.PanicThreshold,
		MaxScaleUpRate:     p.MaxScaleUpRate,
		MaxScaleDownRate:   p.MaxScaleDownRate,
		ScaleToZeroGrace:   seconds(p.ScaleToZeroGraceSeconds),
		TargetWaiting:      p.TargetWaitingPerReplica,
		TargetKVCacheUsage: p.TargetKVCacheUsage,
	}
	if s.Policy == PolicyRequestRate && s.TargetQPS <= 0 {
		// The per-accelerator map form: SkyServe's InstanceAwareRequestRateAutoscaler, with the
		// smallest target as the fallback for replicas of unknown type.
		for _, q := range p.TargetQPSPerAccelerator {
			if s.TargetQPS <= 0 || q < s.TargetQPS {
				s.TargetQPS = q
			}
		}
		s.TargetQPSPerAccelerator = p.TargetQPSPerAccelerator
	}
	return s.WithDefaults()
}

// WantsEngineLoad reports whether Decide reads Observation.Engine, so that the caller scrapes
// the replicas' /metrics: the llm policy scales on it, and a concurrency policy without a
// target_inflight_per_replica learns its target from it.
func (s Spec) WantsEngineLoad() bool {
	return s.Policy == PolicyLLM || (s.Policy == PolicyConcurrency && s.TargetInflight <= 0)
}

// InitialTarget is the count a service starts with before any load was seen. request_rate
// starts at min_replicas plus overprovision, as SkyServe does. concurrency and llm start a
// scale-to-zero service with one replica, so that its first user does not wait for a cold
// start and a broken image shows up at once; it goes to zero after its idle window.
func (s Spec) InitialTarget() int {
	switch s.Policy {
	case "":
		return s.Min
	case PolicyRequestRate:
		return s.Min + s.Overprovision
	}
	return min(max(s.Min, 1), s.Max) + s.Overprovision
}

func seconds(n int) time.Duration { return time.Duration(n) * time.Second }
