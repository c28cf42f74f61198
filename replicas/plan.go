package replicas

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ferryserve/ferry/configs"
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
	// Forget are records to delete now: scaled down with no instance left, or old failures.
	Forget []int
	// Launch and LaunchSpot are how many new on-demand and spot replicas to launch.
	Launch, LaunchSpot int
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

// plan decides one reconcile pass. It is pure: same input, same actions.
func plan(in planInput) actions {
	var out actions
	transitionAt := map[int]int{} // replica id → index in out.Transitions
	move := func(id int, from, to Status, reason string, inst *launcher.Instance) {
		if i, ok := transitionAt[id]; ok {
			out.Transitions[i].To, out.Transitions[i].Reason = to, reason
			return
		}
		transitionAt[id] = len(out.Transitions)
		out.Transitions = append(out.Transitions, transition{ID: id, From: from, To: to, Reason: reason, Instance: inst})
	}
	terminate := func(replicaID int, inst *launcher.Instance, forget bool) {
		out.Terminate = append(out.Terminate, termination{ReplicaID: replicaID, InstanceID: inst.ID, Forget: forget})
	}

	byReplica := map[int][]launcher.Instance{}
	for _, inst := range in.Instances {
		id, err := strconv.Atoi(inst.Labels[launcher.LabelReplicaID])
		if err != nil || id <= 0 {
			// Labelled with our service but no usable replica id: nothing can own it.
			terminate(0, &inst, false)
			continue
		}
		byReplica[id] = append(byReplica[id], inst)
	}

	type candidate struct {
		id    int
		ready bool
		spot  bool
		rank  int
		price float64
		inst  *launcher.Instance
		// current: of the target version (or one it reuses); healthySince as replicaView's.
		current      bool
		healthySince time.Time
	}
	launchedAs := func(v int) int {
		if a, ok := in.LaunchedAs[v]; ok {
			return a
		}
		return v
	}
	isCurrent := func(v int) bool { return in.Target == 0 || launchedAs(v) == launchedAs(in.Target) }
	minHealthy := time.Duration(0)
	if in.Rollout != nil {
		minHealthy = time.Duration(in.Rollout.Policy.MinHealthySeconds) * time.Second
	}
	var rolloutFailure string // why the new version failed during this pass, if it did
	rank := func(infra string) int {
		if r, ok := in.InfraRank[infra]; ok {
			return r
		}
		return len(in.InfraRank)
	}
	var alive []candidate   // live replicas that scale-down may pick
	var noticed []candidate // live replicas of the target version whose instance will be reclaimed
	liveCount := 0
	launchingSpot := 0         // live spot replicas whose launch is under way (not in alive)
	launching := 0             // live current replicas whose launch is under way
	status := map[int]Status{} // status after this pass
	hasInstance := map[int]bool{}
	terminating := map[int]bool{}

	for _, r := range in.Replicas {
		rec := r.Record
		inst, strays := pickInstance(rec, byReplica[rec.ID])
		delete(byReplica, rec.ID)
		for i := range strays {
			terminate(0, &strays[i], false)
		}
		status[rec.ID] = rec.Status
		hasInstance[rec.ID] = inst != nil
		terminating[rec.ID] = r.Terminating
		setStatus := func(to Status, reason string, adopted *launcher.Instance) {
			move(rec.ID, rec.Status, to, reason, adopted)
			status[rec.ID] = to
		}
		switch {
		case r.Launching:
			// Its outcome arrives outside the pass; it counts toward the target meanwhile (a
			// launch of a version rolled back from goes once it has an instance).
			if live(rec.Status) && isCurrent(rec.Version) {
				liveCount++
				launching++
				if rec.Spot {
					launchingSpot++
				}
			}
		case rec.Status == StatusShuttingDown:
			switch {
			case r.Terminating, r.Draining:
			case inst != nil:
				terminate(rec.ID, inst, true)
			default:
				out.Forget = append(out.Forget, rec.ID)
			}
		case rec.Status.Terminal():
			if inst != nil && !r.Terminating {
				terminate(rec.ID, inst, false)
			}
		case !probeable(rec.Status):
			// PROVISIONING (or PENDING/UNKNOWN from elsewhere) with no launch under way: the
			// controller that launched it died. Follow the instance if it got made.
			switch {
			case inst != nil && inst.State != launcher.StateTerminated && inst.State != launcher.StatePreempted:
				setStatus(StatusStarting, "adopted instance of an interrupted launch", inst)
				liveCount++
				alive = append(alive, candidate{id: rec.ID, spot: rec.Spot, rank: rank(inst.Infra), inst: inst, current: isCurrent(rec.Version)})
			case inst != nil:
				setStatus(StatusFailedProvision, "launch interrupted; instance ended: "+endReason(inst), nil)
				terminate(rec.ID, inst, false)
			default:
				setStatus(StatusFailedProvision, "launch interrupted: no instance found", nil)
			}
		default:
			if inst != nil && inst.Endpoint != "" && inst.Endpoint != rec.Endpoint {
				out.Follow = append(out.Follow, *inst)
			}
			to, reason := liveStatus(in, r, inst)
			if to != rec.Status {
				setStatus(to, reason, nil)
				if in.Rollout.Active() && rec.Version == in.Rollout.To && versionFailure(to) &&
					(rec.ReadyAt.IsZero() || in.Now.Sub(rec.ReadyAt) < minHealthy) && rolloutFailure == "" {
					rolloutFailure = fmt.Sprintf("replica %d of version %d: %s: %s", rec.ID, rec.Version, to, reason)
				}
			}
			if !live(to) {
				if inst != nil && !r.Terminating {
					terminate(rec.ID, inst, false)
				}
				continue
			}
			if r.Noticed && isCurrent(rec.Version) {
				// Going away soon: its replacement is launched as if it had gone, and it drains
				// once the others are enough (below). A noticed replica of an older version
				// stays in the rollout's accounting, and goes as the rollout says.
				noticed = append(noticed, candidate{id: rec.ID, ready: to == StatusReady, spot: rec.Spot, inst: inst})
				continue
			}
			liveCount++
			c := candidate{id: rec.ID, ready: to == StatusReady, spot: rec.Spot, rank: rank(rec.Infra), price: rec.Price, inst: inst,
				current: isCurrent(rec.Version)}
			if c.ready {
				c.healthySince = r.HealthySince
			}
			if c.current && rec.Version != in.Target && in.Target != 0 {
				out.Relabel = append(out.Relabel, rec.ID)
			}
			alive = append(alive, c)
		}
		if s := status[rec.ID]; in.Rollout.Active() && rolloutFailure == "" && rec.Version == in.Rollout.To &&
			versionFailure(s) && s == rec.Status && rec.ReadyAt.IsZero() && !rec.LaunchedAt.Before(in.Rollout.StartedAt) {
			// Failed before this pass (e.g. while the controller was down).
			rolloutFailure = fmt.Sprintf("replica %d of version %d: %s: %s", rec.ID, rec.Version, s, rec.Reason)
		}
	}

	// Instances no record owns: adopt them.
	for _, id := range sortedKeys(byReplica) {
		inst, strays := pickInstance(Record{}, byReplica[id])
		for i := range strays {
			terminate(0, &strays[i], false)
		}
		rec := recordFromInstance(in.Service, id, inst)
		switch inst.State {
		case launcher.StateTerminated, launcher.StatePreempted:
			rec.Status, rec.Reason = endStatus(inst), endReason(inst)
			terminate(id, inst, false)
		default:
			rec.Status, rec.Reason = StatusStarting, "adopted"
			liveCount++
			current := isCurrent(rec.Version)
			if current && in.Target != 0 {
				rec.Version = in.Target
			}
			alive = append(alive, candidate{id: id, spot: rec.Spot, rank: rank(inst.Infra), inst: inst, current: current})
		}
		out.Adopt = append(out.Adopt, rec)
		status[id] = rec.Status
		hasInstance[id] = true
	}

	// Replicas of older versions: as many stay as the rollout's mode says, the rest go.
	var current, old []candidate
	for _, c := range alive {
		if c.current {
			current = append(current, c)
		} else {
			old = append(old, c)
		}
	}
	liveCount = launching + len(current)
	holding := in.Rollout != nil && (in.Rollout.State == RolloutInProgress || in.Rollout.State == RolloutFailed)
	healthy := 0
	var progressAt time.Time
	for _, c := range current {
		if !c.ready {
			continue
		}
		if !c.healthySince.IsZero() && in.Now.Sub(c.healthySince) >= minHealthy {
			healthy++
			if at := c.healthySince.Add(minHealthy); in.Rollout != nil && at.After(in.Rollout.ProgressAt) && at.After(progressAt) {
				progressAt = at
			}
		}
	}
	keepOld := 0
	switched := false
	if holding && in.Desired >= 0 {
		switch in.Rollout.Mode {
		case configs.UpdateBlueGreen:
			switched = in.Rollout.Switched || healthy >= in.SwitchAt
			if !switched {
				keepOld = in.Desired
			}
		default:
			keepOld = max(0, in.Desired-healthy)
		}
	}
	scaleDown := func(cands []candidate, excess map[bool]int, reason string) {
		// Replicas not serving first, then the least preferred infra (burst replicas outside
		// the cluster), then the most expensive (on-demand before spot), then the newest.
		slices.SortFunc(cands, func(a, b candidate) int {
			if a.ready != b.ready {
				if a.ready {
					return 1
				}
				return -1
			}
			if c := cmp.Compare(b.rank, a.rank); c != 0 {
				return c
			}
			if c := cmp.Compare(b.price, a.price); c != 0 {
				return c
			}
			return cmp.Compare(b.id, a.id)
		})
		for _, c := range cands {
			if excess[c.spot] <= 0 {
				continue
			}
			excess[c.spot]--
			// An earlier transition of this pass keeps its From and now ends here.
			move(c.id, status[c.id], StatusShuttingDown, reason, nil)
			status[c.id] = StatusShuttingDown
			if in.Drain && c.ready {
				continue // out of the READY set now; terminated once drained
			}
			if c.inst != nil {
				terminate(c.id, c.inst, true)
			} else {
				out.Forget = append(out.Forget, c.id)
			}
		}
	}
	// The rollout may end only once no old replica was live at the start of this pass: the
	// READY set without them is then published before anyone reads the rollout as done.
	oldLeft := len(old)
	if in.Desired >= 0 && len(old) > keepOld {
		// Old replicas are one pool whatever their kind: the new version's mix is what counts.
		for i := range old {
			old[i].spot = false
		}
		scaleDown(old, map[bool]int{false: len(old) - keepOld}, fmt.Sprintf("replaced by version %d", in.Target))
	}

	// Each kind is scaled to its share of Desired. A service without spot is one pool, whatever
	// its replicas were launched as.
	if !in.Mix.UseSpot {
		launchingSpot = 0
		for i := range current {
			current[i].spot = false
		}
	}
	liveSpot, readySpot := launchingSpot, 0
	for _, c := range current {
		if c.spot {
			liveSpot++
			if c.ready {
				readySpot++
			}
		}
	}
	liveOnDemand := liveCount - liveSpot
	want := policy.Split(in.Desired, in.Mix, readySpot)
	if in.Desired >= 0 && (liveSpot > want.Spot || liveOnDemand > want.OnDemand) {
		scaleDown(current, map[bool]int{true: liveSpot - want.Spot, false: liveOnDemand - want.OnDemand}, "scaled down")
	}
	readyCurrent := 0
	for _, c := range current {
		if c.ready && status[c.id] == StatusReady { // not scaled down just now
			readyCurrent++
		}
	}
	if in.Desired >= 0 && len(noticed) > 0 && readyCurrent >= in.Desired {
		// Its replacements serve: it takes no new request (one sent now would be cut at the
		// reclaim), finishes those it has, and goes.
		scaleDown(noticed, map[bool]int{true: len(noticed), false: len(noticed)}, "spot interruption notice; replaced")
	}
	if in.Desired >= 0 {
		// deferred reports whether a kind's backoff holds its launches now.
		deferred := func(failures int, last time.Time) bool {
			notBefore := last.Add(launchBackoff(failures))
			if failures > 0 && in.Now.Before(notBefore) {
				if out.LaunchDeferredUntil.IsZero() || notBefore.Before(out.LaunchDeferredUntil) {
					out.LaunchDeferredUntil = notBefore
				}
				return true
			}
			return false
		}
		if n := want.OnDemand - liveOnDemand; n > 0 && !deferred(in.ConsecutiveFailures, in.LastFailure) {
			out.Launch = n
		}
		if n := want.Spot - liveSpot; n > 0 && !deferred(in.SpotFailures, in.SpotLastFailure) {
			out.LaunchSpot = n
		}
		if holding {
			// At most max_parallel new replicas starting (launched, not yet healthy) at once.
			budget := max(0, maxParallel(in.Rollout.Policy, in.Desired)-(liveCount-healthy))
			out.Launch = min(out.Launch, budget)
			out.LaunchSpot = min(out.LaunchSpot, budget-out.Launch)
		}
	}

	if in.Rollout.Active() && in.Desired >= 0 {
		out.Rollout = judgeRollout(in, rolloutFailure, switched, healthy, oldLeft, progressAt)
	} else if in.Rollout != nil && in.Rollout.State == RolloutFailed && in.Desired >= 0 && oldLeft == 0 && healthy >= in.Desired {
		// A failed rollout without rollback that came good after all (capacity came back).
		out.Rollout = &rolloutChange{End: RolloutSucceeded, Reason: fmt.Sprintf("%d of %d replicas of version %d healthy", healthy, in.Desired, in.Target)}
	}
	// Keep the newest KeepFailed terminal records for display; forget older ones once their
	// instance is gone.
	var ended []int
	for id, s := range status {
		if s.Terminal() {
			ended = append(ended, id)
		}
	}
	slices.Sort(ended)
	slices.Reverse(ended)
	for _, id := range ended[min(len(ended), max(in.KeepFailed, 0)):] {
		if !hasInstance[id] && !terminating[id] {
			out.Forget = append(out.Forget, id)
		}
	}
	slices.Sort(out.Forget)
	return out
}

// versionFailure reports whether a replica that ends in status s failed through its own
// version (its program or image), as opposed to capacity or a preemption.
func versionFailure(s Status) bool {
	switch s {
	case StatusFailed, StatusFailedInitialDelay, StatusFailedProbing:
		return true
	}
	return false
}

// judgeRollout says whether an IN_PROGRESS rollout switches, succeeds or fails now.
func judgeRollout(in planInput, failure string, switched bool, healthy, oldLeft int, progressAt time.Time) *rolloutChange {
	r := in.Rollout
	var ch rolloutChange
	changed := false
	if !progressAt.IsZero() {
		ch.ProgressAt, changed = progressAt, true
	}
	deadline := time.Duration(r.Policy.ProgressDeadlineSeconds) * time.Second
	last := r.ProgressAt
	if last.IsZero() {
		last = r.StartedAt
	}
	if !progressAt.IsZero() {
		last = progressAt
	}
	if failure == "" && deadline > 0 && in.Now.Sub(last) >= deadline && healthy < in.Desired {
		failure = fmt.Sprintf("no new replica became healthy within the progress deadline (%v)", deadline)
	}
	switch {
	case failure != "":
		ch.End, ch.Reason = RolloutFailed, failure
		if r.FromServed && r.Policy.AutoRollback {
			ch.End = RolloutRolledBack
		}
		return &ch
	case switched && !r.Switched:
		ch.Switched, changed = true, true
	}
	if oldLeft == 0 && healthy >= in.Desired && (r.Mode != configs.UpdateBlueGreen || switched) {
		ch.End, ch.Reason = RolloutSucceeded, fmt.Sprintf("%d of %d replicas of version %d healthy", healthy, in.Desired, r.To)
		return &ch
	}
	if !changed {
		return nil
	}
	return &ch
}

// liveStatus is the status a STARTING, READY or NOT_READY replica moves to, from its instance
// and its probes.
func liveStatus(in planInput, r replicaView, inst *launcher.Instance) (Status, string) {
	rec, probe := r.Record, r.Probe
	switch {
	case inst == nil:
		return StatusFailed, "instance disappeared"
	case inst.State == launcher.StatePreempted || inst.State == launcher.StateTerminated:
		return endStatus(inst), endReason(inst)
	}
	switch rec.Status {
	case StatusStarting:
		if probe.OK {
			return StatusReady, ""
		}
		if delay := in.InitialDelay; delay > 0 && in.Now.Sub(rec.LaunchedAt) >= delay {
			return StatusFailedInitialDelay, fmt.Sprintf("not ready within %v of launch%s", delay, lastError(probe))
		}
	case StatusReady, StatusNotReady:
		switch {
		case probe.At.IsZero():
			// Not probed yet by this manager (just restarted): keep what the store said.
		case probe.OK:
			return StatusReady, ""
		case in.Now.Sub(probe.FailingSince) >= in.FailureThreshold:
			return StatusFailedProbing, fmt.Sprintf("readiness probe failing for %v%s",
				in.Now.Sub(probe.FailingSince).Round(time.Second), lastError(probe))
		case rec.Status == StatusReady:
			return StatusNotReady, "readiness probe failing" + lastError(probe)
		}
	}
	return rec.Status, rec.Reason
}

func lastError(p probeState) string {
	if p.Err == "" {
		return ""
	}
	return ": " + p.Err
}

// endStatus is the status of a replica whose instance ended.
func endStatus(inst *launcher.Instance) Status {
	if inst.State == launcher.StatePreempted {
		return StatusPreempted
	}
	return StatusFailed
}

func endReason(inst *launcher.Instance) string {
	switch {
	case inst.Reason != "":
		return inst.Reason
	case inst.State == launcher.StatePreempted:
		return "preempted"
	}
	return "instance terminated"
}

// pickInstance chooses the instance that belongs to rec among those labelled with its id: the
// one it recorded, else (no id recorded yet) a running one. The rest are strays.
func pickInstance(rec Record, insts []launcher.Instance) (*launcher.Instance, []launcher.Instance) {
	if len(insts) == 0 {
		return nil, nil
	}
	best := -1
	for i, inst := range insts {
		switch {
		case rec.InstanceID != "":
			if inst.ID == rec.InstanceID {
				best = i
			}
		case best < 0 || (insts[best].State != launcher.StateRunning && inst.State == launcher.StateRunning):
			best = i
		}
	}
	var strays []launcher.Instance
	for i, inst := range insts {
		if i != best && (best < 0 || inst.ID != insts[best].ID) { // a duplicate is not a stray
			strays = append(strays, inst)
		}
	}
	if best < 0 {
		return nil, strays
	}
	return &insts[best], strays
}

// recordFromInstance rebuilds a record from an instance's labels and facts.
func recordFromInstance(service string, id int, inst *launcher.Instance) Record {
	version, _ := strconv.Atoi(inst.Labels[launcher.LabelVersion])
	rec := Record{Service: service, ID: id, Version: version, LaunchedAt: inst.LaunchedAt}
	followInstance(&rec, inst)
	return rec
}

// followInstance copies what a record shows about its instance.
func followInstance(rec *Record, inst *launcher.Instance) {
	rec.InstanceID = inst.ID
	rec.Endpoint = inst.Endpoint
	rec.Infra = inst.Infra
	rec.Zone = inst.Zone
	rec.Price = inst.PricePerHour
	// Spot is the kind the replica was launched as (its label), which the mix counts; an
	// instance from before kinds were labelled tells by its capacity.
	switch inst.Labels[LabelKind] {
	case kindSpot:
		rec.Spot = true
	case kindOnDemand:
		rec.Spot = false
	default:
		rec.Spot = inst.Spot
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
