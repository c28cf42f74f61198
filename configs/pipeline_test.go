package configs

import (
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
