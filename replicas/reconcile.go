package replicas

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// safeReconcile runs one full pass; a panic in it is logged and the loop goes on.
func (m *Manager) safeReconcile(ctx context.Context) {
	defer m.recoverPanic("reconcile")
	if observe := m.cfg.ObserveReconcile; observe != nil {
		defer func(start time.Time) { observe(time.Since(start)) }(time.Now())
	}
	m.reconcile(ctx)
}

// reconcile lists the service's instances and runs a pass against them.
func (m *Manager) reconcile(ctx context.Context) {
	if err := m.load(); err != nil {
		m.log.Warn("load replica records; will retry", zap.Error(err))
		return
	}
	var (
		shutdown bool
		seq      uint64
	)
	m.own(func() { shutdown, seq = m.shutdown, m.eventSeq })
	if shutdown {
		return
	}

	listCtx, cancel := context.WithTimeout(ctx, listTimeout)
	insts, err := m.cfg.Provider.List(listCtx, m.selector)
	cancel()
	gaps, partial := launcher.Partial(err)
	if !partial {
		if ctx.Err() == nil {
			m.log.Warn("list instances; will retry", zap.Error(err))
		}
		return
	}

	// do: following an instance's new endpoint saves the record (followOwned).
	m.do(func() {
		m.noteGapsOwned(gaps)
		m.observeOwned(insts, gaps, seq)
	})
	m.pass()
}

// observeOwned takes a List result begun at seq as the current observation, minus instances
// we terminated since, plus instances our launches made since. Where the List had gaps (an
// infra or zone that did not answer), what is there is unknown, not gone: the instances last
// seen there stay as they were, and a replica recorded there that this manager never saw (it
// just restarted) keeps the instance its record names. Their replicas go on serving while
// their own probes pass.
func (m *Manager) observeOwned(insts []launcher.Instance, gaps []launcher.Gap, seq uint64) {
	now := time.Now()
	for id, at := range m.gone {
		if now.Sub(at) > goneTTL {
			delete(m.gone, id)
		}
	}
	seen := map[string]bool{}
	observed := make([]launcher.Instance, 0, len(insts))
	for _, inst := range insts {
		if _, ok := m.gone[inst.ID]; ok || m.stopping[inst.ID] {
			continue
		}
		seen[inst.ID] = true
		observed = append(observed, inst)
	}
	for _, r := range m.replicas {
		if len(r.launched) == 0 || r.listed {
			continue
		}
		if r.launchSeq <= seq && !slices.ContainsFunc(r.launched, func(i launcher.Instance) bool { return !seen[i.ID] }) {
			r.listed = true // this List shows them all: from now on, gone from a List is gone
			continue
		}
		// Begun before the launch returned, or from a cache that has not caught up with it
		// yet (an informer, EC2's eventually consistent DescribeInstances): not gone until a
		// List has shown them, or for launchListGrace.
		if r.launchSeq <= seq && now.Sub(r.launchedAt) > launchListGrace {
			continue
		}
		for _, inst := range r.launched {
			if _, terminated := m.gone[inst.ID]; !seen[inst.ID] && !terminated && !m.stopping[inst.ID] {
				seen[inst.ID] = true
				observed = append(observed, inst)
			}
		}
	}
	if len(gaps) > 0 {
		observed = m.keepUnknownOwned(observed, seen, gaps)
	}
	m.instances = observed
	m.observed = true
	// A notice is kept while the instance is listed: it may be reclaimed late, or a List may
	// begin before the notice and still show it running.
	for id, at := range m.notices {
		if !seen[id] && now.Sub(at) > goneTTL {
			delete(m.notices, id)
		}
	}
}

// launchListGrace is how long a launched instance that no List has shown yet counts as
// running: a List served from a cache may trail the launch by seconds under load.
const launchListGrace = 30 * time.Second

// maxPassRounds bounds how often one pass plans again after writing what its plan needed.
const maxPassRounds = 6

// pass decides on the latest observation and acts on it, in rounds posted from the caller's
// goroutine (never the run loop's). What must be on disk before the pass acts (a verdict on the
// rollout: it must not be undone by a restart halfway; ids for new replicas) is written outside
// the loop (the verdict by the executor, ordered with StartUpdate's write), and the pass then
// plans again on the state as it is by then. Each verdict ends or latches a state, so this
// settles within a few rounds; a write that fails is not retried in the same pass.
func (m *Manager) pass() {
	var rolloutFailed, idsFailed bool
	for round := 1; ; round++ {
		var (
			next passNeed
			ids  int
		)
		verdicts, reserve := round < maxPassRounds && !rolloutFailed, round < maxPassRounds && !idsFailed
		// do: a queued verdict is written (or failed) when it returns.
		m.do(func() { next, ids = m.passRoundOwned(verdicts, reserve, &rolloutFailed) })
		switch next {
		case passNeedsVerdict:
			continue
		case passNeedsIDs:
			if err := m.reserveIDs(ids); err != nil {
				m.log.Error("allocate replica ids; launching later", zap.Error(err))
				idsFailed = true
			}
			continue
		}
		return
	}
}

// passNeed is what a round of a pass needs written before it can act.
type passNeed int

const (
	passActed passNeed = iota
	// passNeedsVerdict: a verdict on the rollout is queued; the next round plans under it.
	passNeedsVerdict
	// passNeedsIDs: the launches need more reserved replica ids.
	passNeedsIDs
)

// passRoundOwned plans once and acts, unless the plan needs a verdict saved first (queued,
// its failure reported in rolloutFailed) or more replica ids (and how many).
func (m *Manager) passRoundOwned(verdicts, reserve bool, rolloutFailed *bool) (passNeed, int) {
	if m.shutdown || !m.observed || !m.loaded.Load() || m.workCtx == nil || m.workCtx.Err() != nil {
		return passActed, 0
	}
	now := m.cfg.Now()
	acts := plan(m.planInputOwned(now))
	if verdicts && acts.Rollout != nil {
		if next, changed := m.verdictOwned(now, acts.Rollout); changed {
			prev, ch := m.rollout, acts.Rollout
			m.queueOwned(func() { *rolloutFailed = !m.commitVerdict(prev, next, ch) })
			return passNeedsVerdict, 0
		}
	}
	if n := acts.Launch + acts.LaunchSpot + spreadLaunches(acts); reserve && n > len(m.spareIDs) {
		return passNeedsIDs, n
	}
	m.applyOwned(now, acts)
	if m.desired < 0 {
		// First pass after a (re)start with no target yet: keep what runs.
		m.desired = max(m.taskOwned(m.target).Service.ReplicaPolicy.MinReplicas, m.liveOwned())
		m.log.Info("replica target taken from running replicas", zap.Int("target", m.desired))
		m.kickLoop()
	}
	m.setReadyOwned()
	m.publishOwned(false)
	return passActed, 0
}

// spreadLaunches is how many launches a spread move adds to acts: 0 or 1.
func spreadLaunches(acts actions) int {
	if acts.SpreadFrom != "" {
		return 1
	}
	return 0
}

// planInputOwned is what a pass decides on now.
func (m *Manager) planInputOwned(now time.Time) planInput {
	in := planInput{
		Now:                 now,
		Service:             m.cfg.Service,
		Desired:             m.desired,
		InitialDelay:        m.initialDelayOwned(),
		FailureThreshold:    m.cfg.FailureThreshold,
		ConsecutiveFailures: m.failures[false],
		LastFailure:         m.lastFail[false],
		SpotFailures:        m.failures[true],
		SpotLastFailure:     m.lastFail[true],
		KeepFailed:          keepFailed,
		Instances:           m.instances,
		Drain:               m.cfg.Busy != nil,
		InfraRank:           m.cfg.InfraRank,
		Mix:                 m.mixOwned(),
		Spread:              m.spreadsOwned(),
		SpreadAfter:         m.spreadAfter,
	}
	if in.Mix.UseSpot && len(m.losses.Zones) > 0 { // no zone seen, no ceiling: skip the count
		in.Spare = m.losses.Spare(now, m.spotHeldOwned(nil))
	}
	if in.Spare == 0 { // a spare stands against the next loss instead of the held fallback
		in.HoldOnDemand = m.losses.HoldOnDemand(now)
	}
	if in.Spare != m.spotSpare {
		m.log.Info("spare spot replica", zap.Int("spare", in.Spare), zap.String("why", spareWhy(in.Spare)))
		m.spotSpare = in.Spare
	}
	m.dueWindowsOwned(now) // window.go
	for _, id := range sortedKeys(m.replicas) {
		r := m.replicas[id]
		switch {
		case r.rec.Status != StatusReady:
			r.healthySince = time.Time{}
		case r.healthySince.IsZero() && r.probe.OK:
			r.healthySince = now
		}
		in.Replicas = append(in.Replicas, replicaView{Record: r.rec, Probe: r.probe, Launching: r.launching,
			Terminating: r.terminating, Draining: m.drainingOwned(now, r), HealthySince: r.healthySince,
			Noticed: m.noticedOwned(r), InGap: m.inGapOwned(r.rec), Moving: r.spreadFrom != ""})
	}
	m.versionInputOwned(&in)
	return in
}

// noticedOwned reports whether an infra warned that the replica's instance, or a node of its
// gang, will be reclaimed.
func (m *Manager) noticedOwned(r *replica) bool {
	for id := range m.notices {
		if r.hasNode(id) {
			return true
		}
	}
	return false
}

// inGapOwned reports whether rec's instance lies where the last List could not read.
func (m *Manager) inGapOwned(rec Record) bool {
	if len(m.gaps) == 0 || rec.Infra == "" {
		return false
	}
	g, in := m.inGaps(m.gaps, rec)
	return in && !errors.Is(g.Err, launcher.ErrNotFound)
}

// drainingOwned reports whether a scaled-down replica still serves requests it took while it
// was READY, within the drain timeout.
func (m *Manager) drainingOwned(now time.Time, r *replica) bool {
	if m.cfg.Busy == nil || r.rec.Status != StatusShuttingDown || r.rec.Endpoint == "" {
		return false
	}
	if r.drainingSince.IsZero() {
		r.drainingSince = now
	}
	if now.Sub(r.drainingSince) >= m.cfg.DrainTimeout {
		m.log.Warn("drain timed out; terminating with requests in flight", zap.Int("replica", r.rec.ID),
			zap.Duration("drain_timeout", m.cfg.DrainTimeout))
		return false
	}
	return m.cfg.Busy(r.rec.Endpoint) > 0
}

func (m *Manager) initialDelayOwned() time.Duration {
	if s := m.taskOwned(m.target).Service.ReadinessProbe.InitialDelaySeconds; s > 0 {
		return time.Duration(s) * time.Second
	}
	return DefaultInitialDelay
}

// applyOwned carries out a plan. Each status change is saved before its action starts.
func (m *Manager) applyOwned(now time.Time, acts actions) {
	for _, rec := range acts.Adopt {
		r := &replica{rec: rec}
		m.replicas[rec.ID] = r
		m.saveOwned(r)
		m.log.Info("adopted replica", zap.Int("replica", rec.ID), zap.String("instance", rec.InstanceID),
			zap.String("status", string(rec.Status)), zap.String("reason", rec.Reason))
	}
	for _, tr := range acts.Transitions {
		if r := m.replicas[tr.ID]; r != nil {
			if tr.To == StatusPreempted {
				m.recordPreemptionOwned(r)
				// A replica noticed before was lost at its notice already.
				if r.rec.Spot && !m.noticedOwned(r) {
					m.lostOwned(now, r)
				}
			}
			m.transitionOwned(now, r, tr.To, tr.Reason, tr.Instance)
		}
	}
	for _, inst := range acts.Follow {
		m.followOwned(inst)
	}
	for _, g := range acts.Gangs {
		if r := m.replicas[g.ID]; r != nil {
			r.rec.Nodes = g.Nodes
			m.saveOwned(r)
		}
	}
	for _, id := range acts.Relabel {
		if r := m.replicas[id]; r != nil && r.rec.Version != m.target {
			m.log.Info("replica relabelled", zap.Int("replica", id), zap.Int("from_version", r.rec.Version), zap.Int("to_version", m.target))
			r.rec.Version = m.target
			m.saveOwned(r)
		}
	}
	for _, t := range acts.Terminate {
		m.terminateOwned(t)
	}
	for _, id := range acts.Forget {
		m.forgetOwned(id)
	}
	if !acts.LaunchDeferredUntil.IsZero() {
		m.log.Debug("launch deferred after repeated failures", zap.Time("until", acts.LaunchDeferredUntil),
			zap.Int("failures", m.failures[false]), zap.Int("spot_failures", m.failures[true]))
	}
	for range acts.Launch {
		m.launchOwned(now, false, "")
	}
	for range acts.LaunchSpot {
		m.launchOwned(now, true, "")
	}
	if acts.SpreadFrom != "" {
		m.log.Debug("spread move: one more spot replica out of a zone that holds most of them", zap.String("zone", acts.SpreadFrom))
		m.launchOwned(now, true, acts.SpreadFrom)
	}
	for _, r := range m.replicas {
		if probeable(r.rec.Status) && r.rec.Endpoint != "" {
			m.ensureProberOwned(r, 0)
		}
	}
}

// keepUnknownOwned adds to observed what lies in the List's gaps and the List could not show:
// the instances of the last observation there, and the instances of replica records there that
// were never observed.
func (m *Manager) keepUnknownOwned(observed []launcher.Instance, seen map[string]bool, gaps []launcher.Gap) []launcher.Instance {
	// A zone that does not exist holds nothing: what was recorded there is gone.
	gaps = slices.DeleteFunc(slices.Clone(gaps), func(g launcher.Gap) bool { return errors.Is(g.Err, launcher.ErrNotFound) })
	unknown := func(id string) bool {
		_, gone := m.gone[id]
		return id != "" && !seen[id] && !gone && !m.stopping[id]
	}
	for _, inst := range m.instances {
		if _, in := launcher.InGaps(gaps, inst.Infra, inst.Region, inst.Zone); in && unknown(inst.ID) {
			seen[inst.ID] = true
			observed = append(observed, inst)
		}
	}
	for _, id := range sortedKeys(m.replicas) {
		rec := m.replicas[id].rec
		if _, in := m.inGaps(gaps, rec); in && unknown(rec.InstanceID) && rec.Infra != "" {
			seen[rec.InstanceID] = true
			observed = append(observed, instanceOfRecord(rec))
		}
	}
	return observed
}

// inGaps is the gap a record's instance lies in, its region told by the provider where the
// record lacks it (a region's gap must not cover another region's instances).
func (m *Manager) inGaps(gaps []launcher.Gap, rec Record) (launcher.Gap, bool) {
	region := ""
	if l, ok := m.cfg.Provider.(launcher.Locator); ok && rec.InstanceID != "" {
		region, _ = l.Locate(rec.InstanceID)
	}
	return launcher.InGaps(gaps, rec.Infra, region, rec.Zone)
}

// instanceOfRecord is the instance a record names, as the record knows it: running, for an
// infra that cannot say otherwise now.
func instanceOfRecord(rec Record) launcher.Instance {
	return launcher.Instance{
		ID: rec.InstanceID, Endpoint: rec.Endpoint, Infra: rec.Infra, Zone: rec.Zone, Spot: rec.Spot,
		PricePerHour: rec.Price, Accelerator: rec.Accelerator, State: launcher.StateRunning, LaunchedAt: rec.LaunchedAt,
		Labels: map[string]string{launcher.LabelService: rec.Service, launcher.LabelReplicaID: strconv.Itoa(rec.ID),
			launcher.LabelVersion: strconv.Itoa(rec.Version), launcher.LabelOwner: "true"},
	}
}

// noteGapsOwned keeps the List's gaps for Unknown, and logs when they change.
func (m *Manager) noteGapsOwned(gaps []launcher.Gap) {
	was := make([]string, len(m.gaps))
	for i, g := range m.gaps {
		was[i] = g.Where()
	}
	now := make([]string, len(gaps))
	for i, g := range gaps {
		now[i] = g.Where()
	}
	if !slices.Equal(was, now) {
		if len(gaps) > 0 {
			m.log.Warn("instances on some infras are unknown: their replicas are kept as last seen", zap.Error(launcher.PartialList(slices.Clone(gaps))))
		} else if len(m.gaps) > 0 {
			m.log.Info("every infra listed again")
		}
	}
	m.gaps = gaps
}

// Unknown are the parts of the infras the last List could not read: the replicas there are kept
// as last seen.
func (m *Manager) Unknown() []launcher.Gap {
	return slices.Clone(m.snap.Load().gaps)
}

// spareWhy says why the spare changed, for the log.
func spareWhy(spare int) string {
	if spare > 0 {
		return "a zone holds as many spot replicas as when it last refused a launch or took some back"
	}
	return "no zone sits at a capacity ceiling seen within a day"
}
