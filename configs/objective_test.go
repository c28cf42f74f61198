package configs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseObjective(t *testing.T) {
	base := "run: x\nservice:\n  readiness_probe: /\n  replicas: 1\nresources:\n  ports: 8080\n"
	tests := map[string]struct {
		yaml    string
		want    Objective
		wantErr string
	}{
		"name":              {yaml: "  objective: cost_per_token\n", want: Objective{Minimize: ObjectiveCostPerToken, Nodes: 1}},
		"mapping":           {yaml: "  objective: {minimize: cost_per_step, checkpoint_minutes: 10, restart_minutes: 5, model_size: 70B}\n", want: Objective{Minimize: ObjectiveCostPerStep, CheckpointMinutes: 10, RestartMinutes: 5, ModelSizeB: 70, Nodes: 1}},
		"unknown":           {yaml: "  objective: cost_per_tokens\n", wantErr: "7:14: resources.objective: unknown objective \"cost_per_tokens\""},
		"no minimize":       {yaml: "  objective: {model_size: 8B}\n", wantErr: "resources.objective.minimize: required"},
		"bad size":          {yaml: "  objective: {minimize: cost_per_token, model_size: huge}\n", wantErr: "resources.objective.model_size: expected a model size"},
		"in an alternative": {yaml: "  any_of:\n    - objective: cost_per_step\n", wantErr: "resources.any_of[0].objective: objective applies to every alternative"},
		// A per-work objective prices interruptions, so a service may mix spot and on-demand.
		"mixed spot with objective": {yaml: "  objective: cost_per_token\n  any_of:\n    - {use_spot: true, accelerators: A10G:1}\n    - {accelerators: A100:1}\n",
			want: Objective{Minimize: ObjectiveCostPerToken, Nodes: 1}},
		"mixed spot without objective": {yaml: "  any_of:\n    - {use_spot: true, accelerators: A10G:1}\n    - {accelerators: A100:1}\n",
			wantErr: "all candidates of a service must agree on use_spot"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("t.yaml", []byte(base+tc.yaml), Overrides{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Resources.Objective); diff != "" {
				t.Errorf("objective (-want +got):\n%s", diff)
			}
			for _, alt := range task.Resources.AnyOf {
				if alt.Objective != tc.want {
					t.Errorf("alternative objective %+v: want the top's", alt.Objective)
				}
			}
		})
	}
}

// The resolved YAML serve up prints names the objective, and reads back to the same one.
func TestObjectiveResolvedYAMLRoundTrips(t *testing.T) {
	src := "run: x\nnum_nodes: 2\nresources:\n  objective: {minimize: cost_per_step, checkpoint_minutes: 10, model_size: 70B}\n  accelerators: A100:1\n"
	task, err := Parse("t.yaml", []byte(src), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "objective:") || !strings.Contains(string(out), "model_size: 70B") {
		t.Fatalf("resolved YAML lacks the objective:\n%s", out)
	}
	again, err := Parse("resolved.yaml", out, Overrides{})
	if err != nil {
		t.Fatalf("resolved YAML does not parse: %v\n%s", err, out)
	}
	want := Objective{Minimize: ObjectiveCostPerStep, CheckpointMinutes: 10, ModelSizeB: 70, Nodes: 2}
	if diff := cmp.Diff(want, again.Resources.Objective); diff != "" {
		t.Errorf("objective after a round trip (-want +got):\n%s", diff)
	}
}
