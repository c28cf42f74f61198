package replicas

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"
)

// readySet is an immutable published READY set.
type readySet struct {
	version   uint64
	endpoints []Endpoint
}

// kickLoop asks the loop for a full pass now.
func (m *Manager) kickLoop() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// setReadyOwned swaps in a new READY set if membership changed.
func (m *Manager) setReadyOwned() {
	var endpoints []Endpoint
	if !m.shutdown {
		var ready []Record
		for _, id := range sortedKeys(m.replicas) {
			if r := m.replicas[id]; r.rec.Status == StatusReady && r.rec.Endpoint != "" {
				ready = append(ready, r.rec)
			}
		}
		for _, rec := range serving(m.rollout, m.target, m.launchedAsOwned, ready) {
			acc := accelerator(m.taskOwned(rec.Version).Resources)
			if rec.Accelerator != "" {
				acc = rec.Accelerator // where it was placed, among the task's alternatives
			}
			endpoints = append(endpoints, Endpoint{ReplicaID: rec.ID, Version: rec.Version, Addr: rec.Endpoint, Accelerator: acc})
		}
	}
	cur := m.ready.Load()
	if slices.Equal(cur.endpoints, endpoints) {
		return
	}
	m.ready.Store(&readySet{version: cur.version + 1, endpoints: endpoints})
}

// publishOwned queues a publication of the READY set: when the executor reaches it, OnReady
// gets the newest set if it changed since the last call, or always with force (Start's first
// publication, Shutdown). The executor runs publications one at a time, once the record writes
// queued before them are done, so calls never overlap, and each sends the newest set, so the
// last change is never lost. Unforced, it queues nothing when the set has not changed since
// the last publication queued: every pass asks, and a caller of do would wait for it behind
// every record write queued before it, other replicas' included (a pass that changed nothing
// took seconds on a busy API server).
func (m *Manager) publishOwned(force bool) {
	version := m.ready.Load().version
	if !force && version == m.publishQueued {
		return
	}
	m.publishQueued = version
	m.queueAfterOwned(func() { m.publishNow(force) })
}

// publishNow is a publication as the executor runs it.
func (m *Manager) publishNow(force bool) {
	if force {
		m.publishing.Store(true)
	}
	set := m.ready.Load()
	if !m.publishing.Load() || (!force && set.version == m.published) {
		return
	}
	m.published = set.version
	m.log.Info("ready set", zap.Int("ready", len(set.endpoints)))
	if m.cfg.OnReady == nil {
		return
	}
	defer m.recoverPanic("OnReady")
	m.cfg.OnReady(slices.Clone(set.endpoints))
}

// awaitFirstProbes waits until every probed replica has a first result, or firstProbesWait.
func (m *Manager) awaitFirstProbes(ctx context.Context) {
	deadline := time.NewTimer(firstProbesWait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if m.firstProbesDone() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

func (m *Manager) firstProbesDone() bool {
	done := true
	m.own(func() {
		for _, r := range m.replicas {
			if r.stopProbe != nil && r.probe.At.IsZero() {
				done = false
			}
		}
	})
	return done
}
