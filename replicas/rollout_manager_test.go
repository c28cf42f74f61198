package replicas

import (
	"slices"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// v2Task is testTask with a different program: its replicas must be relaunched.
func v2Task() *configs.Task {
	t := testTask()
	t.Run = "serve-v2 --port $FERRY_PORT"
	return t
}

func newRollout(mode string) Rollout {
	now := time.Now()
	return Rollout{From: 1, To: 2, Mode: mode, State: RolloutInProgress, FromServed: true, StartedAt: now, ProgressAt: now,
		Policy: configs.Update{Mode: mode, MaxParallel: 1, ProgressDeadlineSeconds: 600, AutoRollback: true}}
}

func versionsOf(eps []Endpoint) []int {
	var out []int
	for _, ep := range eps {
		if !slices.Contains(out, ep.Version) {
			out = append(out, ep.Version)
		}
	}
	slices.Sort(out)
	return out
}

func (h *harness) waitRollout(want RolloutState) Rollout {
	h.t.Helper()
	var got Rollout
	eventually(h.t, "rollout "+string(want), func() bool {
		got, _ = h.store.lastRollout()
		return got.State == want
	})
	return got
}

func TestManagerRollingUpdate(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	_, before := h.pubs.last()
	h.m.startRollout(Version{Number: 2, Task: v2Task()}, newRollout(configs.UpdateRolling))
	r := h.waitRollout(RolloutSucceeded)
	h.waitReady(3, 4)
	if got := h.m.TargetVersion(); got != 2 {
		t.Errorf("target version = %d, want 2", got)
	}
	for _, ep := range h.m.Ready() {
		if ep.Version != 2 {
			t.Errorf("replica %d serves version %d, want 2", ep.ReplicaID, ep.Version)
		}
	}
	h.prov.mu.Lock()
	for _, spec := range h.prov.specs[2:] {
		if spec.Labels[launcher.LabelVersion] != "2" || spec.Run != v2Task().Run {
			t.Errorf("replica %s launched as version %s running %q", spec.Name, spec.Labels[launcher.LabelVersion], spec.Run)
		}
	}
	h.prov.mu.Unlock()
	// Rolling never drops below the target: every published set after the first has 2+
	// replicas.
	for i, set := range h.pubs.all()[before:] {
		if len(set) < 2 {
			t.Errorf("publication %d has %d replicas %v; a rolling update keeps the target serving", i, len(set), ids(set))
		}
	}
	if r.Reason == "" || r.FinishedAt.IsZero() {
		t.Errorf("finished rollout lacks reason or time: %+v", r)
	}
}

func TestManagerBlueGreenSwitchesAtOnce(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	_, before := h.pubs.last()
	h.m.startRollout(Version{Number: 2, Task: v2Task()}, newRollout(configs.UpdateBlueGreen))
	h.waitRollout(RolloutSucceeded)
	h.waitReady(3, 4)
	// Never both versions at once, and never nothing.
	for i, set := range h.pubs.all()[before:] {
		if v := versionsOf(set); len(v) != 1 {
			t.Errorf("publication %d %v serves versions %v; blue-green serves exactly one", i, ids(set), v)
		}
	}
}

func TestManagerRollsBackWhenNewReplicasCrash(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	h.prov.mu.Lock()
	h.prov.unhealthyAtStart = true
	h.prov.mu.Unlock()
	h.m.startRollout(Version{Number: 2, Task: v2Task()}, newRollout(configs.UpdateRolling))
	h.waitStatus(3, StatusStarting)
	h.prov.end(3, launcher.StateTerminated, "exit status 3")

	r := h.waitRollout(RolloutRolledBack)
	if want := "replica 3 of version 2: FAILED: exit status 3"; r.Reason != want {
		t.Errorf("reason = %q, want %q", r.Reason, want)
	}
	if got := h.m.TargetVersion(); got != 1 {
		t.Errorf("target version after rollback = %d, want 1", got)
	}
	h.waitReady(1, 2)
	// The version rolled back from has nothing live left, once the pass that saw replica 3 end
	// has published its records (the verdict may be out first).
	eventually(t, "no live replica of the failed version", func() bool {
		for _, rec := range h.m.Replicas() {
			if rec.Version == 2 && live(rec.Status) {
				return false
			}
		}
		return true
	})
}

func TestManagerServiceOnlyUpdateRelabels(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	task := testTask()
	task.Service.LoadBalancingPolicy = configs.PolicyRoundRobin
	h.m.startRollout(Version{Number: 2, Task: task, LaunchedAs: 1}, newRollout(configs.UpdateRolling))
	h.waitRollout(RolloutSucceeded)
	eventually(t, "replicas 1 and 2 relabelled to version 2", func() bool {
		return h.record(1).Version == 2 && h.record(2).Version == 2
	})
	if n := h.prov.count(); n != 2 {
		t.Errorf("%d instances, want the same 2", n)
	}
}

func TestManagerResumesRolloutAfterRestart(t *testing.T) {
	prov, store := newFakeProvider(t), newFakeStore()
	h := newHarness(t, prov, store, newFakeClock())
	h.start()
	h.m.SetDesired(3)
	h.waitReady(1, 2, 3)
	prov.mu.Lock()
	prov.launchBlock = make(chan struct{}) // the new version's first launch hangs
	prov.mu.Unlock()
	r := newRollout(configs.UpdateRolling)
	h.m.startRollout(Version{Number: 2, Task: v2Task()}, r)
	h.waitStatus(4, StatusProvisioning)
	h.stop() // the controller dies mid-launch
	prov.mu.Lock()
	close(prov.launchBlock)
	prov.launchBlock = nil
	prov.mu.Unlock()

	target := 3
	h2 := newHarness(t, prov, store, newFakeClock(), func(c *Config) {
		c.Version, c.Task = 2, v2Task()
		c.Versions = []Version{{Number: 1, Task: testTask(), LaunchedAs: 1}}
		c.Rollout = &r
		c.InitialTarget = &target
	})
	h2.start()
	h2.waitRollout(RolloutSucceeded)
	eventually(t, "three replicas of version 2 serving", func() bool {
		eps := h2.m.Ready()
		return len(eps) == 3 && slices.Equal(versionsOf(eps), []int{2})
	})
	for _, rec := range h2.m.Replicas() {
		if rec.Version == 1 && live(rec.Status) {
			t.Errorf("old replica %d still %s", rec.ID, rec.Status)
		}
	}
}

// The crashes of a version rolled back from must not hold back the restored version's
// launches (the launch backoff counts only the version being launched).
func TestManagerRollbackDoesNotBackOffRestoredVersion(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock()) // the clock stands still
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	h.prov.mu.Lock()
	h.prov.unhealthyAtStart = true
	h.prov.mu.Unlock()
	r := newRollout(configs.UpdateRolling)
	r.Policy.MaxParallel = 2
	h.m.startRollout(Version{Number: 2, Task: v2Task()}, r)
	h.waitStatus(3, StatusStarting)
	h.waitStatus(4, StatusStarting)
	h.prov.end(3, launcher.StateTerminated, "exit status 3")
	h.prov.end(4, launcher.StateTerminated, "exit status 3")
	h.waitRollout(RolloutRolledBack)
	h.waitStatus(4, StatusFailed)

	h.prov.mu.Lock()
	h.prov.unhealthyAtStart = false
	h.prov.mu.Unlock()
	h.prov.end(1, launcher.StateTerminated, "host lost")
	h.waitStatus(1, StatusFailed)
	h.waitReady(2, 5)
	if v := h.record(5).Version; v != 1 {
		t.Errorf("replacement runs version %d, want 1", v)
	}
}
