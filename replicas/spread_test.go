package replicas

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// spotIn is a READY spot replica of id in zone (of infra aws), and its running instance.
func spotIn(id int, zone string) (replicaView, launcher.Instance) {
	r := rec(id, StatusReady)
	r.Spot, r.Infra, r.Zone, r.ReadyAt = true, "aws", zone, t0
	v := view(r, probeOK)
	v.HealthySince = t0
	i := inst(id, launcher.StateRunning, "")
	i.Infra, i.Zone = "aws", zone
	return v, i
}

// spreadInput is a pass of a spot service with Desired 3 over the given replicas (zones by
// id; "" makes the replica a move under way, launching).
func spreadInput(zones ...string) planInput {
	in := planInput{Now: t0.Add(time.Hour), Service: "svc", Desired: 3, InitialDelay: 20 * time.Minute, FailureThreshold: 3 * time.Minute,
		KeepFailed: 10, Drain: true, Mix: policy.MixSpec{UseSpot: true, DynamicFallback: true}, Spread: true}
	for i, zone := range zones {
		v, inst := spotIn(i+1, zone)
		in.Replicas = append(in.Replicas, v)
		in.Instances = append(in.Instances, inst)
	}
	return in
}

// starting makes v a replica launched 10 s before now, not probed yet.
func starting(v *replicaView, now time.Time) {
	v.Record.Status, v.Record.LaunchedAt, v.Record.ReadyAt = StatusStarting, now.Add(-10*time.Second), time.Time{}
	v.Probe, v.HealthySince = notProbedYet, time.Time{}
}

func TestPlanSpreadsSpotOutOfACrowdedZone(t *testing.T) {
	tests := map[string]struct {
		in       planInput
		wantFrom string
		// wantDown are the replicas scaled down; wantSpot and wantOD the launches.
		wantDown         []int
		wantSpot, wantOD int
	}{
		"all three in one zone: one more, out of it": {in: spreadInput("a", "a", "a"), wantFrom: "aws/a"},
		"two of three in one zone stay":              {in: spreadInput("a", "a", "b")},
		"a service that does not spread":             {in: func() planInput { in := spreadInput("a", "a", "a"); in.Spread = false; return in }()},
		"a move that found no zone waits": {
			in: func() planInput {
				in := spreadInput("a", "a", "a")
				in.SpreadAfter = in.Now.Add(time.Second)
				return in
			}(),
		},
		"a spot replica not READY yet": {
			// The fallback stands in for it meanwhile (policy.Split).
			in:     func() planInput { in := spreadInput("a", "a", "a"); starting(&in.Replicas[2], in.Now); return in }(),
			wantOD: 2,
		},
		"a reclaim notice under way": {
			// The warned replica's replacement launches, with the fallback; no move beside it.
			in:       func() planInput { in := spreadInput("a", "a", "a"); in.Replicas[2].Noticed = true; return in }(),
			wantSpot: 1, wantOD: 2,
		},
		"a replica whose infra names no zone": {
			in: func() planInput { in := spreadInput("a", "a", "a"); in.Replicas[0].Record.Zone = ""; return in }(),
		},
		// The move's replica is starting: it neither counts toward the target nor is scaled
		// down, and no second move starts.
		"a move under way": {
			in: func() planInput {
				in := spreadInput("a", "a", "a", "b")
				starting(&in.Replicas[3], in.Now)
				in.Replicas[3].Moving = true
				return in
			}(),
		},
		// The move's replica is READY: four spot replicas for three wanted, and the one to go is
		// in the crowded zone, the newest there.
		"the move is READY: one of the crowded zone's goes": {
			in:       func() planInput { in := spreadInput("a", "a", "a", "b"); in.Replicas[3].Moving = true; return in }(),
			wantDown: []int{3},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			acts := plan(tc.in)
			var down []int
			for _, tr := range acts.Transitions {
				if tr.To == StatusShuttingDown {
					down = append(down, tr.ID)
				}
			}
			if acts.SpreadFrom != tc.wantFrom || !slices.Equal(down, tc.wantDown) || acts.LaunchSpot != tc.wantSpot || acts.Launch != tc.wantOD {
				t.Errorf("spread from %q, scaled down %v, launched %d spot and %d on-demand; want %q, %v, %d and %d",
					acts.SpreadFrom, down, acts.LaunchSpot, acts.Launch, tc.wantFrom, tc.wantDown, tc.wantSpot, tc.wantOD)
			}
		})
	}
}

// spreadingProvider is a fakeProvider that takes spread moves (SpreadMover).
type spreadingProvider struct{ *fakeProvider }

func (spreadingProvider) MovesSpot() bool { return true }

// TestManagerSpreadsSpotReplicas: both spot replicas land in zone a. Once they are READY the
// manager asks for a move out of a; the first finds no zone, which leaves no record, counts
// no launch failure and holds moves back for SpreadRetry. The next goes to zone b; once it is
// READY one of zone a's drains and is terminated, and the service settles at one in each zone.
func TestManagerSpreadsSpotReplicas(t *testing.T) {
	prov := newFakeProvider(t)
	prov.unhealthyAtStart = true
	var moves atomic.Int32
	prov.zone = func(s launcher.Spec) (string, error) {
		if s.SpreadFrom == "" {
			return "a", nil
		}
		if s.SpreadFrom != "fake/a" {
			return "", fmt.Errorf("move out of %q, want fake/a", s.SpreadFrom)
		}
		if moves.Add(1) == 1 {
			return "", fmt.Errorf("%w: no zone holds fewer", launcher.ErrNoCapacity)
		}
		return "b", nil
	}
	h := startSpreading(t, prov)
	crowded := readySpot(t, h, prov)
	eventually(t, "a move tried, finding no zone", func() bool { return moves.Load() == 1 })
	eventually(t, "the failed move's record gone", func() bool { return len(liveSpot(h)) == 2 && len(h.m.Replicas()) == 2 })
	h.m.do(func() {
		if h.m.failures[true] != 0 {
			t.Errorf("a move that found no zone counted as %d spot launch failures", h.m.failures[true])
		}
	})
	time.Sleep(100 * time.Millisecond) // five reconcile intervals: no move before SpreadRetry
	if n := moves.Load(); n != 1 {
		t.Fatalf("%d moves before SpreadRetry passed, want 1", n)
	}
	h.clock.Advance(SpreadRetry)
	eventually(t, "a second move launched", func() bool { return moves.Load() == 2 && startedSpot(h) == 3 })
	moved := newestSpot(h, 0)
	prov.byReplica(moved).healthy.Store(true)
	eventually(t, "one of zone a's replicas terminated once the move is READY", func() bool {
		spot := liveSpot(h)
		return len(spot) == 2 && slices.Contains(spot, moved)
	})
	left := liveSpot(h)
	if !slices.Contains(crowded, left[0]) && !slices.Contains(crowded, left[1]) {
		t.Errorf("live spot replicas %v: want the move %d and one of zone a's %v", left, moved, crowded)
	}
	time.Sleep(100 * time.Millisecond)
	if n := moves.Load(); n != 2 {
		t.Errorf("%d moves, want 2: one replica in each zone is spread enough", n)
	}
}

// startSpreading runs a manager of two spot replicas with SpotHedge's placer on prov, which
// takes spread moves, and waits until both are launched.
func startSpreading(t *testing.T, prov *fakeProvider) *harness {
	h := newHarness(t, prov, newFakeStore(), newFakeClock(), func(c *Config) {
		task := testTask()
		task.Resources.UseSpot = true
		task.Service.ReplicaPolicy = configs.ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2,
			DynamicOndemandFallback: true, SpotPlacer: configs.SpotPlacerDynamicFallback}
		c.Task, c.Provider = task, spreadingProvider{prov}
	})
	h.m.SetDesired(2)
	h.start()
	eventually(t, "two spot replicas launched", func() bool { return startedSpot(h) == 2 })
	return h
}

// startedSpot counts the live spot replicas whose instance is launched (not PROVISIONING).
func startedSpot(h *harness) int {
	n := 0
	for _, r := range h.m.Replicas() {
		if r.Spot && live(r.Status) && r.Status != StatusProvisioning {
			n++
		}
	}
	return n
}

// liveSpot are the ids of the live spot replicas.
func liveSpot(h *harness) []int {
	var out []int
	for _, r := range h.m.Replicas() {
		if r.Spot && live(r.Status) {
			out = append(out, r.ID)
		}
	}
	return out
}

// TestManagerPausesMovesThatDoNotMove: a provider that places a move in the very zone it was
// to leave (its zone names and the records' disagree) gets no second move for spreadPause.
func TestManagerPausesMovesThatDoNotMove(t *testing.T) {
	prov := newFakeProvider(t)
	prov.unhealthyAtStart = true
	var moves atomic.Int32
	prov.zone = func(s launcher.Spec) (string, error) {
		if s.SpreadFrom != "" {
			moves.Add(1)
		}
		return "a", nil
	}
	h := startSpreading(t, prov)
	for _, id := range liveSpot(h) {
		prov.byReplica(id).healthy.Store(true)
	}
	eventually(t, "a move launched", func() bool { return moves.Load() == 1 && startedSpot(h) == 3 })
	prov.byReplica(newestSpot(h, 0)).healthy.Store(true)
	eventually(t, "back to two spot replicas once the move is READY", func() bool { return len(liveSpot(h)) == 2 })
	h.clock.Advance(SpreadRetry)
	time.Sleep(100 * time.Millisecond) // five reconcile intervals
	if n := moves.Load(); n != 1 {
		t.Fatalf("%d moves; want 1: a move that landed where it was to leave pauses moves for %v", n, spreadPause)
	}
	h.clock.Advance(spreadPause)
	eventually(t, "moves again after the pause", func() bool { return moves.Load() == 2 })
}
