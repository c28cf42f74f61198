package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

func TestPlanNotes(t *testing.T) {
	infras := []optimizer.Infra{{Name: "aws", Kind: optimizer.Cloud}, {Name: "kubernetes/lab", Kind: optimizer.Kubernetes,
		Offerings: []launcher.Offering{{VCPUs: 96, MemoryGiB: 512, Total: -1, Free: -1}, {Accelerator: "A100", AcceleratorCount: 8, VCPUs: 96, MemoryGiB: 512, Total: 8, Free: 8}}}}
	cases := map[string]struct {
		yaml    string
		want    []string
		wantErr bool
	}{
		// SkyPilot's examples/aws_efa/efa_vm.yaml's resources.
		"network_tier: best": {"run: x\nresources:\n  infra: aws\n  instance_type: p4d.24xlarge\n  network_tier: best\n",
			[]string{"Note: network_tier: best: 9 of 9 placements have high-bandwidth networking", "aws p4d.24xlarge (EFA, 400 Gbps)"}, false},
		"pod_config on a cluster": {"run: x\nresources: {accelerators: A100:8}\nconfig:\n  kubernetes:\n    provision_timeout: 300\n    pod_config: {spec: {containers: [{resources: {limits: {vpc.amazonaws.com/efa: 4}}}]}}\n",
			[]string{"config.kubernetes: pod_config is merged into each pod; a pod unschedulable for 300s moves"}, false},
		"pod_config with nowhere to go": {"run: x\nresources: {infra: aws, accelerators: A100:8}\nconfig:\n  kubernetes:\n    pod_config: {spec: {hostNetwork: true}}\n",
			[]string{"no placement above is on Kubernetes: it changes nothing here"}, false},
		"pod_config that makes no pod": {"run: x\nresources: {accelerators: A100:8}\nconfig:\n  kubernetes:\n    pod_config: {spec: {tolerations: everything}}\n", nil, true},
		"git workdir": {"run: x\nresources: {accelerators: A100:8}\nworkdir: {url: 'https://github.com/o/r.git', ref: v1}\n",
			[]string{"workdir: https://github.com/o/r.git@v1 is cloned on each node before setup"}, false},
		"elastic job": {"run: x\nnum_nodes: 8\nresources:\n  accelerators: A100:8\n  job_recovery: {strategy: DYNAMIC_NODE_SET, min_nodes: 4}\n",
			[]string{"as many of its 8 nodes as can be placed together, at least 4"}, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			task, err := configs.Parse("task.yaml", []byte(tc.yaml), configs.Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			cands, err := optimizer.Plan(task.Resources, infras)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err = printPlanNotes(&out, task, cands)
			if tc.wantErr {
				if !errors.Is(err, launcher.ErrInvalid) {
					t.Fatalf("err = %v, want the pod_config's ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("notes lack %q:\n%s", w, out.String())
				}
			}
		})
	}
}
