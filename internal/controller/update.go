package controller

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
	"github.com/ferryserve/ferry/replicas"
)

// UpdateService implements api.Backend: it records the new version and the rollout to it,
// then hands both to the service's replica manager, which carries the rollout out pass by
// pass. It returns once the rollout is on disk, not when it finishes.
func (c *Controller) UpdateService(_ context.Context, name string, req api.UpdateServiceRequest) (api.ServiceStatus, error) {
	task := req.Task
	if task == nil || task.Service == nil {
		return api.ServiceStatus{}, fmt.Errorf("task has no service: section: %w", api.ErrInvalid)
	}
	if a := task.Service.Auth; a != nil && len(a.KeyHashes) == 0 {
		return api.ServiceStatus{}, fmt.Errorf("service.auth resolved no API keys (the CLI resolves them from keys_from_env and keys_file): %w", api.ErrInvalid)
	}
	mode := task.Service.Update.Mode
	if req.Mode != "" {
		mode = req.Mode
	}
	if mode != configs.UpdateRolling && mode != configs.UpdateBlueGreen {
		return api.ServiceStatus{}, fmt.Errorf("unknown update mode %q (rolling or blue_green): %w", mode, api.ErrInvalid)
	}
	c.mu.Lock()
	s, ok := c.services[name]
	c.mu.Unlock()
	if !ok {
		return api.ServiceStatus{}, fmt.Errorf("service %q: %w", name, api.ErrNotFound)
	}
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	s.mu.Lock()
	down := s.shuttingDown
	oldTask := s.task
	s.mu.Unlock()
	if down {
		return api.ServiceStatus{}, fmt.Errorf("service %q is shutting down: %w", name, api.ErrConflict)
	}
	if _, err := c.proxyConfig(name, task.Service); err != nil {
		return api.ServiceStatus{}, fmt.Errorf("%v: %w", err, api.ErrInvalid)
	}

	versions, err := c.store.Versions(name)
	if err != nil {
		return api.ServiceStatus{}, err
	}
	cur := s.mgr.Target()
	next := cur + 1
	launchedAs := map[int]int{}
	for _, v := range versions {
		next = max(next, v.Number+1)
		launchedAs[v.Number] = v.LaunchedAs
	}
	v := replicas.Version{Number: next, Task: task, LaunchedAs: next}
	if onlyServiceChanged(oldTask, task) {
		// Same program, resources and replica port: the running replicas are this version
		// already, relabelled rather than relaunched.
		v.LaunchedAs = cur
		if a, ok := launchedAs[cur]; ok && a != 0 {
			v.LaunchedAs = a
		}
	}
	from, fromServed := c.stableVersion(s, cur)
	policy := task.Service.Update
	policy.Mode = mode
	now := time.Now()
	r := replicas.Rollout{From: from, To: next, Mode: mode, Policy: policy, State: replicas.RolloutInProgress,
		FromServed: fromServed, StartedAt: now, ProgressAt: now}
	// On disk first: a controller killed from here on resumes this rollout.
	if err := c.store.StartUpdate(name, v, r); err != nil {
		return api.ServiceStatus{}, err
	}
	c.log.Info("service update", zap.String("service", name), zap.Int("from", from), zap.Int("to", next),
		zap.String("mode", mode), zap.Bool("relaunch", v.LaunchedAs == next), zap.Bool("rollback_possible", fromServed && policy.AutoRollback))
	s.mgr.Update(v, r)
	c.applyServiceSection(s, task)

	c.mu.Lock()
	defer c.mu.Unlock()
	return s.statusLocked(false), nil
}

// stableVersion is the version a new rollout would roll back to, and whether it ever served:
// the last version that served, not merely the previous target (which may be a failed one).
func (c *Controller) stableVersion(s *service, cur int) (int, bool) {
	prev := s.mgr.Rollout()
	switch {
	case prev == nil:
		s.mu.Lock()
		served := s.everReady
		s.mu.Unlock()
		for _, r := range s.mgr.Replicas() {
			if r.Version == cur && !r.ReadyAt.IsZero() {
				served = true
			}
		}
		return cur, served
	case prev.State == replicas.RolloutSucceeded:
		return prev.To, true
	default: // rolled back, failed or superseded mid-way: the rollout's own good version
		return prev.From, prev.FromServed
	}
}

// onlyServiceChanged reports whether b differs from a only in its service section, and not in
// the port replicas serve on: then a's replicas can serve as b's.
func onlyServiceChanged(a, b *configs.Task) bool {
	if a == nil || b == nil || a.Service == nil || b.Service == nil || a.Service.Port != b.Service.Port {
		return false
	}
	ac, bc := *a, *b
	ac.Service, bc.Service = nil, nil
	ac.Name, bc.Name = "", ""
	ac.Source, bc.Source = "", ""
	return reflect.DeepEqual(ac, bc)
}

// applyServiceSection makes the service follow a new version's service section: the
// autoscaler's policy and the proxy's settings. Replicas follow through the manager.
func (c *Controller) applyServiceSection(s *service, task *configs.Task) {
	s.mu.Lock()
	old := s.task
	s.task = task
	s.mu.Unlock()
	if !reflect.DeepEqual(old.Service.ReplicaPolicy, task.Service.ReplicaPolicy) {
		c.restartScaler(s, task)
	}
	c.reconfigureProxy(s, old, task)
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
	s.mgr.SetTarget(n)
}

// pokeScaler is the proxy's OnColdRequest hook: decide now, a request waits at zero.
func (s *service) pokeScaler() {
	s.mu.Lock()
	sc := s.scaler
	s.mu.Unlock()
	if sc != nil {
		sc.poke()
	}
}

// startScaleLoop runs sc as the service's scale loop until the service ends or
// restartScaler replaces it.
func (c *Controller) startScaleLoop(s *service, sc *scaler) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	s.mu.Lock()
	s.scaler = sc
	s.stopScaler = func() {
		cancel()
		<-done
	}
	s.mu.Unlock()
	s.inner.Add(1)
	go func() {
		defer s.inner.Done()
		defer close(done)
		c.scaleLoop(ctx, s)
	}()
}

// restartScaler makes a new replica policy take effect: the old scale loop stops, and a new
// one (if the policy autoscales) resumes from the current target; a fixed count is set.
func (c *Controller) restartScaler(s *service, task *configs.Task) {
	s.mu.Lock()
	stop := s.stopScaler
	s.stopScaler = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	spec := autoscaler.SpecFor(task.Service.ReplicaPolicy)
	if spec.Policy == "" {
		s.mu.Lock()
		s.scaler = nil
		s.mu.Unlock()
		c.setTarget(s, spec.Min)
		return
	}
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	sc := newScaler(spec)
	sc.decider = autoscaler.Resume(spec, target)
	c.startScaleLoop(s, sc)
	c.log.Info("autoscaler replaced", zap.String("service", s.name), zap.String("policy", spec.Policy))
}

// newServiceProxy builds the proxy for a service's task; onCold is its OnColdRequest hook.
func (c *Controller) newServiceProxy(name string, task *configs.Task, onCold func()) (*proxy.Service, proxy.ServiceConfig, error) {
	pcfg, err := c.proxyConfig(name, task.Service)
	if err != nil {
		return nil, pcfg, err
	}
	pcfg.ScrapeEngineMetrics = autoscaler.SpecFor(task.Service.ReplicaPolicy).WantsEngineLoad()
	pcfg.OnColdRequest = onCold
	px, err := proxy.NewService(pcfg)
	return px, pcfg, err
}

// reconfigureProxy makes a new service section's proxy settings take effect. A proxy.Service
// is immutable on its request path, so a new one takes over the endpoint: new connections go
// to it, while the old one finishes its requests and streams (proxy.Handover).
func (c *Controller) reconfigureProxy(s *service, old, task *configs.Task) {
	// What the proxy is made of: the YAML's mapping to it, its TLS files and whether it
	// scrapes the engines for the autoscaler.
	same := reflect.DeepEqual(attach.ProxyConfigFor(old.Service), attach.ProxyConfigFor(task.Service)) &&
		reflect.DeepEqual(old.Service.TLS, task.Service.TLS) &&
		autoscaler.SpecFor(old.Service.ReplicaPolicy).WantsEngineLoad() == autoscaler.SpecFor(task.Service.ReplicaPolicy).WantsEngineLoad()
	if same {
		return
	}
	px, _, err := c.newServiceProxy(s.name, task, s.pokeScaler)
	if err != nil {
		// Validated by UpdateService; a TLS file that vanished since is the one way here.
		c.log.Error("new proxy settings not applied", zap.String("service", s.name), zap.Error(err))
		return
	}
	px.SetBackends(s.front.Current().Backends())
	s.front.Swap(px, c.opts.DrainTimeout)
	c.updateGateway()
	c.configChanged(s)
	c.log.Info("proxy settings replaced", zap.String("service", s.name), zap.String("policy", task.Service.LoadBalancingPolicy))
}
