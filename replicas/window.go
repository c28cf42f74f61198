package replicas

import (
	"time"

	"go.uber.org/zap"
)

// A replica in a reservation or capacity block (launcher.Instance.WindowEnd, or a provider's
// Notice of the end sent ahead of time) is replaced before the window ends as a spot replica
// is on its interruption warning, only WindowLead ahead instead of when warned: at end −
// WindowLead the instance is noticed, a replacement launches (elsewhere, or in another window:
// the optimizer leaves windows shorter than the lead), and the old replica is drained once the
// others READY make the target (retireNoticed), so no request fails. The lead must cover a
// replacement's launch and cold start; it is Config.WindowLead (the controller's
// --window-lead), 10 minutes by default. Unlike a spot warning the end is not a preemption:
// the zone is not avoided afterwards.

// deferNotice keeps a notice whose reclaim time is further away than the lead, to be acted on
// once within it; it reports whether it did. Spot warnings (minutes or less) pass through.
func (m *Manager) deferNotice(instance string, at time.Time) bool {
	if at.Sub(m.cfg.Now()) <= m.cfg.WindowLead {
		return false
	}
	ours := false
	m.own(func() { ours = m.deferNoticeOwned(instance, at) })
	return ours
}

func (m *Manager) deferNoticeOwned(instance string, at time.Time) bool {
	ours := false
	for _, r := range m.replicas {
		if r.hasNode(instance) && live(r.rec.Status) {
			ours = true
		}
	}
	if ours {
		if m.windowEnds == nil {
			m.windowEnds = map[string]time.Time{}
		}
		if _, known := m.windowEnds[instance]; !known {
			m.log.Info("replica's reservation ends: replacing it ahead", zap.String("instance", instance), zap.Time("ends", at),
				zap.Time("replaced_from", at.Add(-m.cfg.WindowLead)))
		}
		m.windowEnds[instance] = at
	}
	return ours
}

// dueWindowsOwned notices the instances whose window ends within the lead from now: those
// the provisioner or List reported with a WindowEnd, and those a deferred notice named.
func (m *Manager) dueWindowsOwned(now time.Time) {
	seen := map[string]bool{}
	for _, inst := range m.instances {
		seen[inst.ID] = true
		if !inst.WindowEnd.IsZero() {
			m.noticeWindowOwned(now, inst.ID, inst.WindowEnd)
		}
	}
	for id, end := range m.windowEnds {
		m.noticeWindowOwned(now, id, end)
		if !seen[id] && now.After(end) {
			delete(m.windowEnds, id)
		}
	}
}

func (m *Manager) noticeWindowOwned(now time.Time, id string, end time.Time) {
	if _, known := m.notices[id]; known || now.Before(end.Add(-m.cfg.WindowLead)) {
		return
	}
	for _, r := range m.replicas {
		if r.hasNode(id) && live(r.rec.Status) {
			m.notices[id] = end
			m.log.Warn("reservation ends soon: replacing the replica before it does",
				zap.Int("replica", r.rec.ID), zap.String("instance", id), zap.Time("ends", end))
			return
		}
	}
}
