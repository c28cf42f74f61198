package configs

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// The fields of replica_policy that choose and tune an autoscaler. SkyServe knows only
// request_rate's; the others are Knative KPA's knobs (concurrency) and Ferry's engine-aware
// additions (llm).
var (
	autoscalers = []string{AutoscalerRequestRate, AutoscalerConcurrency, AutoscalerLLM}
	// requestRateKeys are SkyServe's hysteresis, which only request_rate reads.
	requestRateKeys = []string{"upscale_delay_seconds", "downscale_delay_seconds"}
	// windowedKeys are read by concurrency and llm.
	windowedKeys = []string{"target_inflight_per_replica", "stable_window_seconds", "panic_window_seconds",
		"panic_threshold", "max_scale_up_rate", "max_scale_down_rate", "scale_to_zero_grace_seconds"}
	// llmKeys are read by llm only.
	llmKeys = []string{"target_waiting_per_replica", "target_kv_cache_usage"}
)

// Bounds on the windowed autoscalers' fields. The autoscaler package owns the defaults; the
// stable window's is repeated here because panic_window_seconds must fit inside it.
const (
	defaultStableWindowSeconds = 60
	// minStableWindowSeconds is the default panic window: a shorter stable window would
	// leave no room for one.
	minStableWindowSeconds = 6
	maxStableWindowSeconds = 3600
	maxPanicThreshold      = 100
)

// scaling is how a replica_policy's autoscaler was chosen, so that an error about a field the
// autoscaler does not read can say why that autoscaler applies.
type scaling struct {
	// name is the autoscaler; "" is a fixed count.
	name string
	// known is false when the autoscaler cannot be told because of another error (a bad
	// autoscaler name, or bad min_replicas or max_replicas); rules that depend on it are skipped.
	known bool
	// why explains a name the YAML did not write; "" when it did.
	why string
}

// windowed reports whether the autoscaler is one of the KPA-style ones.
func (s scaling) windowed() bool {
	return s.name == AutoscalerConcurrency || s.name == AutoscalerLLM
}

// resolveAutoscaler picks the autoscaler: the one named, else none for min == max, else
// DefaultAutoscaler when a concurrency or llm field is set, else request_rate when
// target_qps_per_replica is set (so a SkyServe file scales as it did there), else
// DefaultAutoscaler. rangeOK says min_replicas and max_replicas were read without error.
func (c *checker) resolveAutoscaler(f map[string]entry, p ReplicaPolicy, rangeOK, hasQPS bool) scaling {
	const field = "service.replica_policy.autoscaler"
	if e, ok := f["autoscaler"]; ok {
		v, ok := c.str(e.value, field)
		if !ok {
			return scaling{}
		}
		if !slices.Contains(autoscalers, v) {
			hint := suggest(v, autoscalers, "autoscalers")
			if strings.HasPrefix(hint, ";") {
				hint += fmt.Sprintf(" (valid autoscalers: %s)", strings.Join(autoscalers, ", "))
			}
			c.errorf(e.value, field, "unknown autoscaler %s%s", quoteShort(v), hint)
			return scaling{}
		}
		if v == AutoscalerRequestRate && !hasQPS {
			c.errorf(e.value, "service.replica_policy.target_qps_per_replica",
				"required with autoscaler: %s, which scales on queries per second per replica", AutoscalerRequestRate)
		}
		return scaling{name: v, known: true}
	}
	if !rangeOK {
		return scaling{}
	}
	if p.MinReplicas == p.MaxReplicas {
		return scaling{known: true}
	}
	for _, k := range slices.Concat(windowedKeys, llmKeys) {
		if _, ok := f[k]; ok {
			return scaling{name: DefaultAutoscaler, known: true,
				why: fmt.Sprintf("autoscaler is %s, the default, because %s is set", DefaultAutoscaler, k)}
		}
	}
	if hasQPS {
		// No field of another autoscaler is set, so no error will need a why.
		return scaling{name: AutoscalerRequestRate, known: true}
	}
	return scaling{name: DefaultAutoscaler, known: true,
		why: fmt.Sprintf("autoscaler is %s, the default without target_qps_per_replica; set target_qps_per_replica to scale on request rate as SkyServe does", DefaultAutoscaler)}
}

// scalingFields reads the fields that tune the autoscaler into p, reporting any the chosen
// autoscaler would not read: a field that silently does nothing is worse than an error.
func (c *checker) scalingFields(f map[string]entry, p *ReplicaPolicy, s scaling, minOK bool) {
	const field = "service.replica_policy"
	// applies reports whether key is read by s, recording an error when it is not.
	applies := func(key string, n *yaml.Node) bool {
		if !s.known {
			return true // still check the value's range
		}
		msg, why := "", s.why
		switch {
		case s.name == "":
			msg = fmt.Sprintf("no effect with a fixed replica count (min_replicas = max_replicas = %d): raise max_replicas, or name an autoscaler", p.MinReplicas)
		case slices.Contains(requestRateKeys, key) && s.windowed():
			msg = fmt.Sprintf("%s only; %s and %s use stable_window_seconds and panic_window_seconds",
				AutoscalerRequestRate, AutoscalerConcurrency, AutoscalerLLM)
		case slices.Contains(windowedKeys, key) && !s.windowed():
			msg = fmt.Sprintf("only with autoscaler: %s or %s; %s scales on target_qps_per_replica with upscale_delay_seconds and downscale_delay_seconds",
				AutoscalerConcurrency, AutoscalerLLM, AutoscalerRequestRate)
		case slices.Contains(llmKeys, key) && s.name != AutoscalerLLM:
			msg = fmt.Sprintf("only with autoscaler: %s", AutoscalerLLM)
			if why != "" {
				// The default may have been picked because of this very field: say how to get llm.
				why = fmt.Sprintf("the default autoscaler is %s; add autoscaler: %s", s.name, AutoscalerLLM)
			}
		default:
			return true
		}
		if why != "" {
			msg += " (" + why + ")"
		}
		c.errorf(n, joinField(field, key), "%s", msg)
		return false
	}

	// SkyServe's delays stay allowed with a fixed count, as in SkyServe, and keep their
	// defaults there; under concurrency and llm they are zero.
	if s.windowed() {
		p.UpscaleDelaySeconds, p.DownscaleDelaySeconds = 0, 0
	}
	for _, key := range requestRateKeys {
		e, ok := f[key]
		if !ok || (s.name != "" && !applies(key, e.value)) {
			continue
		}
		if v, ok := c.intAtLeast(e.value, joinField(field, key), 0); ok {
			if key == "upscale_delay_seconds" {
				p.UpscaleDelaySeconds = v
			} else {
				p.DownscaleDelaySeconds = v
			}
		}
	}

	// read returns the node of key when it is present and read by the autoscaler.
	read := func(key string) (*yaml.Node, string, bool) {
		e, ok := f[key]
		if !ok || !applies(key, e.value) {
			return nil, "", false
		}
		return e.value, joinField(field, key), true
	}
	if n, kf, ok := read("target_inflight_per_replica"); ok {
		p.TargetInflightPerReplica, _ = c.positive(n, kf)
	}
	stable := defaultStableWindowSeconds
	if n, kf, ok := read("stable_window_seconds"); ok {
		if v, ok := c.intBetween(n, kf, minStableWindowSeconds, maxStableWindowSeconds); ok {
			p.StableWindowSeconds, stable = v, v
		} else {
			stable = 0 // unknown: skip the panic window's bound
		}
	}
	if n, kf, ok := read("panic_window_seconds"); ok {
		if v, ok := c.intAtLeast(n, kf, 1); ok {
			switch {
			case stable == 0:
				p.PanicWindowSeconds = v
			case v > stable && p.StableWindowSeconds == 0:
				c.errorf(n, kf, "must be at most stable_window_seconds (%d, the default), got %d", stable, v)
			case v > stable:
				c.errorf(n, kf, "must be at most stable_window_seconds (%d), got %d", stable, v)
			default:
				p.PanicWindowSeconds = v
			}
		}
	}
	if n, kf, ok := read("panic_threshold"); ok {
		p.PanicThreshold, _ = c.numberAbove(n, kf, 1, maxPanicThreshold)
	}
	if n, kf, ok := read("max_scale_up_rate"); ok {
		p.MaxScaleUpRate, _ = c.numberAbove(n, kf, 1, 0)
	}
	if n, kf, ok := read("max_scale_down_rate"); ok {
		p.MaxScaleDownRate, _ = c.numberAbove(n, kf, 1, 0)
	}
	if n, kf, ok := read("scale_to_zero_grace_seconds"); ok {
		if v, ok := c.intAtLeast(n, kf, 0); ok {
			if minOK && p.MinReplicas > 0 {
				c.errorf(n, kf, "only matters with min_replicas: 0 (min_replicas is %d)", p.MinReplicas)
			} else {
				p.ScaleToZeroGraceSeconds = v
			}
		}
	}
	if n, kf, ok := read("target_waiting_per_replica"); ok {
		p.TargetWaitingPerReplica, _ = c.positive(n, kf)
	}
	if n, kf, ok := read("target_kv_cache_usage"); ok {
		if v, ok := c.positive(n, kf); ok {
			if v > 1 {
				c.errorf(n, kf, "a fraction of the KV cache: must be at most 1, got %s", n.Value)
			} else {
				p.TargetKVCacheUsage = v
			}
		}
	}
}

// intBetween reads an integer in [lo, hi].
func (c *checker) intBetween(n *yaml.Node, field string, lo, hi int) (int, bool) {
	v, ok := c.intAtLeast(n, field, lo)
	if ok && v > hi {
		c.errorf(n, field, "must be at most %d, got %d", hi, v)
		return v, false
	}
	return v, ok
}

// numberAbove reads a number greater than lo and, when hi > lo, at most hi.
func (c *checker) numberAbove(n *yaml.Node, field string, lo, hi float64) (float64, bool) {
	v, ok := c.number(n, field)
	switch {
	case !ok:
		return 0, false
	case v <= lo:
		c.errorf(n, field, "must be greater than %g, got %s", lo, n.Value)
		return 0, false
	case hi > lo && v > hi:
		c.errorf(n, field, "must be at most %g, got %s", hi, n.Value)
		return 0, false
	}
	return v, true
}
