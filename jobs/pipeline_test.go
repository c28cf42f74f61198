package jobs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
)

func (e *env) submitPipeline(yaml string) jobs.Job {
	e.t.Helper()
	p, err := configs.ParsePipeline("pipeline.yaml", []byte(yaml), configs.Overrides{})
	if err != nil {
		e.t.Fatal(err)
	}
	j, err := e.m.SubmitPipeline(p)
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

// TestPipelineRunsTasksInOrder: a pipeline's tasks run one after the other as one job, each
// with its own SKYPILOT_TASK_ID (SkyPilot's managed form with the task's name and index) and
// its own nodes; the second starts only after the first succeeded, and sees what it left in
// the job's checkpoint storage.
func TestPipelineRunsTasksInOrder(t *testing.T) {
	e := newEnv(t)
	j := e.submitPipeline(`name: train-eval
---
name: train
run: |
  echo "train as $SKYPILOT_TASK_ID"
  echo weights > "$FERRY_CHECKPOINT_DIR/model"
---
name: eval
num_nodes: 2
run: |
  echo "eval as $SKYPILOT_TASK_ID, rank $SKYPILOT_NODE_RANK, found $(cat "$FERRY_CHECKPOINT_DIR/model")"
`)
	if j.TaskIndex != 0 || len(j.Pipeline) != 2 || j.Task.Name != "train" || !strings.HasSuffix(j.TaskID, "_train-eval_train_1-0") {
		t.Fatalf("submitted: task %d of %d (%s), task id %s", j.TaskIndex, len(j.Pipeline), j.Task.Name, j.TaskID)
	}
	done := e.waitState(j.ID, jobs.Succeeded)
	if done.TaskIndex != 1 || done.Task.Name != "eval" || !strings.HasSuffix(done.TaskID, "_train-eval_eval_1-1") {
		t.Errorf("ended on task %d (%s), task id %s: want the second", done.TaskIndex, done.Task.Name, done.TaskID)
	}
	if !strings.HasPrefix(done.Reason, "task 2/2 (eval): every node exited 0") {
		t.Errorf("reason %q", done.Reason)
	}
	if got := e.logOf(j.ID, 1); !strings.Contains(got, "eval as "+done.TaskID+", rank 1, found weights") {
		t.Errorf("the second task's node 1 printed %q", got)
	}
	first, err := os.ReadFile(e.m.LogFile(j.ID, 1, 0))
	if err != nil || !strings.Contains(string(first), "train as "+strings.TrimSuffix(done.TaskID, "_eval_1-1")+"_train_1-0") {
		t.Errorf("the first task's log: %q %v", first, err)
	}
}

// TestPipelineStopsAtAFailedTask: a task that fails fails the job, and the tasks after it
// never run.
func TestPipelineStopsAtAFailedTask(t *testing.T) {
	e := newEnv(t)
	mark := filepath.Join(t.TempDir(), "ran")
	j := e.submitPipeline("name: a\nrun: exit 3\n---\nname: b\nrun: touch " + mark + "\n")
	failed := e.waitState(j.ID, jobs.Failed)
	if failed.TaskIndex != 0 || !strings.Contains(failed.Reason, "task 1/2 (a): node 0 exited with status 3") {
		t.Errorf("failed on task %d: %q", failed.TaskIndex, failed.Reason)
	}
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Errorf("the task after the failed one ran: %v", err)
	}
}
