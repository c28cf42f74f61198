package e2e

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// shapesJob offers two gang shapes for the same work: eight 1-GPU spot nodes or one 8-GPU
// on-demand node, ranked per step of work.
const shapesJob = `name: shapes
resources:
  infra: aws/us-east-1
  objective: {minimize: cost_per_step}
  any_of:
    - {accelerators: V100:1, use_spot: true, num_nodes: 8}
    - {accelerators: V100:8}
run: ferry train-sim --steps 10
`

// A job offering gang shapes is planned by what each whole gang costs per step, counting the
// spot gang's expected interruptions from the preemption history in use: on a calm history the
// eight spot nodes win, on a volatile one the single on-demand node does. And a shape is
// launched as a gang of its own size: an alternative of two local nodes runs two, with
// SkyPilot's variables saying so.
func TestJobGangShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clouds := startFakeClouds(t)
	e.extraEnv = append(e.extraEnv, awsEnv...)
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	dir := t.TempDir()
	f := filepath.Join(dir, "shapes.yaml")
	writeFile(t, f, shapesJob)
	history := func(name string, interruptions int) string {
		p := filepath.Join(dir, name+".csv")
		writeFile(t, p, "cloud,region,zone,traced,instance_hours,interruptions,trace\n"+
			"aws,us-east-1,us-east-1a,v100_1,1000,"+strconv.Itoa(interruptions)+",our fleet\n")
		return p
	}
	chosen := func(csv string) string {
		t.Helper()
		c := e.cmd("jobs", "launch", f, "--dry-run")
		c.Env = append(c.Env, "FERRY_SPOT_INTERRUPTIONS="+csv)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("dry run: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "Objective cost_per_step") {
				return line
			}
		}
		t.Fatalf("no objective line in:\n%s", out)
		return ""
	}
	if got := chosen(history("calm", 20)); !strings.Contains(got, "chose 8× V100:1 p3.2xlarge[Spot]") {
		t.Errorf("on a calm history (0.02/h): %s\nwant the eight spot nodes", got)
	}
	if got := chosen(history("volatile", 600)); !strings.Contains(got, "chose V100:8 p3.16xlarge on aws") {
		t.Errorf("on a volatile history (0.6/h): %s\nwant the on-demand node", got)
	}

	// A shape of its own size, launched.
	local := filepath.Join(dir, "local.yaml")
	writeFile(t, local, `name: pair
resources:
  any_of:
    - {infra: local, num_nodes: 2}
run: echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"
`)
	out := e.mustRun("jobs", "launch", local, "-y")
	if !strings.Contains(out, "rank 0 of 2") || !strings.Contains(out, "finished (status: SUCCEEDED)") {
		t.Errorf("jobs launch of a 2-node shape:\n%s", out)
	}
	var list []struct {
		GangSize int `json:"gang_size"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("jobs", "queue", "--all", "--json")), &list); err != nil || len(list) != 1 || list[0].GangSize != 2 {
		t.Errorf("gang size: %+v %v, want 2", list, err)
	}
}
