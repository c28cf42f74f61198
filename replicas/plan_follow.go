package replicas

import (
	"fmt"
	"strconv"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// The first phases of a plan: which instance is whose, and what each replica's status is now.

// attribute sorts the listed instances by the replica id on their label. An instance labelled
// with the service but no usable id can belong to no replica, and goes.
func (p *pass) attribute() {
	for _, inst := range p.in.Instances {
		id, err := strconv.Atoi(inst.Labels[launcher.LabelReplicaID])
		if err != nil || id <= 0 {
			p.terminate(0, &inst, false)
			continue
		}
		p.byReplica[id] = append(p.byReplica[id], inst)
	}
}

// followRecords claims each known replica's instance, or its gang's nodes (plan_gang.go; any
// other instance with its id is a stray), and moves the replica on from what the instance and
// its probes say.
func (p *pass) followRecords() {
	for _, r := range p.in.Replicas {
		rec := r.Record
		g, strays := pickGang(rec, p.byReplica[rec.ID])
		delete(p.byReplica, rec.ID)
		if !r.Launching {
			// A launch under way is left to make or roll back what it will: a gang's launch may
			// still be failing over from a location where it made some nodes.
			for i := range strays {
				p.terminate(0, &strays[i], false)
			}
		}
		inst := g.judged(r.InGap)
		p.workers[rec.ID] = g.listed()
		p.status[rec.ID] = rec.Status
		p.hasInstance[rec.ID] = inst != nil
		p.terminating[rec.ID] = r.Terminating
		switch {
		case r.Launching && r.Moving:
			p.moving++
		case r.Launching:
			p.followLaunching(rec)
		case rec.Status == StatusShuttingDown:
			p.followShuttingDown(r, inst)
		case rec.Status.Terminal():
			p.followEnded(r, inst)
		case !probeable(rec.Status):
			p.followInterruptedLaunch(rec, inst, g)
		default:
			p.followLive(r, inst, g)
		}
	}
}

// followLaunching counts a replica whose Launch is under way toward the target: its outcome
// arrives outside the pass (a launch of a version rolled back from goes once it has an
// instance).
func (p *pass) followLaunching(rec Record) {
	if live(rec.Status) && p.isCurrent(rec.Version) {
		p.launching++
		if rec.Spot {
			p.launchingSpot++
		}
	}
}

// followShuttingDown terminates a scaled-down replica once it has drained, and forgets it
// once its instance is gone.
func (p *pass) followShuttingDown(r replicaView, inst *launcher.Instance) {
	switch {
	case r.Terminating, r.Draining:
	case inst != nil:
		p.terminate(r.Record.ID, inst, true)
	default:
		p.out.Forget = append(p.out.Forget, r.Record.ID)
	}
}

// followEnded terminates what is left of a replica that will not serve again. One of the
// rollout's new version that failed before this pass (while the controller was down, say)
// fails the rollout.
func (p *pass) followEnded(r replicaView, inst *launcher.Instance) {
	rec := r.Record
	if inst != nil && !r.Terminating {
		p.terminate(rec.ID, inst, false)
	}
	if ro := p.in.Rollout; ro.Active() && rec.Version == ro.To && versionFailure(rec.Status) &&
		rec.ReadyAt.IsZero() && !rec.LaunchedAt.Before(ro.StartedAt) {
		p.failRollout(rec, rec.Status, rec.Reason)
	}
}

// followInterruptedLaunch resolves a PROVISIONING replica (or PENDING/UNKNOWN from elsewhere)
// with no launch under way: the controller that launched it died. The replica follows its
// instance if one was made.
func (p *pass) followInterruptedLaunch(rec Record, inst *launcher.Instance, g gang) {
	switch {
	case inst != nil && inst.State != launcher.StateTerminated && inst.State != launcher.StatePreempted:
		p.move(rec.ID, rec.Status, StatusStarting, "adopted instance of an interrupted launch", inst)
		p.followNodes(rec, g)
		p.alive = append(p.alive, candidate{id: rec.ID, spot: rec.Spot, rank: p.rank(inst.Infra), inst: inst, current: p.isCurrent(rec.Version)})
	case inst != nil:
		p.move(rec.ID, rec.Status, StatusFailedProvision, "launch interrupted; instance ended: "+endReason(inst), nil)
		p.terminate(rec.ID, inst, false)
	default:
		p.move(rec.ID, rec.Status, StatusFailedProvision, "launch interrupted: no instance found", nil)
	}
}

// followLive moves a STARTING, READY or NOT_READY replica on (liveStatus) and files it: gone,
// warned of its reclaim (noticed), or alive for the later phases.
func (p *pass) followLive(r replicaView, inst *launcher.Instance, g gang) {
	rec := r.Record
	if inst != nil && inst.Endpoint != "" && inst.Endpoint != rec.Endpoint {
		p.out.Follow = append(p.out.Follow, *inst)
	}
	to, reason := liveStatus(p.in, r, inst)
	if live(to) {
		p.followNodes(rec, g)
	}
	if to != rec.Status {
		p.move(rec.ID, rec.Status, to, reason, nil)
		if ro := p.in.Rollout; ro.Active() && rec.Version == ro.To && versionFailure(to) &&
			(rec.ReadyAt.IsZero() || p.in.Now.Sub(rec.ReadyAt) < p.in.minHealthy()) {
			p.failRollout(rec, to, reason)
		}
	}
	if !live(to) {
		if inst != nil && !r.Terminating {
			p.terminate(rec.ID, inst, false)
		}
		return
	}
	current := p.isCurrent(rec.Version)
	if r.Noticed && current {
		// Going away soon: its replacement is launched as if it had gone, and it drains once
		// the others are enough (retireNoticed). A noticed replica of an older version stays
		// in the rollout's accounting, and goes as the rollout says.
		p.noticed = append(p.noticed, candidate{id: rec.ID, ready: to == StatusReady, spot: rec.Spot, inst: inst})
		return
	}
	if r.Moving && to != StatusReady {
		p.moving++ // a spread move: counted once READY
		return
	}
	c := candidate{id: rec.ID, ready: to == StatusReady, spot: rec.Spot, rank: p.rank(rec.Infra), price: rec.Price, inst: inst, current: current}
	if rec.Spot && rec.Zone != "" {
		c.zone = launcher.ZoneKey(rec.Infra, "", rec.Zone)
	}
	if c.ready {
		c.healthySince = r.HealthySince
	}
	if current && rec.Version != p.in.Target && p.in.Target != 0 {
		p.out.Relabel = append(p.out.Relabel, rec.ID)
	}
	p.alive = append(p.alive, c)
}

// failRollout records the first replica of the new version that failed through its own
// version during this pass.
func (p *pass) failRollout(rec Record, s Status, reason string) {
	if p.rolloutFailure == "" {
		p.rolloutFailure = fmt.Sprintf("replica %d of version %d: %s: %s", rec.ID, rec.Version, s, reason)
	}
}

// adoptUnowned makes records for instances no record owns (a controller that crashed between
// launching and saving, or a lost store): live ones join the pass as STARTING, ended ones are
// recorded as such and terminated.
func (p *pass) adoptUnowned() {
	for _, id := range sortedKeys(p.byReplica) {
		g, strays := pickGang(Record{}, p.byReplica[id])
		for i := range strays {
			p.terminate(0, &strays[i], false)
		}
		if g.head == nil {
			continue // nodes of a gang without its head: strays, all of them
		}
		inst := g.judged(false)
		p.workers[id] = g.listed()
		rec := recordFromInstance(p.in.Service, id, inst)
		rec.Nodes = g.ids()
		switch inst.State {
		case launcher.StateTerminated, launcher.StatePreempted:
			rec.Status, rec.Reason = endStatus(inst), endReason(inst)
			p.terminate(id, inst, false)
		default:
			rec.Status, rec.Reason = StatusStarting, "adopted"
			current := p.isCurrent(rec.Version)
			if current && p.in.Target != 0 {
				rec.Version = p.in.Target
			}
			p.alive = append(p.alive, candidate{id: id, spot: rec.Spot, rank: p.rank(inst.Infra), inst: inst, current: current})
		}
		p.out.Adopt = append(p.out.Adopt, rec)
		p.status[id] = rec.Status
		p.hasInstance[id] = true
	}
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
		if probe.OK && allUp(inst) {
			return StatusReady, ""
		}
		if delay := in.InitialDelay; delay > 0 && in.Now.Sub(rec.LaunchedAt) >= delay {
			return StatusFailedInitialDelay, fmt.Sprintf("not ready within %v of launch%s", delay, lastError(probe))
		}
	case StatusReady, StatusNotReady:
		switch {
		case probe.At.IsZero():
			// Not probed yet by this manager (just restarted): keep what the store said.
		case probe.OK && !allUp(inst):
			// The head serves, but a node of its gang does not run: not a whole replica.
			return StatusNotReady, inst.Reason
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
	if inst.Accelerator != "" {
		rec.Accelerator = inst.Accelerator // a listed instance may not know; keep the launch's
	}
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
