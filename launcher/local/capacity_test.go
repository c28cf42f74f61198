package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

func TestFits(t *testing.T) {
	tests := []struct {
		name    string
		devices int
		held    []float64
		want    float64
		ok      bool
	}{
		{"free device", 1, nil, 1, true},
		{"device taken", 1, []float64{1}, 1, false},
		{"two of two", 2, []float64{1}, 1, true},
		{"whole beside a share", 1, []float64{0.5}, 1, false},
		{"two halves share", 1, []float64{0.5}, 0.5, true},
		{"shares do not split", 1, []float64{0.7}, 0.7, false},
		{"shares on two devices", 2, []float64{0.7}, 0.7, true},
		{"halves pack beside a whole", 2, []float64{0.5, 0.5}, 1, true},
		{"a pair needs two free", 2, []float64{0.25}, 2, false},
		{"more than declared", 1, nil, 2, false},
	}
	for _, tt := range tests {
		if got := fits(tt.devices, tt.held, tt.want); got != tt.ok {
			t.Errorf("%s: fits(%d, %v, %g) = %v, want %v", tt.name, tt.devices, tt.held, tt.want, got, tt.ok)
		}
	}
}

// gpuJob is a job node asking for one L4.
func gpuJob(name, job string, priority int, preemptible bool, run string) launcher.Spec {
	return launcher.Spec{
		Name:      name,
		Labels:    map[string]string{launcher.LabelJob: job},
		Run:       run,
		Resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}},
		Job:       &launcher.JobSpec{Priority: priority, Preemptible: preemptible, Grace: 5 * time.Second},
	}
}

func stateOf(t *testing.T, p *Provider, id string) launcher.Instance {
	t.Helper()
	insts, err := p.List(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.ID == id {
			return in
		}
	}
	t.Fatalf("instance %s not listed", id)
	return launcher.Instance{}
}

// TestDeclaredGPUsAreHeld: two jobs asking for the one L4 this machine declares run one after
// the other; a GPU it does not declare is not counted; an ask it could never hold is refused.
func TestDeclaredGPUsAreHeld(t *testing.T) {
	p := newProvider(t, Options{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}})
	ctx := context.Background()
	first, err := p.Launch(ctx, gpuJob("first", "1", 500, false, "sleep 300"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Launch(ctx, gpuJob("second", "2", 500, false, "sleep 300"))
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "job 1's first holds 1 (priority 500)") {
		t.Fatalf("second L4 job: %v, want no capacity naming the holder", err)
	}
	other := gpuJob("other", "3", 500, false, "sleep 300")
	other.Resources.Accelerators[0].Name = "A100" // not declared: not counted
	o, err := p.Launch(ctx, other)
	if err != nil {
		t.Fatalf("an undeclared GPU: %v", err)
	}
	big := gpuJob("big", "4", 500, false, "sleep 300")
	big.Resources.Accelerators[0].Count = 2
	if _, err := p.Launch(ctx, big); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("two L4 on a one-L4 machine: %v, want invalid", err)
	}
	if _, err := p.PrepareGang(gpuJob("gang", "5", 500, false, "true"), 2); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("a 2-node L4 gang on a one-L4 machine: %v, want invalid", err)
	}
	for _, id := range []string{first.ID, o.ID} {
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	second, err := p.Launch(ctx, gpuJob("second", "2", 500, false, "sleep 300"))
	if err != nil {
		t.Fatalf("once the first is gone: %v", err)
	}
	_ = p.Terminate(ctx, second.ID)
}

// TestReplicaPreemptsAPreemptibleJob: a replica's launch (serving priority) that does not fit
// takes the GPU of a preemptible job's node: SIGTERM with its grace (the checkpoint it writes
// then survives), the node lists PREEMPTED at once, and the launch fits once the node is gone.
// A job's launch never preempts here (the job queue does, jobs/preempt.go); a non-preemptible
// node is never taken, a multi-node replica's nodes are not preemptible, and a job preempted
// here is safe for the cooldown.
func TestReplicaPreemptsAPreemptibleJob(t *testing.T) {
	dir := t.TempDir()
	mark, trapped := filepath.Join(dir, "checkpointed"), filepath.Join(dir, "trapped")
	p := newProvider(t, Options{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}, PreemptionCooldown: time.Hour})
	ctx := context.Background()
	low, err := p.Launch(ctx, gpuJob("low", "1", 100, true, "trap 'touch "+mark+"; exit 0' TERM; touch "+trapped+"; while true; do sleep 0.05; done"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Launch(ctx, gpuJob("high", "2", 900, false, "sleep 300")); !errors.Is(err, launcher.ErrNoCapacity) || strings.Contains(err.Error(), "preempting") {
		t.Fatalf("a higher-priority job's launch: %v, want no capacity and no preemption (the queue's to decide)", err)
	}
	// The node's shell must have set its trap before the SIGTERM: a fixed sleep here lost that
	// race under -race with every package testing at once.
	waitFor(t, 10*time.Second, "the low node's trap", func() bool { _, err := os.Stat(trapped); return err == nil })
	replica := launcher.Spec{Name: "svc-1", Labels: map[string]string{launcher.LabelService: "svc"}, Run: "sleep 300",
		Resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}}}
	_, err = p.Launch(ctx, replica)
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "preempting job 1's low") {
		t.Fatalf("the replica's launch: %v, want no capacity while it preempts the low job", err)
	}
	if in := stateOf(t, p, low.ID); in.State != launcher.StatePreempted || !strings.Contains(in.Reason, "preempted for svc-1 (priority 1000)") {
		t.Fatalf("the low job's node: %s %q, want PREEMPTED saying for whom", in.State, in.Reason)
	}
	var r launcher.Instance
	waitFor(t, 10*time.Second, "the replica fits once the low node is gone", func() bool {
		r, err = p.Launch(ctx, replica)
		return err == nil
	})
	// Its trap runs in the node's shell, which may end a moment after the node counts as gone.
	waitFor(t, 5*time.Second, "the preempted node's SIGTERM trap (its grace)", func() bool { _, err := os.Stat(mark); return err == nil })
	for _, id := range []string{low.ID, r.ID} {
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// Non-preemptible: kept.
	keep, err := p.Launch(ctx, gpuJob("keep", "3", 100, false, "sleep 300"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Launch(ctx, replica); !errors.Is(err, launcher.ErrNoCapacity) || strings.Contains(err.Error(), "preempting") {
		t.Fatalf("a replica against a non-preemptible job: %v", err)
	}
	_ = p.Terminate(ctx, keep.ID)

	// Job 1 again, preempted an hour ago as far as the cooldown knows: safe from the replica.
	again, err := p.Launch(ctx, gpuJob("low", "1", 100, true, "sleep 300"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Launch(ctx, replica); !errors.Is(err, launcher.ErrNoCapacity) || strings.Contains(err.Error(), "preempting") {
		t.Fatalf("a job within its cooldown was preempted again: %v", err)
	}
	_ = p.Terminate(ctx, again.ID)

	if prio, preemptible := priorityOf(launcher.Spec{Labels: map[string]string{launcher.LabelService: "svc"},
		Job: &launcher.JobSpec{Priority: launcher.ServingPriority, Preemptible: true}}); prio != launcher.ServingPriority || preemptible {
		t.Errorf("a multi-node replica's node: priority %d preemptible %v", prio, preemptible)
	}
}

// TestDeclaredCPUsAndMemoryAreHeld: with local.cpus and local.memory declared, tasks asking for
// cpus or memory hold them: a job that would pass either waits; a task asking for neither is
// not counted.
func TestDeclaredCPUsAndMemoryAreHeld(t *testing.T) {
	p := newProvider(t, Options{CPUs: 4, MemoryGiB: 16})
	ctx := context.Background()
	job := func(name, cpus, mem string) launcher.Spec {
		return launcher.Spec{Name: name, Labels: map[string]string{launcher.LabelJob: name}, Run: "sleep 300",
			Resources: configs.Resources{CPUs: cpus, Memory: mem}, Job: &launcher.JobSpec{Priority: 500}}
	}
	a, err := p.Launch(ctx, job("a", "3", "8+"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Launch(ctx, job("b", "2", ""))
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "local's 4 declared CPUs are in use (3 held, 2 asked)") || !strings.Contains(err.Error(), "a holds 3 CPUs, 8 GiB") {
		t.Fatalf("CPUs past the declared 4: %v", err)
	}
	if _, err := p.Launch(ctx, job("c", "", "9")); !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "16 GiB of declared memory") {
		t.Fatalf("memory past the declared 16 GiB: %v", err)
	}
	if _, err := p.Launch(ctx, job("d", "8", "")); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("more CPUs than declared at all: %v, want invalid", err)
	}
	free, err := p.Launch(ctx, job("e", "1", "8"))
	if err != nil {
		t.Fatalf("what is left: %v", err)
	}
	uncounted, err := p.Launch(ctx, job("f", "", ""))
	if err != nil {
		t.Fatalf("a task asking for nothing: %v", err)
	}
	for _, in := range []launcher.Instance{a, free, uncounted} {
		_ = p.Terminate(ctx, in.ID)
	}
}
