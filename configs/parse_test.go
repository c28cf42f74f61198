package configs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func writeFile(path, content string) error {
	return os.WriteFile(path, []byte(content), 0o600)
}

// defaultService is what a service section with only a port resolves to.
func defaultService(port int) *Service {
	return &Service{
		ReadinessProbe:      Probe{Path: "/", InitialDelaySeconds: 1200, TimeoutSeconds: 15},
		FixedReplicas:       true,
		ReplicaPolicy:       ReplicaPolicy{MinReplicas: 1, MaxReplicas: 1, UpscaleDelaySeconds: 300, DownscaleDelaySeconds: 1200},
		Port:                port,
		LoadBalancingPolicy: PolicyLeastTTFT,
		Update:              DefaultUpdate(),
	}
}

// local is what a task without infra resolves to: no infra, which the optimizer reads as
// every enabled infra (local where it fits).
func local() Resources {
	return Resources{}
}

func TestParse(t *testing.T) {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		yaml string
		ov   Overrides
		want *Task
	}{
		"job with defaults": {
			yaml: "run: echo hi\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "echo hi"},
		},
		"service defaults": {
			yaml: "run: serve\nservice:\n  ports: 8080\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "serve", Service: defaultService(8080)},
		},
		"service port from the single resources port": {
			yaml: "run: serve\nresources:\n  ports: \"9000\"\nservice:\n  readiness_probe: /health\n",
			want: &Task{NumNodes: 1, Run: "serve",
				Resources: Resources{Ports: []int{9000}},
				Service: func() *Service {
					s := defaultService(9000)
					s.ReadinessProbe.Path = "/health"
					return s
				}()},
		},
		"fixed replicas, including zero": {
			yaml: "run: serve\nservice:\n  ports: 8080\n  replicas: 0\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "serve", Service: func() *Service {
				s := defaultService(8080)
				s.ReplicaPolicy.MinReplicas, s.ReplicaPolicy.MaxReplicas = 0, 0
				return s
			}()},
		},
		"replica policy defaults max to min": {
			yaml: "run: serve\nservice:\n  ports: 8080\n  replica_policy:\n    min_replicas: 2\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "serve", Service: func() *Service {
				s := defaultService(8080)
				s.FixedReplicas = false
				s.ReplicaPolicy.MinReplicas, s.ReplicaPolicy.MaxReplicas = 2, 2
				return s
			}()},
		},
		"full spot autoscaling service": {
			yaml: `name: chat
workdir: ./app
resources:
  infra: AWS/us-east-1
  accelerators: {A100: 1, L4: 2}
  cpus: 8+
  memory: 32
  use_spot: yes
  ports: [8000]
  image_id: docker:vllm/vllm-openai:latest
  disk_size: 256
envs:
  PORT: 8000
  DEBUG: true
  RATIO: 0.5
file_mounts:
  /data: s3://bucket/data
setup: pip install vllm
run: |
  vllm serve x
service:
  readiness_probe:
    path: /v1/models
    initial_delay_seconds: 0
    timeout_seconds: 3
    headers:
      X-Probe: "1"
  replica_policy:
    min_replicas: 0
    max_replicas: 10
    target_qps_per_replica: {A100: 8, L4: 2.5}
    num_overprovision: 1
    upscale_delay_seconds: 60
    downscale_delay_seconds: 0
    base_ondemand_fallback_replicas: 1
    dynamic_ondemand_fallback: true
    spot_placer: dynamic_fallback
  load_balancing_policy: instance_aware_least_load
  tls:
    keyfile: ~/certs/key.pem
    certfile: /etc/cert.pem
  update:
    mode: blue_green
    max_parallel: 2
    min_healthy_seconds: 0
    progress_deadline_seconds: 600
    auto_rollback: false
  health_check:
    path: /ping
    interval_seconds: 0.25
    timeout_seconds: 2
`,
			want: &Task{
				Name: "chat", Workdir: "./app", NumNodes: 1,
				Resources: Resources{
					Infra: "aws/us-east-1", Cloud: "aws", Region: "us-east-1",
					Accelerators: []Accelerator{{"A100", 1}, {"L4", 2}},
					CPUs:         "8+", Memory: "32", UseSpot: true, Ports: []int{8000},
					ImageID: "docker:vllm/vllm-openai:latest", DiskSize: 256,
				},
				Envs:       map[string]string{"PORT": "8000", "DEBUG": "true", "RATIO": "0.5"},
				FileMounts: map[string]string{"/data": "s3://bucket/data"},
				Setup:      "pip install vllm",
				Run:        "vllm serve x\n",
				Service: &Service{
					ReadinessProbe: Probe{Path: "/v1/models", InitialDelaySeconds: 0, TimeoutSeconds: 3, Headers: map[string]string{"X-Probe": "1"}},
					ReplicaPolicy: ReplicaPolicy{
						MinReplicas: 0, MaxReplicas: 10, Autoscaler: AutoscalerRequestRate,
						TargetQPSPerAccelerator: map[string]float64{"A100": 8, "L4": 2.5},
						NumOverprovision:        1, NumOverprovisionSet: true, UpscaleDelaySeconds: 60, DownscaleDelaySeconds: 0,
						BaseOndemandFallbackReplicas: 1, DynamicOndemandFallback: true, SpotPlacer: "dynamic_fallback",
					},
					Port:                8000,
					LoadBalancingPolicy: PolicyInstanceAwareLeastLoad,
					TLS:                 &TLS{KeyFile: filepath.Join(home, "certs/key.pem"), CertFile: "/etc/cert.pem"},
					Update:              Update{Mode: UpdateBlueGreen, MaxParallel: 2, ProgressDeadlineSeconds: 600},
					HealthCheck:         &HealthCheck{Path: "/ping", IntervalSeconds: 0.25, TimeoutSeconds: 2},
				},
			},
		},
		"any_of alternatives inherit top-level fields": {
			yaml: `run: serve
resources:
  ports: 8000
  use_spot: true
  cpus: 4
  any_of:
    - infra: aws/us-west-2/us-west-2b
      accelerators: A10G
    - infra: k8s/my-ctx
      cpus: 16
    - accelerators: ["H100:0.5"]
service:
  replicas: 2
`,
			want: &Task{NumNodes: 1, Run: "serve",
				Resources: Resources{
					CPUs: "4", UseSpot: true, Ports: []int{8000},
					AnyOf: []Resources{
						{Infra: "aws/us-west-2/us-west-2b", Cloud: "aws", Region: "us-west-2", Zone: "us-west-2b",
							Accelerators: []Accelerator{{"A10G", 1}}, CPUs: "4", UseSpot: true, Ports: []int{8000}},
						{Infra: "kubernetes/my-ctx", Cloud: "kubernetes", Region: "my-ctx", CPUs: "16", UseSpot: true, Ports: []int{8000}},
						{Infra: "*", Accelerators: []Accelerator{{"H100", 0.5}}, CPUs: "4", UseSpot: true, Ports: []int{8000}},
					},
				},
				Service: func() *Service {
					s := defaultService(8000)
					s.ReplicaPolicy.MinReplicas, s.ReplicaPolicy.MaxReplicas = 2, 2
					return s
				}(),
			},
		},
		"ordered alternatives leave infra to the optimizer when nothing sets it": {
			yaml: "run: x\nresources:\n  ordered:\n    - accelerators: L4\n    - cpus: 2\n",
			want: &Task{NumNodes: 1, Run: "x",
				Resources: Resources{Ordered: []Resources{
					{Accelerators: []Accelerator{{"L4", 1}}},
					{CPUs: "2"},
				}},
			},
		},
		"a job's candidates may mix spot and on-demand": {
			yaml: "run: x\nresources:\n  any_of: [{use_spot: true}, {infra: aws}]\n",
			want: &Task{NumNodes: 1, Run: "x", Resources: Resources{AnyOf: []Resources{
				{Infra: "*", UseSpot: true},
				{Infra: "aws", Cloud: "aws"},
			}}},
		},
		"legacy cloud, region and zone": {
			yaml: "run: x\nresources:\n  cloud: GCP\n  zone: us-central1-a\n",
			want: &Task{NumNodes: 1, Run: "x",
				Resources: Resources{Infra: "gcp/us-central1/us-central1-a", Cloud: "gcp", Region: "us-central1", Zone: "us-central1-a"}},
		},
		"accelerator list and port range": {
			yaml: "run: x\nresources:\n  infra: '*'\n  accelerators: [A100:8, tpu-v5e-8]\n  ports: [\"8000-8002\", 8001, 9000]\n",
			// A list is SkyPilot's order of preference: one ordered alternative per accelerator.
			want: &Task{NumNodes: 1, Run: "x",
				Resources: Resources{Infra: "*", Accelerators: []Accelerator{{"A100", 8}, {"tpu-v5e-8", 1}}, Ports: []int{8000, 8001, 8002, 9000},
					Ordered: []Resources{
						{Infra: "*", Accelerators: []Accelerator{{"A100", 8}}, Ports: []int{8000, 8001, 8002, 9000}},
						{Infra: "*", Accelerators: []Accelerator{{"tpu-v5e-8", 1}}, Ports: []int{8000, 8001, 8002, 9000}},
					}}},
		},
		"overrides add and replace envs, secrets and name": {
			yaml: "name: a\nrun: x\nenvs:\n  A: \"1\"\n  B: \"2\"\nsecrets:\n  TOKEN:\n",
			ov: Overrides{Name: "b", Envs: map[string]string{"B": "two", "C": "3"},
				Secrets: map[string]string{"TOKEN": "t0k", "EXTRA": "e"}},
			want: &Task{Name: "b", NumNodes: 1, Resources: local(), Run: "x",
				Envs:    map[string]string{"A": "1", "B": "two", "C": "3"},
				Secrets: map[string]string{"TOKEN": "t0k", "EXTRA": "e"}},
		},
		"override fills a null env": {
			yaml: "run: x\nenvs:\n  MODEL:\n",
			ov:   Overrides{Envs: map[string]string{"MODEL": "m"}},
			want: &Task{NumNodes: 1, Resources: local(), Run: "x", Envs: map[string]string{"MODEL": "m"}},
		},
		"post_data mapping is encoded as JSON in order": {
			yaml: "run: x\nservice:\n  ports: 1\n  readiness_probe:\n    post_data:\n      model: m\n      messages: [{role: user, content: \"<hi> & bye\"}]\n      max_tokens: 1\n      stream: false\n      temperature: 0.5\n      stop: null\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "x", Service: func() *Service {
				s := defaultService(1)
				s.ReadinessProbe.PostData = `{"model":"m","messages":[{"role":"user","content":"<hi> & bye"}],"max_tokens":1,"stream":false,"temperature":0.5,"stop":null}`
				return s
			}()},
		},
		"post_data JSON string is kept as written": {
			yaml: "run: x\nservice:\n  ports: 1\n  readiness_probe:\n    post_data: '{\"prompt\": \"hi\"}'\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "x", Service: func() *Service {
				s := defaultService(1)
				s.ReadinessProbe.PostData = `{"prompt": "hi"}`
				return s
			}()},
		},
		"post_data plain string is encoded": {
			yaml: "run: x\nservice:\n  ports: 1\n  readiness_probe:\n    post_data: hello\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "x", Service: func() *Service {
				s := defaultService(1)
				s.ReadinessProbe.PostData = `"hello"`
				return s
			}()},
		},
		"anchors, aliases and merge keys": {
			yaml: `base: &base
  ports: 8000
  use_spot: true
run: x
resources:
  <<: *base
  use_spot: false
`,
			want: nil, // "base" is not a task field; see the next case
		},
		"merge keys inside resources": {
			yaml: `resources:
  any_of:
    - &aws {infra: aws, ports: 8000}
    - <<: *aws
      infra: gcp
run: x
`,
			want: &Task{NumNodes: 1, Run: "x", Resources: Resources{AnyOf: []Resources{
				{Infra: "aws", Cloud: "aws", Ports: []int{8000}},
				{Infra: "gcp", Cloud: "gcp", Ports: []int{8000}},
			}}},
		},
		"null values are treated as absent": {
			yaml: "run: x\nsetup:\nresources:\n  cpus: ~\nservice:\n  ports: 80\n  readiness_probe:\n  replica_policy:\n",
			want: &Task{NumNodes: 1, Resources: local(), Run: "x", Service: defaultService(80)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse("task.yaml", []byte(tc.yaml), tc.ov)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("Parse succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tc.want.Source = "task.yaml"
			if tc.want.Service == nil && tc.want.Job == nil {
				j := DefaultJob() // a task without service: is a job
				tc.want.Job = &j
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("task mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseDoesNotShareSlicesBetweenAlternatives(t *testing.T) {
	task, err := Parse("t", []byte("run: x\nresources:\n  ports: [1, 2]\n  accelerators: A100\n  any_of: [{cpus: 1}, {cpus: 2}]\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	task.Resources.AnyOf[0].Ports[0] = 99
	task.Resources.AnyOf[0].Accelerators[0].Name = "X"
	if task.Resources.Ports[0] != 1 || task.Resources.AnyOf[1].Ports[0] != 1 || task.Resources.AnyOf[1].Accelerators[0].Name != "A100" {
		t.Errorf("alternatives share slices: %+v", task.Resources)
	}
}
