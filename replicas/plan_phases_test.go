package replicas

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/policy"
)

// Table tests of plan's phases, each on a pass set up as the earlier phases would leave it.
// TestPlan and TestPlanRollout test the phases together.

func readyCand(id int, healthyFor time.Duration, now time.Time) candidate {
	return candidate{id: id, ready: true, current: true, healthySince: now.Add(-healthyFor)}
}

func TestWeighRollout(t *testing.T) {
	now := t0.Add(time.Hour)
	rolling := &Rollout{From: 1, To: 2, Mode: configs.UpdateRolling, State: RolloutInProgress,
		Policy: configs.Update{MinHealthySeconds: 60}, ProgressAt: t0}
	blueGreen := &Rollout{From: 1, To: 2, Mode: configs.UpdateBlueGreen, State: RolloutInProgress, ProgressAt: t0}
	type want struct {
		Holding, Switched         bool
		Healthy, KeepOld, OldLeft int
		ProgressAt                time.Time
	}
	tests := map[string]struct {
		rollout  *Rollout
		desired  int
		switchAt int
		current  []candidate
		old      int
		want     want
	}{
		"no rollout keeps no old replica": {
			desired: 3, current: []candidate{readyCand(1, time.Hour, now)}, old: 2,
			want: want{Healthy: 1, OldLeft: 2},
		},
		"rolling keeps what the healthy new replicas cannot carry": {
			rollout: rolling, desired: 3, old: 3,
			current: []candidate{readyCand(4, 2*time.Minute, now), readyCand(5, 30*time.Second, now), {id: 6, current: true}},
			want:    want{Holding: true, Healthy: 1, KeepOld: 2, OldLeft: 3, ProgressAt: now.Add(-time.Minute)},
		},
		"blue-green keeps the whole target until it switches": {
			rollout: blueGreen, desired: 2, switchAt: 2, old: 2,
			current: []candidate{readyCand(3, time.Minute, now)},
			want:    want{Holding: true, Healthy: 1, KeepOld: 2, OldLeft: 2, ProgressAt: now.Add(-time.Minute)},
		},
		"blue-green switches once the new version carries the target": {
			rollout: blueGreen, desired: 2, switchAt: 2, old: 2,
			current: []candidate{readyCand(3, time.Minute, now), readyCand(4, time.Second, now)},
			want:    want{Holding: true, Switched: true, Healthy: 2, OldLeft: 2, ProgressAt: now.Add(-time.Second)},
		},
		"no target yet holds everything": {
			rollout: rolling, desired: -1, old: 2,
			want: want{Holding: true, OldLeft: 2},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newPass(planInput{Now: now, Desired: tc.desired, Rollout: tc.rollout, SwitchAt: tc.switchAt})
			p.current = tc.current
			p.old = make([]candidate, tc.old)
			w := p.weighRollout()
			got := want{Holding: w.holding, Switched: w.switched, Healthy: w.healthy, KeepOld: w.keepOld, OldLeft: w.oldLeft, ProgressAt: w.progressAt}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("weighRollout (-want +got):\n%s", diff)
			}
		})
	}
}

func TestScaleKinds(t *testing.T) {
	spot := func(id int, ready bool) candidate { return candidate{id: id, ready: ready, spot: true, current: true} }
	onDemand := func(id int, ready bool) candidate { return candidate{id: id, ready: ready, current: true} }
	tests := map[string]struct {
		desired       int
		mix           policy.MixSpec
		current       []candidate
		launchingSpot int
		wantDown      []int
		wantWant      policy.Mix
	}{
		"a service without spot is one pool": {
			desired: 2, current: []candidate{spot(1, true), onDemand(2, true), spot(3, true)},
			wantDown: []int{3}, wantWant: policy.Mix{OnDemand: 2},
		},
		"each kind to its share": {
			desired: 2, mix: policy.MixSpec{UseSpot: true, BaseOnDemand: 1},
			current:  []candidate{spot(1, true), spot(2, true), onDemand(3, true), onDemand(4, true)},
			wantDown: []int{4, 2}, wantWant: policy.Mix{Spot: 1, OnDemand: 1},
		},
		"a READY replica over its kind's share stays while the other kind starts": {
			// base_ondemand lowered to 0: the on-demand replica serves until the spot one is READY.
			desired: 1, mix: policy.MixSpec{UseSpot: true}, launchingSpot: 1,
			current:  []candidate{onDemand(1, true)},
			wantWant: policy.Mix{Spot: 1},
		},
		"then goes once the other kind is READY": {
			desired: 1, mix: policy.MixSpec{UseSpot: true},
			current:  []candidate{onDemand(1, true), spot(2, true)},
			wantDown: []int{1}, wantWant: policy.Mix{Spot: 1},
		},
		"replicas not serving go first, and may all go": {
			desired: 1, mix: policy.MixSpec{UseSpot: true},
			current:  []candidate{onDemand(1, false), onDemand(2, false), spot(3, false)},
			wantDown: []int{2, 1}, wantWant: policy.Mix{Spot: 1},
		},
		"to zero": {
			desired: 0, current: []candidate{onDemand(1, true), onDemand(2, true)},
			wantDown: []int{2, 1}, wantWant: policy.Mix{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := newPass(planInput{Desired: tc.desired, Mix: tc.mix})
			p.current = slices.Clone(tc.current)
			p.launchingSpot, p.launching = tc.launchingSpot, tc.launchingSpot
			for _, c := range p.current {
				p.status[c.id] = StatusStarting
				if c.ready {
					p.status[c.id] = StatusReady
				}
			}
			split := p.scaleKinds()
			var down []int
			for _, tr := range p.out.Transitions {
				down = append(down, tr.ID)
			}
			if diff := cmp.Diff(tc.wantDown, down); diff != "" {
				t.Errorf("scaled down (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantWant, split.want); diff != "" {
				t.Errorf("split (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLaunchPhase(t *testing.T) {
	now := t0.Add(time.Hour)
	rolling := &Rollout{Mode: configs.UpdateRolling, State: RolloutInProgress, Policy: configs.Update{MaxParallel: 2}}
	tests := map[string]struct {
		in                    planInput
		want                  policy.Mix
		liveSpot, liveOD      int
		holding               bool
		healthy, current      int
		wantLaunch, wantSpot  int
		wantDeferredUntilZero bool
	}{
		"what each kind misses": {
			in: planInput{Desired: 4}, want: policy.Mix{Spot: 3, OnDemand: 1}, liveSpot: 1,
			wantLaunch: 1, wantSpot: 2, wantDeferredUntilZero: true,
		},
		"on-demand backoff holds on-demand only": {
			in:   planInput{Desired: 4, ConsecutiveFailures: 3, LastFailure: now.Add(-time.Second)},
			want: policy.Mix{Spot: 3, OnDemand: 1}, wantSpot: 3,
		},
		"spot backoff holds spot only": {
			in:   planInput{Desired: 4, SpotFailures: 2, SpotLastFailure: now.Add(-time.Second)},
			want: policy.Mix{Spot: 3, OnDemand: 1}, wantLaunch: 1,
		},
		"an expired backoff holds nothing": {
			in:   planInput{Desired: 1, ConsecutiveFailures: 1, LastFailure: now.Add(-time.Minute)},
			want: policy.Mix{OnDemand: 1}, wantLaunch: 1, wantDeferredUntilZero: true,
		},
		"a rollout starts at most max_parallel at once": {
			in: planInput{Desired: 6, Rollout: rolling}, want: policy.Mix{Spot: 3, OnDemand: 3},
			holding: true, current: 1, healthy: 0, liveOD: 1,
			wantLaunch: 1, wantDeferredUntilZero: true,
		},
		"no target yet launches nothing": {
			in: planInput{Desired: -1}, want: policy.Mix{OnDemand: 2}, wantDeferredUntilZero: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.in.Now = now
			p := newPass(tc.in)
			p.current = make([]candidate, tc.current)
			p.launch(rolloutWeight{holding: tc.holding, healthy: tc.healthy}, kindSplit{want: tc.want, liveSpot: tc.liveSpot, liveOnDemand: tc.liveOD})
			if p.out.Launch != tc.wantLaunch || p.out.LaunchSpot != tc.wantSpot {
				t.Errorf("launch %d on-demand, %d spot; want %d, %d", p.out.Launch, p.out.LaunchSpot, tc.wantLaunch, tc.wantSpot)
			}
			if p.out.LaunchDeferredUntil.IsZero() != tc.wantDeferredUntilZero {
				t.Errorf("deferred until %v", p.out.LaunchDeferredUntil)
			}
		})
	}
}

func TestScaleDownOrder(t *testing.T) {
	cands := []candidate{
		{id: 1, ready: true, rank: 0, price: 1},
		{id: 2, ready: true, rank: 1, price: 1}, // burst infra
		{id: 3, ready: false, rank: 0, price: 1},
		{id: 4, ready: true, rank: 0, price: 3}, // on-demand price
		{id: 5, ready: true, rank: 0, price: 1},
		// Spot, two in zone a and one, dearer, in zone b.
		{id: 6, ready: true, spot: true, price: 0.5, zone: "aws/b", crowd: 1},
		{id: 7, ready: true, spot: true, price: 0.4, zone: "aws/a", crowd: 2},
		{id: 8, ready: true, spot: true, price: 0.4, zone: "aws/a", crowd: 2},
	}
	slices.SortFunc(cands, scaleDownOrder)
	var got []int
	for _, c := range cands {
		got = append(got, c.id)
	}
	// Not serving, then the least preferred infra, then on-demand before spot, then the most
	// crowded zone's spot replicas, then the most expensive, then the newest.
	if diff := cmp.Diff([]int{3, 2, 4, 5, 1, 8, 7, 6}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestForgetEnded(t *testing.T) {
	p := newPass(planInput{KeepFailed: 2})
	for id, s := range map[int]Status{1: StatusFailed, 2: StatusPreempted, 3: StatusReady, 4: StatusFailedProbing, 5: StatusFailed, 6: StatusFailed} {
		p.status[id] = s
	}
	p.hasInstance[2] = true // its instance is still being cleaned up
	p.terminating[1] = true
	p.forgetEnded()
	// The two newest failures stay (6, 5); of the rest, those with an instance left wait.
	if diff := cmp.Diff([]int{4}, p.out.Forget); diff != "" {
		t.Errorf("forgotten (-want +got):\n%s", diff)
	}
}
