package controller

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// A disaggregated service (service.pools.prefill) runs two replica managers: the service's own,
// whose replicas decode, and the prefill pool's, whose READY replicas go to the proxies as their
// prefill pool (proxy.Service.SetPrefillBackends). Each pool has its own scale loop on its own
// signal: the decode pool on the service's replica_policy (llm: running sequences and KV-cache
// use), the prefill pool on the prompt tokens the proxies are prefilling. No ratio between the
// pools is configured: each follows what the workload asks of it, so when prompts grow and
// answers shrink the prefill pool grows while the decode pool shrinks, and the other way round.
//
// The prefill pool's replicas are labelled with the service's name plus poolSuffix, so neither
// manager lists the other's instances; their records are kept with the service's, under
// negated ids (poolStore), so they go with the service and need no store of their own.

// poolSuffix makes a prefill pool's name from its service's: its instances' service label,
// its replicas' cluster names and FERRY_SERVICE.
const poolSuffix = "-" + configs.PoolPrefill

// poolName is the prefill pool's name for service.
func poolName(service string) string { return service + poolSuffix }

// pool is a disaggregated service's prefill pool: its replica manager and its scale loop.
type pool struct {
	name string
	mgr  *replicas.Manager

	mu            sync.Mutex
	cfg           *configs.Pool // service.pools.prefill of the version it runs
	scaleLoop     *autoscaler.Loop
	stopScaleLoop func()
	target        int
	targetKnown   bool
	scaling       string
}

// poolStore keeps a pool's replica records with its service's: ids come from the service's
// counter (so no replica id repeats across the pools) and are stored negated.
type poolStore struct {
	inner   replicas.Store
	service string
}

var (
	_ replicas.Store        = poolStore{}
	_ replicas.RolloutStore = poolStore{}
)

func (p poolStore) NextReplicaIDs(_ string, n int) (int, error) {
	return p.inner.NextReplicaIDs(p.service, n)
}

func (p poolStore) SaveReplica(r replicas.Record) error {
	r.Service, r.ID = p.service, -r.ID
	return p.inner.SaveReplica(r)
}

func (p poolStore) DeleteReplica(_ string, id int) error {
	return p.inner.DeleteReplica(p.service, -id)
}

func (p poolStore) ListReplicas(pool string) ([]replicas.Record, error) {
	recs, err := p.inner.ListReplicas(p.service)
	var out []replicas.Record
	for _, r := range recs {
		if r.ID < 0 {
			r.Service, r.ID = pool, -r.ID
			out = append(out, r)
		}
	}
	return out, err
}

// SaveRollout and StartUpdate keep nothing: the service's own manager saves the rollout both
// pools follow, and a restarted controller resumes the pool from it.
func (poolStore) SaveRollout(string, replicas.Rollout) error                   { return nil }
func (poolStore) StartUpdate(string, replicas.Version, replicas.Rollout) error { return nil }

// decodeStore is the store as the service's own manager sees it: without its prefill pool's
// records (negative ids, poolStore).
type decodeStore struct{ store.Store }

func (d decodeStore) ListReplicas(service string) ([]replicas.Record, error) {
	recs, err := d.Store.ListReplicas(service)
	out := recs[:0]
	for _, r := range recs {
		if r.ID > 0 {
			out = append(out, r)
		}
	}
	return out, err
}

// poolVersions is versions with each task made the prefill pool's; a version without the pool
// keeps no replicas in it.
func poolVersions(versions []replicas.Version) []replicas.Version {
	out := make([]replicas.Version, 0, len(versions))
	for _, v := range versions {
		if t := v.Task.PoolTask(configs.PoolPrefill); t != nil {
			v.Task = t
			out = append(out, v)
		}
	}
	return out
}

// newPool builds s's prefill pool when its task has one, before the service's endpoint
// serves (runPool starts it): its replicas are the proxies' prefill pool as they become READY.
func (c *Controller) newPool(s *service, rec store.Service, r replicas.Resumed, rollout *replicas.Rollout, restored bool) error {
	task := r.Task.PoolTask(configs.PoolPrefill)
	if task == nil {
		return nil
	}
	p := &pool{name: poolName(rec.Name), cfg: r.Task.Service.Pools.Prefill}
	// An empty pool, not none: requests are prefilled on the decode replicas, and counted for
	// the pool's scale loop, until a prefill replica is READY.
	s.front.SetPrefillBackends(toBackends(nil))
	s.attach.PublishPrefill(toBackends(nil))
	mgr, err := replicas.New(replicas.Config{
		Service:   p.name,
		Version:   r.Version,
		Task:      task,
		Provider:  c.provider.Scope(task.Resources),
		InfraRank: c.infraRank(task.Resources),
		Store:     poolStore{inner: c.store, service: rec.Name},
		OnReady: func(eps []replicas.Endpoint) {
			backends := toBackends(eps)
			if err := s.front.SetPrefillBackends(backends); err != nil {
				c.log.Error("prefill pool not applied", zap.String("service", s.name), zap.Error(err))
			}
			s.attach.PublishPrefill(backends)
		},
		Logger:        c.log.Named("replicas").With(zap.String("pool", configs.PoolPrefill)),
		ProbeInterval: c.opts.ProbeInterval,
		Busy:          func(addr string) int64 { return c.busy(s, addr) },
		DrainTimeout:  c.opts.DrainTimeout,
		WindowLead:    c.opts.WindowLead,
		Versions:      poolVersions(r.Others),
		Rollout:       rollout,

		ObserveReconcile: c.control.observeReconcile(loopReplicas),
	})
	if err != nil {
		return fmt.Errorf("service %q prefill pool: %w", rec.Name, err)
	}
	p.mgr = mgr
	s.pool = p
	if spec := prefillSpec(p.cfg); !restored || spec.Policy == "" {
		p.target, p.targetKnown = spec.InitialTarget(), true
		mgr.SetDesired(p.target)
	} // else the manager keeps what it finds until the scale loop resumes from it
	return nil
}

// runPool starts the prefill pool's manager and scale loop, once the service runs (c.run).
func (c *Controller) runPool(s *service) {
	p := s.pool
	if p == nil {
		return
	}
	c.spawn(&s.inner, "prefill pool manager", func() {
		if err := p.mgr.Start(s.ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error("prefill pool manager stopped", zap.String("service", s.name), zap.Error(err))
		}
	})
	c.startPoolScaleLoop(s, p, prefillSpec(p.cfg))
}

// prefillSpec is the prefill pool's scaling: its replica_policy's windows and bounds over the
// prompt tokens being prefilled, target_queued_prompt_tokens per replica (the concurrency
// policy's in-flight target, in tokens).
func prefillSpec(cfg *configs.Pool) autoscaler.Spec {
	spec := autoscaler.SpecFor(cfg.ReplicaPolicy)
	if spec.Policy == "" {
		return spec
	}
	spec.Policy = autoscaler.PolicyConcurrency
	spec.TargetInflight = float64(cfg.TargetQueuedPromptTokens)
	if spec.TargetInflight <= 0 {
		spec.TargetInflight = configs.DefaultTargetQueuedPromptTokens
	}
	return spec.WithDefaults()
}

// startPoolScaleLoop runs the pool's autoscaler (none for a fixed count) until the service ends
// or the pool is replaced.
func (c *Controller) startPoolScaleLoop(s *service, p *pool, spec autoscaler.Spec) {
	if spec.Policy == "" {
		return
	}
	loop, stop := spawnScaleLoop(s, autoscaler.LoopConfig{Spec: spec, Load: prefillLoad{s}, Fleet: poolFleet{p},
		Logger: c.log.With(zap.String("service", s.name), zap.String("pool", configs.PoolPrefill))})
	p.mu.Lock()
	p.scaleLoop, p.stopScaleLoop = loop, stop
	p.mu.Unlock()
}

// prefillLoad is the prefill pool's demand as its autoscaler reads it: the prompt tokens this
// process's proxy and the attached ones are prefilling, as "in flight".
type prefillLoad struct{ s *service }

var _ autoscaler.LoadSource = prefillLoad{}

func (l prefillLoad) Arrivals() uint64 { return 0 }

func (l prefillLoad) InFlight() float64 {
	return float64(l.s.front.PrefillTokens() + l.s.attach.PrefillTokens())
}

func (l prefillLoad) Engines() []autoscaler.EngineLoad { return nil }

// poolFleet is the pool's replicas and target as its autoscaler reads and sets them. The
// target lives in memory: a restarted controller's scale loop resumes from the live replicas.
type poolFleet struct{ p *pool }

var _ autoscaler.Fleet = poolFleet{}

func (f poolFleet) Replicas() []autoscaler.Replica { return fleetReplicas(f.p.mgr.Replicas()) }

func (f poolFleet) Target() (int, bool) {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.p.target, f.p.targetKnown
}

func (f poolFleet) SetTarget(d autoscaler.Decision) {
	f.p.mu.Lock()
	f.p.target, f.p.targetKnown, f.p.scaling = d.Target, true, d.Reason
	f.p.mu.Unlock()
	f.p.mgr.SetDesired(d.Target)
}

// poke makes the pool's scale loop decide now (a request held at zero replicas).
func (p *pool) poke() {
	if p == nil {
		return
	}
	p.mu.Lock()
	loop := p.scaleLoop
	p.mu.Unlock()
	if loop != nil {
		loop.Poke()
	}
}

// stopScaling ends the pool's scale loop; its manager ends with the service's context.
func (p *pool) stopScaling() {
	p.mu.Lock()
	stop := p.stopScaleLoop
	p.stopScaleLoop, p.scaleLoop = nil, nil
	p.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// status is the pool's part of the service's status.
func (p *pool) status(down bool) *api.PoolStatus {
	if p == nil {
		return nil
	}
	recs := p.mgr.Replicas()
	p.mu.Lock()
	defer p.mu.Unlock()
	return &api.PoolStatus{Name: configs.PoolPrefill, TargetReplicas: p.target, Scaling: p.scaling, Replicas: recs,
		Status: p.mgr.ServiceStatus(down), ReadyReplicas: readyCount(recs)}
}

// updatePool makes the prefill pool follow a new version of the service's task: its replicas
// roll out as the service's do, and its scaling follows the new policy.
func (c *Controller) updatePool(s *service, task *configs.Task, mode string) error {
	p := s.pool
	next := task.PoolTask(configs.PoolPrefill)
	if p == nil || next == nil {
		return nil // UpdateService refuses a version that adds or drops the pool
	}
	if _, _, err := p.mgr.StartUpdate(next, mode, time.Now()); err != nil {
		return err
	}
	p.mu.Lock()
	old, cfg := p.cfg, task.Service.Pools.Prefill
	p.cfg = cfg
	p.mu.Unlock()
	if !reflect.DeepEqual(prefillSpec(old), prefillSpec(cfg)) {
		p.stopScaling()
		spec := prefillSpec(cfg)
		if spec.Policy == "" {
			poolFleet{p}.SetTarget(autoscaler.Decision{Target: spec.Min, Reason: "fixed"})
		}
		c.startPoolScaleLoop(s, p, spec)
	}
	return nil
}

// shutdown terminates the pool's replicas (serve down), returning what an infra that did
// not answer kept.
func (p *pool) shutdown(ctx context.Context) ([]launcher.Leftover, error) {
	if p == nil {
		return nil, nil
	}
	p.stopScaling()
	return p.mgr.Shutdown(ctx)
}

// poolNameTaken refuses a new service whose name, or whose prefill pool's name, is another
// service's or pool's: the two would label the same instances. Called under c.mu.
func (c *Controller) poolNameTaken(name string) error {
	for _, other := range c.services {
		if other.pool != nil && other.pool.name == name {
			return fmt.Errorf("service %q: the name is service %q's prefill pool's: %w", name, other.name, api.ErrConflict)
		}
		if other.name == poolName(name) {
			return fmt.Errorf("service %q: its prefill pool would be named %q, which is another service's: %w", name, other.name, api.ErrConflict)
		}
	}
	return nil
}
