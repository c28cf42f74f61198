package replicas

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// A service's spot losses (policy.Losses) decide how long its on-demand fallback is held once
// spot is READY again: a reclaim notice or a preemption of one of its spot replicas is a loss,
// the plan keeps the fallback while Losses holds it (planInput.HoldOnDemand), and the history
// is saved with the service so that a restarted controller holds what its predecessor held.

// Losses is policy.Losses under the name the stores and the API know it by: they build on
// replicas, not on the decision packages (the import rules of docs/ARCHITECTURE.md).
type Losses = policy.Losses

// LossStore keeps a service's spot losses across restarts; the controller's stores implement
// it. With a store that does not, a restarted manager starts with no history and holds nothing
// until losses come in a run again.
type LossStore interface {
	SaveLosses(service string, l Losses) error
	// Losses returns the service's saved losses, the zero value when it has none.
	Losses(service string) (Losses, error)
}

// SpotLosses returns what the service has seen of its spot capacity being taken back, for
// `serve status -v`.
func (m *Manager) SpotLosses() policy.Losses {
	if err := m.load(); err != nil {
		m.log.Warn("load replica records", zap.Error(err))
	}
	return cloneLosses(m.snap.Load().losses)
}

// lostOwned records the loss of spot replica r (noticed or preempted) at now, and queues its
// save.
func (m *Manager) lostOwned(now time.Time, r *replica) {
	where := cmp.Or(r.rec.Zone, m.regionOwned(r.rec.InstanceID), r.rec.Infra)
	// Copied, never changed in place: snapshots and the queued save share the old value.
	next := cloneLosses(m.losses)
	next.Lost(now, where)
	m.losses = next
	m.log.Info("spot replica lost", zap.Int("replica", r.rec.ID), zap.String("zone", where),
		zap.Duration("fallback_hold", next.Hold(now)))
	m.queueOwned(func() {
		if ls, ok := m.cfg.Store.(LossStore); ok {
			if err := ls.SaveLosses(m.cfg.Service, next); err != nil {
				m.log.Error("save spot losses", zap.Error(err))
			}
		}
	})
}

// regionOwned is the region of the listed instance id ("" when not listed).
func (m *Manager) regionOwned(id string) string {
	for _, inst := range m.instances {
		if inst.ID == id {
			return inst.Region
		}
	}
	return ""
}

// loadLosses reads the saved losses, outside the run loop; none without a LossStore.
func (m *Manager) loadLosses() (policy.Losses, error) {
	ls, ok := m.cfg.Store.(LossStore)
	if !ok {
		return policy.Losses{}, nil
	}
	return ls.Losses(m.cfg.Service)
}

// cloneLosses is a copy of l that shares no slice or map with it.
func cloneLosses(l policy.Losses) policy.Losses {
	l.Gaps = slices.Clone(l.Gaps)
	l.Zones = maps.Clone(l.Zones)
	return l
}
