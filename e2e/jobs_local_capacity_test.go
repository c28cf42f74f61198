package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// localGPUJob is a 1-node train-sim job asking for the L4 this machine declares; no infra, so
// the planner picks local for it.
const localGPUJob = `name: %s
resources:
  accelerators: L4:1
job: {priority: %d, preemptible: %t, grace_period_seconds: 10}
run: ferry train-sim --master-port 8008 --steps=%d --step-time=50ms --checkpoint-every=5
`

// On a machine declaring one L4 (local.accelerators), GPU jobs hold it as pods hold a node's:
//
//  1. Two jobs contending for it run one after the other: the second waits PENDING, saying
//     who holds the GPU, and starts once the first has ended.
//  2. A high-priority job preempts a low-priority preemptible one (the job queue decides,
//     jobs/preempt.go): the low job's node gets SIGTERM and its grace (it checkpoints), the job
//     is RECOVERING while the high one runs, then resumes from its checkpoint and completes.
func TestLocalGPUJobsShareTheDeclaredGPU(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extraEnv = append(e.extraEnv, "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	writeFile(t, filepath.Join(e.home, "config.yaml"), "local:\n  accelerators: {L4: 1}\n")
	defer e.stopJobs()
	job := jobFiles(t, localGPUJob)

	// 1. One after the other.
	first := e.launchDetached(job("first", 500, false, 100))
	e.waitJob(first, time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })
	second := e.launchDetached(job("second", 500, false, 20))
	e.waitJob(second, time.Minute, "waits for the GPU", func(j jobView) bool {
		return j.State == "PENDING" && strings.Contains(j.Reason, "waiting for capacity") && strings.Contains(j.Reason, "job 1's first-1-1 holds 1 (priority 500)")
	})
	for {
		var f, s jobView
		for _, j := range e.jobs() { // one listing: both as of one moment
			switch j.ID {
			case first:
				f = j
			case second:
				s = j
			}
		}
		if s.State == "RUNNING" || s.State == "SUCCEEDED" {
			if f.State != "RUNNING" && f.State != "SUCCEEDED" {
				t.Fatalf("the first job is %s: %s", f.State, f.Reason)
			}
			break
		}
		if f.State != "RUNNING" && f.State != "SUCCEEDED" {
			t.Fatalf("the first job is %s: %s", f.State, f.Reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.waitJob(second, time.Minute, "completes", func(j jobView) bool { return j.State == "SUCCEEDED" })
	// The one L4 was never held twice: the first job's node had exited before the second's was
	// launched. Judged from the controller's log, not from job states: the first job reads
	// SUCCEEDED only a watch interval after its node exits, and the node's capacity is free from
	// its exit on (jobs/queue.go), so the second may run while the first still reads RUNNING.
	b, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	exited, launched := -1, -1
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case exited < 0 && strings.Contains(line, `"msg":"instance exited"`) && strings.Contains(line, `"instance":"local-first-1-`):
			exited = i
		case launched < 0 && strings.Contains(line, `"msg":"launched instance"`) && strings.Contains(line, `"name":"second-`):
			launched = i
		}
	}
	if exited < 0 || launched < exited {
		t.Fatalf("the second job's node was launched (log line %d) before the first's exited (line %d): both held the one L4", launched, exited)
	}

	// 2. Preemption by priority.
	low := e.launchDetached(job("low", 100, true, 400))
	e.waitJob(low, time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })
	eventually(t, time.Minute, "the low job trains", func() (bool, string) {
		out, _, _ := e.run("jobs", "logs", strconv.FormatInt(low, 10))
		return strings.Contains(out, "step 20/400"), lastLines(out, 2)
	})
	high := e.launchDetached(job("high", 900, false, 40))
	rec := e.waitJob(low, time.Minute, "preempted for the high job", func(j jobView) bool { return j.State == "RECOVERING" })
	if want := fmt.Sprintf("preempted for job %d (high, priority 900)", high); len(rec.History) != 1 || !strings.Contains(rec.History[0].Reason, want) {
		t.Errorf("the low job's recovery: %+v", rec.History)
	}
	e.waitJob(high, 2*time.Minute, "the high job completes", func(j jobView) bool { return j.State == "SUCCEEDED" })
	done := e.waitJob(low, 2*time.Minute, "the low job completes", func(j jobView) bool { return j.State == "SUCCEEDED" })
	if done.Recoveries != 1 || done.RestartsOnErrors != 0 {
		t.Errorf("want one recovery and no error restart: %+v", done)
	}
	if out := e.mustRun("jobs", "logs", strconv.FormatInt(low, 10)); !strings.Contains(out, "resuming from checkpoint at step") || !strings.Contains(out, "training done: 400 steps") {
		t.Errorf("the low job did not resume from its checkpoint:\n%s", lastLines(out, 10))
	}
}

// jobFiles writes job YAMLs from tmpl, a template taking a job's name, priority, whether it is
// preemptible and its steps, and returns each file's path.
func jobFiles(t *testing.T, tmpl string) func(name string, priority int, preemptible bool, steps int) string {
	dir := t.TempDir()
	return func(name string, priority int, preemptible bool, steps int) string {
		f := filepath.Join(dir, name+".yaml")
		writeFile(t, f, fmt.Sprintf(tmpl, name, priority, preemptible, steps))
		return f
	}
}
