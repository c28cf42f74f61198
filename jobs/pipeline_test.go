package jobs_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
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

// A controller killed after a pipeline's task succeeded and before its nodes were stopped left
// the job PENDING (the next task) with the ended gang still recorded: the next controller stops
// that gang and runs the next task.
func TestPipelineResumesAfterARestartBetweenTasks(t *testing.T) {
	e := newEnv(t)
	e.stop()
	p, err := configs.ParsePipeline("p.yaml", []byte("name: a\nrun: exec sleep 600\n---\nname: b\nrun: echo second\n"), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	id, err := e.store.CreateJob(jobs.Job{Name: "ab", Task: p.Tasks[1], Pipeline: p.Tasks, TaskIndex: 1, State: jobs.Pending,
		Reason: "task 1/2 (a): every node exited 0; task 2/2 waits for its turn", Attempt: 1, SubmittedAt: now, StateSince: now, Priority: 500})
	if err != nil {
		t.Fatal(err)
	}
	spec := launcher.Spec{Name: "ab-left", Run: "exec sleep 600", Job: &launcher.JobSpec{},
		Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelJob: strconv.FormatInt(id, 10), launcher.LabelAttempt: "1", launcher.LabelNodeRank: "0"}}
	left, err := e.prov.Launch(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	// The dead controller had recorded the first task's node.
	rec := jobs.Job{ID: id, Name: "ab", Task: p.Tasks[1], Pipeline: p.Tasks, TaskIndex: 1, State: jobs.Pending,
		Reason: "task 1/2 (a): every node exited 0; task 2/2 waits for its turn", Attempt: 1, SubmittedAt: now, StateSince: now, Priority: 500,
		Nodes: []jobs.Node{{Rank: 0, InstanceID: left.ID, Infra: "local"}}}
	if err := e.store.SaveJob(rec); err != nil {
		t.Fatal(err)
	}
	e.start()
	done := e.waitState(id, jobs.Succeeded)
	if done.TaskIndex != 1 || !strings.Contains(e.logOf(id, 0), "second") {
		t.Errorf("ended on task %d, log %q", done.TaskIndex, e.logOf(id, 0))
	}
	for _, in := range e.running(id) {
		t.Errorf("node %s still runs", in.ID)
	}
}
