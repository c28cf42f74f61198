package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
	"github.com/ferryserve/ferry/replicas"
)

// service is one running service: its proxy listener, its replica manager, its scale loop and
// its hub for attached proxies.
type service struct {
	name      string
	port      int
	createdAt time.Time
	endpoint  string

	// front serves the endpoint: one proxy.Service, replaced in place (a handover) when an
	// update changes the proxy's settings.
	front *proxy.Handover
	mgr   *replicas.Manager
	// attach is the service as standalone proxies follow it (attach.go).
	attach *attach.Hub
	// pool is a disaggregated service's prefill pool (pool.go); nil for most. Set before the
	// endpoint serves and never replaced.
	pool *pool

	ctx    context.Context // the service's lifetime
	cancel context.CancelFunc
	inner  sync.WaitGroup // the service's goroutines
	done   chan struct{}  // closed once they have stopped

	// updateMu serialises updates of this service.
	updateMu sync.Mutex

	mu sync.Mutex
	// task is the current version's: an update replaces it.
	task *configs.Task
	// scaleLoop is nil for a fixed replica count; it is replaced when an update changes the
	// replica policy, and stopScaleLoop ends it.
	scaleLoop     *autoscaler.Loop
	stopScaleLoop func()
	// target is the replica count asked for, and targetKnown whether it was decided (or read
	// from the store after a restart); scaling is the autoscaler's reason for it.
	target      int
	targetKnown bool
	scaling     string
	// shuttingDown is set by serve down; savedStatus is the status last written to the store.
	shuttingDown bool
	savedStatus  string
}

// restoreBindWait bounds how long a restarted controller waits for a restored service's
// endpoint to be released: a predecessor that was told to stop may still be closing its
// listeners when the next controller starts (its pid file gone, its process not yet), and
// giving up at once would leave the service unserved until another restart.
const restoreBindWait = 15 * time.Second

// listenRestored binds addr, retrying while another socket holds it (EADDRINUSE), for at most
// wait; any other error, or the port still taken after wait, is returned.
func listenRestored(ctx context.Context, log *zap.Logger, addr string, wait time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(wait)
	pause := 50 * time.Millisecond
	for logged := false; ; {
		ln, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().Add(pause).After(deadline) {
			return ln, err
		}
		if !logged {
			log.Warn("a restored service's endpoint is still taken, by a controller that is stopping perhaps; waiting for it",
				zap.String("addr", addr), zap.Duration("at_most", wait))
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// startService starts a service's proxy listener, replica manager and scale loop. ln may be a
// listener already bound to rec.Port (a new service); without one the service is being
// restored after a controller restart.
func (c *Controller) startService(rec store.Service, ln net.Listener) (*service, error) {
	if rec.Task == nil || rec.Task.Service == nil {
		return nil, fmt.Errorf("service %q has no service section", rec.Name)
	}
	restored := ln == nil
	addr := net.JoinHostPort(c.opts.ProxyHost, strconv.Itoa(rec.Port))
	if ln == nil {
		var err error
		if ln, err = listenRestored(c.ctx, c.log, addr, restoreBindWait); err != nil {
			return nil, fmt.Errorf("service %q endpoint %s: %w", rec.Name, addr, err)
		}
	}
	resumed, rollout, err := c.resume(rec)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s, err := c.newService(rec, resumed.Task, ln, addr)
	if err != nil {
		ln.Close()
		return nil, err
	}
	if s.mgr, err = c.newManager(s, rec, resumed, rollout, restored); err != nil {
		ln.Close()
		return nil, err
	}
	if err := c.newPool(s, rec, resumed, rollout, restored); err != nil {
		ln.Close()
		return nil, err
	}
	spec := autoscaler.SpecFor(resumed.Task.Service.ReplicaPolicy)
	c.setInitialTarget(s, spec, rec, restored)
	startTarget := s.target // the scale loop owns it from here
	c.run(s, spec)
	c.runPool(s)

	c.mu.Lock()
	c.services[rec.Name] = s
	c.mu.Unlock()
	c.updateGateway()
	c.publishServices()
	c.log.Info("service started", zap.String("service", rec.Name), zap.Int("version", resumed.Version),
		zap.String("endpoint", s.endpoint), zap.Int("target_replicas", startTarget), zap.String("autoscaler", spec.Policy))
	return s, nil
}

// resume reads the service's versions and latest rollout from the store and picks the version
// it runs (replicas.Resume).
func (c *Controller) resume(rec store.Service) (replicas.Resumed, *replicas.Rollout, error) {
	versions, err := c.store.Versions(rec.Name)
	if err != nil {
		return replicas.Resumed{}, nil, err
	}
	rollout, err := c.store.Rollout(rec.Name)
	if err != nil {
		return replicas.Resumed{}, nil, err
	}
	r := replicas.Resume(rec.Version, rec.Task, versions, rollout)
	if r.Disagreed {
		c.log.Warn("stored rollout and service version disagree; following the rollout", zap.String("service", rec.Name),
			zap.Int("service_version", rec.Version), zap.Int("rollout_target", r.Version))
	}
	return r, rollout, nil
}

// newService builds the service's endpoint (its proxy on ln) and its attach hub.
func (c *Controller) newService(rec store.Service, task *configs.Task, ln net.Listener, addr string) (*service, error) {
	s := &service{name: rec.Name, task: task, port: rec.Port, createdAt: rec.CreatedAt, done: make(chan struct{}),
		savedStatus: rec.Status}
	px, pcfg, err := c.newServiceProxy(rec.Name, task, s.pokeScaler)
	if err != nil {
		return nil, err
	}
	scheme := "http://"
	if pcfg.TLS != nil {
		scheme = "https://"
	}
	s.endpoint = scheme + addr
	s.front = proxy.NewHandover(ln, px, c.log.Named("proxy").With(zap.String("service", rec.Name)))
	s.attach = c.newAttachHub(s, time.Now)
	return s, nil
}

// newManager builds the service's replica manager. Its READY set goes to the service's own
// proxy and to attached ones, as the same []proxy.Backend.
func (c *Controller) newManager(s *service, rec store.Service, r replicas.Resumed, rollout *replicas.Rollout, restored bool) (*replicas.Manager, error) {
	var initialTarget *int
	if restored && rec.Target >= 0 {
		initialTarget = &rec.Target
	}
	return replicas.New(replicas.Config{
		Service:   rec.Name,
		Version:   r.Version,
		Task:      r.Task,
		Provider:  c.provider.Scope(r.Task.Resources),
		InfraRank: c.infraRank(r.Task.Resources),
		Store:     decodeStore{c.store}, // without a prefill pool's records (pool.go)
		OnReady: func(eps []replicas.Endpoint) {
			backends := toBackends(eps)
			s.front.SetBackends(backends)
			s.attach.Publish(backends)
		},
		Logger:        c.log.Named("replicas"),
		ProbeInterval: c.opts.ProbeInterval,
		Busy:          func(addr string) int64 { return c.busy(s, addr) },
		DrainTimeout:  c.opts.DrainTimeout,
		WindowLead:    c.opts.WindowLead,
		Versions:      r.Others,
		Rollout:       rollout,
		InitialTarget: initialTarget,

		ObserveReconcile: c.control.observeReconcile(loopReplicas),
	})
}

// setInitialTarget gives the manager the replica count to start from.
func (c *Controller) setInitialTarget(s *service, spec autoscaler.Spec, rec store.Service, restored bool) {
	switch {
	case restored && rec.Target >= 0:
		// The target saved before the restart; the scale loop resumes from it.
		s.target, s.targetKnown = rec.Target, true
	case spec.Policy == "":
		c.setTarget(s, spec.Min)
	case restored:
		// The manager keeps what it finds until the scale loop's first decision, which
		// resumes from those replicas.
	default:
		c.setTarget(s, spec.InitialTarget())
	}
}

// run starts the service's goroutines: the scale loop, the replica manager and the endpoint.
func (c *Controller) run(s *service, spec autoscaler.Spec) {
	s.ctx, s.cancel = context.WithCancel(c.ctx)
	c.startScaleLoop(s, spec)
	c.spawn(&s.inner, "replica manager", func() {
		if err := s.mgr.Start(s.ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error("replica manager stopped", zap.String("service", s.name), zap.Error(err))
		}
	})
	c.spawn(&s.inner, "service endpoint", func() {
		if err := s.front.Serve(); err != nil {
			c.log.Error("proxy stopped", zap.String("service", s.name), zap.Error(err))
		}
	})
	go func() {
		<-s.ctx.Done()
		s.inner.Wait()
		close(s.done)
	}()
}

// stop ends the service's loops without touching its replicas (controller shutdown).
func (s *service) stop(ctx context.Context) {
	s.cancel()
	_ = s.front.Shutdown(ctx)
	select {
	case <-s.done:
	case <-ctx.Done():
	}
}

// toBackends is the one conversion of a READY set from the replica manager's terms to the
// proxy's, which attached proxies get on the wire too.
func toBackends(eps []replicas.Endpoint) []proxy.Backend {
	out := make([]proxy.Backend, len(eps))
	for i, e := range eps {
		out[i] = proxy.Backend{ID: e.ReplicaID, Addr: e.Addr, Accelerator: e.Accelerator, Version: e.Version}
	}
	return out
}

// rankTimeout bounds planning a new service's infra preference (it may ask clusters).
const rankTimeout = 10 * time.Second

// infraRank is the service's infra preference for scale-down: burst replicas on a later
// candidate go first. Without an answer (a cluster unreachable) every infra ranks alike.
func (c *Controller) infraRank(r configs.Resources) map[string]int {
	ctx, cancel := context.WithTimeout(c.ctx, rankTimeout)
	defer cancel()
	rank, err := c.provider.Rank(ctx, r)
	if err != nil {
		c.log.Warn("no infra preference for scale-down", zap.Error(err))
		return nil
	}
	return rank
}

// CreateService implements api.Backend. The name and the endpoint port are reserved under
// c.mu; the store is written after it is released.
func (c *Controller) CreateService(_ context.Context, req api.CreateServiceRequest) (api.ServiceStatus, error) {
	if req.Task == nil || req.Task.Service == nil {
		return api.ServiceStatus{}, fmt.Errorf("task has no service: section: %w", api.ErrInvalid)
	}
	if req.Name == "" {
		return api.ServiceStatus{}, fmt.Errorf("service name is empty: %w", api.ErrInvalid)
	}
	if err := checkAuth(req.Task); err != nil {
		return api.ServiceStatus{}, err
	}
	ln, port, err := c.reserveService(req.Name)
	if err != nil {
		return api.ServiceStatus{}, err
	}
	defer c.releaseReservation(req.Name)
	rec := store.Service{Name: req.Name, Version: 1, Task: req.Task, Port: port, Status: api.ServiceControllerInit, CreatedAt: time.Now()}
	if err := c.store.CreateService(rec); err != nil {
		ln.Close()
		return api.ServiceStatus{}, err
	}
	s, err := c.startService(rec, ln)
	if err != nil {
		_ = c.store.DeleteService(req.Name)
		return api.ServiceStatus{}, err
	}
	return s.status(false), nil
}

// checkAuth refuses a task whose service.auth the CLI did not resolve, or that takes an API
// key from one of its envs, which are stored and shown as written (a CLI older than that rule,
// or a client of the API that is no CLI, could send one).
func checkAuth(task *configs.Task) error {
	a := task.Service.Auth
	if a == nil {
		return nil
	}
	if len(a.KeyHashes) == 0 && !a.ManagedKeys {
		return fmt.Errorf("service.auth resolved no API keys (the CLI resolves them from keys_from_env and keys_file): %w", api.ErrInvalid)
	}
	if names := task.KeyEnvs(); len(names) > 0 {
		return fmt.Errorf("service.auth.keys_from_env takes keys from %s, among the task's envs, which are stored and shown as written; make them secrets: %w",
			strings.Join(names, ", "), api.ErrInvalid)
	}
	return nil
}

// reserveService claims a new service's name and binds the lowest free endpoint port not owned
// by another service, holding the listener so that no other process can take the port between
// choosing and serving. releaseReservation undoes the claim once the service runs or failed.
func (c *Controller) reserveService(name string) (net.Listener, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.services[name]; ok {
		return nil, 0, fmt.Errorf("service %q %w; use 'ferry serve down %s' first", name, api.ErrConflict, name)
	}
	if _, ok := c.creating[name]; ok {
		return nil, 0, fmt.Errorf("service %q is being created: %w", name, api.ErrConflict)
	}
	if err := c.poolNameTaken(name); err != nil {
		return nil, 0, err
	}
	used := map[int]bool{}
	for _, s := range c.services {
		used[s.port] = true
	}
	for _, port := range c.creating {
		used[port] = true
	}
	for port := c.opts.FirstServicePort; port < c.opts.FirstServicePort+1000 && port < 65536; port++ {
		if used[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(c.opts.ProxyHost, strconv.Itoa(port)))
		if err == nil {
			c.creating[name] = port
			return ln, port, nil
		}
	}
	return nil, 0, fmt.Errorf("no free endpoint port in %d-%d", c.opts.FirstServicePort, c.opts.FirstServicePort+999)
}

func (c *Controller) releaseReservation(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.creating, name)
}

// Services implements api.Backend.
func (c *Controller) Services(names []string) ([]api.ServiceStatus, error) {
	var svcs []*service
	if len(names) == 0 {
		svcs = c.serviceList()
	}
	for _, n := range names {
		s, err := c.serviceNamed(n)
		if err != nil {
			return nil, err
		}
		svcs = append(svcs, s)
	}
	out := make([]api.ServiceStatus, 0, len(svcs))
	for _, s := range svcs {
		st := s.status(true)
		c.addInfraHealth(s, &st)
		out = append(out, st)
	}
	return out, nil
}

// serviceNamed finds a running service.
func (c *Controller) serviceNamed(name string) (*service, error) {
	c.mu.Lock()
	s, ok := c.services[name]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("service %q: %w", name, api.ErrNotFound)
	}
	return s, nil
}

// status builds the API view of a service.
func (s *service) status(withTask bool) api.ServiceStatus {
	recs := s.mgr.Replicas()
	s.mu.Lock()
	target, scaling, task, down := s.target, s.scaling, s.task, s.shuttingDown
	s.mu.Unlock()
	st := api.ServiceStatus{
		Name: s.name, Version: s.mgr.TargetVersion(), Endpoint: s.endpoint, Policy: task.Service.LoadBalancingPolicy,
		CreatedAt: s.createdAt, TargetReplicas: target, Replicas: recs,
		Autoscaler: task.Service.ReplicaPolicy.Autoscaler, Scaling: scaling, Update: s.mgr.Rollout(),
		Status: s.mgr.ServiceStatus(down), SpotLosses: spotLosses(s.mgr.SpotLosses(), s.mgr.SpotSpare(), time.Now(), replicas.MixFor(task.Resources, task.Service.ReplicaPolicy).DynamicFallback),
		Prefill: s.pool.status(down),
	}
	st.ReadyReplicas = readyCount(recs)
	if withTask {
		st.Task = task.Redacted()
	}
	return st
}

// readyCount is how many of recs are READY.
func readyCount(recs []replicas.Record) int {
	n := 0
	for _, r := range recs {
		if r.Status == replicas.StatusReady {
			n++
		}
	}
	return n
}

// spotLosses is the API view of a service's spot losses and zone ceilings at now, and of the
// spare it runs; nil before any. Only a dynamic fallback is held (replicas' plan): without one
// the losses show, and no hold.
func spotLosses(l policy.Losses, spare int, now time.Time, dynamic bool) *api.SpotLosses {
	if l.Last.IsZero() && len(l.Zones) == 0 && spare == 0 {
		return nil
	}
	out := &api.SpotLosses{Losses: l, RecentGaps: len(l.RecentGaps(now)), Spare: spare}
	if !dynamic {
		return out
	}
	out.Hold = l.Hold(now)
	if now.Sub(l.Last) < out.Hold { // Holding, without reading the gaps again
		out.HeldUntil = l.Last.Add(out.Hold)
	}
	return out
}

// statusLoop persists service statuses so that an operator reading the store sees them.
func (c *Controller) statusLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		func() {
			defer c.recoverPanic("status loop")
			c.persistStatuses()
		}()
	}
}

// persistStatuses writes each service's status that changed since it was last written.
func (c *Controller) persistStatuses() {
	for _, s := range c.serviceList() {
		st := s.status(false)
		s.mu.Lock()
		changed := st.Status != s.savedStatus
		s.savedStatus = st.Status
		s.mu.Unlock()
		if !changed {
			continue
		}
		c.log.Info("service status", zap.String("service", st.Name), zap.String("status", st.Status),
			zap.Int("ready", st.ReadyReplicas), zap.Int("target", st.TargetReplicas))
		if err := c.store.SetServiceStatus(st.Name, st.Status); err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Warn("persist service status", zap.String("service", st.Name), zap.Error(err))
		}
	}
}

// DeleteService implements api.Backend: drain the endpoint, terminate every replica, forget it.
// What an infra that did not answer kept is handed to the provisioner's janitor and returned,
// so that the caller can say exactly what is left: the service is down all the same.
func (c *Controller) DeleteService(ctx context.Context, name string) (api.DeleteServiceResult, error) {
	s, err := c.serviceNamed(name)
	if err != nil {
		return api.DeleteServiceResult{}, err
	}
	left, err := c.takeDown(ctx, s)
	return api.DeleteServiceResult{LeftBehind: left}, err
}

// down takes s down, for a serve down that a restart interrupted: the janitor has what is
// left, and logs it.
func (c *Controller) down(ctx context.Context, s *service) error {
	_, err := c.takeDown(ctx, s)
	return err
}

// takeDown drains s's endpoint, stops its replicas and forgets it, returning what could not
// be stopped.
func (c *Controller) takeDown(ctx context.Context, s *service) ([]launcher.Leftover, error) {
	s.mu.Lock()
	s.shuttingDown = true
	s.mu.Unlock()
	c.publishServices() // attached gateways drop it now, and drain its requests
	// Persist first: a controller killed half-way finishes the job on restart.
	if err := c.store.SetServiceStatus(s.name, api.ServiceShuttingDown); err != nil {
		return nil, err
	}
	c.log.Info("service shutting down", zap.String("service", s.name))
	drainCtx, cancel := context.WithTimeout(ctx, c.opts.DrainTimeout)
	defer cancel()
	// The endpoint stops accepting first, and in-flight requests and streams finish, before
	// their replicas go.
	if err := s.front.Shutdown(drainCtx); err != nil {
		c.log.Warn("drain did not finish", zap.String("service", s.name), zap.Error(err))
	}
	termCtx, termCancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer termCancel()
	left, err := s.mgr.Shutdown(termCtx)
	poolLeft, poolErr := s.pool.shutdown(termCtx)
	left, err = append(left, poolLeft...), errors.Join(err, poolErr)
	if err != nil {
		_ = c.store.SetServiceStatus(s.name, api.ServiceFailedCleanup)
		return nil, fmt.Errorf("terminate replicas of %q: %w", s.name, err)
	}
	s.cancel()
	<-s.done
	if err := c.store.DeleteService(s.name); err != nil {
		return nil, err
	}
	c.mu.Lock()
	delete(c.services, s.name)
	c.mu.Unlock()
	c.updateGateway()
	c.publishServices()
	if len(left) > 0 {
		c.log.Warn("service down; what an infra that did not answer holds is left to the janitor", zap.String("service", s.name), zap.Int("left_behind", len(left)))
	} else {
		c.log.Info("service down", zap.String("service", s.name))
	}
	return left, nil
}

// ControllerLogPath implements api.Backend.
func (c *Controller) ControllerLogPath() string { return c.opts.LogFile }
