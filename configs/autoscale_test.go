package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// policyHead is a service whose replica_policy lines follow, from line 5.
const policyHead = "run: serve\nservice:\n  ports: 8080\n  replica_policy:\n"

func TestParseAutoscaler(t *testing.T) {
	// withDelays gives p the delays request_rate and fixed policies get by default.
	withDelays := func(p ReplicaPolicy) ReplicaPolicy {
		p.UpscaleDelaySeconds, p.DownscaleDelaySeconds = DefaultUpscaleDelaySeconds, DefaultDownscaleDelaySeconds
		return p
	}
	tests := map[string]struct {
		policy string // replica_policy's lines
		want   ReplicaPolicy
	}{
		"SkyServe policy scales on request rate": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: 2\n",
			want:   withDelays(ReplicaPolicy{MinReplicas: 1, MaxReplicas: 3, Autoscaler: AutoscalerRequestRate, TargetQPSPerReplica: 2}),
		},
		"SkyServe policy keeps its delays": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    target_qps_per_replica: 2\n    upscale_delay_seconds: 0\n    downscale_delay_seconds: 60\n",
			want:   ReplicaPolicy{MinReplicas: 0, MaxReplicas: 3, Autoscaler: AutoscalerRequestRate, TargetQPSPerReplica: 2, DownscaleDelaySeconds: 60},
		},
		"a range without a target gets the default autoscaler": {
			policy: "    min_replicas: 0\n    max_replicas: 4\n",
			want:   ReplicaPolicy{MinReplicas: 0, MaxReplicas: 4, Autoscaler: DefaultAutoscaler},
		},
		"a concurrency field picks the default autoscaler even with a QPS target": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: 2\n    stable_window_seconds: 30\n",
			want:   ReplicaPolicy{MinReplicas: 1, MaxReplicas: 3, Autoscaler: DefaultAutoscaler, TargetQPSPerReplica: 2, StableWindowSeconds: 30},
		},
		"min equal to max stays fixed": {
			policy: "    min_replicas: 2\n    max_replicas: 2\n    target_qps_per_replica: 2\n    upscale_delay_seconds: 10\n",
			want:   ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2, TargetQPSPerReplica: 2, UpscaleDelaySeconds: 10, DownscaleDelaySeconds: DefaultDownscaleDelaySeconds},
		},
		"a named autoscaler with min equal to max": {
			policy: "    min_replicas: 2\n    autoscaler: concurrency\n",
			want:   ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2, Autoscaler: AutoscalerConcurrency},
		},
		"named request_rate": {
			policy: "    min_replicas: 1\n    max_replicas: 5\n    autoscaler: request_rate\n    target_qps_per_replica: 4\n",
			want:   withDelays(ReplicaPolicy{MinReplicas: 1, MaxReplicas: 5, Autoscaler: AutoscalerRequestRate, TargetQPSPerReplica: 4}),
		},
		"concurrency scaling to zero with every field": {
			policy: `    min_replicas: 0
    max_replicas: 8
    autoscaler: concurrency
    target_qps_per_replica: 3
    target_inflight_per_replica: 6.5
    stable_window_seconds: 6
    panic_window_seconds: 6
    panic_threshold: 100
    max_scale_up_rate: 1.5
    max_scale_down_rate: 4
    scale_to_zero_grace_seconds: 0
`,
			want: ReplicaPolicy{MinReplicas: 0, MaxReplicas: 8, Autoscaler: AutoscalerConcurrency, TargetQPSPerReplica: 3,
				TargetInflightPerReplica: 6.5, StableWindowSeconds: 6, PanicWindowSeconds: 6, PanicThreshold: 100,
				MaxScaleUpRate: 1.5, MaxScaleDownRate: 4},
		},
		"llm with its own fields": {
			policy: `    min_replicas: 0
    max_replicas: 4
    autoscaler: llm
    stable_window_seconds: 3600
    panic_window_seconds: 60
    scale_to_zero_grace_seconds: 120
    target_waiting_per_replica: 0.5
    target_kv_cache_usage: 1
`,
			want: ReplicaPolicy{MinReplicas: 0, MaxReplicas: 4, Autoscaler: AutoscalerLLM, StableWindowSeconds: 3600,
				PanicWindowSeconds: 60, ScaleToZeroGraceSeconds: 120, TargetWaitingPerReplica: 0.5, TargetKVCacheUsage: 1},
		},
		"panic window up to the default stable window": {
			policy: "    min_replicas: 1\n    max_replicas: 2\n    panic_window_seconds: 60\n",
			want:   ReplicaPolicy{MinReplicas: 1, MaxReplicas: 2, Autoscaler: DefaultAutoscaler, PanicWindowSeconds: 60},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(policyHead+tc.policy), Overrides{})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, task.Service.ReplicaPolicy); diff != "" {
				t.Errorf("replica_policy (-want +got):\n%s", diff)
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, task, out)
		})
	}
}

func TestParseAutoscalerFixedReplicas(t *testing.T) {
	task, err := Parse("task.yaml", []byte("run: serve\nservice:\n  ports: 8080\n  replicas: 3\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if got := task.Service.ReplicaPolicy.Autoscaler; got != "" {
		t.Errorf("replicas: 3 has autoscaler %q, want none", got)
	}
}

func TestParseAutoscalerErrors(t *testing.T) {
	const requestRateMsg = "only with autoscaler: concurrency or llm; request_rate scales on target_qps_per_replica with upscale_delay_seconds and downscale_delay_seconds"
	const windowedMsg = "request_rate only; concurrency and llm use stable_window_seconds and panic_window_seconds"
	tests := map[string]struct {
		policy string // replica_policy's lines, from line 5
		want   []wantErr
	}{
		"unknown autoscaler lists the names": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    autoscaler: knative\n",
			want: []wantErr{{7, 17, "service.replica_policy.autoscaler",
				`unknown autoscaler "knative" (valid autoscalers: request_rate, concurrency, llm)`}},
		},
		"misspelt autoscaler suggests and lists": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    autoscaler: concurency\n",
			want: []wantErr{{7, 17, "service.replica_policy.autoscaler",
				`unknown autoscaler "concurency"; did you mean "concurrency"? (valid autoscalers: request_rate, concurrency, llm)`}},
		},
		"empty autoscaler": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    autoscaler: \"\"\n",
			want:   []wantErr{{7, 17, "service.replica_policy.autoscaler", `unknown autoscaler ""`}},
		},
		"autoscaler is not a string": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    autoscaler: [llm]\n",
			want:   []wantErr{{7, 17, "service.replica_policy.autoscaler", "expected a string, got a list"}},
		},
		"named request_rate still needs a QPS target": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    autoscaler: request_rate\n",
			want: []wantErr{{7, 17, "service.replica_policy.target_qps_per_replica",
				"required with autoscaler: request_rate, which scales on queries per second per replica"}},
		},
		"named request_rate needs a QPS target with min equal to max": {
			policy: "    min_replicas: 2\n    autoscaler: request_rate\n",
			want:   []wantErr{{6, 17, "service.replica_policy.target_qps_per_replica", "required with autoscaler: request_rate"}},
		},
		"concurrency with SkyServe's delays": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    autoscaler: concurrency\n    upscale_delay_seconds: 60\n    downscale_delay_seconds: -1\n",
			want: []wantErr{
				{8, 28, "service.replica_policy.upscale_delay_seconds", windowedMsg},
				{9, 30, "service.replica_policy.downscale_delay_seconds", windowedMsg},
			},
		},
		"llm with SkyServe's delays": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    autoscaler: llm\n    upscale_delay_seconds: 60\n",
			want:   []wantErr{{8, 28, "service.replica_policy.upscale_delay_seconds", windowedMsg}},
		},
		"delay without a QPS target says why the autoscaler is concurrency": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    upscale_delay_seconds: 60\n",
			want: []wantErr{{7, 28, "service.replica_policy.upscale_delay_seconds", windowedMsg +
				" (autoscaler is concurrency, the default without target_qps_per_replica; set target_qps_per_replica to scale on request rate as SkyServe does)"}},
		},
		"delay beside a concurrency field says why the autoscaler is concurrency": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: 2\n    stable_window_seconds: 30\n    downscale_delay_seconds: 60\n",
			want: []wantErr{{9, 30, "service.replica_policy.downscale_delay_seconds", windowedMsg +
				" (autoscaler is concurrency, the default, because stable_window_seconds is set)"}},
		},
		"request_rate with every windowed and llm field": {
			policy: `    min_replicas: 1
    max_replicas: 3
    autoscaler: request_rate
    target_qps_per_replica: 2
    target_inflight_per_replica: 4
    stable_window_seconds: 30
    panic_window_seconds: 3
    panic_threshold: 3
    max_scale_up_rate: 10
    max_scale_down_rate: 4
    scale_to_zero_grace_seconds: 10
    target_waiting_per_replica: 2
    target_kv_cache_usage: 0.5
`,
			want: []wantErr{
				{9, 34, "service.replica_policy.target_inflight_per_replica", requestRateMsg},
				{10, 28, "service.replica_policy.stable_window_seconds", requestRateMsg},
				{11, 27, "service.replica_policy.panic_window_seconds", requestRateMsg},
				{12, 22, "service.replica_policy.panic_threshold", requestRateMsg},
				{13, 24, "service.replica_policy.max_scale_up_rate", requestRateMsg},
				{14, 26, "service.replica_policy.max_scale_down_rate", requestRateMsg},
				{15, 34, "service.replica_policy.scale_to_zero_grace_seconds", requestRateMsg},
				{16, 33, "service.replica_policy.target_waiting_per_replica", "only with autoscaler: llm"},
				{17, 28, "service.replica_policy.target_kv_cache_usage", "only with autoscaler: llm"},
			},
		},
		"llm fields with concurrency": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    autoscaler: concurrency\n    target_waiting_per_replica: 2\n    target_kv_cache_usage: 0.5\n",
			want: []wantErr{
				{8, 33, "service.replica_policy.target_waiting_per_replica", "only with autoscaler: llm"},
				{9, 28, "service.replica_policy.target_kv_cache_usage", "only with autoscaler: llm"},
			},
		},
		"llm fields without an autoscaler say how to get llm": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    target_kv_cache_usage: 0.5\n",
			want: []wantErr{{7, 28, "service.replica_policy.target_kv_cache_usage",
				"only with autoscaler: llm (the default autoscaler is concurrency; add autoscaler: llm)"}},
		},
		"windowed fields with a fixed count": {
			policy: "    min_replicas: 2\n    stable_window_seconds: 30\n    target_kv_cache_usage: 0.5\n    upscale_delay_seconds: 10\n",
			want: []wantErr{
				{6, 28, "service.replica_policy.stable_window_seconds",
					"no effect with a fixed replica count (min_replicas = max_replicas = 2): raise max_replicas, or name an autoscaler"},
				{7, 28, "service.replica_policy.target_kv_cache_usage", "no effect with a fixed replica count"},
			},
		},
		"panic window above the default stable window": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    panic_window_seconds: 61\n",
			want: []wantErr{{7, 27, "service.replica_policy.panic_window_seconds",
				"must be at most stable_window_seconds (60, the default), got 61"}},
		},
		"panic window above the stable window": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    stable_window_seconds: 20\n    panic_window_seconds: 21\n",
			want: []wantErr{{8, 27, "service.replica_policy.panic_window_seconds",
				"must be at most stable_window_seconds (20), got 21"}},
		},
		"windows below their minimum": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    stable_window_seconds: 5\n    panic_window_seconds: 0\n",
			want: []wantErr{
				{7, 28, "service.replica_policy.stable_window_seconds", "must be at least 6, got 5"},
				{8, 27, "service.replica_policy.panic_window_seconds", "must be at least 1, got 0"},
			},
		},
		"stable window above an hour": {
			// A bad stable window leaves the panic window's bound unknown: one error, not two.
			policy: "    min_replicas: 0\n    max_replicas: 3\n    stable_window_seconds: 3601\n    panic_window_seconds: 100\n",
			want:   []wantErr{{7, 28, "service.replica_policy.stable_window_seconds", "must be at most 3600, got 3601"}},
		},
		"out-of-range llm values": {
			policy: `    min_replicas: 0
    max_replicas: 3
    autoscaler: llm
    target_inflight_per_replica: 0
    panic_threshold: 1
    max_scale_up_rate: 1
    max_scale_down_rate: 0.5
    scale_to_zero_grace_seconds: -1
    target_waiting_per_replica: 0
    target_kv_cache_usage: 1.5
`,
			want: []wantErr{
				{8, 34, "service.replica_policy.target_inflight_per_replica", "must be greater than 0, got 0"},
				{9, 22, "service.replica_policy.panic_threshold", "must be greater than 1, got 1"},
				{10, 24, "service.replica_policy.max_scale_up_rate", "must be greater than 1, got 1"},
				{11, 26, "service.replica_policy.max_scale_down_rate", "must be greater than 1, got 0.5"},
				{12, 34, "service.replica_policy.scale_to_zero_grace_seconds", "must be at least 0, got -1"},
				{13, 33, "service.replica_policy.target_waiting_per_replica", "must be greater than 0, got 0"},
				{14, 28, "service.replica_policy.target_kv_cache_usage", "must be at most 1, got 1.5"},
			},
		},
		"panic threshold too high, zero KV target, inflight not a number": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    autoscaler: llm\n    panic_threshold: 101\n    target_kv_cache_usage: 0\n    target_inflight_per_replica: x\n",
			want: []wantErr{
				{8, 22, "service.replica_policy.panic_threshold", "must be at most 100, got 101"},
				{9, 28, "service.replica_policy.target_kv_cache_usage", "must be greater than 0, got 0"},
				{10, 34, "service.replica_policy.target_inflight_per_replica", `expected a number, got string "x"`},
			},
		},
		"scale-to-zero grace with min_replicas 1": {
			policy: "    min_replicas: 1\n    max_replicas: 3\n    scale_to_zero_grace_seconds: 10\n",
			want: []wantErr{{7, 34, "service.replica_policy.scale_to_zero_grace_seconds",
				"only matters with min_replicas: 0 (min_replicas is 1)"}},
		},
		"a bad min_replicas hides the rules that depend on it": {
			policy: "    min_replicas: x\n    max_replicas: 3\n    upscale_delay_seconds: 10\n    stable_window_seconds: 10\n",
			want:   []wantErr{{5, 19, "service.replica_policy.min_replicas", `expected an integer, got string "x"`}},
		},
		"a new key misspelt": {
			policy: "    min_replicas: 0\n    max_replicas: 3\n    stable_window: 30\n",
			want:   []wantErr{{7, 5, "service.replica_policy.stable_window", `did you mean "stable_window_seconds"?`}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(policyHead+tc.policy), Overrides{})
			if err == nil {
				t.Fatalf("Parse succeeded, want errors; got %+v", task.Service.ReplicaPolicy)
			}
			if diff := cmp.Diff(tc.want, project(Errors(err), tc.want)); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}
