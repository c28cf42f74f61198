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
)

// UpdateService implements api.Backend: it records the new version and the rollout to it,
// then hands both to the service's replica manager, which carries the rollout out pass by
// pass. It returns once the rollout is on disk, not when it finishes.
func (c *Controller) UpdateService(_ context.Context, name string, req api.UpdateServiceRequest) (api.ServiceStatus, error) {
	task := req.Task
	if task == nil || task.Service == nil {
		return api.ServiceStatus{}, fmt.Errorf("task has no service: section: %w", api.ErrInvalid)
	}
	if err := checkAuth(task); err != nil {
		return api.ServiceStatus{}, err
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
	s.mu.Unlock()
	if down {
		return api.ServiceStatus{}, fmt.Errorf("service %q is shutting down: %w", name, api.ErrConflict)
	}
	if _, err := c.proxyConfig(name, task.Service); err != nil {
		return api.ServiceStatus{}, fmt.Errorf("%v: %w", err, api.ErrInvalid)
	}
	if (s.pool != nil) != task.Service.Disaggregated() {
		return api.ServiceStatus{}, fmt.Errorf("adding or removing service.pools.prefill is not an update: take the service down and up again: %w", api.ErrInvalid)
	}
	// On disk before it returns: a controller killed from here on resumes this rollout.
	v, r, err := s.mgr.StartUpdate(task, mode, time.Now())
	if err != nil {
		return api.ServiceStatus{}, err
	}
	if err := c.updatePool(s, task, mode); err != nil {
		c.log.Error("prefill pool not updated", zap.String("service", name), zap.Error(err))
	}
	c.log.Info("service update", zap.String("service", name), zap.Int("from", r.From), zap.Int("to", r.To),
		zap.String("mode", mode), zap.Bool("relaunch", v.LaunchedAs == v.Number), zap.Bool("rollback_possible", r.FromServed && r.Policy.AutoRollback))
	c.applyServiceSection(s, task)
	return s.status(false), nil
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
	if err := px.SetPrefillBackends(s.front.Current().PrefillBackends()); err != nil {
		c.log.Error("prefill pool not carried to the new proxy settings", zap.String("service", s.name), zap.Error(err))
	}
	s.front.Swap(px, c.opts.DrainTimeout)
	c.updateGateway()
	s.attach.ConfigChanged() // attached proxies fetch the new settings with the next Seq
	c.log.Info("proxy settings replaced", zap.String("service", s.name), zap.String("policy", task.Service.LoadBalancingPolicy))
}
