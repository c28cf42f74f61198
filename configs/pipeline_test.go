package configs

import (
	"fmt"
	"strings"
	"testing"
)

func TestParsePipeline(t *testing.T) {
	const two = `name: train-eval
---
name: train
resources: {accelerators: L4:1}
run: python train.py
---
name: eval
envs: {SPLIT: test}
run: python eval.py
`
	p, err := ParsePipeline("p.yaml", []byte(two), Overrides{Envs: map[string]string{"SEED": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "train-eval" || len(p.Tasks) != 2 || p.Tasks[0].Name != "train" || p.Tasks[1].Name != "eval" {
		t.Fatalf("pipeline %q with tasks %d: %+v", p.Name, len(p.Tasks), p.Tasks)
	}
	if p.Tasks[0].Envs["SEED"] != "1" || p.Tasks[1].Envs["SEED"] != "1" || p.Tasks[1].Envs["SPLIT"] != "test" {
		t.Errorf("envs: %v %v", p.Tasks[0].Envs, p.Tasks[1].Envs)
	}

	// No header: the first task names it; -n replaces it.
	p, err = ParsePipeline("p.yaml", []byte("name: a\nrun: x\n---\nname: b\nrun: y\n"), Overrides{Name: "mine"})
	if err != nil || p.Name != "mine" || len(p.Tasks) != 2 || p.Tasks[0].Name != "a" {
		t.Fatalf("%v %+v", err, p)
	}

	// One task: as Parse gives it.
	p, err = ParsePipeline("p.yaml", []byte("name: one\nrun: x\n"), Overrides{})
	if err != nil || p.Name != "one" || len(p.Tasks) != 1 {
		t.Fatalf("%v %+v", err, p)
	}
}

func TestParsePipelineErrors(t *testing.T) {
	tests := map[string]struct{ yaml, want string }{
		"a service task": {"name: p\n---\nrun: x\n---\nrun: y\nservice: {readiness_probe: /, replicas: 1}\nresources: {ports: 8080}\n", "p.yaml:5:1: service: task 2 of 2 has a service section"},
		"an empty task":  {"run: x\n---\n---\nrun: y\n", "task 2 of 3 is an empty document"},
		"a bad field":    {"run: x\n---\nrun: y\nnum_nodes: zero\n", "p.yaml:4:12: num_nodes"},
		"a syntax error": {"run: x\n---\nrun: [y\n", "p.yaml:2: invalid YAML"},
		"a job group":    {"name: g\nexecution: parallel\n---\nrun: x\n", "a SkyPilot job group"},
		"not a mapping":  {"run: x\n---\n- a\n", "task 2 of 2: expected a mapping of task fields"},
	}
	for name, tt := range tests {
		_, err := ParsePipeline("p.yaml", []byte(tt.yaml), Overrides{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", name, err, tt.want)
		}
	}
}

// A job's gang shapes (an alternative's own num_nodes) read back from the resolved YAML as
// they were; at the top of resources, or in a service, num_nodes is refused.
func TestGangShapes(t *testing.T) {
	const job = `name: shapes
resources:
  objective: {minimize: cost_per_step}
  any_of:
    - {accelerators: V100:1, use_spot: true, num_nodes: 8}
    - {accelerators: V100:8}
run: train
`
	task, err := Parse("s.yaml", []byte(job), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if !task.Resources.HasShapes() || task.Resources.AnyOf[0].NumNodes != 8 || task.Resources.AnyOf[0].Objective.Nodes != 8 || task.Resources.AnyOf[1].Objective.Nodes != 1 {
		t.Fatalf("alternatives: %+v", task.Resources.AnyOf)
	}
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("resolved.yaml", out, Overrides{})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if back.Resources.AnyOf[0].NumNodes != 8 || back.Resources.AnyOf[1].NumNodes != 0 {
		t.Errorf("read back: %+v\n%s", back.Resources.AnyOf, out)
	}
	for name, tt := range map[string]struct{ yaml, want string }{
		"top":     {"resources: {num_nodes: 2}\nrun: x\n", "s.yaml:1:13: resources.num_nodes: num_nodes is the task's"},
		"service": {"resources: {ports: 8080, any_of: [{num_nodes: 2}]}\nservice: {readiness_probe: /, replicas: 1}\nrun: x\n", "a service's replicas have the task's num_nodes"},
		"zero":    {"resources: {any_of: [{num_nodes: 0}]}\nrun: x\n", "num_nodes"},
	} {
		if _, err := Parse("s.yaml", []byte(tt.yaml), Overrides{}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", name, err, tt.want)
		}
	}
}

// A pipeline's name is held to a task's rules, whether from its header or from -n.
func TestPipelineName(t *testing.T) {
	two := "name: %s\n---\nrun: a\n---\nrun: b\n"
	p, err := ParsePipeline("p.yaml", []byte(fmt.Sprintf(two, "My_Pipe")), Overrides{})
	if err != nil || p.Name != "my-pipe" {
		t.Errorf("SkyPilot's spelling: %v %+v, want the name made a hostname, as a task's", err, p)
	}
	if _, err := ParsePipeline("p.yaml", []byte(fmt.Sprintf(two, "pipe")), Overrides{Name: "Bad Name!"}); err == nil || !strings.Contains(err.Error(), "(given on the command line)") {
		t.Errorf("-n with a bad name: %v", err)
	}
	if _, err := ParsePipeline("p.yaml", []byte("---\n---\nrun: a\n"), Overrides{}); err == nil {
		t.Error("an empty first document passed")
	}
}
