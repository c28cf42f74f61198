package replicas

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

var t0 = time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)

func rec(id int, s Status) Record {
	return Record{Service: "svc", ID: id, Version: 1, Status: s, InstanceID: "i-" + strconv.Itoa(id),
		Endpoint: "127.0.0.1:" + strconv.Itoa(9000+id), LaunchedAt: t0}
}

func view(r Record, p probeState) replicaView { return replicaView{Record: r, Probe: p} }

func inst(replicaID int, state launcher.State, reason string) launcher.Instance {
	return launcher.Instance{
		ID:   "i-" + strconv.Itoa(replicaID),
		Name: "svc-" + strconv.Itoa(replicaID),
		Labels: map[string]string{launcher.LabelService: "svc", launcher.LabelVersion: "1",
			launcher.LabelReplicaID: strconv.Itoa(replicaID)},
		Endpoint: "127.0.0.1:" + strconv.Itoa(9000+replicaID), Infra: "local", State: state,
		LaunchedAt: t0, Reason: reason,
	}
}

func running(ids ...int) []launcher.Instance {
	var out []launcher.Instance
	for _, id := range ids {
		out = append(out, inst(id, launcher.StateRunning, ""))
	}
	return out
}

var (
	probeOK       = probeState{At: t0.Add(59 * time.Second), OK: true}
	probeFailing  = probeState{At: t0.Add(59 * time.Second), FailingSince: t0.Add(30 * time.Second), Err: "HTTP 503"}
	notProbedYet  = probeState{}
	terminateKeep = func(id int) termination { return termination{ReplicaID: id, InstanceID: "i-" + strconv.Itoa(id)} }
	terminateGone = func(id int) termination {
		return termination{ReplicaID: id, InstanceID: "i-" + strconv.Itoa(id), Forget: true}
	}
)

func TestPlan(t *testing.T) {
	now := t0.Add(time.Minute)
	base := planInput{Now: now, Service: "svc", Desired: 1, InitialDelay: 20 * time.Minute,
		FailureThreshold: 3 * time.Minute, KeepFailed: 10}
	withInput := func(f func(*planInput)) planInput {
		in := base
		f(&in)
		return in
	}
	tests := map[string]struct {
		in   planInput
		want actions
	}{
		"nothing yet: launch the target": {
			in:   withInput(func(in *planInput) { in.Desired = 2 }),
			want: actions{Launch: 2},
		},
		"no target yet holds": {
			in: withInput(func(in *planInput) {
				in.Desired = -1
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeOK)}
				in.Instances = running(1)
			}),
			want: actions{},
		},
		"launch in flight counts toward the target": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{{Record: Record{ID: 4, Status: StatusProvisioning}, Launching: true}}
			}),
			want: actions{},
		},
		"starting replica answers 200: ready": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusStarting), probeOK)}
				in.Instances = running(1)
			}),
			want: actions{Transitions: []transition{{ID: 1, From: StatusStarting, To: StatusReady}}},
		},
		"an instance listed twice is not its own stray": {
			// A List overlapping a launch once handed the same instance in twice; the copy was
			// terminated as a stray and took the READY replica down with it.
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeOK)}
				in.Instances = running(1, 1)
			}),
			want: actions{},
		},
		"starting within the initial delay waits": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusStarting), probeFailing)}
				in.Instances = running(1)
			}),
			want: actions{},
		},
		"starting past the initial delay fails and is replaced": {
			in: withInput(func(in *planInput) {
				in.Now = t0.Add(20 * time.Minute)
				in.Replicas = []replicaView{view(rec(1, StatusStarting), probeFailing)}
				in.Instances = running(1)
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusStarting, To: StatusFailedInitialDelay,
					Reason: "not ready within 20m0s of launch: HTTP 503"}},
				Terminate: []termination{terminateKeep(1)},
				Launch:    1,
			},
		},
		"ready replica failing probes goes not ready": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeFailing)}
				in.Instances = running(1)
			}),
			want: actions{Transitions: []transition{{ID: 1, From: StatusReady, To: StatusNotReady,
				Reason: "readiness probe failing: HTTP 503"}}},
		},
		"not ready replica failing under the threshold stays": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusNotReady), probeFailing)}
				in.Instances = running(1)
			}),
			want: actions{},
		},
		"not ready past the failure threshold fails probing and is replaced": {
			in: withInput(func(in *planInput) {
				in.Now = t0.Add(30*time.Second + 3*time.Minute)
				in.Replicas = []replicaView{view(rec(1, StatusNotReady), probeFailing)}
				in.Instances = running(1)
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusNotReady, To: StatusFailedProbing,
					Reason: "readiness probe failing for 3m0s: HTTP 503"}},
				Terminate: []termination{terminateKeep(1)},
				Launch:    1,
			},
		},
		"not ready replica recovers": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusNotReady), probeOK)}
				in.Instances = running(1)
			}),
			want: actions{Transitions: []transition{{ID: 1, From: StatusNotReady, To: StatusReady}}},
		},
		"ready replica not probed since restart keeps its status": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusReady), notProbedYet)}
				in.Instances = running(1)
			}),
			want: actions{},
		},
		"exited instance fails the replica with its exit status": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeOK)}
				in.Instances = []launcher.Instance{inst(1, launcher.StateTerminated, "exit status 1")}
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusFailed, Reason: "exit status 1"}},
				Terminate:   []termination{terminateKeep(1)},
				Launch:      1,
			},
		},
		"preempted instance": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeOK)}
				in.Instances = []launcher.Instance{inst(1, launcher.StatePreempted, "")}
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusPreempted, Reason: "preempted"}},
				Terminate:   []termination{terminateKeep(1)},
				Launch:      1,
			},
		},
		"vanished instance": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(rec(1, StatusStarting), notProbedYet)}
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusStarting, To: StatusFailed, Reason: "instance disappeared"}},
				Launch:      1,
			},
		},
		"scale down prefers replicas not serving, then the newest": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				in.Replicas = []replicaView{
					view(rec(1, StatusReady), probeOK), view(rec(2, StatusReady), probeOK),
					view(rec(3, StatusReady), probeOK), view(rec(4, StatusStarting), notProbedYet),
				}
				in.Instances = running(1, 2, 3, 4)
			}),
			want: actions{
				Transitions: []transition{
					{ID: 4, From: StatusStarting, To: StatusShuttingDown, Reason: "scaled down"},
					{ID: 3, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"},
				},
				Terminate: []termination{terminateGone(4), terminateGone(3)},
			},
		},
		"scale down takes the most expensive serving replica first": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				spot, onDemand := rec(2, StatusReady), rec(1, StatusReady)
				spot.Spot, spot.Price, onDemand.Price = true, 0.9, 3.06
				in.Replicas = []replicaView{view(onDemand, probeOK), view(spot, probeOK), view(rec(3, StatusReady), probeOK)}
				in.Instances = running(1, 2, 3)
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"}},
				Terminate:   []termination{terminateGone(1)},
			},
		},
		"spot mix: on-demand covers the spot replicas that are not READY yet": {
			in: withInput(func(in *planInput) {
				in.Desired = 3
				in.Mix = policy.MixSpec{UseSpot: true, BaseOnDemand: 1, DynamicFallback: true}
			}),
			// spot 3-1 = 2; on-demand 1 base + 2 spot not READY = 3 (at most the target).
			want: actions{LaunchSpot: 2, Launch: 3},
		},
		"spot mix: READY spot replicas retire the fallback on-demand ones (no hold, or the hold ended)": {
			in: withInput(func(in *planInput) {
				in.Desired = 3
				in.Mix = policy.MixSpec{UseSpot: true, BaseOnDemand: 1, DynamicFallback: true}
				s1, s2 := rec(1, StatusReady), rec(2, StatusReady)
				s1.Spot, s2.Spot = true, true
				in.Replicas = []replicaView{view(s1, probeOK), view(s2, probeOK), view(rec(3, StatusReady), probeOK),
					view(rec(4, StatusReady), probeOK), view(rec(5, StatusReady), probeOK)}
				in.Instances = running(1, 2, 3, 4, 5)
			}),
			want: actions{
				Transitions: []transition{
					{ID: 5, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"},
					{ID: 4, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"},
				},
				Terminate: []termination{terminateGone(5), terminateGone(4)},
			},
		},
		"spot mix: while spot losses hold the fallback, READY spot replicas do not retire it": {
			in: withInput(func(in *planInput) {
				in.Desired = 3
				in.Mix = policy.MixSpec{UseSpot: true, BaseOnDemand: 1, DynamicFallback: true}
				in.HoldOnDemand = 10
				s1, s2 := rec(1, StatusReady), rec(2, StatusReady)
				s1.Spot, s2.Spot = true, true
				in.Replicas = []replicaView{view(s1, probeOK), view(s2, probeOK), view(rec(3, StatusReady), probeOK),
					view(rec(4, StatusReady), probeOK), view(rec(5, StatusReady), probeOK)}
				in.Instances = running(1, 2, 3, 4, 5)
			}),
			want: actions{},
		},
		"spot mix: a spare missing with the target's spot READY is launched on spot alone": {
			in:   withInput(spareMissing),
			want: actions{LaunchSpot: 1},
		},
		"spot mix: once a spot launch failed, on-demand stands in for the missing spare": {
			in: withInput(func(in *planInput) {
				spareMissing(in)
				in.SpotFailures, in.SpotLastFailure = 1, now
			}),
			// The spot launch backs off; the stand-in goes ahead.
			want: actions{Launch: 1, LaunchDeferredUntil: now.Add(launchBackoff(1))},
		},
		"spot mix: a live stand-in stays until the spare is READY on spot, though the failure count reset": {
			in: withInput(func(in *planInput) {
				spareMissing(in)
				in.Replicas = append(in.Replicas, view(rec(3, StatusReady), probeOK))
				in.Instances = running(1, 2, 3)
			}),
			want: actions{LaunchSpot: 1},
		},
		"spot mix: a held fallback beyond the target goes down to the target": {
			in: withInput(func(in *planInput) {
				in.Desired = 1
				in.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
				in.HoldOnDemand = 10
				s1 := rec(1, StatusReady)
				s1.Spot = true
				in.Replicas = []replicaView{view(s1, probeOK), view(rec(2, StatusReady), probeOK), view(rec(3, StatusReady), probeOK)}
				in.Instances = running(1, 2, 3)
			}),
			want: actions{
				Transitions: []transition{{ID: 3, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"}},
				Terminate:   []termination{terminateGone(3)},
			},
		},
		"spot mix: a preempted spot replica is replaced and on-demand covers it and one more meanwhile": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				in.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
				s1, s2 := rec(1, StatusReady), rec(2, StatusReady)
				s1.Spot, s2.Spot = true, true
				in.Replicas = []replicaView{view(s1, probeOK), view(s2, probeOK)}
				in.Instances = []launcher.Instance{inst(1, launcher.StateRunning, ""), inst(2, launcher.StatePreempted, "spot reclaimed")}
			}),
			want: actions{
				Transitions: []transition{{ID: 2, From: StatusReady, To: StatusPreempted, Reason: "spot reclaimed"}},
				Terminate:   []termination{terminateKeep(2)},
				LaunchSpot:  1,
				// The shortfall and one more (policy.Split), at most the target; the same while
				// the fallback is held (TestPlanHoldsTheFallback: holding changes no launch).
				Launch: 2,
			},
		},
		"spot mix: a noticed spot replica whose replacement serves drains and goes": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				in.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
				s1, s2, s3 := rec(1, StatusReady), rec(2, StatusReady), rec(3, StatusReady)
				s1.Spot, s2.Spot, s3.Spot = true, true, true
				noticed := view(s2, probeOK)
				noticed.Noticed = true
				// Replica 3 is its replacement, READY: 1 and 3 make the target.
				in.Replicas = []replicaView{view(s1, probeOK), noticed, view(s3, probeOK)}
				in.Instances = running(1, 2, 3)
			}),
			want: actions{
				Transitions: []transition{{ID: 2, From: StatusReady, To: StatusShuttingDown, Reason: "spot interruption notice; replaced"}},
				Terminate:   []termination{terminateGone(2)},
			},
		},
		"spot mix: a noticed spot replica serves on while its replacement and fallback (one more) launch": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				in.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
				s1, s2 := rec(1, StatusReady), rec(2, StatusReady)
				s1.Spot, s2.Spot = true, true
				noticed := view(s2, probeOK)
				noticed.Noticed = true
				in.Replicas = []replicaView{view(s1, probeOK), noticed}
				in.Instances = running(1, 2)
			}),
			// The fallback covers the shortfall and one more (policy.Split).
			want: actions{LaunchSpot: 1, Launch: 2},
		},
		"spot mix: spot launch failures back off spot launches only; the fallback goes ahead": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				in.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
				in.SpotFailures, in.SpotLastFailure = 3, now.Add(-time.Second) // backoff 4 s, 3 s to go
			}),
			want: actions{Launch: 2, LaunchDeferredUntil: now.Add(3 * time.Second)},
		},
		"an adopted replica follows its instance's endpoint once it has one": {
			in: withInput(func(in *planInput) {
				in.Desired = 1
				r := rec(1, StatusStarting)
				r.Endpoint = "" // adopted while its pod had no IP yet
				in.Replicas = []replicaView{view(r, notProbedYet)}
				in.Instances = running(1)
			}),
			want: actions{Follow: running(1)},
		},
		"scale down takes burst replicas outside the cluster first, even when cheaper": {
			in: withInput(func(in *planInput) {
				in.Desired = 2
				in.InfraRank = map[string]int{"kubernetes/ctx": 0, "gcp": 1}
				pod1, burst, pod3, other := rec(1, StatusReady), rec(2, StatusReady), rec(3, StatusReady), rec(4, StatusReady)
				pod1.Infra, pod3.Infra, pod1.Price, pod3.Price = "kubernetes/ctx", "kubernetes/ctx", 5, 5
				burst.Infra, burst.Price = "gcp", 1.2
				other.Infra = "local" // not ranked: after every ranked infra
				in.Replicas = []replicaView{view(pod1, probeOK), view(burst, probeOK), view(pod3, probeOK), view(other, probeOK)}
				in.Instances = running(1, 2, 3, 4)
			}),
			want: actions{
				Transitions: []transition{
					{ID: 4, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"},
					{ID: 2, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"},
				},
				Terminate: []termination{terminateGone(4), terminateGone(2)},
			},
		},
		"with draining, scale down only takes a serving replica out of the READY set": {
			in: withInput(func(in *planInput) {
				in.Drain = true
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeOK), view(rec(2, StatusReady), probeOK),
					view(rec(3, StatusStarting), notProbedYet)}
				in.Desired = 1
				in.Instances = running(1, 2, 3)
			}),
			want: actions{
				Transitions: []transition{
					{ID: 3, From: StatusStarting, To: StatusShuttingDown, Reason: "scaled down"},
					{ID: 2, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"},
				},
				Terminate: []termination{terminateGone(3)},
			},
		},
		"a draining replica is terminated once drained": {
			in: withInput(func(in *planInput) {
				in.Drain, in.Desired = true, 0
				in.Replicas = []replicaView{
					{Record: rec(1, StatusShuttingDown), Draining: true},
					view(rec(2, StatusShuttingDown), probeOK),
				}
				in.Instances = running(1, 2)
			}),
			want: actions{Terminate: []termination{terminateGone(2)}},
		},
		"scale down to zero keeps an in-flight launch for the next pass": {
			in: withInput(func(in *planInput) {
				in.Desired = 0
				in.Replicas = []replicaView{
					view(rec(1, StatusReady), probeOK),
					{Record: Record{ID: 2, Status: StatusProvisioning}, Launching: true},
				}
				in.Instances = running(1)
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"}},
				Terminate:   []termination{terminateGone(1)},
			},
		},
		"interrupted launch whose instance exists is followed": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(Record{Service: "svc", ID: 1, Status: StatusProvisioning}, notProbedYet)}
				in.Instances = running(1)
			}),
			want: actions{Transitions: []transition{{ID: 1, From: StatusProvisioning, To: StatusStarting,
				Reason: "adopted instance of an interrupted launch", Instance: new(inst(1, launcher.StateRunning, ""))}}},
		},
		"interrupted launch without instance failed to provision": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(Record{Service: "svc", ID: 1, Status: StatusProvisioning}, notProbedYet)}
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusProvisioning, To: StatusFailedProvision,
					Reason: "launch interrupted: no instance found"}},
				Launch: 1,
			},
		},
		"unrecorded running instance is adopted": {
			in: withInput(func(in *planInput) {
				in.Instances = running(7)
			}),
			want: actions{Adopt: []Record{{Service: "svc", ID: 7, Version: 1, Status: StatusStarting, Reason: "adopted",
				InstanceID: "i-7", Endpoint: "127.0.0.1:9007", Infra: "local", LaunchedAt: t0}}},
		},
		"unrecorded ended instance is recorded as failed and cleaned up": {
			in: withInput(func(in *planInput) {
				in.Desired = 0
				in.Instances = []launcher.Instance{inst(7, launcher.StateTerminated, "exit status 2")}
			}),
			want: actions{
				Adopt: []Record{{Service: "svc", ID: 7, Version: 1, Status: StatusFailed, Reason: "exit status 2",
					InstanceID: "i-7", Endpoint: "127.0.0.1:9007", Infra: "local", LaunchedAt: t0}},
				Terminate: []termination{terminateKeep(7)},
			},
		},
		"instance without a replica id and a duplicate are terminated": {
			in: withInput(func(in *planInput) {
				bad := inst(0, launcher.StateRunning, "")
				bad.ID, bad.Labels = "i-bad", map[string]string{launcher.LabelService: "svc"}
				dup := inst(1, launcher.StateRunning, "")
				dup.ID = "i-dup"
				in.Replicas = []replicaView{view(rec(1, StatusReady), probeOK)}
				in.Instances = append(running(1), bad, dup)
			}),
			want: actions{Terminate: []termination{{InstanceID: "i-bad"}, {InstanceID: "i-dup"}}},
		},
		"shutting down replicas are stopped then forgotten": {
			in: withInput(func(in *planInput) {
				in.Desired = 0
				in.Replicas = []replicaView{
					view(rec(1, StatusShuttingDown), probeOK),
					view(rec(2, StatusShuttingDown), probeOK),
					{Record: rec(3, StatusShuttingDown), Terminating: true},
				}
				in.Instances = running(1, 3)
			}),
			want: actions{Terminate: []termination{terminateGone(1)}, Forget: []int{2}},
		},
		"failed replica whose instance lingers is cleaned up once": {
			in: withInput(func(in *planInput) {
				in.Desired = 0
				in.Replicas = []replicaView{
					view(rec(1, StatusFailed), notProbedYet),
					{Record: rec(2, StatusFailedProbing), Terminating: true},
				}
				in.Instances = []launcher.Instance{inst(1, launcher.StateTerminated, "x"), inst(2, launcher.StateRunning, "")}
			}),
			want: actions{Terminate: []termination{terminateKeep(1)}},
		},
		"repeated failures defer the launch": {
			in: withInput(func(in *planInput) {
				in.ConsecutiveFailures, in.LastFailure = 3, now.Add(-2*time.Second)
			}),
			want: actions{LaunchDeferredUntil: now.Add(2 * time.Second)},
		},
		"launch once the backoff passed": {
			in: withInput(func(in *planInput) {
				in.ConsecutiveFailures, in.LastFailure = 3, now.Add(-4*time.Second)
			}),
			want: actions{Launch: 1},
		},
		"only the newest failures are kept": {
			in: withInput(func(in *planInput) {
				in.Desired, in.KeepFailed = 0, 2
				for id := 1; id <= 4; id++ {
					in.Replicas = append(in.Replicas, view(rec(id, StatusFailed), notProbedYet))
				}
			}),
			want: actions{Forget: []int{1, 2}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := plan(tc.in)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLaunchBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 0, 1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second,
		9: 256 * time.Second, 10: 5 * time.Minute, 1000: 5 * time.Minute} {
		if got := launchBackoff(n); got != want {
			t.Errorf("launchBackoff(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestProbeStateRecord(t *testing.T) {
	errDown := errTest("down")
	s := probeState{}.record(t0, errDown)
	s = s.record(t0.Add(time.Second), errDown)
	if want := (probeState{At: t0.Add(time.Second), FailingSince: t0, Err: "down"}); s != want {
		t.Errorf("after two failures = %+v, want %+v", s, want)
	}
	s = s.record(t0.Add(2*time.Second), nil)
	s = s.record(t0.Add(3*time.Second), errDown)
	if want := (probeState{At: t0.Add(3 * time.Second), FailingSince: t0.Add(3 * time.Second), Err: "down"}); s != want {
		t.Errorf("failure after success = %+v, want %+v", s, want)
	}
}

type errTest string

func (e errTest) Error() string { return string(e) }

// spareMissing is a spot service with a dynamic fallback whose target of 2 runs READY on spot
// while a zone's ceiling asks for a spare that is not there.
func spareMissing(in *planInput) {
	in.Desired = 2
	in.Mix = policy.MixSpec{UseSpot: true, DynamicFallback: true}
	in.Spare = 1
	s1, s2 := rec(1, StatusReady), rec(2, StatusReady)
	s1.Spot, s2.Spot = true, true
	in.Replicas = []replicaView{view(s1, probeOK), view(s2, probeOK)}
	in.Instances = running(1, 2)
}
