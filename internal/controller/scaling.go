package controller

import (
	"context"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/replicas"
)

// The scale loop itself is autoscaler.Loop; this file adapts a service to it: its proxies are
// the LoadSource, its replica manager and saved target the Fleet.

// serviceLoad is a service's data plane as the autoscaler reads it: this process's proxy and
// the attached ones.
type serviceLoad struct {
	c *Controller
	s *service
}

var _ autoscaler.LoadSource = serviceLoad{}

func (l serviceLoad) Arrivals() uint64 {
	_, remote := l.c.remoteLoad(l.s)
	return l.s.front.Arrivals() + remote
}

// InFlight is requests being served plus requests the proxies hold for a replica or a slot;
// for a disaggregated service, not those in their prefill step (the prefill pool's load).
// Attached proxies report per decode replica, where a request is only once prefilled.
func (l serviceLoad) InFlight() float64 {
	remote, _ := l.c.remoteLoad(l.s)
	return float64(l.s.front.InFlight()+l.s.front.Waiting()-l.s.front.PrefillRequests()) + remote
}

// Engines are what the READY replicas last reported on /metrics to this process's proxy.
func (l serviceLoad) Engines() []autoscaler.EngineLoad {
	var out []autoscaler.EngineLoad
	for _, r := range l.s.front.Current().ReplicaLoad() {
		if r.Scraped {
			out = append(out, autoscaler.EngineLoad{Waiting: r.Waiting, Running: r.Running, KVCacheUsage: r.KVCacheUsage, Replicas: 1})
		}
	}
	return out
}

// serviceFleet is a service's replicas and target as the autoscaler reads and sets them.
type serviceFleet struct {
	c *Controller
	s *service
}

var _ autoscaler.Fleet = serviceFleet{}

func (f serviceFleet) Replicas() []autoscaler.Replica { return fleetReplicas(f.s.mgr.Replicas()) }

// fleetReplicas is a manager's replicas as the autoscaler reads them.
func fleetReplicas(recs []replicas.Record) []autoscaler.Replica {
	out := make([]autoscaler.Replica, len(recs))
	for i, r := range recs {
		out[i] = autoscaler.Replica{LaunchedAt: r.LaunchedAt, ReadyAt: r.ReadyAt, Ready: r.Status == replicas.StatusReady, Accelerator: r.Accelerator,
			Live: r.Status == replicas.StatusReady || (!r.Status.Terminal() && r.Status != replicas.StatusShuttingDown)}
	}
	return out
}

func (f serviceFleet) Target() (int, bool) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	return f.s.target, f.s.targetKnown
}

func (f serviceFleet) SetTarget(d autoscaler.Decision) {
	f.s.mu.Lock()
	f.s.scaling = d.Reason
	f.s.mu.Unlock()
	f.c.setTarget(f.s, d.Target)
}

// setTarget saves a new replica target, then hands it to the manager: a restarted controller
// resumes from the saved one instead of counting replicas mid-rollout.
func (c *Controller) setTarget(s *service, n int) {
	s.mu.Lock()
	s.target, s.targetKnown = n, true
	s.mu.Unlock()
	if err := c.store.SetTarget(s.name, n); err != nil {
		c.log.Warn("save replica target", zap.String("service", s.name), zap.Error(err))
	}
	s.mgr.SetDesired(n)
}

// pokeScaler is the proxy's OnColdRequest hook: decide now, a request waits at zero. It never
// blocks the request path.
func (s *service) pokeScaler() {
	s.mu.Lock()
	loop := s.scaleLoop
	s.mu.Unlock()
	if loop != nil {
		loop.Poke()
	}
	s.pool.poke() // a cold request wants its prefill too
}

// startScaleLoop runs the service's autoscaler for spec (a fixed count has none) until the
// service ends or restartScaler replaces it.
func (c *Controller) startScaleLoop(s *service, spec autoscaler.Spec) {
	if spec.Policy == "" {
		return
	}
	loop, stop := spawnScaleLoop(s, autoscaler.LoopConfig{Spec: spec, Load: serviceLoad{c, s}, Fleet: serviceFleet{c, s},
		Logger: c.log.With(zap.String("service", s.name))})
	s.mu.Lock()
	s.scaleLoop, s.stopScaleLoop = loop, stop
	s.mu.Unlock()
}

// spawnScaleLoop runs a scale loop among s's goroutines until s ends or stop is called; stop
// returns once the loop has.
func spawnScaleLoop(s *service, cfg autoscaler.LoopConfig) (loop *autoscaler.Loop, stop func()) {
	loop = autoscaler.NewLoop(cfg)
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	s.inner.Add(1)
	go func() {
		defer s.inner.Done()
		defer close(done)
		_ = loop.Start(ctx)
	}()
	return loop, func() {
		cancel()
		<-done
	}
}

// restartScaler makes a new replica policy take effect: the old scale loop stops, and a new
// one (if the policy autoscales) resumes from the current target; a fixed count is set.
func (c *Controller) restartScaler(s *service, task *configs.Task) {
	s.mu.Lock()
	stop := s.stopScaleLoop
	s.stopScaleLoop, s.scaleLoop = nil, nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	spec := autoscaler.SpecFor(task.Service.ReplicaPolicy)
	if spec.Policy == "" {
		c.setTarget(s, spec.Min)
		return
	}
	c.startScaleLoop(s, spec)
	c.log.Info("autoscaler replaced", zap.String("service", s.name), zap.String("policy", spec.Policy))
}
