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

// SpotSpare is how many spare spot replicas the service ran at its last pass, while a zone sat
// at its capacity ceiling (policy.Losses.Spare), for `serve status -v`.
func (m *Manager) SpotSpare() int { return m.snap.Load().spotSpare }

// lostOwned records the loss of spot replica r (noticed or preempted) at now, and what it left
// in its zone (policy.Losses.Capped), and queues the save.
func (m *Manager) lostOwned(now time.Time, r *replica) {
	where := cmp.Or(r.rec.Zone, m.regionOwned(r.rec.InstanceID), r.rec.Infra)
	held := m.spotHeldOwned(r)[r.rec.Zone]
	next := m.updateLossesOwned(func(l *policy.Losses) {
		l.Lost(now, where)
		l.Capped(now, r.rec.Zone, held) // a replica in no named zone says nothing of one
	})
	m.log.Info("spot replica lost", zap.Int("replica", r.rec.ID), zap.String("zone", where),
		zap.Int("left_in_zone", held), zap.Duration("fallback_hold", next.Hold(now)))
}

// refusedOwned records that no zone took spot replica r's launch at now: each zone holds no
// more of the service's spot replicas than it does now (policy.Losses.Capped).
func (m *Manager) refusedOwned(now time.Time, r *replica) {
	held := m.spotHeldOwned(r)
	m.updateLossesOwned(func(l *policy.Losses) {
		for zone, n := range held {
			l.Capped(now, zone, n)
		}
	})
}

// updateLossesOwned applies fn to a copy of the losses, keeps it, and queues its save.
func (m *Manager) updateLossesOwned(fn func(*policy.Losses)) policy.Losses {
	// Copied, never changed in place: snapshots and the queued save share the old value.
	next := cloneLosses(m.losses)
	fn(&next)
	m.losses = next
	m.queueOwned(func() {
		if ls, ok := m.cfg.Store.(LossStore); ok {
			if err := ls.SaveLosses(m.cfg.Service, next); err != nil {
				m.log.Error("save spot losses", zap.Error(err))
			}
		}
	})
	return next
}

// spotHeldOwned counts the service's live spot replicas per zone (their records' Zone, which
// is also where their losses count), except those warned of a reclaim, those in no named zone,
// and except itself. Ceilings are a zone's: a region or a whole infra is too coarse for one.
func (m *Manager) spotHeldOwned(except *replica) map[string]int {
	held := map[string]int{}
	for _, r := range m.replicas {
		if r != except && r.rec.Spot && r.rec.Zone != "" && live(r.rec.Status) && !m.noticedOwned(r) {
			held[r.rec.Zone]++
		}
	}
	return held
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
	l.Sizes = slices.Clone(l.Sizes) // Lost adds to the last size in place
	l.Zones = maps.Clone(l.Zones)
	return l
}
