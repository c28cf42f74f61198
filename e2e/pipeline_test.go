package e2e

import (
	"path/filepath"
	"strings"
	"testing"
)

// A pipeline, written as SkyPilot writes one (a header naming it, then one document per task),
// launched and streamed by `jobs launch`: the tasks run in order as one managed job, the second
// with two nodes and the first's checkpoint, each with its own SKYPILOT_TASK_ID; `jobs queue`
// shows which task the job is on.
func TestJobPipeline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := filepath.Join(t.TempDir(), "pipeline.yaml")
	writeFile(t, f, `name: train-eval
---
name: train
run: |
  echo "train: task $SKYPILOT_TASK_ID"
  echo weights-v1 > "$FERRY_CHECKPOINT_DIR/model"
---
name: eval
num_nodes: 2
run: |
  echo "eval: task $SKYPILOT_TASK_ID on $SKYPILOT_NUM_NODES nodes, model $(cat "$FERRY_CHECKPOINT_DIR/model")"
`)
	out := e.mustRun("jobs", "launch", f, "-y")
	for _, want := range []string{`Task 1/2 "train" of pipeline "train-eval"`, `Task 2/2 "eval"`,
		"train: task sky-managed-", "_train-eval_train_1-0", "eval: task sky-managed-", "_train-eval_eval_1-1 on 2 nodes, model weights-v1",
		"Managed job 1 finished (status: SUCCEEDED)"} {
		if !strings.Contains(out, want) {
			t.Errorf("jobs launch output lacks %q:\n%s", want, out)
		}
	}
	queue := e.mustRun("jobs", "queue", "--all")
	if !strings.Contains(queue, "2/2 eval") || !strings.Contains(queue, "train-eval") {
		t.Errorf("jobs queue does not show the pipeline's last task:\n%s", queue)
	}
	if _, stderr, err := e.run("serve", "up", f, "-y"); err == nil || !strings.Contains(stderr, "several tasks are a pipeline") {
		t.Errorf("serve up of a pipeline: %v\n%s", err, stderr)
	}
}
