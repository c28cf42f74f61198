package configs

import (
	"reflect"
	"strings"
	"testing"
)

const poolsHead = "resources: {accelerators: H100:1}\nrun: vllm serve m --kv-transfer-config \"{\\\"kv_role\\\":\\\"kv_both\\\"}\"\nservice:\n  ports: 8000\n  readiness_probe: /health\n  replica_policy: {min_replicas: 1, max_replicas: 4, autoscaler: llm}\n  pools:\n"

func TestParsePools(t *testing.T) {
	yaml := poolsHead + "    prefill:\n      resources: {accelerators: L4:1}\n      replica_policy: {min_replicas: 0, max_replicas: 6, stable_window_seconds: 30}\n" +
		"      target_queued_prompt_tokens: 4096\n      readiness_probe: /ready\n      envs: {EXTRA: x}\n"
	task, err := Parse("task.yaml", []byte(yaml), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	p := task.Service.Pools.Prefill
	if !task.Service.Disaggregated() || p.TargetQueuedPromptTokens != 4096 || p.ReplicaPolicy.MaxReplicas != 6 ||
		p.ReplicaPolicy.StableWindowSeconds != 30 || p.ReadinessProbe.Path != "/ready" || p.Resources == nil {
		t.Fatalf("pool %+v", p)
	}
	pt := task.PoolTask(PoolPrefill)
	if got := pt.Resources.Candidates()[0].Accelerators; len(got) != 1 || got[0].Name != "L4" {
		t.Errorf("pool task accelerators %v, want L4:1", got)
	}
	if pt.Envs[EnvPool] != PoolPrefill || pt.Envs["EXTRA"] != "x" || pt.Service.Pools != nil ||
		pt.Service.ReplicaPolicy.MaxReplicas != 6 || pt.Service.ReadinessProbe.Path != "/ready" {
		t.Errorf("pool task envs %v service %+v", pt.Envs, pt.Service)
	}
	if task.Envs[EnvPool] != "" || task.Service.ReplicaPolicy.MaxReplicas != 4 {
		t.Errorf("the service's own task changed: envs %v policy %+v", task.Envs, task.Service.ReplicaPolicy)
	}
	// What serve up shows parses back to the same task.
	resolved, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("resolved.yaml", resolved, Overrides{})
	if err != nil {
		t.Fatalf("the resolved task does not parse: %v\n%s", err, resolved)
	}
	if !reflect.DeepEqual(again.Service.Pools, task.Service.Pools) {
		t.Errorf("resolved pools %+v, want %+v\n%s", again.Service.Pools.Prefill, task.Service.Pools.Prefill, resolved)
	}
	if task.PoolTask(PoolDecode) != nil {
		t.Error("PoolTask(decode) is the task itself, not a pool")
	}

	// Defaults: the service's probe and resources, one replica, the token target.
	task, err = Parse("task.yaml", []byte(poolsHead+"    prefill: {}\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	p = task.Service.Pools.Prefill
	if p.Resources != nil || p.ReadinessProbe.Path != "/health" || !p.FixedReplicas || p.ReplicaPolicy.MinReplicas != 1 ||
		p.TargetQueuedPromptTokens != DefaultTargetQueuedPromptTokens {
		t.Errorf("defaults %+v", p)
	}
	if got := task.PoolTask(PoolPrefill).Resources.Candidates()[0].Accelerators; len(got) != 1 || got[0].Name != "H100" {
		t.Errorf("pool task accelerators %v, want the task's H100:1", got)
	}
}

func TestParsePoolsErrors(t *testing.T) {
	tests := map[string]struct{ yaml, want string }{
		"no prefill":        {poolsHead + "    decode: {}\n", "unknown field \"decode\""},
		"empty pools":       {poolsHead + "    {}\n", "service.pools.prefill: is required"},
		"llm autoscaler":    {poolsHead + "    prefill:\n      replica_policy: {min_replicas: 1, max_replicas: 2, autoscaler: llm}\n", "service.pools.prefill.replica_policy.autoscaler: a prefill pool scales with concurrency"},
		"request autoscale": {poolsHead + "    prefill:\n      replica_policy: {min_replicas: 1, max_replicas: 2, target_qps_per_replica: 3}\n", "task.yaml:9:58: service.pools.prefill.replica_policy.target_qps_per_replica: a prefill pool scales on the prompt tokens"},
		"policy field path": {poolsHead + "    prefill:\n      replica_policy: {max_replicas: 2}\n", "service.pools.prefill.replica_policy.min_replicas: required"},
		"both counts":       {poolsHead + "    prefill:\n      replicas: 2\n      replica_policy: {min_replicas: 1}\n", "service.pools.prefill.replica_policy: replicas and replica_policy are exclusive"},
		"bad replicas":      {poolsHead + "    prefill:\n      replicas: -1\n", "service.pools.prefill.replicas"},
		"bad tokens":        {poolsHead + "    prefill:\n      target_queued_prompt_tokens: 0\n", "service.pools.prefill.target_queued_prompt_tokens"},
		"bad env":           {poolsHead + "    prefill:\n      envs: {\"1X\": y}\n", "service.pools.prefill.envs.1X"},
		"bad resources":     {poolsHead + "    prefill:\n      resources: {accelerators: 3}\n", "service.pools.prefill.resources.accelerators"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
