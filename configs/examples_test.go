package configs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// exampleOverrides supplies what the examples leave for the command line.
var exampleOverrides = Overrides{Secrets: map[string]string{"HF_TOKEN": "hf_example"},
	Envs: map[string]string{"ENDPOINT": "http://127.0.0.1:30001", "PROMPTS": "prompts.txt"}}

func TestExamplesParse(t *testing.T) {
	paths, err := filepath.Glob("examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 4 {
		t.Fatalf("found %d examples, want at least 4", len(paths))
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			task, err := Load(path, exampleOverrides)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if (task.Service == nil) == (task.Job == nil) {
				t.Fatalf("example is neither a service nor a job")
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, task, out)
		})
	}
}

func TestQuickstartExample(t *testing.T) {
	task, err := Load("examples/quickstart.yaml", Overrides{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := &Task{
		Name:      "quickstart",
		NumNodes:  1,
		Resources: Resources{Infra: InfraLocal, Cloud: InfraLocal},
		Run:       "ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b",
		Service: &Service{
			ReadinessProbe:      Probe{Path: "/health", InitialDelaySeconds: 30, TimeoutSeconds: 5},
			FixedReplicas:       true,
			ReplicaPolicy:       ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2, UpscaleDelaySeconds: 300, DownscaleDelaySeconds: 1200},
			Port:                8080,
			LoadBalancingPolicy: PolicyLeastTTFT,
			Update:              DefaultUpdate(),
		},
		Source: "examples/quickstart.yaml",
	}
	if diff := cmp.Diff(want, task); diff != "" {
		t.Errorf("quickstart (-want +got):\n%s", diff)
	}
}

func TestVLLMExampleNeedsItsSecret(t *testing.T) {
	data, err := os.ReadFile("examples/vllm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse("examples/vllm.yaml", data, Overrides{})
	errs := Errors(err)
	if len(errs) != 1 || errs[0].Field != "secrets.HF_TOKEN" {
		t.Fatalf("want one error about secrets.HF_TOKEN, got %v", err)
	}
	task, err := Parse("examples/vllm.yaml", data, exampleOverrides)
	if err != nil {
		t.Fatal(err)
	}
	p := task.Service.ReplicaPolicy
	if !task.Resources.UseSpot || p.BaseOndemandFallbackReplicas != 1 || !p.DynamicOndemandFallback || p.TargetQPSPerReplica != 5 {
		t.Errorf("unexpected vllm policy: %+v (use_spot %v)", p, task.Resources.UseSpot)
	}
	const wantBody = `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"ping"}],"max_tokens":1}`
	if task.Service.ReadinessProbe.PostData != wantBody {
		t.Errorf("post_data = %s, want %s", task.Service.ReadinessProbe.PostData, wantBody)
	}
}

func TestAutoscaleConcurrencyExample(t *testing.T) {
	task, err := Load("examples/autoscale-concurrency.yaml", Overrides{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	wantPolicy := ReplicaPolicy{
		MinReplicas: 0, MaxReplicas: 4, Autoscaler: AutoscalerConcurrency,
		TargetInflightPerReplica: 4, StableWindowSeconds: 60, PanicWindowSeconds: 6, PanicThreshold: 2,
		ScaleToZeroGraceSeconds: 30,
	}
	if diff := cmp.Diff(wantPolicy, task.Service.ReplicaPolicy); diff != "" {
		t.Errorf("replica_policy (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&Limits{MaxQueuedRequests: 100, MaxQueueWaitSeconds: 120}, task.Service.Limits); diff != "" {
		t.Errorf("limits (-want +got):\n%s", diff)
	}
	if task.Resources.Infra != InfraLocal || task.Service.Port != 8080 {
		t.Errorf("want a local service on port 8080, got infra %q port %d", task.Resources.Infra, task.Service.Port)
	}
}
