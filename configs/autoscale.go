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
	t := &tuning{c: c, f: f, p: p, s: s}
	t.requestRateDelays()
	if n, kf, ok := t.read("target_inflight_per_replica"); ok {
		p.TargetInflightPerReplica, _ = c.positive(n, kf)
	}
	t.windows()
	t.scaleRates()
	t.scaleToZeroGrace(minOK)
	t.llmTargets()
}

// tuning is what the phases of scalingFields share: the replica_policy's fields, the policy
// they fill in and the autoscaler that decides which of them apply.
type tuning struct {
	c *checker
	f map[string]entry
	p *ReplicaPolicy
	s scaling
}

// ignores says why s's autoscaler does not read key, or "" when it does (or when the
// autoscaler is not known, so that the value's range is still checked).
func (s scaling) ignores(key string, minReplicas int) string {
	if !s.known {
		return ""
	}
	msg, why := "", s.why
	switch {
	case s.name == "":
		msg = fmt.Sprintf("no effect with a fixed replica count (min_replicas = max_replicas = %d): raise max_replicas, or name an autoscaler", minReplicas)
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
		return ""
	}
	if why != "" {
		msg += " (" + why + ")"
	}
	return msg
}

// applies reports whether key is read by the autoscaler, recording an error when it is not.
func (t *tuning) applies(key string, n *yaml.Node) bool {
	msg := t.s.ignores(key, t.p.MinReplicas)
	if msg == "" {
		return true
	}
	t.c.errorf(n, joinField(t.c.policyField(), key), "%s", msg)
	return false
}

// read returns the node of key and its field when key is present and read by the autoscaler.
func (t *tuning) read(key string) (*yaml.Node, string, bool) {
	e, ok := t.f[key]
	if !ok || !t.applies(key, e.value) {
		return nil, "", false
	}
	return e.value, joinField(t.c.policyField(), key), true
}

// requestRateDelays reads SkyServe's delays. They stay allowed with a fixed count, as in
// SkyServe, and keep their defaults there; under concurrency and llm they are zero.
func (t *tuning) requestRateDelays() {
	if t.s.windowed() {
		t.p.UpscaleDelaySeconds, t.p.DownscaleDelaySeconds = 0, 0
	}
	for _, key := range requestRateKeys {
		e, ok := t.f[key]
		if !ok || (t.s.name != "" && !t.applies(key, e.value)) {
			continue
		}
		if v, ok := t.c.intAtLeast(e.value, joinField(t.c.policyField(), key), 0); ok {
			if key == "upscale_delay_seconds" {
				t.p.UpscaleDelaySeconds = v
			} else {
				t.p.DownscaleDelaySeconds = v
			}
		}
	}
}

// windows reads the stable and panic windows; the panic window must fit inside the stable
// one, whether that was set or left to its default.
func (t *tuning) windows() {
	stable := defaultStableWindowSeconds
	if n, kf, ok := t.read("stable_window_seconds"); ok {
		if v, ok := t.c.intBetween(n, kf, minStableWindowSeconds, maxStableWindowSeconds); ok {
			t.p.StableWindowSeconds, stable = v, v
		} else {
			stable = 0 // unknown: skip the panic window's bound
		}
	}
	n, kf, ok := t.read("panic_window_seconds")
	if !ok {
		return
	}
	v, ok := t.c.intAtLeast(n, kf, 1)
	if !ok {
		return
	}
	switch {
	case stable == 0:
		t.p.PanicWindowSeconds = v
	case v > stable && t.p.StableWindowSeconds == 0:
		t.c.errorf(n, kf, "must be at most stable_window_seconds (%d, the default), got %d", stable, v)
	case v > stable:
		t.c.errorf(n, kf, "must be at most stable_window_seconds (%d), got %d", stable, v)
	default:
		t.p.PanicWindowSeconds = v
	}
}

// scaleRates reads the panic threshold and the bounds on how fast a windowed autoscaler may
// grow or shrink the replica count.
func (t *tuning) scaleRates() {
	if n, kf, ok := t.read("panic_threshold"); ok {
		t.p.PanicThreshold, _ = t.c.numberAbove(n, kf, 1, maxPanicThreshold)
	}
	if n, kf, ok := t.read("max_scale_up_rate"); ok {
		t.p.MaxScaleUpRate, _ = t.c.numberAbove(n, kf, 1, 0)
	}
	if n, kf, ok := t.read("max_scale_down_rate"); ok {
		t.p.MaxScaleDownRate, _ = t.c.numberAbove(n, kf, 1, 0)
	}
}

// scaleToZeroGrace reads scale_to_zero_grace_seconds, which only a policy that can reach zero
// replicas uses. minOK says min_replicas was read without error.
func (t *tuning) scaleToZeroGrace(minOK bool) {
	n, kf, ok := t.read("scale_to_zero_grace_seconds")
	if !ok {
		return
	}
	if v, ok := t.c.intAtLeast(n, kf, 0); ok {
		if minOK && t.p.MinReplicas > 0 {
			t.c.errorf(n, kf, "only matters with min_replicas: 0 (min_replicas is %d)", t.p.MinReplicas)
		} else {
			t.p.ScaleToZeroGraceSeconds = v
		}
	}
}

// llmTargets reads the engine-aware targets that only the llm autoscaler uses.
func (t *tuning) llmTargets() {
	if n, kf, ok := t.read("target_waiting_per_replica"); ok {
		t.p.TargetWaitingPerReplica, _ = t.c.positive(n, kf)
	}
	if n, kf, ok := t.read("target_kv_cache_usage"); ok {
		if v, ok := t.c.positive(n, kf); ok {
			if v > 1 {
				t.c.errorf(n, kf, "a fraction of the KV cache: must be at most 1, got %s", n.Value)
			} else {
				t.p.TargetKVCacheUsage = v
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
