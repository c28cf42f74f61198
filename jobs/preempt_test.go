package jobs_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
)

// l4Job is a one-node job on an L4 that sleeps until stopped, checkpointing on SIGTERM.
func l4Job(name string, priority int, preemptible bool) string {
	return fmt.Sprintf(`name: %s
resources: {accelerators: L4:1}
job: {priority: %d, preemptible: %t, grace_period_seconds: 5}
run: |
  trap 'echo checkpoint saved; exit 143' TERM
  echo started
  while true; do sleep 0.05; done
`, name, priority, preemptible)
}

// TestQueuePreemptsLowerPriorityJobs: on a machine with room for one node, a job that finds no
// capacity preempts the lowest-priority preemptible job (the newest first), which recovers
// once the GPU is free again; it preempts neither a non-preemptible job, nor one of its own
// priority, nor a job within its cooldown.
func TestQueuePreemptsLowerPriorityJobs(t *testing.T) {
	e := newEnv(t)
	e.prov.setCapacity(1)
	e.tune = func(c *jobs.Config) { c.PreemptionCooldown = time.Hour }
	e.stop()
	e.start()

	keep := e.submit(l4Job("keep", 100, false))
	e.waitState(keep.ID, jobs.Running)
	peer := e.submit(l4Job("peer", 900, true))
	e.waitFor(peer.ID, 10*time.Second, "waits without preempting a non-preemptible job", func(j jobs.Job) bool {
		return j.State == jobs.Pending && strings.Contains(j.Reason, "waiting for capacity") && !strings.Contains(j.Reason, "preempting")
	})
	if _, err := e.m.Cancel(peer.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Cancel(keep.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(keep.ID, jobs.Cancelled)

	low := e.submit(l4Job("low", 100, true))
	preemptedAttempt := e.waitState(low.ID, jobs.Running).Attempt
	equal := e.submit(l4Job("equal", 100, false))
	e.waitFor(equal.ID, 10*time.Second, "waits without preempting an equal priority", func(j jobs.Job) bool {
		return j.State == jobs.Pending && strings.Contains(j.Reason, "waiting for capacity") && !strings.Contains(j.Reason, "preempting")
	})
	if _, err := e.m.Cancel(equal.ID); err != nil {
		t.Fatal(err)
	}
	high := e.submit(l4Job("high", 900, false))
	rec := e.waitFor(low.ID, 20*time.Second, "preempted", func(j jobs.Job) bool { return j.State == jobs.Recovering })
	want := fmt.Sprintf("preempted for job %d (high, priority 900)", high.ID)
	if len(rec.History) != 1 || rec.History[0].Reason != want || rec.Recoveries != 1 || rec.PreemptedAt.IsZero() {
		t.Errorf("the low job: history %+v recoveries %d preempted at %v, want one recovery %q", rec.History, rec.Recoveries, rec.PreemptedAt, want)
	}
	e.waitState(high.ID, jobs.Running)
	// The preempted attempt's own archive, once the job has let its node go (the archive is
	// then complete): the queue has been trying the low job again meanwhile, each try a new
	// attempt.
	e.waitFor(low.ID, 20*time.Second, "its preempted node released", func(j jobs.Job) bool { return len(j.Nodes) == 0 })
	if b, err := os.ReadFile(e.m.LogFile(low.ID, preemptedAttempt, 0)); err != nil || !strings.Contains(string(b), "checkpoint saved") {
		t.Errorf("the preempted node's log %q (%v) lacks what it printed in its grace", b, err)
	}

	// The high job ends; the low one runs again, and within its cooldown a second
	// high-priority job waits instead of preempting it.
	if _, err := e.m.Cancel(high.ID); err != nil {
		t.Fatal(err)
	}
	e.waitFor(low.ID, 20*time.Second, "runs again", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 1 })
	again := e.submit(l4Job("again", 900, false))
	e.waitFor(again.ID, 10*time.Second, "waits: the low job is in its cooldown", func(j jobs.Job) bool {
		return j.State == jobs.Pending && strings.Contains(j.Reason, "waiting for capacity") && !strings.Contains(j.Reason, "preempting")
	})
	if j, _ := e.m.Get(low.ID); j.State != jobs.Running || j.Recoveries != 1 {
		t.Errorf("the low job was preempted again within its cooldown: %s, %d recoveries", j.State, j.Recoveries)
	}
}

func TestMayRunOn(t *testing.T) {
	job := func(infra string) jobs.Job {
		task, err := configs.Parse("j.yaml", []byte("resources: {infra: "+infra+"}\nrun: x\n"), configs.Overrides{})
		if err != nil {
			t.Fatal(err)
		}
		return jobs.Job{Task: task}
	}
	for _, tt := range []struct {
		task, node string
		want       bool
	}{
		{"local", "local", true}, {"aws", "local", false}, {"kubernetes", "kubernetes/ctx", true},
		{"kubernetes/a", "kubernetes/b", false}, {"'*'", "local", false}, {"'*'", "kubernetes/ctx", true},
	} {
		if got := jobs.MayRunOn(job(tt.task), tt.node); got != tt.want {
			t.Errorf("a job on %s may run on %s: %v, want %v", tt.task, tt.node, got, tt.want)
		}
	}
}
