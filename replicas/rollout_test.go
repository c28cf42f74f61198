package replicas

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

func versioned(r Record, v int) Record {
	r.Version = v
	return r
}

func TestPlanRollout(t *testing.T) {
	now := t0.Add(time.Minute)
	healthyLongAgo := now.Add(-time.Minute)
	justReady := now.Add(-time.Second)
	rolling := func(mutate ...func(*Rollout)) *Rollout {
		r := &Rollout{From: 1, To: 2, Mode: configs.UpdateRolling, State: RolloutInProgress, FromServed: true,
			Policy: configs.Update{Mode: configs.UpdateRolling, MaxParallel: 1, MinHealthySeconds: 10,
				ProgressDeadlineSeconds: 600, AutoRollback: true},
			StartedAt: t0, ProgressAt: t0}
		for _, f := range mutate {
			f(r)
		}
		return r
	}
	blueGreen := func(r *Rollout) { r.Mode, r.Policy.Mode = configs.UpdateBlueGreen, configs.UpdateBlueGreen }
	ready := func(id, version int, since time.Time) replicaView {
		v := view(versioned(rec(id, StatusReady), version), probeOK)
		v.HealthySince = since
		return v
	}
	base := planInput{Now: now, Service: "svc", Desired: 2, InitialDelay: 20 * time.Minute,
		FailureThreshold: 3 * time.Minute, KeepFailed: 10, Drain: true, Target: 2, SwitchAt: 2}

	tests := map[string]struct {
		mutate func(*planInput)
		want   actions
	}{
		"rolling starts max_parallel new replicas and keeps every old one": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo)}
				in.Instances = running(1, 2)
			},
			want: actions{Launch: 1},
		},
		"a new replica READY but not yet healthy retires nothing": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo), ready(3, 2, justReady)}
				in.Instances = running(1, 2, 3)
			},
			want: actions{},
		},
		"a healthy new replica retires one old (draining) and the next one starts": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo), ready(3, 2, healthyLongAgo)}
				in.Instances = running(1, 2, 3)
			},
			want: actions{
				Transitions: []transition{{ID: 2, From: StatusReady, To: StatusShuttingDown, Reason: "replaced by version 2"}},
				Launch:      1,
				Rollout:     &rolloutChange{ProgressAt: healthyLongAgo.Add(10 * time.Second)},
			},
		},
		"rolling succeeds once the target is healthy and no old replica is left": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				in.Replicas = []replicaView{ready(3, 2, healthyLongAgo), ready(4, 2, healthyLongAgo)}
				in.Instances = running(3, 4)
			},
			want: actions{Rollout: &rolloutChange{End: RolloutSucceeded, Reason: "2 of 2 replicas of version 2 healthy",
				ProgressAt: healthyLongAgo.Add(10 * time.Second)}},
		},
		"a noticed old replica is still old: the rollout does not end while it serves": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				noticed := ready(2, 1, healthyLongAgo)
				noticed.Noticed = true
				in.Replicas = []replicaView{noticed, ready(3, 2, healthyLongAgo), ready(4, 2, healthyLongAgo)}
				in.Instances = running(2, 3, 4)
			},
			want: actions{
				Transitions: []transition{{ID: 2, From: StatusReady, To: StatusShuttingDown, Reason: "replaced by version 2"}},
				Rollout:     &rolloutChange{ProgressAt: healthyLongAgo.Add(10 * time.Second)},
			},
		},
		"a new replica that crashes before it is healthy rolls back": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				r := view(versioned(rec(3, StatusStarting), 2), notProbedYet)
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo), r}
				in.Instances = append(running(1, 2), inst(3, launcher.StateTerminated, "exit status 1"))
			},
			want: actions{
				Transitions: []transition{{ID: 3, From: StatusStarting, To: StatusFailed, Reason: "exit status 1"}},
				Terminate:   []termination{terminateKeep(3)},
				// The manager saves the verdict and plans again under it before acting.
				Launch:  1,
				Rollout: &rolloutChange{End: RolloutRolledBack, Reason: "replica 3 of version 2: FAILED: exit status 1"},
			},
		},
		"without a version that ever served the rollout fails and stays": {
			mutate: func(in *planInput) {
				in.Rollout = rolling(func(r *Rollout) { r.FromServed = false })
				r := view(versioned(rec(3, StatusStarting), 2), notProbedYet)
				in.Replicas = []replicaView{r}
				in.Instances = []launcher.Instance{inst(3, launcher.StateTerminated, "exit status 1")}
			},
			want: actions{
				Transitions: []transition{{ID: 3, From: StatusStarting, To: StatusFailed, Reason: "exit status 1"}},
				Terminate:   []termination{terminateKeep(3)},
				Launch:      1,
				Rollout:     &rolloutChange{End: RolloutFailed, Reason: "replica 3 of version 2: FAILED: exit status 1"},
			},
		},
		"no progress within the deadline rolls back": {
			mutate: func(in *planInput) {
				in.Rollout = rolling(func(r *Rollout) { r.Policy.ProgressDeadlineSeconds = 30 })
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo),
					view(versioned(rec(3, StatusStarting), 2), probeFailing)}
				in.Instances = running(1, 2, 3)
			},
			want: actions{Rollout: &rolloutChange{End: RolloutRolledBack,
				Reason: "no new replica became healthy within the progress deadline (30s)"}},
		},
		"after a rollback the new version's replicas go and the old one is restored": {
			mutate: func(in *planInput) {
				in.Rollout = rolling(func(r *Rollout) { r.State = RolloutRolledBack })
				in.Target = 1
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(3, 2, justReady)}
				in.Instances = running(1, 3)
			},
			want: actions{
				Transitions: []transition{{ID: 3, From: StatusReady, To: StatusShuttingDown, Reason: "replaced by version 1"}},
				Launch:      1,
			},
		},
		"only the service section changed: replicas are relabelled, not relaunched": {
			mutate: func(in *planInput) {
				in.Rollout = rolling()
				in.LaunchedAs = map[int]int{1: 1, 2: 1}
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo)}
				in.Instances = running(1, 2)
			},
			want: actions{Relabel: []int{1, 2}, Rollout: &rolloutChange{End: RolloutSucceeded,
				Reason: "2 of 2 replicas of version 2 healthy", ProgressAt: healthyLongAgo.Add(10 * time.Second)}},
		},
		"blue-green keeps the whole old fleet until the new one can carry the target": {
			mutate: func(in *planInput) {
				in.Rollout = rolling(blueGreen)
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo), ready(3, 2, healthyLongAgo)}
				in.Instances = running(1, 2, 3)
			},
			want: actions{Launch: 1, Rollout: &rolloutChange{ProgressAt: healthyLongAgo.Add(10 * time.Second)}},
		},
		"blue-green switches and retires the old fleet at once": {
			mutate: func(in *planInput) {
				in.Rollout = rolling(blueGreen, func(r *Rollout) { r.ProgressAt = now })
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo),
					ready(3, 2, healthyLongAgo), ready(4, 2, healthyLongAgo)}
				in.Instances = running(1, 2, 3, 4)
			},
			want: actions{
				Transitions: []transition{
					{ID: 2, From: StatusReady, To: StatusShuttingDown, Reason: "replaced by version 2"},
					{ID: 1, From: StatusReady, To: StatusShuttingDown, Reason: "replaced by version 2"},
				},
				// Done on the next pass, once the set without the old fleet is out.
				Rollout: &rolloutChange{Switched: true},
			},
		},
		"max_parallel counts launches under way": {
			mutate: func(in *planInput) {
				in.Desired = 4
				in.Rollout = rolling(func(r *Rollout) { r.Policy.MaxParallel = 2 })
				in.Replicas = []replicaView{ready(1, 1, healthyLongAgo), ready(2, 1, healthyLongAgo),
					ready(3, 1, healthyLongAgo), ready(4, 1, healthyLongAgo),
					{Record: versioned(Record{ID: 5, Status: StatusProvisioning}, 2), Launching: true}}
				in.Instances = running(1, 2, 3, 4)
			},
			want: actions{Launch: 1},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			in := base
			tt.mutate(&in)
			got := plan(in)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServing(t *testing.T) {
	old1, old2 := versioned(rec(1, StatusReady), 1), versioned(rec(2, StatusReady), 1)
	new3 := versioned(rec(3, StatusReady), 2)
	self := func(v int) int { return v }
	bg := &Rollout{From: 1, To: 2, Mode: configs.UpdateBlueGreen, State: RolloutInProgress}
	ids := func(recs []Record) []int {
		var out []int
		for _, r := range recs {
			out = append(out, r.ID)
		}
		return out
	}
	tests := map[string]struct {
		r     *Rollout
		ready []Record
		want  []int
	}{
		"no rollout: all":                          {nil, []Record{old1, new3}, []int{1, 3}},
		"rolling: every version":                   {&Rollout{Mode: configs.UpdateRolling, State: RolloutInProgress}, []Record{old1, new3}, []int{1, 3}},
		"blue-green before the switch: old only":   {bg, []Record{old1, old2, new3}, []int{1, 2}},
		"blue-green after the switch: new only":    {&Rollout{From: 1, To: 2, Mode: configs.UpdateBlueGreen, State: RolloutInProgress, Switched: true}, []Record{old1, new3}, []int{3}},
		"blue-green with no old READY: new serves": {bg, []Record{new3}, []int{3}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, ids(serving(tt.r, 2, self, tt.ready))); diff != "" {
				t.Errorf("serving (-want +got):\n%s", diff)
			}
		})
	}
}
