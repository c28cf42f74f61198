package configs

import (
	"maps"
	"slices"

	"gopkg.in/yaml.v3"
)

// service.pools: prefill/decode disaggregation (vLLM's NixlConnector, llm-d's P/D). The
// service's own replicas (its resources, replica_policy and readiness_probe) are the decode
// pool; pools.prefill is a second pool with its own of each, which the proxy sends every
// completion's prefill to before the decode pool streams the answer. SkyPilot has no field for
// it; the shape follows the service's own.

// PoolPrefill is the prefill pool's name, in its replicas' FERRY_POOL and in status.
const (
	PoolPrefill = "prefill"
	PoolDecode  = "decode"
)

// EnvPool tells a replica of a disaggregated service which pool it is in ("prefill" or
// "decode"), so that one run command can pick vLLM's kv_role.
const EnvPool = "FERRY_POOL"

// DefaultTargetQueuedPromptTokens is the prefill pool's default target: prompt tokens sent to
// prefill and not yet answered, per replica. vLLM's V1 scheduler prefills up to
// max_num_batched_tokens (8192 for its OpenAI server) a step, so a replica holding more than a
// step's worth makes prompts wait a step behind others.
const DefaultTargetQueuedPromptTokens = 8192

// Pools is service.pools.
type Pools struct {
	Prefill *Pool `json:"prefill,omitempty" yaml:"prefill,omitempty"`
}

// Pool is one pool of a disaggregated service: what its replicas differ in from the service's.
type Pool struct {
	// Resources, when set, replace the task's for this pool's replicas.
	Resources *Resources `json:"resources,omitempty" yaml:"resources,omitempty"`
	// ReadinessProbe is the pool's; the service's when the YAML leaves it out.
	ReadinessProbe Probe `json:"readiness_probe" yaml:"readiness_probe"`
	// FixedReplicas and ReplicaPolicy as the service's: `replicas: N` or `replica_policy`.
	FixedReplicas bool          `json:"fixed_replicas" yaml:"replicas"`
	ReplicaPolicy ReplicaPolicy `json:"replica_policy" yaml:"replica_policy"`
	// TargetQueuedPromptTokens is what the pool scales on: the prompt tokens in prefill (sent,
	// not yet answered) per replica.
	TargetQueuedPromptTokens int `json:"target_queued_prompt_tokens" yaml:"target_queued_prompt_tokens"`
	// Envs are added to the task's for this pool's replicas.
	Envs map[string]string `json:"envs,omitempty" yaml:"envs,omitempty"`
}

var _ shapedSection = Pool{}

var (
	poolsKeys = keysOf[Pools]()
	poolKeys  = keysOf[Pool]()
	// poolPolicyRefused are replica_policy keys a prefill pool cannot use: it scales on queued
	// prompt tokens, not on requests.
	poolPolicyRefused = []string{"target_qps_per_replica", "target_inflight_per_replica",
		"target_waiting_per_replica", "target_kv_cache_usage"}
)

// pools reads service.pools; svc is the service read so far (its probe is the pool's default).
func (c *checker) pools(n *yaml.Node, field string, svc *Service, useSpot bool) *Pools {
	f, ok := c.fields(n, field, poolsKeys)
	if !ok {
		return nil
	}
	e, ok := f[PoolPrefill]
	if !ok {
		c.errorf(n, joinField(field, PoolPrefill), "is required: the pool that prefills (the service's own replicas decode)")
		return nil
	}
	return &Pools{Prefill: c.pool(e.value, joinField(field, PoolPrefill), svc, useSpot)}
}

// pool reads one pool at field.
func (c *checker) pool(n *yaml.Node, field string, svc *Service, useSpot bool) *Pool {
	p := &Pool{ReadinessProbe: svc.ReadinessProbe, TargetQueuedPromptTokens: DefaultTargetQueuedPromptTokens}
	f, ok := c.fields(n, field, poolKeys)
	if !ok {
		return p
	}
	if e, ok := f["resources"]; ok {
		r, _ := c.resourcesAt(e.value, joinField(field, "resources"), true)
		p.Resources, useSpot = &r, r.UseSpot
	}
	if e, ok := f["readiness_probe"]; ok {
		p.ReadinessProbe = c.probe(e.value, joinField(field, "readiness_probe"))
	}
	if e, ok := f["replica_policy"]; ok {
		c.refuseKeys(e.value, joinField(field, "replica_policy"), poolPolicyRefused,
			"a prefill pool scales on the prompt tokens it holds: set "+joinField(field, "target_queued_prompt_tokens")+" instead")
	}
	c.section = field
	var pooled Service
	c.replicas(f, &pooled, useSpot)
	c.section = ""
	p.FixedReplicas, p.ReplicaPolicy = pooled.FixedReplicas, pooled.ReplicaPolicy
	if a := p.ReplicaPolicy.Autoscaler; a != "" && a != AutoscalerConcurrency {
		c.errorf(f["replica_policy"].value, joinField(field, "replica_policy.autoscaler"),
			"a prefill pool scales with %s over the prompt tokens it holds, got %s", AutoscalerConcurrency, a)
	}
	if e, ok := f["target_queued_prompt_tokens"]; ok {
		p.TargetQueuedPromptTokens, _ = c.intBetween(e.value, joinField(field, "target_queued_prompt_tokens"), 1, 1<<24)
	}
	envField := joinField(field, "envs")
	if e, ok := f["envs"]; ok {
		p.Envs = c.envs(map[string]entry{envField: e}, envField, nil, nil)
	}
	return p
}

// refuseKeys records an error for each of keys that mapping n holds.
func (c *checker) refuseKeys(n *yaml.Node, field string, keys []string, why string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; slices.Contains(keys, k.Value) {
			c.errorf(k, joinField(field, k.Value), "%s", why)
		}
	}
}

// PoolTask is the task a pool's replicas run: the task with the pool's resources, probe,
// replica policy and envs, and FERRY_POOL naming the pool. Nil when the service has no such
// pool.
func (t *Task) PoolTask(name string) *Task {
	if t == nil || t.Service == nil || t.Service.Pools == nil || name != PoolPrefill || t.Service.Pools.Prefill == nil {
		return nil
	}
	p := t.Service.Pools.Prefill
	out := *t
	if p.Resources != nil {
		out.Resources = p.Resources.withNodes(t.NumNodes)
	}
	out.Envs = maps.Clone(t.Envs)
	if out.Envs == nil {
		out.Envs = map[string]string{}
	}
	maps.Copy(out.Envs, p.Envs)
	out.Envs[EnvPool] = name
	svc := *t.Service
	svc.ReadinessProbe, svc.FixedReplicas, svc.ReplicaPolicy = p.ReadinessProbe, p.FixedReplicas, p.ReplicaPolicy
	svc.Pools = nil
	out.Service = &svc
	return &out
}

// Disaggregated reports whether the service prefills on a pool of its own.
func (s *Service) Disaggregated() bool {
	return s != nil && s.Pools != nil && s.Pools.Prefill != nil
}

// resolvedValue writes a fixed count as replicas (and no replica_policy), as the service's.
func (p Pool) resolvedValue(key string) (any, bool) {
	return Service{FixedReplicas: p.FixedReplicas, ReplicaPolicy: p.ReplicaPolicy}.resolvedValue(key)
}
