package replicas

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
)

// Each probed replica has its own prober goroutine, so probes of all replicas run concurrently
// and a slow replica delays no other. Its results reach the state as steps (loop.go); one that
// may change readiness runs a pass at once and republishes the READY set without waiting for
// the next reconcile tick.

// ensureProberOwned starts probing r, first after delay first, unless a prober runs already.
func (m *Manager) ensureProberOwned(r *replica, first time.Duration) {
	if r.stopProbe != nil || m.shutdown || m.workCtx == nil || m.workCtx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(m.workCtx)
	r.probeGen++
	r.stopProbe = cancel
	gen, addr, everReady := r.probeGen, r.rec.Endpoint, !r.rec.ReadyAt.IsZero()
	m.workers.Add(1)
	go func() {
		defer m.workers.Done()
		defer cancel()
		m.runProber(ctx, r, gen, addr, first, everReady)
	}()
}

// stopProberOwned stops r's prober; a result it is about to deliver is ignored.
func (m *Manager) stopProberOwned(r *replica) {
	if r.stopProbe != nil {
		r.stopProbe()
		r.stopProbe = nil
		r.probeGen++
	}
}

func (m *Manager) runProber(ctx context.Context, r *replica, gen uint64, addr string, delay time.Duration, everReady bool) {
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		ok := m.probeOnce(ctx, r, gen, addr)
		if ctx.Err() != nil {
			return
		}
		everReady = everReady || ok
		delay = nextProbeDelay(delay, m.cfg.ProbeInterval, everReady)
		timer.Reset(delay)
	}
}

// probeOnce probes and records the result; a panic is logged and counts as a failed probe.
func (m *Manager) probeOnce(ctx context.Context, r *replica, gen uint64, addr string) (ok bool) {
	defer m.recoverPanic("probe")
	var probe configs.Probe
	m.own(func() { probe = m.taskOwned(r.rec.Version).Service.ReadinessProbe })
	err := probeReplica(ctx, m.cfg.HTTPClient, addr, probe)
	if ctx.Err() != nil {
		return false
	}
	m.onProbe(r, gen, err)
	return err == nil
}

// onProbe folds a probe result into r and, unless nothing can have changed, runs a pass.
func (m *Manager) onProbe(r *replica, gen uint64, err error) {
	var changed bool
	m.own(func() { changed = m.recordProbeOwned(r, gen, err) })
	if changed {
		m.pass() // publishes what changed
	}
}

// recordProbeOwned folds a probe result into r and reports whether a pass may have something
// to do.
func (m *Manager) recordProbeOwned(r *replica, gen uint64, err error) bool {
	if m.shutdown || r.probeGen != gen || m.replicas[r.rec.ID] != r {
		return false
	}
	prev := r.probe
	r.probe = prev.record(m.cfg.Now(), err)
	if prev.At.IsZero() || prev.OK != r.probe.OK {
		if err != nil {
			m.log.Info("readiness probe failing", zap.Int("replica", r.rec.ID), zap.String("status", string(r.rec.Status)), zap.Error(err))
		} else {
			m.log.Info("readiness probe passing", zap.Int("replica", r.rec.ID), zap.String("status", string(r.rec.Status)))
		}
	}
	return !(prev.OK && r.probe.OK && r.rec.Status == StatusReady)
}
