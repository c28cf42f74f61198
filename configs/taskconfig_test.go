package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ncclEFA is SkyPilot's examples/aws_efa/nccl_efa.yaml, its run cut short: EFA devices for the
// pod through config.kubernetes.pod_config.
const ncclEFA = `# from skypilot-org/skypilot examples/aws_efa/nccl_efa.yaml (Apache 2.0), run shortened
name: nccl-efa-eks

resources:
  infra: k8s
  accelerators: A100:8
  cpus: 90+
  image_id: docker:public.ecr.aws/hpc-cloud/nccl-tests:latest

num_nodes: 2

envs:
  USE_EFA: "true"

run: |
  echo "rank $SKYPILOT_NODE_RANK"

config:
  kubernetes:
    pod_config:
      spec:
        containers:
        - resources:
            limits:
              vpc.amazonaws.com/efa: 4
            requests:
              vpc.amazonaws.com/efa: 4
`

func TestTaskConfigSkyPilotExamples(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want *TaskConfig
	}{
		"nccl_efa.yaml: EFA devices": {ncclEFA, &TaskConfig{Kubernetes: &KubernetesTaskConfig{PodConfig: map[string]any{
			"spec": map[string]any{"containers": []any{map[string]any{"resources": map[string]any{
				"limits":   map[string]any{"vpc.amazonaws.com/efa": int64(4)},
				"requests": map[string]any{"vpc.amazonaws.com/efa": int64(4)},
			}}}},
		}}}},
		"tolerations, volumes, a node selector, env and a provision timeout": {`run: x
config:
  kubernetes:
    provision_timeout: 900
    custom_metadata:
      labels: {team: ml}
      annotations: {owner: alice}
    pod_config:
      metadata:
        annotations: {sidecar.istio.io/inject: "false"}
      spec:
        nodeSelector: {node.kubernetes.io/instance-type: p4d.24xlarge}
        tolerations:
          - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        volumes:
          - name: dshm
            emptyDir: {medium: Memory}
        containers:
          - env:
              - {name: NCCL_DEBUG, value: INFO}
            volumeMounts:
              - {name: dshm, mountPath: /dev/shm}
            securityContext:
              capabilities: {add: [IPC_LOCK]}
`, &TaskConfig{Kubernetes: &KubernetesTaskConfig{
			ProvisionTimeoutSeconds: 900,
			CustomMetadata:          map[string]any{"labels": map[string]any{"team": "ml"}, "annotations": map[string]any{"owner": "alice"}},
			PodConfig: map[string]any{
				"metadata": map[string]any{"annotations": map[string]any{"sidecar.istio.io/inject": "false"}},
				"spec": map[string]any{
					"nodeSelector": map[string]any{"node.kubernetes.io/instance-type": "p4d.24xlarge"},
					"tolerations":  []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}},
					"volumes":      []any{map[string]any{"name": "dshm", "emptyDir": map[string]any{"medium": "Memory"}}},
					"containers": []any{map[string]any{
						"env":             []any{map[string]any{"name": "NCCL_DEBUG", "value": "INFO"}},
						"volumeMounts":    []any{map[string]any{"name": "dshm", "mountPath": "/dev/shm"}},
						"securityContext": map[string]any{"capabilities": map[string]any{"add": []any{"IPC_LOCK"}}},
					}},
				},
			},
		}}},
		"apiVersion and kind as SkyPilot's docs write them": {"run: x\nconfig:\n  kubernetes:\n    pod_config:\n      apiVersion: v1\n      kind: Pod\n      spec:\n        runtimeClassName: nvidia\n",
			&TaskConfig{Kubernetes: &KubernetesTaskConfig{PodConfig: map[string]any{"apiVersion": "v1", "kind": "Pod", "spec": map[string]any{"runtimeClassName": "nvidia"}}}}},
		"an empty section is none": {"run: x\nconfig:\n  kubernetes: {}\n", nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Config); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			// --dry-run shows it, and what it shows parses back to the same.
			again, out := reparse(t, task)
			if diff := cmp.Diff(task.Config, again.Config); diff != "" {
				t.Errorf("resolved YAML changed config (-first +again):\n%s\n%s", diff, out)
			}
		})
	}
}

// TestTaskConfigRefusedFieldByField: every key SkyPilot lets a task override that Ferry does
// not act on is refused by name, at its line and column, all in one pass.
func TestTaskConfigRefusedFieldByField(t *testing.T) {
	const yaml = `run: x
config:
  docker:
    run_options: [--cap-add=SYS_ADMIN]
  nvidia_gpus:
    disable_ecc: true
  kubernetes:
    dws: {enabled: true}
    kueue: {local_queue_name: lq}
    remote_identity: SERVICE_ACCOUNT
    networking: portforward
    pod_config:
      spec:
        restartPolicy: Always
        tolerationz: []
        containers:
          - image: ubuntu
            command: [sleep]
            resource: {}
      metadata:
        name: mine
        labels: {ferry.service: other}
      status: {}
  gcp:
    enable_gvnic: true
  ssh:
    pod_config: {}
  active_workspace: team-a
  hooks: []
  aws:
    vpc_name: x
`
	_, err := Parse("task.yaml", []byte(yaml), Overrides{})
	want := []wantErr{
		{4, 5, "config.docker.run_options", "SkyPilot's config.docker.run_options is not supported by Ferry"},
		{6, 5, "config.nvidia_gpus.disable_ecc", "does not change GPU settings"},
		{8, 5, "config.kubernetes.dws", "resources.capacity: {mode: queued}"},
		{9, 5, "config.kubernetes.kueue", "kubernetes.kueue_local_queue"},
		{10, 5, "config.kubernetes.remote_identity", "serviceAccountName"},
		{11, 5, "config.kubernetes.networking", `unknown field "networking": a task may override pod_config, custom_metadata, provision_timeout`},
		{14, 9, "config.kubernetes.pod_config.spec.restartPolicy", "never restart by themselves"},
		{15, 9, "config.kubernetes.pod_config.spec.tolerationz", `unknown field "tolerationz" of a PodSpec; did you mean "tolerations"?`},
		{17, 13, "config.kubernetes.pod_config.spec.containers[0].image", "write resources.image_id: docker:IMAGE"},
		{18, 13, "config.kubernetes.pod_config.spec.containers[0].command", "runs the task's setup and run"},
		{19, 13, "config.kubernetes.pod_config.spec.containers[0].resource", `did you mean "resources"?`},
		{21, 9, "config.kubernetes.pod_config.metadata.name", "Ferry names each pod itself"},
		{22, 18, "config.kubernetes.pod_config.metadata.labels.ferry.service", "Ferry's own"},
		{23, 7, "config.kubernetes.pod_config.status", `unknown field "status": pod_config is a Pod`},
		{25, 5, "config.gcp.enable_gvnic", "network interfaces"},
		{27, 5, "config.ssh.pod_config", "no SSH node pools"},
		{28, 3, "config.active_workspace", "no workspaces"},
		{29, 3, "config.hooks", "no lifecycle hooks"},
		{30, 3, "config.aws", `unknown field "aws"`},
	}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
	}
}

func TestTaskConfigValueErrors(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want wantErr
	}{
		"timeout not positive": {"run: x\nconfig:\n  kubernetes:\n    provision_timeout: 0\n",
			wantErr{4, 24, "config.kubernetes.provision_timeout", "must be at least 1"}},
		"timeout beyond a day": {"run: x\nconfig:\n  kubernetes:\n    provision_timeout: 100000\n",
			wantErr{4, 24, "config.kubernetes.provision_timeout", "at most 86400 seconds"}},
		"two containers": {"run: x\nconfig:\n  kubernetes:\n    pod_config:\n      spec:\n        containers: [{}, {}]\n",
			wantErr{6, 21, "config.kubernetes.pod_config.spec.containers", "expected one container, got 2"}},
		"kind other than Pod": {"run: x\nconfig:\n  kubernetes:\n    pod_config:\n      kind: Deployment\n",
			wantErr{5, 13, "config.kubernetes.pod_config.kind", `must be Pod, got "Deployment"`}},
		"config not a mapping": {"run: x\nconfig: [kubernetes]\n",
			wantErr{2, 9, "config", "expected a mapping, got a list"}},
		"custom_metadata name": {"run: x\nconfig:\n  kubernetes:\n    custom_metadata: {name: x}\n",
			wantErr{4, 23, "config.kubernetes.custom_metadata.name", "Ferry names each pod itself"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			want := []wantErr{tc.want}
			if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}
