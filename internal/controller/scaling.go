package controller

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/replicas"
)

// samplesPerDecision is how many times per decision interval the scale loop samples the
// proxy's concurrency: one sample a second would read a burst that came and went between
// two ticks as nothing, so each decision sees the tick's average (Knative's queue-proxy
// averages per second the same way).
const samplesPerDecision = 10

// scaler is one service's autoscaling state, owned by its scale loop.
type scaler struct {
	spec autoscaler.Spec
	// kick asks the loop to decide now: a request arrived while the service has no replica.
	kick chan struct{}

	decider      autoscaler.Scaler
	lastArrivals uint64
	inflightSum  float64
	samples      int
}

func newScaler(spec autoscaler.Spec) *scaler {
	return &scaler{spec: spec, kick: make(chan struct{}, 1)}
}

// poke is the proxy's OnColdRequest hook; it never blocks the request path.
func (sc *scaler) poke() {
	select {
	case sc.kick <- struct{}{}:
	default:
	}
}

// scaleLoop runs the service's autoscaler: it samples the proxy's load, decides every
// decision interval (at once when a request waits at zero), and hands the target to the
// replica manager.
func (c *Controller) scaleLoop(ctx context.Context, s *service) {
	sc := s.scaler
	interval := sc.spec.DecisionInterval
	sample := time.NewTicker(interval / samplesPerDecision)
	defer sample.Stop()
	decide := time.NewTicker(interval)
	defer decide.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sample.C:
			sc.inflightSum += c.concurrency(s)
			sc.samples++
			continue
		case <-decide.C:
		case <-sc.kick:
		}
		c.decide(s, time.Now())
	}
}

// concurrency is what the autoscaler calls in-flight: requests being served plus requests the
// proxy holds because no replica is READY, in this process's proxy and in attached ones.
func (c *Controller) concurrency(s *service) float64 {
	remote, _ := c.remoteLoad(s)
	return float64(s.front.InFlight()+s.front.Waiting()) + remote
}

// decide runs one decision and applies it.
func (c *Controller) decide(s *service, now time.Time) {
	sc := s.scaler
	ready := 0
	live := 0
	var coldStarts []time.Duration // launch to READY of each replica that got there
	for _, r := range s.mgr.Replicas() {
		if !r.LaunchedAt.IsZero() && r.ReadyAt.After(r.LaunchedAt) {
			coldStarts = append(coldStarts, r.ReadyAt.Sub(r.LaunchedAt))
		}
		switch {
		case r.Status == replicas.StatusReady:
			ready++
			live++
		case !r.Status.Terminal() && r.Status != replicas.StatusShuttingDown:
			live++
		}
	}
	s.mu.Lock()
	target, known := s.target, s.targetKnown
	s.mu.Unlock()
	if sc.decider == nil {
		// A restarted controller resumes from the target it saved, else from the replicas it
		// found, so a restart neither drops a loaded service to its minimum nor keeps it above
		// what it had (mid-rollout, old and new replicas together are more than the target).
		if !known {
			target = max(live, target)
		}
		sc.decider = autoscaler.Resume(sc.spec, target)
	}

	_, remoteArrivals := c.remoteLoad(s)
	arrivals := s.front.Arrivals() + remoteArrivals
	obs := autoscaler.Observation{Arrivals: int(arrivals - sc.lastArrivals)}
	sc.lastArrivals = arrivals
	obs.InFlight = c.concurrency(s)
	if sc.samples > 0 {
		obs.InFlight = max(obs.InFlight, sc.inflightSum/float64(sc.samples))
	}
	sc.inflightSum, sc.samples = 0, 0
	if sc.spec.WantsEngineLoad() {
		obs.Engine = s.engineLoad()
	}
	obs.ColdStart = autoscaler.ColdStartOf(coldStarts)

	d := sc.decider.Decide(now, obs, autoscaler.State{Ready: ready, Target: target})
	if d.Target == target {
		return
	}
	s.mu.Lock()
	s.scaling = d.Reason
	s.mu.Unlock()
	c.log.Info("scaling", zap.String("service", s.name), zap.Int("from", target), zap.Int("to", d.Target),
		zap.Bool("panic", d.Panic), zap.String("reason", d.Reason), zap.Int("ready", ready))
	c.setTarget(s, d.Target)
}

// engineLoad sums what READY replicas last reported on /metrics; nil when none was scraped.
func (s *service) engineLoad() *autoscaler.EngineLoad {
	var e autoscaler.EngineLoad
	kv := 0
	for _, r := range s.front.Current().ReplicaLoad() {
		if !r.Scraped {
			continue
		}
		e.Waiting += r.Waiting
		e.Running += r.Running
		e.KVCacheUsage += r.KVCacheUsage
		kv++
	}
	if kv == 0 {
		return nil
	}
	e.Replicas = kv
	e.KVCacheUsage /= float64(kv)
	return &e
}
