package e2e

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Issue 25: a task that names no infra is planned over every enabled infra. With both fake
// clouds enabled and no GPU on this machine, a T4 task plans on a cloud, never on local.
func TestDryRunWithoutInfraPlansEveryInfra(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = append(e.extraEnv, awsEnv...)
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	file := filepath.Join(t.TempDir(), "t4.yaml")
	writeFile(t, file, `name: t4
resources:
  accelerators: T4:1
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: ferry replica-sim --model ferry-sim-1b
`)
	plan := e.mustRun("serve", "up", file, "--dry-run")
	if regexp.MustCompile(`(?m)^local\s`).MatchString(plan) {
		t.Errorf("a T4 task was planned on local, which has no GPUs:\n%s", plan)
	}
	if !regexp.MustCompile(`(?m)^(aws|gcp)\s+\S+\s.*T4:1.*\$ [0-9.]+\s+✔`).MatchString(plan) {
		t.Errorf("the chosen row is not a priced cloud T4:\n%s", plan)
	}

	// A per-token objective may mix spot and on-demand, and the plan says why the winner won.
	mixed := filepath.Join(t.TempDir(), "mixed.yaml")
	writeFile(t, mixed, `name: mixed
resources:
  objective: cost_per_token
  any_of:
    - {infra: gcp, accelerators: L4:1, use_spot: true}
    - {infra: gcp, accelerators: A100:1}
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: ferry replica-sim --model ferry-sim-1b
`)
	plan = e.mustRun("serve", "up", mixed, "--dry-run")
	for _, want := range []string{"COST_PER_TOKEN ($/M tokens)", "Objective cost_per_token ($/M tokens): chose "} {
		if !strings.Contains(plan, want) {
			t.Errorf("plan lacks %q:\n%s", want, plan)
		}
	}
}
