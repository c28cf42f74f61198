package replicas

import (
	"maps"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// Property tests of plan: rapid draws whole services (records in every status, their
// instances, strays and unowned ones, rollouts in every state, spot mixes, backoff) and checks
// what must hold of any pass, whatever the inputs.

var allStatuses = []Status{StatusPending, StatusProvisioning, StatusStarting, StatusReady, StatusNotReady,
	StatusShuttingDown, StatusPreempted, StatusFailed, StatusFailedInitialDelay, StatusFailedProbing,
	StatusFailedProvision, StatusFailedCleanup, StatusUnknown}

// drawPlanInput draws one pass's input.
func drawPlanInput(t *rapid.T) planInput {
	now := t0.Add(time.Hour)
	in := planInput{Now: now, Service: "svc", InitialDelay: 20 * time.Minute, FailureThreshold: 3 * time.Minute,
		KeepFailed: rapid.IntRange(0, 3).Draw(t, "keepFailed"), Drain: rapid.Bool().Draw(t, "drain"),
		Desired: rapid.IntRange(-1, 6).Draw(t, "desired")}
	if rapid.Bool().Draw(t, "spot") {
		in.Mix = policy.MixSpec{UseSpot: true, BaseOnDemand: rapid.IntRange(0, 2).Draw(t, "base"),
			DynamicFallback: rapid.Bool().Draw(t, "dynamic")}
		in.HoldOnDemand = rapid.IntRange(0, 4).Draw(t, "holdOnDemand")
		in.Spare = rapid.IntRange(0, 1).Draw(t, "spare")
	}
	if rapid.Bool().Draw(t, "backoff") {
		in.ConsecutiveFailures = rapid.IntRange(1, 4).Draw(t, "failures")
		in.LastFailure = now.Add(-time.Duration(rapid.IntRange(0, 20).Draw(t, "sinceFailure")) * time.Second)
	}
	drawVersions(t, &in)
	n := rapid.IntRange(0, 8).Draw(t, "replicas")
	for id := 1; id <= n; id++ {
		view, insts := drawReplica(t, &in, id)
		in.Replicas = append(in.Replicas, view)
		in.Instances = append(in.Instances, insts...)
	}
	for range rapid.IntRange(0, 2).Draw(t, "unowned") {
		id := rapid.IntRange(1, 12).Draw(t, "unownedID")
		head := drawInstance(t, id, rapid.IntRange(1, max(in.Target, 1)).Draw(t, "unownedVersion"), "u")
		var workers []launcher.Instance
		if size := rapid.SampledFrom([]int{1, 2, 3}).Draw(t, "unownedNodes"); size > 1 {
			workers = drawGang(t, &head, size)
		}
		if rapid.IntRange(0, 4).Draw(t, "unownedHeadless") > 0 {
			in.Instances = append(in.Instances, head)
		}
		in.Instances = append(in.Instances, workers...)
	}
	return in
}

// drawVersions draws the versions and the rollout: none, or one in any state between the last
// two versions, with a target version that follows it.
func drawVersions(t *rapid.T, in *planInput) {
	in.Target = rapid.IntRange(0, 3).Draw(t, "target")
	if in.Target < 2 || !rapid.Bool().Draw(t, "rollout") {
		return
	}
	if rapid.Bool().Draw(t, "relabelled") {
		in.LaunchedAs = map[int]int{in.Target: in.Target - 1}
	}
	r := &Rollout{From: in.Target - 1, To: in.Target, Mode: rapid.SampledFrom([]string{configs.UpdateRolling, configs.UpdateBlueGreen}).Draw(t, "mode"),
		State:      rapid.SampledFrom([]RolloutState{RolloutInProgress, RolloutSucceeded, RolloutRolledBack, RolloutFailed}).Draw(t, "state"),
		Switched:   rapid.Bool().Draw(t, "switched"),
		FromServed: rapid.Bool().Draw(t, "fromServed"), StartedAt: t0, ProgressAt: t0.Add(30 * time.Minute)}
	r.Policy = configs.Update{Mode: r.Mode, MaxParallel: rapid.IntRange(0, 2).Draw(t, "maxParallel"),
		MinHealthySeconds: rapid.IntRange(0, 120).Draw(t, "minHealthy"), AutoRollback: rapid.Bool().Draw(t, "autoRollback"),
		ProgressDeadlineSeconds: rapid.SampledFrom([]int{0, 600, 7200}).Draw(t, "deadline")}
	in.Rollout = r
	in.Target = r.Target()
	in.SwitchAt = max(in.Desired, 1)
}

// drawReplica draws one record with the view the manager would give it, and its instances.
func drawReplica(t *rapid.T, in *planInput, id int) (replicaView, []launcher.Instance) {
	status := rapid.SampledFrom(allStatuses).Draw(t, "status")
	version := rapid.IntRange(1, max(in.Target, 1)).Draw(t, "version")
	r := rec(id, status)
	r.Version = version
	r.Spot = rapid.Bool().Draw(t, "recSpot")
	r.Price = float64(rapid.IntRange(1, 4).Draw(t, "price"))
	r.Infra = rapid.SampledFrom([]string{"local", "kubernetes/c", "aws"}).Draw(t, "infra")
	if rapid.Bool().Draw(t, "everReady") {
		r.ReadyAt = t0.Add(time.Minute)
	}
	v := replicaView{Record: r}
	switch status {
	case StatusProvisioning:
		v.Launching = rapid.Bool().Draw(t, "launching")
	case StatusShuttingDown:
		v.Draining = rapid.Bool().Draw(t, "draining")
	case StatusReady:
		v.HealthySince = in.Now.Add(-time.Duration(rapid.IntRange(0, 300).Draw(t, "healthyFor")) * time.Second)
	}
	v.Terminating = rapid.IntRange(0, 4).Draw(t, "terminating") == 0
	v.Noticed = live(status) && rapid.IntRange(0, 5).Draw(t, "noticed") == 0
	if probeable(status) {
		v.Probe = rapid.SampledFrom([]probeState{probeOK, probeFailing, notProbedYet}).Draw(t, "probe")
	}
	var insts []launcher.Instance
	size := rapid.SampledFrom([]int{1, 1, 2, 3}).Draw(t, "nodes")
	if v.Launching || rapid.IntRange(0, 4).Draw(t, "noInstance") == 0 {
		return v, nil
	}
	own := drawInstance(t, id, version, "")
	own.Labels[LabelKind] = kindOnDemand // launched as the kind its record says
	if r.Spot {
		own.Labels[LabelKind] = kindSpot
	}
	insts = append(insts, own)
	if size > 1 {
		workers := drawGang(t, &own, size)
		insts = append(insts[:0], own)
		insts = append(insts, workers...)
		if rapid.Bool().Draw(t, "nodesRecorded") {
			v.Record.Nodes = []string{own.ID}
			for rank := 1; rank < size; rank++ {
				v.Record.Nodes = append(v.Record.Nodes, own.ID+"-"+strconv.Itoa(rank))
			}
		}
		v.InGap = rapid.IntRange(0, 3).Draw(t, "inGap") == 0
	}
	if rapid.IntRange(0, 6).Draw(t, "stray") == 0 {
		insts = append(insts, drawInstance(t, id, version, "s"))
	}
	return v, insts
}

// drawGang makes head the head of a gang of size nodes and draws its other nodes: each
// listed or not, in any state, and now and then one elsewhere than the head (a stray).
func drawGang(t *rapid.T, head *launcher.Instance, size int) []launcher.Instance {
	head.Labels[launcher.LabelNodeRank] = "0"
	head.Labels[LabelNodes] = strconv.Itoa(size)
	var out []launcher.Instance
	for rank := 1; rank < size; rank++ {
		if rapid.IntRange(0, 4).Draw(t, "nodeMissing") == 0 {
			continue
		}
		n := *head
		n.ID = head.ID + "-" + strconv.Itoa(rank)
		n.Labels = maps.Clone(head.Labels)
		n.Labels[launcher.LabelNodeRank] = strconv.Itoa(rank)
		n.State = rapid.SampledFrom([]launcher.State{launcher.StateRunning, launcher.StateRunning, launcher.StatePending,
			launcher.StateTerminated, launcher.StatePreempted}).Draw(t, "nodeState")
		out = append(out, n)
		if rapid.IntRange(0, 5).Draw(t, "nodeElsewhere") == 0 {
			far := n
			far.ID, far.Zone = n.ID+"-far", "elsewhere"
			out = append(out, far)
		}
	}
	return out
}

// drawInstance draws an instance labelled with replica id; a suffix makes a second one (a
// stray, or an instance no record owns).
func drawInstance(t *rapid.T, id, version int, suffix string) launcher.Instance {
	i := inst(id, rapid.SampledFrom([]launcher.State{launcher.StateRunning, launcher.StateRunning, launcher.StatePending,
		launcher.StateTerminated, launcher.StatePreempted}).Draw(t, "instState"), "")
	i.ID += suffix
	i.Labels[launcher.LabelVersion] = strconv.Itoa(version)
	if rapid.Bool().Draw(t, "instSpot") {
		i.Labels[LabelKind] = kindSpot
	}
	return i
}

// fleetAfter is what a pass leaves live, counted as the next pass would: replicas that count
// toward the target (launches included), of the target version and of older ones, without
// those warned of their reclaim.
type fleetAfter struct {
	current, old, readyCurrent, launches int
	// spot and onDemand split current by kind; healthy counts the current ones READY for
	// the rollout's min_healthy_seconds.
	spot, onDemand, healthy int
}

func countAfter(in planInput, out actions) fleetAfter {
	p := newPass(in)
	status := map[int]Status{}
	for _, r := range in.Replicas {
		status[r.Record.ID] = r.Record.Status
	}
	for _, rec := range out.Adopt {
		status[rec.ID] = rec.Status
	}
	for _, tr := range out.Transitions {
		status[tr.ID] = tr.To
	}
	var f fleetAfter
	// A launch under way cannot be called back: one of a kind beyond its share of the target
	// (the mix changed since) goes once it has an instance, and is no decision of this pass.
	share := policy.Split(in.Desired, in.Mix, 0, in.spare())
	if !in.Mix.UseSpot {
		share = policy.Mix{OnDemand: max(in.Desired, 0)}
	}
	launching := map[bool]int{}
	count := func(id, version int, spot, noticed bool, healthySince time.Time) {
		s := status[id]
		if !live(s) || noticed {
			return
		}
		if !p.isCurrent(version) {
			f.old++
			return
		}
		f.current++
		if spot && in.Mix.UseSpot {
			f.spot++
		} else {
			f.onDemand++
		}
		if s == StatusReady {
			f.readyCurrent++
			if !healthySince.IsZero() && in.Now.Sub(healthySince) >= in.minHealthy() {
				f.healthy++
			}
		}
	}
	for _, r := range in.Replicas {
		if r.Launching {
			// Likewise a launch of a version no longer wanted.
			if p.isCurrent(r.Record.Version) && live(r.Record.Status) {
				launching[r.Record.Spot && in.Mix.UseSpot]++
			}
			continue
		}
		count(r.Record.ID, r.Record.Version, r.Record.Spot, r.Noticed && p.isCurrent(r.Record.Version), r.HealthySince)
	}
	for _, rec := range out.Adopt {
		count(rec.ID, rec.Version, rec.Spot, false, time.Time{})
	}
	f.launches = out.Launch + out.LaunchSpot
	spot := out.LaunchSpot + min(launching[true], share.Spot)
	onDemand := out.Launch + min(launching[false], share.OnDemand)
	f.spot += spot
	f.onDemand += onDemand
	f.current += spot + onDemand
	return f
}

// TestPlanNeverLaunchesAboveTheSurge: a pass that launches a kind leaves no more live
// replicas of that kind than its share of the target (SkyServe's split: with dynamic fallback,
// on-demand replicas beside the spot ones not READY yet); during a rollout, no more than
// max_parallel new replicas starting and no more old ones than the target; without spot or a
// rollout, no more than the target in all. (A READY replica of a kind over its share may stay
// beside its replacement's launch: see TestPlanKeepsReadyReplicasBelowTarget.)
func TestPlanNeverLaunchesAboveTheSurge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		f := countAfter(in, out)
		if f.launches == 0 {
			return
		}
		if in.Desired < 0 {
			t.Fatalf("launched %d with no target yet", f.launches)
		}
		checkShares(t, in, out, f)
		ro := in.Rollout
		switch holding := ro != nil && (ro.State == RolloutInProgress || ro.State == RolloutFailed); {
		case holding && f.old > in.Desired:
			t.Fatalf("launched %d and keeps %d old replicas for a target of %d\nactions %+v", f.launches, f.old, in.Desired, out)
		case holding && f.current-f.healthy > maxParallel(ro.Policy, in.Desired):
			t.Fatalf("launched %d and leaves %d new replicas starting; max_parallel %d\nactions %+v",
				f.launches, f.current-f.healthy, maxParallel(ro.Policy, in.Desired), out)
		case !holding && !in.Mix.UseSpot && f.current+f.old > in.Desired:
			t.Fatalf("launched %d and leaves %d live for a target of %d\nactions %+v", f.launches, f.current+f.old, in.Desired, out)
		}
	})
}

// checkShares fails t when out launched a kind beyond its share of the target.
func checkShares(t *rapid.T, in planInput, out actions, f fleetAfter) {
	share := policy.Split(in.Desired, in.Mix, 0, in.spare())
	if out.LaunchSpot > 0 && f.spot > share.Spot {
		t.Fatalf("launched %d spot and leaves %d spot live; share %d\nactions %+v", out.LaunchSpot, f.spot, share.Spot, out)
	}
	if out.Launch > 0 && f.onDemand > share.OnDemand {
		t.Fatalf("launched %d on-demand and leaves %d on-demand live; share %d\nactions %+v", out.Launch, f.onDemand, share.OnDemand, out)
	}
}

// settle plans as the manager does (passRoundOwned): a verdict on the rollout is saved and the
// pass planned again under it before anything acts.
func settle(in planInput) (planInput, actions) {
	out := plan(in)
	for range 4 {
		if out.Rollout == nil {
			break
		}
		next := withRollout(in, out.Rollout)
		if *next.Rollout == *in.Rollout {
			break
		}
		in = next
		out = plan(in)
	}
	return in, out
}

// withRollout is in with a plan's verdict on its rollout saved (verdictOwned).
func withRollout(in planInput, ch *rolloutChange) planInput {
	r := *in.Rollout
	r.Switched = r.Switched || ch.Switched
	if ch.End != "" {
		r.State, r.Reason = ch.End, ch.Reason
	}
	if !ch.ProgressAt.IsZero() && ch.ProgressAt.After(r.ProgressAt) {
		r.ProgressAt = ch.ProgressAt
	}
	in.Rollout = &r
	in.Target = r.Target()
	return in
}

// TestPlanKeepsReadyReplicasBelowTarget: a pass stops a READY replica of the target version
// only when as many READY ones of it as the target remain.
func TestPlanKeepsReadyReplicasBelowTarget(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		p := newPass(in)
		ready := map[int]bool{}
		for _, r := range in.Replicas {
			// READY now and staying so but for this pass's scale-down: its probe passes.
			if to, _ := liveStatus(in, r, instanceOf(in, r)); r.Record.Status == StatusReady && to == StatusReady &&
				p.isCurrent(r.Record.Version) && !r.Noticed {
				ready[r.Record.ID] = true
			}
		}
		f := countAfter(in, out)
		for _, tr := range out.Transitions {
			if ready[tr.ID] && tr.To == StatusShuttingDown && f.readyCurrent < in.Desired {
				t.Fatalf("stopped READY replica %d (%s) leaving %d READY of a target of %d\nactions %+v",
					tr.ID, tr.Reason, f.readyCurrent, in.Desired, out)
			}
		}
	})
}

// TestPlanLaunchesOncePerSlot: planning again on what a pass did (its launches under way, its
// transitions saved, its terminations running) launches no replica a second time: the second
// pass too keeps each kind within its share, counting the first pass's launches; and it
// terminates no instance twice.
func TestPlanLaunchesOncePerSlot(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		next, again := settle(applied(in, out))
		checkShares(t, next, again, countAfter(next, again))
		terminated := map[string]bool{}
		for _, term := range out.Terminate {
			for _, id := range append([]string{term.InstanceID}, term.Nodes...) {
				terminated[id] = true
			}
		}
		for _, term := range again.Terminate {
			for _, id := range append([]string{term.InstanceID}, term.Nodes...) {
				if terminated[id] {
					t.Fatalf("instance %s terminated again for replica %d\nfirst %+v\nsecond %+v", id, term.ReplicaID, out, again)
				}
			}
		}
	})
}

// instanceOf is the instance followRecords would judge r's replica by (its gang's, plan_gang.go).
func instanceOf(in planInput, r replicaView) *launcher.Instance {
	g, _ := pickGang(r.Record, labelledWith(in, r.Record.ID))
	return g.judged(r.InGap)
}

// labelledWith are the listed instances that carry replica id.
func labelledWith(in planInput, id int) []launcher.Instance {
	var mine []launcher.Instance
	for _, i := range in.Instances {
		if i.Labels[launcher.LabelReplicaID] == strconv.Itoa(id) {
			mine = append(mine, i)
		}
	}
	return mine
}

// applied is in after the manager carried out out (manager.applyOwned), at the same instant:
// statuses moved, adopted records added, launches under way, terminations running, forgotten
// records gone, the rollout's verdict saved.
func applied(in planInput, out actions) planInput {
	next := in
	terminating := map[int]bool{}
	stopping := map[string]bool{}
	for _, term := range out.Terminate {
		terminating[term.ReplicaID] = true
		stopping[term.InstanceID] = true
		for _, id := range term.Nodes {
			stopping[id] = true
		}
	}
	// The manager leaves instances under termination out of what it lists (observeOwned).
	next.Instances = nil
	for _, i := range in.Instances {
		if !stopping[i.ID] {
			next.Instances = append(next.Instances, i)
		}
	}
	forgotten := map[int]bool{}
	for _, id := range out.Forget {
		forgotten[id] = true
	}
	moved := map[int]transition{}
	for _, tr := range out.Transitions {
		moved[tr.ID] = tr
	}
	relabel := map[int]bool{}
	for _, id := range out.Relabel {
		relabel[id] = true
	}
	views := append([]replicaView(nil), in.Replicas...)
	for _, rec := range out.Adopt {
		views = append(views, replicaView{Record: rec})
	}
	next.Replicas = nil
	maxID := 0
	for _, v := range views {
		id := v.Record.ID
		maxID = max(maxID, id)
		if forgotten[id] {
			continue
		}
		if tr, ok := moved[id]; ok {
			v.Record.Status, v.Record.Reason = tr.To, tr.Reason
			if tr.Instance != nil {
				followInstance(&v.Record, tr.Instance)
			}
			if tr.To == StatusShuttingDown && in.Drain && tr.From == StatusReady {
				v.Draining = true
			}
		}
		if relabel[id] {
			v.Record.Version = in.Target
		}
		v.Terminating = v.Terminating || terminating[id]
		next.Replicas = append(next.Replicas, v)
	}
	for i := range out.Launch + out.LaunchSpot {
		maxID++
		r := Record{Service: "svc", ID: maxID, Version: in.Target, Status: StatusProvisioning, Spot: i >= out.Launch, LaunchedAt: in.Now}
		next.Replicas = append(next.Replicas, replicaView{Record: r, Launching: true})
	}
	return next
}

// TestPlanHoldsTheFallback: while spot losses hold a dynamic fallback, the scale-down of each
// kind to its share takes no on-demand replica of the target version but those beyond the
// target or beyond what the hold keeps; and holding changes no launch, since it only keeps
// what runs.
func TestPlanHoldsTheFallback(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		// Whole services as the other properties draw them, or one of serving replicas of both
		// kinds, where scaling a kind down to its share is the common case.
		var in planInput
		if rapid.Bool().Draw(t, "serving") {
			in = drawServing(t)
		} else {
			in = drawPlanInput(t)
		}
		in.Mix = policy.MixSpec{UseSpot: true, BaseOnDemand: rapid.IntRange(0, 2).Draw(t, "heldBase"), DynamicFallback: true}
		keep := rapid.IntRange(1, 12).Draw(t, "keep")
		in.HoldOnDemand = keep
		p := newPass(in)
		p.attribute()
		p.followRecords()
		p.adoptUnowned()
		p.splitVersions()
		p.retireOld(p.weighRollout().keepOld)
		before := len(p.out.Transitions)
		k := p.scaleKinds()
		onDemand := map[int]bool{}
		for _, c := range p.current {
			onDemand[c.id] = !c.spot
		}
		down := 0
		for _, tr := range p.out.Transitions[before:] {
			if onDemand[tr.ID] {
				down++
			}
		}
		if beyond := k.liveOnDemand - min(k.liveOnDemand, max(in.Desired, 0), keep); down > beyond {
			t.Fatalf("held fallback keeping %d: %d on-demand replicas scaled down of %d live for a target of %d\ntransitions %+v",
				keep, down, k.liveOnDemand, in.Desired, p.out.Transitions[before:])
		}

		released := in
		released.HoldOnDemand = 0
		held, free := plan(in), plan(released)
		if held.Launch != free.Launch || held.LaunchSpot != free.LaunchSpot {
			t.Fatalf("holding launches %d on-demand and %d spot, not holding %d and %d",
				held.Launch, held.LaunchSpot, free.Launch, free.LaunchSpot)
		}
	})
}

// drawServing draws a service whose replicas all run, of either kind, most of them READY.
func drawServing(t *rapid.T) planInput {
	in := planInput{Now: t0.Add(time.Hour), Service: "svc", InitialDelay: 20 * time.Minute, FailureThreshold: 3 * time.Minute,
		Drain: rapid.Bool().Draw(t, "drain"), Desired: rapid.IntRange(0, 6).Draw(t, "desired")}
	n := rapid.IntRange(0, 10).Draw(t, "replicas")
	for id := 1; id <= n; id++ {
		r := rec(id, rapid.SampledFrom([]Status{StatusReady, StatusReady, StatusReady, StatusStarting, StatusNotReady}).Draw(t, "status"))
		r.Spot = rapid.Bool().Draw(t, "recSpot")
		probe := probeOK
		if r.Status != StatusReady {
			probe = rapid.SampledFrom([]probeState{probeOK, probeFailing, notProbedYet}).Draw(t, "probe")
		}
		in.Replicas = append(in.Replicas, view(r, probe))
		instance := inst(id, launcher.StateRunning, "")
		if r.Spot {
			instance.Labels[LabelKind] = kindSpot
		}
		in.Instances = append(in.Instances, instance)
	}
	return in
}
