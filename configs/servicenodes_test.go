package configs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// deepseekR1 is SkyPilot's llm/deepseek-r1/deepseek-r1-671B.yaml (Apache 2.0), as it is: a
// service whose replicas are 2-node gangs serving DeepSeek-R1 with SGLang over 16 GPUs.
const deepseekR1 = `name: deepseek-r1

resources:
  accelerators: {H200:8, H100:8, A100-80GB:8}
  disk_size: 1024 # Large disk for model weights
  disk_tier: best
  ports: 30000
  any_of:
    - use_spot: true
    - use_spot: false

num_nodes: 2 # Specify number of nodes to launch

setup: |
  # Install sglang with all dependencies using uv
  uv pip install "sglang[all]==0.4.2.post4" --find-links https://flashinfer.ai/whl/cu124/torch2.5/flashinfer

  # Set up shared memory for better performance
  sudo bash -c "echo 'vm.max_map_count=655300' >> /etc/sysctl.conf"
  sudo sysctl -p

run: |
  # Launch the server with appropriate configuration
  MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  # TP should be number of GPUs per node times number of nodes
  TP=$(($SKYPILOT_NUM_GPUS_PER_NODE * $SKYPILOT_NUM_NODES))

  python -m sglang.launch_server \
    --model deepseek-ai/DeepSeek-R1 \
    --tp $TP \
    --dist-init-addr ${MASTER_ADDR}:5000 \
    --nnodes ${SKYPILOT_NUM_NODES} \
    --node-rank ${SKYPILOT_NODE_RANK} \
    --trust-remote-code \
    --enable-dp-attention \
    --enable-torch-compile \
    --torch-compile-max-bs 8 \
    --host 0.0.0.0 \
    --port 30000

# Optional: Service configuration for SkyServe deployment
# This will be ignored when deploying with ` + "`sky launch`" + `
service:
  # Specifying the path to the endpoint to check the readiness of the service.
  readiness_probe:
    path: /health
    # Allow up to 1 hour for cold start
    initial_delay_seconds: 3600
  # Autoscaling from 0 to 2 replicas
  replica_policy:
    min_replicas: 0
    max_replicas: 2
`

// TestServiceWithSeveralNodes: SkyPilot's multi-node service parses as a service whose
// replicas are gangs of num_nodes, each serving on the head's port. The file as it is meets no
// rule about num_nodes; its any_of mixing spot and on-demand is another rule's (a service's
// candidates must agree on use_spot), so the rest is checked without those lines.
func TestServiceWithSeveralNodes(t *testing.T) {
	_, err := Parse("deepseek-r1-671B.yaml", []byte(deepseekR1), Overrides{})
	for _, e := range Errors(err) {
		if e.Field == "num_nodes" || strings.Contains(e.Msg, "num_nodes") {
			t.Errorf("SkyPilot's multi-node service refused for its nodes: %v", e)
		}
	}
	const mixed = "  any_of:\n    - use_spot: true\n    - use_spot: false\n"
	if !strings.Contains(deepseekR1, mixed) {
		t.Fatal("the example's any_of lines moved")
	}
	task, err := Parse("deepseek-r1-671B.yaml", []byte(strings.Replace(deepseekR1, mixed, "", 1)), Overrides{})
	if err != nil {
		t.Fatalf("SkyPilot's multi-node service refused: %v", err)
	}
	if task.Service == nil || task.Job != nil {
		t.Fatalf("not a service: service %v, job %v", task.Service, task.Job)
	}
	if task.NumNodes != 2 || task.Service.Port != 30000 || task.Service.ReadinessProbe.Path != "/health" {
		t.Errorf("num_nodes %d, port %d, probe %q; want 2, 30000, /health", task.NumNodes, task.Service.Port, task.Service.ReadinessProbe.Path)
	}
}

// TestServiceGangOnAWSIsBounded: a replica's gang that can only go to AWS is at most 16 nodes,
// as a job's is, and says so at parse time; with another infra allowed, it is left to the
// optimizer.
func TestServiceGangOnAWSIsBounded(t *testing.T) {
	const svc = "num_nodes: 17\nresources:\n  infra: aws\n  ports: 8080\nrun: serve\nservice:\n  replicas: 1\n"
	_, err := Parse("svc.yaml", []byte(svc), Overrides{})
	want := []wantErr{{1, 12, "num_nodes", "a replica's gang on AWS is at most 16 nodes (got 17)"}}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
	}
	other := strings.Replace(svc, "infra: aws", "any_of: [{infra: aws}, {infra: gcp}]", 1)
	if _, err := Parse("svc.yaml", []byte(other), Overrides{}); err != nil {
		t.Errorf("any_of with gcp: %v", err)
	}
	if _, err := Parse("svc.yaml", []byte(strings.Replace(svc, "17", "16", 1)), Overrides{}); err != nil {
		t.Errorf("16 nodes on AWS: %v", err)
	}
}
