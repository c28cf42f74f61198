package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// efaVM is SkyPilot's examples/aws_efa/efa_vm.yaml, its run cut short.
const efaVM = `# from skypilot-org/skypilot examples/aws_efa/efa_vm.yaml (Apache 2.0), run shortened
name: nccl-efa-vm

resources:
  infra: aws
  instance_type: p4d.24xlarge
  network_tier: best

num_nodes: 2

run: |
  echo "rank $SKYPILOT_NODE_RANK"
`

func TestNetworkTier(t *testing.T) {
	task, err := Parse("efa_vm.yaml", []byte(efaVM), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if task.Resources.NetworkTier != NetworkTierBest {
		t.Errorf("network_tier = %q, want best", task.Resources.NetworkTier)
	}
	// Every alternative inherits it.
	task, err = Parse("t.yaml", []byte("run: x\nresources:\n  network_tier: BEST\n  any_of: [{infra: aws}, {infra: gcp}]\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range task.Resources.Candidates() {
		if c.NetworkTier != NetworkTierBest {
			t.Errorf("candidate %d: network_tier %q", i, c.NetworkTier)
		}
	}
	again, out := reparse(t, task)
	if diff := cmp.Diff(task.Resources, again.Resources); diff != "" {
		t.Errorf("resolved YAML changed resources (-first +again):\n%s\n%s", diff, out)
	}
}

func TestNetworkTierErrors(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want wantErr
	}{
		"unknown tier": {"run: x\nresources:\n  network_tier: fast\n", wantErr{3, 17, "resources.network_tier", `unknown network tier "fast"; did you mean "best"?`}},
		"in an alternative": {"run: x\nresources:\n  any_of:\n    - {infra: aws, network_tier: best}\n",
			wantErr{4, 20, "resources.any_of[0].network_tier", "applies to every node of the task"}},
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
