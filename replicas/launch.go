package replicas

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// launchOwned records a new PROVISIONING replica and starts its Launch in the background. A
// spread move (from, a zone key, not "") is a spot replica launched out of that zone.
func (m *Manager) launchOwned(now time.Time, spot bool, from string) {
	task := m.taskOwned(m.target)
	id, ok := m.nextIDOwned()
	if !ok {
		return // the pass could not reserve one (logged there); the next pass launches it
	}
	r := &replica{
		rec: Record{
			Service:    m.cfg.Service,
			ID:         id,
			Version:    m.target,
			Status:     StatusProvisioning,
			Spot:       spot,
			Resources:  describeResources(withSpot(task.Resources, spot)),
			LaunchedAt: now,
		},
		launching:  true,
		spreadFrom: from,
	}
	m.replicas[id] = r
	m.saveOwned(r)
	m.log.Info("replica status", zap.Int("replica", id), zap.String("to", string(StatusProvisioning)))
	spec := replicaSpec(m.cfg.Service, m.target, task, id, spot)
	if spot && task.Service.ReplicaPolicy.SpotPlacer == configs.SpotPlacerDynamicFallback {
		spec.Spread, spec.SpreadFrom = m.spotByZoneOwned(), from
	}
	ctx, nodes := m.launchCtx, gangSize(task)
	m.workers.Add(1)
	m.launches.Add(1)
	m.startOwned(func() {
		defer m.workers.Done()
		defer m.launches.Done()
		defer m.recoverPanic("launch")
		m.runLaunch(ctx, r, spec, nodes)
	})
}

// spotByZoneOwned maps live spot replicas' instances to their zones, for SpotHedge.
func (m *Manager) spotByZoneOwned() map[string]string {
	out := map[string]string{}
	for _, r := range m.replicas {
		if r.rec.Spot && live(r.rec.Status) && r.rec.Infra != "" && r.rec.InstanceID != "" {
			out[r.rec.InstanceID] = launcher.ZoneKey(r.rec.Infra, "", r.rec.Zone)
		}
	}
	return out
}

// SpreadMover is an optional Provider capability: it places a spot launch by zone, and takes
// a spread move (launcher.Spec.SpreadFrom) to a zone holding fewer of the caller's spot
// instances, or fails it. The provisioner has it; only then does a manager move replicas.
type SpreadMover interface {
	MovesSpot() bool
}

// SpreadRetry is how long spread moves wait after one found no zone to go to. A move that
// finds none costs no call to an infra (the provisioner filters its zones first, and blocked
// ones are not tried), so it is tried again soon: a zone's block (provision.DefaultBlockFor)
// may end any moment, and until the move the service sits on one zone's reclaim.
const SpreadRetry = time.Minute

// spreadsOwned reports whether the service's spot replicas are spread over zones and moved
// when they settle in mostly one (planInput.Spread).
func (m *Manager) spreadsOwned() bool {
	mover, ok := m.cfg.Provider.(SpreadMover)
	task := m.taskOwned(m.target)
	return ok && mover.MovesSpot() && m.mixOwned().UseSpot && task.Service.ReplicaPolicy.SpotPlacer == configs.SpotPlacerDynamicFallback
}

// spreadPause is how long moves stop after one landed in the zone it was to leave: the
// provider's zones and the records' disagree (an AWS account whose zone names the optimizer
// could not read places by AZ ID, while instances report zone names), and moving again would
// only relaunch into the same zone.
const spreadPause = time.Hour

// spreadLandedOwned logs where a spread move's replica landed, and pauses moves when that is
// the zone it was to leave.
func (m *Manager) spreadLandedOwned(now time.Time, r *replica, to string) {
	if to == r.spreadFrom {
		m.log.Warn("spread move landed in the zone it was to leave; moves paused", zap.Int("replica", r.rec.ID),
			zap.String("zone", to), zap.Duration("for", spreadPause))
		m.spreadAfter = now.Add(spreadPause)
		return
	}
	m.log.Info("spreading spot replicas: one moves out of a zone that holds most of them", zap.Int("replica", r.rec.ID),
		zap.String("from", r.spreadFrom), zap.String("to", to))
}

// recordPreemptionOwned tells the provider where a replica was preempted.
func (m *Manager) recordPreemptionOwned(r *replica) {
	rec, ok := m.cfg.Provider.(PreemptionRecorder)
	if !ok {
		return
	}
	for _, inst := range m.instances {
		if inst.ID == r.rec.InstanceID {
			rec.Preempted(inst)
			return
		}
	}
}

// PreemptionRecorder is an optional Provider capability: told where a spot replica was
// preempted, it avoids that zone for the next spot launches (the provisioner's SpotHedge).
type PreemptionRecorder interface {
	Preempted(inst launcher.Instance)
}

// runLaunch calls the provider in its own goroutine and posts the outcome to the state's owner:
// one instance, or a gang of nodes (all or none, in one location), whose head serves.
func (m *Manager) runLaunch(ctx context.Context, r *replica, spec launcher.Spec, nodes int) {
	var (
		insts []launcher.Instance
		err   error
	)
	select {
	case m.sem <- struct{}{}:
		insts, err = m.safeLaunch(ctx, spec, nodes)
		<-m.sem
	case <-ctx.Done():
		err = ctx.Err()
	}
	m.do(func() { m.launchedOwned(ctx, r, insts, err) })
}

// launchedOwned records how r's launch went.
func (m *Manager) launchedOwned(ctx context.Context, r *replica, insts []launcher.Instance, err error) {
	r.launching = false
	now := m.cfg.Now()
	if err != nil {
		if ctx.Err() != nil {
			// The controller is stopping: leave PROVISIONING for the next one to resolve.
			return
		}
		switch {
		case m.replicas[r.rec.ID] != r:
		case r.spreadFrom != "":
			// A move that found no zone is no failure of the service: no record stays, and
			// moves wait for the blocked zones to be tried again.
			m.log.Debug("spread move found no zone", zap.Int("replica", r.rec.ID), zap.Error(err))
			m.spreadAfter = now.Add(SpreadRetry)
			m.forgetOwned(r.rec.ID)
			m.kickLoop()
		default:
			if r.rec.Spot && errors.Is(err, launcher.ErrCapacityRefused) {
				m.refusedOwned(now, r)
			}
			m.transitionOwned(now, r, StatusFailedProvision, err.Error(), nil)
			m.kickLoop()
		}
		return
	}
	m.eventSeq++
	r.launched, r.launchSeq, r.launchedAt = insts, m.eventSeq, time.Now()
	for _, inst := range insts {
		// A List that overlapped the launch may already hold this instance; a second copy
		// would read as a stray of its own replica and be terminated.
		if i := slices.IndexFunc(m.instances, func(o launcher.Instance) bool { return o.ID == inst.ID }); i >= 0 {
			m.instances[i] = inst
		} else {
			m.instances = append(m.instances, inst)
		}
	}
	g, _ := pickGang(Record{}, insts)
	inst := g.judged(false)
	r.rec.Nodes = g.ids()
	if m.shutdown || m.replicas[r.rec.ID] != r {
		// Shutdown lists and terminates every instance after launches finish.
		m.transitionOwned(now, r, StatusShuttingDown, "service shutting down", inst)
		return
	}
	r.rec.LaunchedAt = now // the initial delay counts from here
	if r.spreadFrom != "" && inst != nil {
		m.spreadLandedOwned(now, r, launcher.ZoneKey(inst.Infra, "", inst.Zone))
	}
	m.transitionOwned(now, r, StatusStarting, "", inst)
	m.ensureProberOwned(r, firstProbeAfterLaunch)
}

// safeLaunch launches one instance, or a gang of nodes through launcher.LaunchGang (the
// provisioner's: all in one location, failing over as a whole), and turns a panicking provider
// into a failed launch. A gang comes back head first, ranked; an incomplete one is an error.
func (m *Manager) safeLaunch(ctx context.Context, spec launcher.Spec, nodes int) (insts []launcher.Instance, err error) {
	defer func() {
		if p := recover(); p != nil {
			m.log.Error("provider Launch panicked", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			insts, err = nil, fmt.Errorf("provider panicked: %v", p)
		}
	}()
	if nodes <= 1 {
		inst, err := m.cfg.Provider.Launch(ctx, spec)
		if err != nil {
			return nil, err
		}
		return []launcher.Instance{inst}, nil
	}
	insts, err = launcher.LaunchGang(ctx, m.cfg.Provider, spec, nodes)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(insts, func(a, b launcher.Instance) int { return nodeRank(a) - nodeRank(b) })
	if len(insts) != nodes || nodeRank(insts[0]) != 0 {
		return nil, fmt.Errorf("launch returned %d of a gang of %d nodes", len(insts), nodes)
	}
	return insts, nil
}

// terminateOwned starts Terminate for one instance, or every node of a replica's gang, in the
// background.
func (m *Manager) terminateOwned(t termination) {
	r := m.replicas[t.ReplicaID]
	if r != nil {
		if r.terminating {
			return
		}
		r.terminating = true
	}
	var ids []string
	for _, id := range append([]string{t.InstanceID}, t.Nodes...) {
		if !m.stopping[id] && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		if r != nil {
			r.terminating = false // another termination stops them
		}
		return
	}
	for _, id := range ids {
		m.stopping[id] = true
	}
	m.instances = slices.DeleteFunc(m.instances, func(i launcher.Instance) bool { return slices.Contains(ids, i.ID) })
	ctx := m.workCtx
	m.workers.Add(1)
	m.startOwned(func() {
		defer m.workers.Done()
		defer m.recoverPanic("terminate")
		errs := make([]error, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Go(func() { errs[i] = m.cfg.Provider.Terminate(ctx, id) })
		}
		wg.Wait()
		m.do(func() {
			if r != nil {
				r.terminating = false
			}
			stopped := true
			for i, id := range ids {
				stopped = m.terminatedOwned(t.ReplicaID, id, errs[i]) && stopped
			}
			if stopped && t.Forget && r != nil && m.replicas[t.ReplicaID] == r {
				m.forgetOwned(t.ReplicaID)
			}
		})
	})
}

// terminatedOwned records how the Terminate of one instance of replica went, and reports
// whether the instance is gone (or left to the provider's janitor).
func (m *Manager) terminatedOwned(replica int, id string, err error) bool {
	delete(m.stopping, id)
	if _, left := launcher.LeftBehind(err); left {
		// Its infra did not answer: the provider's janitor stops it once it does, so the
		// replica goes as if it were gone.
		m.log.Warn("instance left to stop when its infra answers again", zap.String("instance", id), zap.Error(err))
		err = nil
	}
	if err != nil {
		m.log.Warn("terminate instance; will retry", zap.String("instance", id), zap.Error(err))
		return false
	}
	m.gone[id] = time.Now()
	m.instances = slices.DeleteFunc(m.instances, func(i launcher.Instance) bool { return i.ID == id })
	m.log.Info("terminated instance", zap.Int("replica", replica), zap.String("instance", id))
	return true
}
