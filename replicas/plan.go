package replicas

import (
	"slices"
	"time"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// This file is the decision half of reconciliation: plan compares the replicas the manager
// knows with the instances the provider reports and says what to do, with no side effects.
// manager.go applies the result.

// Launch backoff after consecutive failures of replicas that never served.
const (
	launchBackoffBase = time.Second
	launchBackoffMax  = 5 * time.Minute
)

// replicaView is one replica as a reconcile pass sees it.
type replicaView struct {
	Record Record
	Probe  probeState
	// Launching is true while Launch runs for it; Terminating while Terminate does.
	Launching   bool
	Terminating bool
	// Draining is true while a SHUTTING_DOWN replica still has requests in flight.
	Draining bool
	// HealthySince is when the replica's current run of READY began, as this manager saw it
	// (zero when not READY).
	HealthySince time.Time
	// Noticed is true once the infra warned that the replica's instance will be reclaimed: it
	// serves on, but no longer counts toward the target and is never picked for scale-down.
	Noticed bool
	// Moving is set for a spot replica launched to spread the service over zones
	// (actions.SpreadFrom) until it is READY: it neither counts toward the target nor is
	// scaled down meanwhile, and once READY scale-down drains one of the crowded zone's.
	Moving bool
	// InGap is set when the replica's location lies in a part of the infras the last List could
	// not read: a node of its gang missing from that List is unknown, not lost.
	InGap bool
}

// planInput is everything a decision depends on.
type planInput struct {
	Now     time.Time
	Service string
	// Desired is the target count of live replicas; negative holds the current count (before
	// anyone set a target, so a restarted controller neither grows nor shrinks the service).
	Desired          int
	InitialDelay     time.Duration
	FailureThreshold time.Duration
	// ConsecutiveFailures counts on-demand replicas that failed without ever serving since
	// the last on-demand READY; LastFailure is the latest of them. They defer on-demand
	// launches (backoff). SpotFailures and SpotLastFailure do the same for spot replicas, so
	// spot capacity running out never holds back the on-demand fallback.
	ConsecutiveFailures int
	LastFailure         time.Time
	SpotFailures        int
	SpotLastFailure     time.Time
	// KeepFailed is how many terminal records stay for `serve status`.
	KeepFailed int
	// Drain makes scale-down a two-step move: this pass takes the replica out of the READY set
	// (SHUTTING_DOWN), a later one terminates it once it is no longer Draining.
	Drain bool
	// InfraRank orders infras by preference (0 is the most preferred; an infra missing from
	// the map ranks after all). Scale-down removes replicas on the least preferred infra
	// first: burst replicas outside the cluster go before the cluster's own.
	InfraRank map[string]int
	// Mix splits Desired between spot and on-demand replicas (SkyServe's fallback semantics,
	// policy.Split); the zero value makes every replica on-demand.
	Mix policy.MixSpec
	// HoldOnDemand is how many live on-demand replicas of a dynamic fallback are kept from
	// being scaled down (policy.Held) while the service's spot losses come in a run
	// (policy.Losses.HoldOnDemand); 0 keeps none.
	HoldOnDemand int
	// Spare is how many spare spot replicas run beyond Desired while a zone sits at its
	// capacity ceiling (policy.Losses.Spare, policy.Split); HoldOnDemand is 0 while one does.
	Spare int
	// Spread is set for a service whose spot replicas are spread over zones (SpotHedge's
	// dynamic_fallback placer, on a provider that places by zone): a pass whose spot replicas
	// have settled in mostly one zone asks for a move (spreadSpot). SpreadAfter holds moves
	// back after one that found no zone.
	Spread      bool
	SpreadAfter time.Time
	// Target is the version new replicas launch as; zero treats every replica as current
	// (a service never updated).
	Target int
	// LaunchedAs maps a version to the version whose instances it reuses (Version.LaunchedAs);
	// a version missing from it is its own.
	LaunchedAs map[int]int
	// Rollout is the service's latest rollout; nil when it never had one. While it is
	// IN_PROGRESS (or FAILED without rollback) older versions' replicas are kept as the
	// rollout's mode says; otherwise they all go.
	Rollout *Rollout
	// SwitchAt is how many healthy new replicas a blue-green rollout needs before traffic
	// moves (the target, at least min_replicas).
	SwitchAt int
	// Replicas are ordered by id.
	Replicas  []replicaView
	Instances []launcher.Instance
}

// spare is the spare the split runs (policy.Split): on-demand stands in for it only while the
// service's spot launches fail, which SpotFailures counts since the last spot READY.
func (in planInput) spare() policy.Spare {
	return policy.Spare{Spot: in.Spare, SpotFailing: in.SpotFailures > 0}
}

// transition moves one replica to a new status.
type transition struct {
	ID       int
	From, To Status
	Reason   string
	// Instance, when set, is the instance the record now follows (adoption after an
	// interrupted launch).
	Instance *launcher.Instance
}

// termination stops one instance.
type termination struct {
	// ReplicaID is 0 for an instance no record owns.
	ReplicaID  int
	InstanceID string
	// Forget deletes the record once the instance is gone (scale-down): it was not a failure.
	Forget bool
	// Nodes are the other listed nodes of a multi-node replica, stopped with InstanceID: a
	// replica never leaves part of its gang behind.
	Nodes []string
}

// actions is a plan's result, applied in field order.
type actions struct {
	// Adopt are records made for instances no record knew (a controller that crashed between
	// launching and saving, or a lost store).
	Adopt       []Record
	Transitions []transition
	Terminate   []termination
	// Follow are replicas whose instance now reports an endpoint the record lacks (a pod that
	// got its IP after an interrupted launch was adopted).
	Follow []launcher.Instance
	// Gangs are live multi-node replicas whose listed nodes differ from those their record
	// names (adopted, or a restarted controller's first pass): the record follows them.
	Gangs []gangNodes
	// Forget are records to delete now: scaled down with no instance left, or old failures.
	Forget []int
	// Launch and LaunchSpot are how many new on-demand and spot replicas to launch.
	Launch, LaunchSpot int
	// SpreadFrom, when set, asks for one more spot replica, launched out of that zone (a
	// launcher.ZoneKey) to spread the service's spot replicas (spreadSpot).
	SpreadFrom string
	// LaunchDeferredUntil is set when replicas are missing but backoff holds launches.
	LaunchDeferredUntil time.Time
	// Relabel are live replicas of a version that Target reuses (only `service:` changed):
	// their records move to Target without a relaunch.
	Relabel []int
	// Rollout, when set, is how the rollout moves on; the manager saves it and plans again
	// before acting, so that the decision is on disk before any replica follows it.
	Rollout *rolloutChange
}

// rolloutChange is a plan's verdict on the rollout in progress.
type rolloutChange struct {
	// Switched: blue-green traffic moves to the new version now.
	Switched bool
	// End, when set, ends the rollout (SUCCEEDED, ROLLED_BACK or FAILED) for Reason.
	End    RolloutState
	Reason string
	// ProgressAt is a later time a new replica became healthy (zero: no news).
	ProgressAt time.Time
}

// live reports whether a replica in status s counts toward the desired count.
func live(s Status) bool {
	switch s {
	case StatusPending, StatusProvisioning, StatusStarting, StatusReady, StatusNotReady, StatusUnknown:
		return true
	}
	return false
}

// probeable reports whether a replica in status s is probed.
func probeable(s Status) bool {
	return s == StatusStarting || s == StatusReady || s == StatusNotReady
}

// launchBackoff is the wait before the next launch after n consecutive failures.
func launchBackoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := launchBackoffBase
	for i := 1; i < n && d < launchBackoffMax; i++ {
		d *= 2
	}
	return min(d, launchBackoffMax)
}

// plan decides one reconcile pass. It is pure: same input, same actions. Each phase reads what
// the earlier ones left in the pass, or the named set an earlier one returned, in the order
// below (Nomad's computeGroup reads this way).
func plan(in planInput) actions {
	p := newPass(in)
	p.attribute()               // instances to the replicas they are labelled with (plan_follow.go)
	p.followRecords()           // each known replica's status from its instance and probes
	p.adoptUnowned()            // instances no record knows
	p.splitVersions()           // live replicas of the target version and of older ones (plan_scale.go)
	weight := p.weighRollout()  // how many new replicas are healthy, how many old ones stay
	p.retireOld(weight.keepOld) // old replicas beyond that go
	split := p.scaleKinds()     // each kind to its share of the target
	p.retireNoticed()           // warned spot replicas go once their replacements serve
	p.launch(weight, split)     // what is missing, within backoff and the rollout's budget
	p.spreadSpot(weight)        // one spot replica out of a zone that holds most of them
	p.judgeRollout(weight)      // the rollout's verdict (plan_rollout.go)
	p.forgetEnded()             // old failures beyond the few status shows
	slices.Sort(p.out.Forget)
	return p.out
}

// pass is one plan in progress: its input, the actions decided so far, and what later phases
// read of earlier ones.
type pass struct {
	in  planInput
	out actions
	// transitionAt indexes out.Transitions by replica id: a later phase moving the same replica
	// again rewrites its transition instead of adding a second.
	transitionAt map[int]int
	// status is each replica's status after this pass; hasInstance and terminating say whether
	// an instance still stands for it, for forgetEnded.
	status      map[int]Status
	hasInstance map[int]bool
	terminating map[int]bool
	// byReplica are the listed instances by the replica id on their label, until
	// followRecords and adoptUnowned have claimed them.
	byReplica map[int][]launcher.Instance
	// workers are the listed nodes beyond the head of each multi-node replica, stopped with it
	// (terminate).
	workers map[int][]launcher.Instance

	// alive are live replicas that scale-down may pick; noticed the live replicas of the target
	// version whose instance will be reclaimed; current and old split alive by version.
	alive, noticed, current, old []candidate
	// launching counts live current replicas whose launch is under way (not in alive), and
	// launchingSpot the spot ones among them; moving counts the spread moves under way or not
	// READY yet (replicaView.Moving), which are in neither.
	launching, launchingSpot, moving int
	// rolloutFailure says why the new version failed during this pass, if it did.
	rolloutFailure string
}

// rolloutWeight is weighRollout's finding: whether the rollout holds old replicas, how many
// new ones are healthy and since when, how many old ones stay, whether blue-green traffic
// moved, and how many old ones were live at the start of the pass.
type rolloutWeight struct {
	holding    bool
	healthy    int
	progressAt time.Time
	keepOld    int
	switched   bool
	oldLeft    int
}

// kindSplit is scaleKinds' finding: the live count by kind and the split of the target.
type kindSplit struct {
	liveSpot, liveOnDemand int
	want                   policy.Mix
}

// candidate is one live replica as scale-down and the rollout weigh it.
type candidate struct {
	id    int
	ready bool
	spot  bool
	rank  int
	price float64
	// zone is a spot replica's zone (a launcher.ZoneKey; "" when its infra names none), and
	// crowd how many of the service's current spot replicas share it: scale-down takes spot
	// replicas from the most crowded zone first.
	zone  string
	crowd int
	inst  *launcher.Instance
	// current: of the target version (or one it reuses); healthySince as replicaView's.
	current      bool
	healthySince time.Time
}

func newPass(in planInput) *pass {
	return &pass{in: in, transitionAt: map[int]int{}, status: map[int]Status{}, hasInstance: map[int]bool{},
		terminating: map[int]bool{}, byReplica: map[int][]launcher.Instance{}, workers: map[int][]launcher.Instance{}}
}

// move records a status change of one replica; a second change in the same pass keeps the
// first's From.
func (p *pass) move(id int, from, to Status, reason string, inst *launcher.Instance) {
	p.status[id] = to
	if i, ok := p.transitionAt[id]; ok {
		p.out.Transitions[i].To, p.out.Transitions[i].Reason = to, reason
		return
	}
	p.transitionAt[id] = len(p.out.Transitions)
	p.out.Transitions = append(p.out.Transitions, transition{ID: id, From: from, To: to, Reason: reason, Instance: inst})
}

// terminate stops inst and, for a replica, every other node of its gang.
func (p *pass) terminate(replicaID int, inst *launcher.Instance, forget bool) {
	t := termination{ReplicaID: replicaID, InstanceID: inst.ID, Forget: forget}
	if replicaID != 0 {
		for _, w := range p.workers[replicaID] {
			if w.ID != inst.ID && !slices.Contains(t.Nodes, w.ID) {
				t.Nodes = append(t.Nodes, w.ID)
			}
		}
	}
	p.out.Terminate = append(p.out.Terminate, t)
}

// isCurrent reports whether replicas of version v serve as the target version: they are it,
// or it reuses their instances, or the service was never updated.
func (p *pass) isCurrent(v int) bool {
	return p.in.Target == 0 || p.in.launchedAs(v) == p.in.launchedAs(p.in.Target)
}

func (in *planInput) launchedAs(v int) int {
	if a, ok := in.LaunchedAs[v]; ok {
		return a
	}
	return v
}

// rank is an infra's place in the service's preference (later candidates rank higher).
func (p *pass) rank(infra string) int {
	if r, ok := p.in.InfraRank[infra]; ok {
		return r
	}
	return len(p.in.InfraRank)
}

// minHealthy is how long a new replica must stay READY to count as healthy for the rollout.
func (in *planInput) minHealthy() time.Duration {
	if in.Rollout == nil {
		return 0
	}
	return time.Duration(in.Rollout.Policy.MinHealthySeconds) * time.Second
}

// forgetEnded keeps the newest KeepFailed terminal records for display and forgets older ones
// once their instance is gone.
func (p *pass) forgetEnded() {
	var ended []int
	for id, s := range p.status {
		if s.Terminal() {
			ended = append(ended, id)
		}
	}
	slices.Sort(ended)
	slices.Reverse(ended)
	for _, id := range ended[min(len(ended), max(p.in.KeepFailed, 0)):] {
		if !p.hasInstance[id] && !p.terminating[id] {
			p.out.Forget = append(p.out.Forget, id)
		}
	}
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
