package replicas

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// launchLocked records a new PROVISIONING replica and starts its Launch in the background.
func (m *Manager) launchLocked(now time.Time, spot bool) {
	task := m.taskLocked(m.target)
	id, ok := m.nextIDLocked()
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
		launching: true,
	}
	m.replicas[id] = r
	m.saveLocked(r)
	m.log.Info("replica status", zap.Int("replica", id), zap.String("to", string(StatusProvisioning)))
	spec := replicaSpec(m.cfg.Service, m.target, task, id, spot)
	if spot && task.Service.ReplicaPolicy.SpotPlacer == configs.SpotPlacerDynamicFallback {
		spec.Spread = m.spotByZoneLocked()
	}
	ctx := m.launchCtx
	m.workers.Add(1)
	m.launches.Add(1)
	m.startLocked(func() {
		defer m.workers.Done()
		defer m.launches.Done()
		m.runLaunch(ctx, r, spec)
	})
}

// spotByZoneLocked maps live spot replicas' instances to their zones, for SpotHedge.
func (m *Manager) spotByZoneLocked() map[string]string {
	out := map[string]string{}
	for _, r := range m.replicas {
		if r.rec.Spot && live(r.rec.Status) && r.rec.Infra != "" && r.rec.InstanceID != "" {
			out[r.rec.InstanceID] = launcher.ZoneKey(r.rec.Infra, "", r.rec.Zone)
		}
	}
	return out
}

// recordPreemptionLocked tells the provider where a replica was preempted.
func (m *Manager) recordPreemptionLocked(r *replica) {
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

// runLaunch calls the provider outside the lock and records the outcome.
func (m *Manager) runLaunch(ctx context.Context, r *replica, spec launcher.Spec) {
	var (
		inst launcher.Instance
		err  error
	)
	select {
	case m.sem <- struct{}{}:
		inst, err = m.safeLaunch(ctx, spec)
		<-m.sem
	case <-ctx.Done():
		err = ctx.Err()
	}

	m.mu.Lock()
	defer m.unlock()
	r.launching = false
	now := m.cfg.Now()
	if err != nil {
		if ctx.Err() != nil {
			// The controller is stopping: leave PROVISIONING for the next one to resolve.
			return
		}
		if m.replicas[r.rec.ID] == r {
			m.transitionLocked(now, r, StatusFailedProvision, err.Error(), nil)
			m.kickLoop()
		}
		return
	}
	m.eventSeq++
	r.launched, r.launchSeq = &inst, m.eventSeq
	// A List that overlapped the launch may already hold this instance; a second copy would
	// read as a stray of its own replica and be terminated.
	if i := slices.IndexFunc(m.instances, func(o launcher.Instance) bool { return o.ID == inst.ID }); i >= 0 {
		m.instances[i] = inst
	} else {
		m.instances = append(m.instances, inst)
	}
	if m.shutdown || m.replicas[r.rec.ID] != r {
		// Shutdown lists and terminates every instance after launches finish.
		m.transitionLocked(now, r, StatusShuttingDown, "service shutting down", &inst)
		return
	}
	r.rec.LaunchedAt = now // the initial delay counts from here
	m.transitionLocked(now, r, StatusStarting, "", &inst)
	m.ensureProberLocked(r, firstProbeAfterLaunch)
}

// safeLaunch turns a panicking provider into a failed launch.
func (m *Manager) safeLaunch(ctx context.Context, spec launcher.Spec) (inst launcher.Instance, err error) {
	defer func() {
		if p := recover(); p != nil {
			m.log.Error("provider Launch panicked", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("provider panicked: %v", p)
		}
	}()
	return m.cfg.Provider.Launch(ctx, spec)
}

// terminateLocked starts Terminate for one instance in the background.
func (m *Manager) terminateLocked(t termination) {
	r := m.replicas[t.ReplicaID]
	if r != nil {
		if r.terminating {
			return
		}
		r.terminating = true
	}
	if m.stopping[t.InstanceID] {
		return
	}
	m.stopping[t.InstanceID] = true
	m.instances = slices.DeleteFunc(m.instances, func(i launcher.Instance) bool { return i.ID == t.InstanceID })
	ctx := m.workCtx
	m.workers.Add(1)
	m.startLocked(func() {
		defer m.workers.Done()
		defer m.recoverPanic("terminate")
		err := m.cfg.Provider.Terminate(ctx, t.InstanceID)
		m.mu.Lock()
		defer m.unlock()
		delete(m.stopping, t.InstanceID)
		if r != nil {
			r.terminating = false
		}
		if _, left := launcher.LeftBehind(err); left {
			// Its infra did not answer: the provider's janitor stops it once it does, so
			// the replica goes as if it were gone.
			m.log.Warn("instance left to stop when its infra answers again", zap.String("instance", t.InstanceID), zap.Error(err))
			err = nil
		}
		if err != nil {
			m.log.Warn("terminate instance; will retry", zap.String("instance", t.InstanceID), zap.Error(err))
			return
		}
		m.gone[t.InstanceID] = time.Now()
		m.instances = slices.DeleteFunc(m.instances, func(i launcher.Instance) bool { return i.ID == t.InstanceID })
		m.log.Info("terminated instance", zap.Int("replica", t.ReplicaID), zap.String("instance", t.InstanceID))
		if t.Forget && r != nil && m.replicas[t.ReplicaID] == r {
			m.forgetLocked(t.ReplicaID)
		}
	})
}
