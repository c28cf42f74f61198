package autoscaler

import (
	"time"

	"github.com/ferryserve/ferry/configs"
)

// Policy names, the values of `replica_policy.autoscaler`.
const (
	PolicyRequestRate = configs.AutoscalerRequestRate
	PolicyConcurrency = configs.AutoscalerConcurrency
	PolicyLLM         = configs.AutoscalerLLM
)

// Defaults for Spec's zero values. The window defaults are Knative's; the in-flight target is
// sized for an LLM engine rather than a web server (see DefaultTargetInflight).
const (
	// DefaultTargetInflight is in-flight requests per replica. Knative's 70 (100 × 0.7) suits
	// web servers; an LLM replica's time to first token climbs as soon as requests queue
	// behind a full batch, which happens far sooner. The right value depends on GPU and
	// model: `ferry sim`'s V100 with a 7B fp16 model wants 1.75 (its KV cache holds a few
	// sequences), an 80 GB GPU tens; set target_inflight_per_replica for yours.
	DefaultTargetInflight = 8
	// DefaultStableWindow and DefaultPanicWindow are Knative's 60 s and 6 s (10%).
	DefaultStableWindow = 60 * time.Second
	DefaultPanicWindow  = 6 * time.Second
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
)

// Spec is a service's scaling configuration with every default resolved.
type Spec struct {
	// Policy is PolicyRequestRate, PolicyConcurrency, PolicyLLM, or "" for a fixed count.
	Policy string
	Min    int
	Max    int
	// Overprovision replicas are added on top of the computed target (SkyServe).
	Overprovision int

	// request_rate.
	TargetQPS      float64
	UpscaleDelay   time.Duration
	DownscaleDelay time.Duration
	// DecisionInterval is how often Decide is called; request_rate counts its delays in
	// decisions of this length (SkyServe: 20 s, Ferry: 1 s).
	DecisionInterval time.Duration

	// concurrency and llm.
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

// WithDefaults fills zero fields with the defaults above.
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
	set(&s.StableWindow, DefaultStableWindow)
	set(&s.PanicWindow, DefaultPanicWindow)
	s.PanicWindow = min(s.PanicWindow, s.StableWindow)
	set(&s.ScaleToZeroGrace, DefaultScaleToZeroGrace)
	setF(&s.TargetInflight, DefaultTargetInflight)
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
		// The per-accelerator map form: SkyServe scales on the smallest target, so that no
		// accelerator type is overloaded.
		for _, q := range p.TargetQPSPerAccelerator {
			if s.TargetQPS <= 0 || q < s.TargetQPS {
				s.TargetQPS = q
			}
		}
	}
	return s.WithDefaults()
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
