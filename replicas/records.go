package replicas

import (
	"errors"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// followLocked takes a new endpoint from the replica's instance; the prober restarts on it.
func (m *Manager) followLocked(inst launcher.Instance) {
	id, err := strconv.Atoi(inst.Labels[launcher.LabelReplicaID])
	r := m.replicas[id]
	if err != nil || r == nil || r.rec.InstanceID != inst.ID {
		return
	}
	m.log.Info("replica endpoint", zap.Int("replica", id), zap.String("from", r.rec.Endpoint), zap.String("to", inst.Endpoint))
	was := r.rec.Endpoint
	followInstance(&r.rec, &inst)
	m.stopProberLocked(r)
	// Probes of the old address say nothing of the new one: serve it only once it answers.
	r.probe = probeState{}
	if was != "" && r.rec.Status == StatusReady {
		// NOT_READY, not STARTING: the initial delay counts from launch, long past.
		m.transitionLocked(m.cfg.Now(), r, StatusNotReady, "endpoint changed to "+inst.Endpoint, nil)
		return
	}
	m.save(r)
}

// transitionLocked moves r to status to, saves and logs it.
func (m *Manager) transitionLocked(now time.Time, r *replica, to Status, reason string, inst *launcher.Instance) {
	from := r.rec.Status
	r.rec.Status, r.rec.Reason = to, reason
	if inst != nil {
		followInstance(&r.rec, inst)
	}
	kind := r.rec.Spot && m.mixLocked().UseSpot // a service without spot is one pool
	// Only the version being launched backs its launches off: the failures of a version
	// rolled back from say nothing of the one restored.
	current := m.launchedAsLocked(r.rec.Version) == m.launchedAsLocked(m.target)
	switch {
	case !current:
	case to == StatusReady:
		if r.rec.ReadyAt.IsZero() {
			r.rec.ReadyAt = now
		}
		m.failures[kind] = 0
	case to == StatusFailedProvision, to.Terminal() && to != StatusPreempted && r.rec.ReadyAt.IsZero():
		// Replicas that never served: a broken program or image, or no capacity; back off
		// relaunching that kind.
		m.failures[kind]++
		m.lastFail[kind] = now
	}
	if !probeable(to) {
		m.stopProberLocked(r)
	}
	m.save(r)
	fields := []zap.Field{zap.Int("replica", r.rec.ID), zap.String("from", string(from)),
		zap.String("to", string(to)), zap.String("instance", r.rec.InstanceID)}
	if reason != "" {
		fields = append(fields, zap.String("reason", reason))
	}
	if to.Terminal() {
		m.log.Warn("replica status", fields...)
	} else {
		m.log.Info("replica status", fields...)
	}
}

func (m *Manager) save(r *replica) {
	if err := m.cfg.Store.SaveReplica(r.rec); err != nil {
		m.log.Error("save replica record", zap.Int("replica", r.rec.ID), zap.Error(err))
	}
}

// forgetLocked deletes a record for good.
func (m *Manager) forgetLocked(id int) {
	r := m.replicas[id]
	if r == nil {
		return
	}
	m.stopProberLocked(r)
	delete(m.replicas, id)
	if err := m.cfg.Store.DeleteReplica(m.cfg.Service, id); err != nil {
		m.log.Error("delete replica record", zap.Int("replica", id), zap.Error(err))
	}
	m.log.Debug("forgot replica", zap.Int("replica", id), zap.String("status", string(r.rec.Status)))
}

// mixLocked is how the target version's task splits replicas between spot and on-demand.
func (m *Manager) mixLocked() policy.MixSpec {
	task := m.taskLocked(m.target)
	return MixFor(task.Resources, task.Service.ReplicaPolicy)
}

// liveLocked counts replicas that count toward the target.
func (m *Manager) liveLocked() int {
	n := 0
	for _, r := range m.replicas {
		if live(r.rec.Status) {
			n++
		}
	}
	return n
}

// loadLocked reads the service's records from the store once.
func (m *Manager) loadLocked() error {
	if m.loaded {
		return nil
	}
	recs, err := m.cfg.Store.ListReplicas(m.cfg.Service)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		m.replicas[rec.ID] = &replica{rec: rec}
	}
	m.loaded = true
	return nil
}

// nextIDLocked asks the store for an id no replica here holds (the store is the authority,
// but a lost store must not hand out the id of an adopted replica).
func (m *Manager) nextIDLocked() (int, error) {
	for range 1000 {
		id, err := m.cfg.Store.NextReplicaID(m.cfg.Service)
		if err != nil {
			return 0, err
		}
		if _, taken := m.replicas[id]; !taken {
			return id, nil
		}
	}
	return 0, errors.New("store keeps returning replica ids already in use")
}
