// Package controller wires Ferry's control plane together: the store, the provisioner, one
// replica manager and one proxy listener per service, and the API the CLI talks to. It holds
// no domain logic of its own; decisions live in replicas, policy and (later) autoscaler.
package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
	"github.com/ferryserve/ferry/replicas"
)

// ErrAlreadyRunning means another controller holds this home's lock.
var ErrAlreadyRunning = errors.New("a controller is already running for this FERRY_HOME")

// Options configure a controller.
type Options struct {
	Home home.Home
	// Listen is the API address; loopback by default because the token is the only guard.
	Listen string
	// ProxyHost is where service endpoints listen.
	ProxyHost string
	// FirstServicePort is the lowest port a service endpoint gets (SkyServe uses 30001+).
	FirstServicePort int
	// ProbeInterval is how often replicas are probed. SkyServe's 10 s is tuned for VMs; local
	// replicas start in a second, so the controller default is shorter.
	ProbeInterval time.Duration
	// DrainTimeout bounds how long serve down waits for in-flight requests and streams.
	DrainTimeout time.Duration
	Version      string
	Logger       *zap.Logger
	// LogFile is where this controller's log goes, for `serve logs --controller`.
	LogFile string
	// PathPrepend goes first on every local replica's PATH (the ferry binary's directory).
	PathPrepend []string
	// GatewayAddr is the shared endpoint where a request's "model" picks the service; empty or
	// ListenerOff disables it. If the default address is taken the controller runs without a gateway
	// (logged); any other address that cannot be bound is an error.
	GatewayAddr string
	// MetricsAddr is the admin listener serving Prometheus /metrics and /healthz, apart from
	// service traffic; empty or ListenerOff disables it. Like GatewayAddr, a taken default
	// address is logged and skipped, while any other address that cannot be bound is an error.
	MetricsAddr string
	// MetricsToken, when set, protects the metrics listener's /metrics with "Authorization:
	// Bearer TOKEN" (what a Prometheus scrape config's credentials_file sends); /healthz stays
	// open.
	MetricsToken string
	// BlockFor is how long a location that had no capacity is skipped; 0 is
	// provision.DefaultBlockFor.
	BlockFor time.Duration
}

// DefaultGatewayAddr is the gateway's address unless configured: the port just below the
// first service endpoint.
const DefaultGatewayAddr = "127.0.0.1:30000"

// DefaultMetricsAddr is the metrics listener's address unless configured: loopback, because
// metrics name services and traffic volumes, on the port OpenTelemetry's Prometheus exporter
// uses by default, which scrape configs commonly already expect.
const DefaultMetricsAddr = "127.0.0.1:9464"

// ListenerOff as GatewayAddr or MetricsAddr disables that listener; it reads better in a flag
// or environment variable than an empty value.
const ListenerOff = "off"

func (o *Options) defaults() {
	if o.Listen == "" {
		o.Listen = "127.0.0.1:0"
	}
	if o.ProxyHost == "" {
		o.ProxyHost = "127.0.0.1"
	}
	if o.FirstServicePort == 0 {
		o.FirstServicePort = 30001
	}
	if o.ProbeInterval == 0 {
		o.ProbeInterval = 2 * time.Second
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = replicas.DefaultDrainTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
}

// watchNotices relays each infra's preemption notices to the services' replica managers
// (replicas.RelayNotices).
func (c *Controller) watchNotices(ctx context.Context, notifiers map[string]launcher.PreemptionNotifier) {
	for name, n := range notifiers {
		ch := n.Notices(ctx)
		// Not in c.wg: it ends with ctx, which Start cancels only after waiting on c.wg.
		go replicas.RelayNotices(ctx, name, ch, c.managers, c.log)
	}
}

// managers are the replica managers of every service.
func (c *Controller) managers() []*replicas.Manager {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*replicas.Manager, 0, len(c.services))
	for _, s := range c.services {
		if s.mgr != nil {
			out = append(out, s.mgr)
		}
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

// Controller is the daemon. Create with New, run with Start.
type Controller struct {
	opts      Options
	log       *zap.Logger
	store     *store.Store
	infras    *infra.Set
	provider  *provision.Provisioner
	startedAt time.Time
	apiAddr   string

	stopOnce sync.Once
	stopCh   chan struct{}

	// ctx is Start's context; service goroutines derive from it.
	ctx context.Context
	wg  sync.WaitGroup

	gateway     *proxy.Gateway
	gatewayAddr string // bound address, empty without a gateway

	// registry holds the controller's metrics; metrics are the proxy metrics in it, shared by
	// every service and the gateway. They are served on metricsAddr until stopAdmin (nil and
	// empty when off).
	registry    *prometheus.Registry
	metrics     *proxy.Metrics
	stopAdmin   func(context.Context)
	metricsAddr string

	mu       sync.Mutex
	services map[string]*service
}

// New prepares a controller; nothing runs until Start.
func New(opts Options) *Controller {
	opts.defaults()
	return &Controller{opts: opts, log: opts.Logger, stopCh: make(chan struct{}), services: map[string]*service{}}
}

// Start takes the home lock, restores every service (adopting its running replicas), serves
// the API, and blocks until ctx ends or Stop is called. Replicas keep running after it returns:
// a restarted controller adopts them.
func (c *Controller) Start(ctx context.Context) (err error) {
	h := c.opts.Home
	if err := h.Ensure(); err != nil {
		return err
	}
	lock, err := os.OpenFile(h.LockPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return ErrAlreadyRunning
	}
	token, err := h.Token()
	if err != nil {
		return err
	}
	c.store, err = store.Open(h.StorePath())
	if err != nil {
		return err
	}
	defer c.store.Close()
	infras, err := infra.Open(h, infra.Options{PathPrepend: c.opts.PathPrepend, Logger: c.log, BlockFor: c.opts.BlockFor})
	if err != nil {
		return err
	}
	defer infras.Close()
	for name, err := range infras.Problems {
		c.log.Warn("infra disabled", zap.String("infra", name), zap.Error(err))
	}
	c.infras = infras
	c.provider = infras.Provisioner

	ln, err := net.Listen("tcp", c.opts.Listen)
	if err != nil {
		return fmt.Errorf("controller API listen on %s: %w", c.opts.Listen, err)
	}
	c.apiAddr = ln.Addr().String()
	c.startedAt = time.Now()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.ctx = ctx
	c.watchNotices(ctx, infras.Notifiers())

	if err := c.initMetrics(); err != nil {
		ln.Close()
		return err
	}
	if err := c.startMetrics(); err != nil {
		ln.Close()
		return err
	}
	defer c.stopMetrics()
	if err := c.startGateway(); err != nil {
		ln.Close()
		return err
	}
	if err := c.restore(); err != nil {
		ln.Close()
		return err
	}

	srv := &http.Server{
		Handler:           api.NewHandler(c, token, c.log.Named("api"), c.attachRoutes()...),
		ReadHeaderTimeout: 10 * time.Second,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	if err := h.WriteInfo(home.Info{PID: os.Getpid(), Addr: c.apiAddr, Version: c.opts.Version, StartedAt: c.startedAt}); err != nil {
		return err
	}
	c.log.Info("controller started", zap.String("api", c.apiAddr), zap.String("home", h.Dir), zap.Int("pid", os.Getpid()))

	c.wg.Add(1)
	go c.statusLoop(ctx)

	select {
	case <-ctx.Done():
	case <-c.stopCh:
	case err = <-serveErr:
	}
	c.log.Info("controller stopping")
	cancel()
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer shutCancel()
	_ = srv.Shutdown(shutCtx)
	c.mu.Lock()
	svcs := make([]*service, 0, len(c.services))
	for _, s := range c.services {
		svcs = append(svcs, s)
	}
	c.mu.Unlock()
	if c.gateway != nil {
		_ = c.gateway.Shutdown(shutCtx)
	}
	for _, s := range svcs {
		s.stop(shutCtx)
	}
	c.wg.Wait()
	if info, e := h.ReadInfo(); e == nil && info.PID == os.Getpid() {
		os.Remove(h.InfoPath())
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// restore brings back every stored service and finishes any interrupted serve down.
func (c *Controller) restore() error {
	list, err := c.store.ListServices()
	if err != nil {
		return err
	}
	for _, rec := range list {
		if rec.Status == api.ServiceShuttingDown {
			c.log.Info("finishing interrupted serve down", zap.String("service", rec.Name))
			s, err := c.startService(rec, nil)
			if err != nil {
				c.log.Error("restore service", zap.String("service", rec.Name), zap.Error(err))
				continue
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				_ = c.down(c.ctx, s)
			}()
			continue
		}
		if _, err := c.startService(rec, nil); err != nil {
			c.log.Error("restore service", zap.String("service", rec.Name), zap.Error(err))
		}
	}
	return nil
}

// Stop makes Start return.
func (c *Controller) Stop() { c.stopOnce.Do(func() { close(c.stopCh) }) }

// service is one running service: its proxy listener and its replica manager.
type service struct {
	name string
	// task is the current version's (under mu: an update replaces it).
	task      *configs.Task
	port      int
	createdAt time.Time
	endpoint  string
	target    int

	// front serves the endpoint: one proxy.Service, replaced in place (a handover) when an
	// update changes the proxy's settings.
	front *proxy.Handover
	mgr   *replicas.Manager
	// scaleLoop is nil for a fixed replica count; it is replaced (under mu) when an update
	// changes the replica policy, and stopScaleLoop ends it.
	scaleLoop     *autoscaler.Loop
	stopScaleLoop func()
	ctx           context.Context // the service's lifetime
	inner         sync.WaitGroup  // the service's goroutines
	cancel        context.CancelFunc
	done          chan struct{} // closed when the manager and the proxy listener have stopped

	// attach is the service as standalone proxies follow it (attach.go).
	attach *attach.Hub

	// updateMu serialises updates of this service.
	updateMu sync.Mutex

	mu           sync.Mutex
	shuttingDown bool
	// savedStatus is the status last written to the store.
	savedStatus string
	// scaling is the autoscaler's reason for the current target.
	scaling string
	// targetKnown is set once target was decided (or read from the store after a restart).
	targetKnown bool
}

// startService starts the proxy listener, the replica manager and, for an autoscaled service,
// its scale loop. ln may be a listener already bound to rec.Port (a new service); without one
// the service is being restored after a controller restart.
func (c *Controller) startService(rec store.Service, ln net.Listener) (*service, error) {
	restored := ln == nil
	task := rec.Task
	if task == nil || task.Service == nil {
		return nil, fmt.Errorf("service %q has no service section", rec.Name)
	}
	addr := net.JoinHostPort(c.opts.ProxyHost, strconv.Itoa(rec.Port))
	if ln == nil {
		var err error
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("service %q endpoint %s: %w", rec.Name, addr, err)
		}
	}
	versions, err := c.store.Versions(rec.Name)
	if err != nil {
		ln.Close()
		return nil, err
	}
	rollout, err := c.store.Rollout(rec.Name)
	if err != nil {
		ln.Close()
		return nil, err
	}
	if rollout != nil && rollout.Target() != rec.Version {
		c.log.Warn("stored rollout and service version disagree; following the rollout", zap.String("service", rec.Name),
			zap.Int("service_version", rec.Version), zap.Int("rollout_target", rollout.Target()))
		rec.Version = rollout.Target()
	}
	var others []replicas.Version
	for _, v := range versions {
		switch {
		case v.Number != rec.Version:
			others = append(others, v)
		case rollout != nil:
			task = v.Task // the rollout's target, whatever the service row says
		}
	}
	var initialTarget *int
	if restored && rec.Target >= 0 {
		initialTarget = &rec.Target
	}
	spec := autoscaler.SpecFor(task.Service.ReplicaPolicy)
	var s *service
	px, pcfg, err := c.newServiceProxy(rec.Name, task, func() { s.pokeScaler() })
	if err != nil {
		ln.Close()
		return nil, err
	}
	scheme := "http://"
	if pcfg.TLS != nil {
		scheme = "https://"
	}
	s = &service{
		name: rec.Name, task: task, port: rec.Port, createdAt: rec.CreatedAt,
		endpoint: scheme + addr, front: proxy.NewHandover(ln, px, c.log.Named("proxy").With(zap.String("service", rec.Name))),
		done: make(chan struct{}), savedStatus: rec.Status,
	}
	s.attach = c.newAttachHub(s, time.Now)
	mgr, err := replicas.New(replicas.Config{
		Service:   rec.Name,
		Version:   rec.Version,
		Task:      task,
		Provider:  c.provider.Scope(task.Resources),
		InfraRank: c.infraRank(task.Resources),
		Store:     c.store,
		OnReady: func(eps []replicas.Endpoint) {
			backends := toBackends(eps)
			s.front.SetBackends(backends)
			c.published(s, backends)
		},
		Logger:        c.log.Named("replicas"),
		ProbeInterval: c.opts.ProbeInterval,
		Busy:          func(addr string) int64 { return c.busy(s, addr) },
		DrainTimeout:  c.opts.DrainTimeout,
		Versions:      others,
		Rollout:       rollout,
		InitialTarget: initialTarget,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s.mgr = mgr
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

	startTarget := s.target // the scale loop owns s.target from here

	ctx, cancel := context.WithCancel(c.ctx)
	s.ctx, s.cancel = ctx, cancel
	c.startScaleLoop(s, spec)
	s.inner.Add(2)
	go func() {
		defer s.inner.Done()
		if err := mgr.Start(ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error("replica manager stopped", zap.String("service", rec.Name), zap.Error(err))
		}
	}()
	go func() {
		defer s.inner.Done()
		if err := s.front.Serve(); err != nil {
			c.log.Error("proxy stopped", zap.String("service", rec.Name), zap.Error(err))
		}
	}()
	go func() {
		<-ctx.Done()
		s.inner.Wait()
		close(s.done)
	}()

	c.mu.Lock()
	c.services[rec.Name] = s
	c.mu.Unlock()
	c.updateGateway()
	c.log.Info("service started", zap.String("service", rec.Name), zap.Int("version", rec.Version),
		zap.String("endpoint", s.endpoint), zap.Int("target_replicas", startTarget),
		zap.String("autoscaler", spec.Policy))
	return s, nil
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

func toBackends(eps []replicas.Endpoint) []proxy.Backend {
	out := make([]proxy.Backend, len(eps))
	for i, e := range eps {
		out[i] = proxy.Backend{ID: e.ReplicaID, Addr: e.Addr, Accelerator: e.Accelerator, Version: e.Version}
	}
	return out
}

// CreateService implements api.Backend.
func (c *Controller) CreateService(_ context.Context, req api.CreateServiceRequest) (api.ServiceStatus, error) {
	if req.Task == nil || req.Task.Service == nil {
		return api.ServiceStatus{}, fmt.Errorf("task has no service: section: %w", api.ErrInvalid)
	}
	if req.Name == "" {
		return api.ServiceStatus{}, fmt.Errorf("service name is empty: %w", api.ErrInvalid)
	}
	if a := req.Task.Service.Auth; a != nil && len(a.KeyHashes) == 0 {
		return api.ServiceStatus{}, fmt.Errorf("service.auth resolved no API keys (the CLI resolves them from keys_from_env and keys_file): %w", api.ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.services[req.Name]; ok {
		return api.ServiceStatus{}, fmt.Errorf("service %q %w; use 'ferry serve down %s' first", req.Name, api.ErrConflict, req.Name)
	}
	ln, port, err := c.bindServicePort()
	if err != nil {
		return api.ServiceStatus{}, err
	}
	rec := store.Service{Name: req.Name, Version: 1, Task: req.Task, Port: port, Status: api.ServiceControllerInit, CreatedAt: time.Now()}
	if err := c.store.CreateService(rec); err != nil {
		ln.Close()
		return api.ServiceStatus{}, err
	}
	c.mu.Unlock()
	s, err := c.startService(rec, ln)
	c.mu.Lock()
	if err != nil {
		_ = c.store.DeleteService(req.Name)
		return api.ServiceStatus{}, err
	}
	return s.status(false), nil
}

// bindServicePort binds the lowest free endpoint port not owned by another service. It holds
// the listener so that no other process can take the port between choosing and serving.
// Called with c.mu held.
func (c *Controller) bindServicePort() (net.Listener, int, error) {
	used := map[int]bool{}
	for _, s := range c.services {
		used[s.port] = true
	}
	for port := c.opts.FirstServicePort; port < c.opts.FirstServicePort+1000 && port < 65536; port++ {
		if used[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(c.opts.ProxyHost, strconv.Itoa(port)))
		if err == nil {
			return ln, port, nil
		}
	}
	return nil, 0, fmt.Errorf("no free endpoint port in %d-%d", c.opts.FirstServicePort, c.opts.FirstServicePort+999)
}

// Services implements api.Backend.
func (c *Controller) Services(names []string) ([]api.ServiceStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(names) == 0 {
		for n := range c.services {
			names = append(names, n)
		}
		sort.Strings(names)
	}
	out := make([]api.ServiceStatus, 0, len(names))
	for _, n := range names {
		s, ok := c.services[n]
		if !ok {
			return nil, fmt.Errorf("service %q: %w", n, api.ErrNotFound)
		}
		out = append(out, s.status(true))
	}
	return out, nil
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
		Status: s.mgr.ServiceStatus(down),
	}
	for _, r := range recs {
		if r.Status == replicas.StatusReady {
			st.ReadyReplicas++
		}
	}
	if withTask {
		st.Task = task.Redacted()
	}
	return st
}

// statusLoop persists service statuses so that an operator reading the store sees them.
func (c *Controller) statusLoop(ctx context.Context) {
	defer c.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		var changed []api.ServiceStatus
		for _, s := range c.services {
			st := s.status(false)
			s.mu.Lock()
			if st.Status != s.savedStatus {
				s.savedStatus = st.Status
				changed = append(changed, st)
			}
			s.mu.Unlock()
		}
		c.mu.Unlock()
		for _, st := range changed {
			c.log.Info("service status", zap.String("service", st.Name), zap.String("status", st.Status),
				zap.Int("ready", st.ReadyReplicas), zap.Int("target", st.TargetReplicas))
			if err := c.store.SetServiceStatus(st.Name, st.Status); err != nil && !errors.Is(err, store.ErrNotFound) {
				c.log.Warn("persist service status", zap.String("service", st.Name), zap.Error(err))
			}
		}
	}
}

// DeleteService implements api.Backend: drain the endpoint, terminate every replica, forget it.
func (c *Controller) DeleteService(ctx context.Context, name string) error {
	c.mu.Lock()
	s, ok := c.services[name]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("service %q: %w", name, api.ErrNotFound)
	}
	return c.down(ctx, s)
}

func (c *Controller) down(ctx context.Context, s *service) error {
	s.mu.Lock()
	s.shuttingDown = true
	s.mu.Unlock()
	// Persist first: a controller killed half-way finishes the job on restart.
	if err := c.store.SetServiceStatus(s.name, api.ServiceShuttingDown); err != nil {
		return err
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
	if err := s.mgr.Shutdown(termCtx); err != nil {
		_ = c.store.SetServiceStatus(s.name, api.ServiceFailedCleanup)
		return fmt.Errorf("terminate replicas of %q: %w", s.name, err)
	}
	s.cancel()
	<-s.done
	if err := c.store.DeleteService(s.name); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.services, s.name)
	c.mu.Unlock()
	c.updateGateway()
	c.log.Info("service down", zap.String("service", s.name))
	return nil
}

// ReplicaLogPath implements api.Backend.
func (c *Controller) ReplicaLogPath(name string, id int) (string, error) {
	c.mu.Lock()
	s, ok := c.services[name]
	c.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("service %q: %w", name, api.ErrNotFound)
	}
	for _, r := range s.mgr.Replicas() {
		if r.ID != id {
			continue
		}
		if r.InstanceID == "" {
			return "", fmt.Errorf("replica %d of %q has no log: %w", id, name, api.ErrNotFound)
		}
		p, err := c.provider.LogPath(r.InstanceID)
		if err != nil {
			return "", fmt.Errorf("replica %d of %q: %v: %w", id, name, err, api.ErrNotFound)
		}
		return p, nil
	}
	return "", fmt.Errorf("replica %d of %q: %w", id, name, api.ErrNotFound)
}

// ControllerLogPath implements api.Backend.
func (c *Controller) ControllerLogPath() string { return c.opts.LogFile }

// Status implements api.Backend.
func (c *Controller) Status() api.ControllerStatus {
	c.mu.Lock()
	n := len(c.services)
	c.mu.Unlock()
	st := api.ControllerStatus{PID: os.Getpid(), Addr: c.apiAddr, Home: c.opts.Home.Dir, Version: c.opts.Version,
		StartedAt: c.startedAt, Services: n}
	if c.gatewayAddr != "" {
		st.Gateway = "http://" + c.gatewayAddr
	}
	st.Metrics = c.metricsURL()
	return st
}

var _ api.Backend = (*Controller)(nil)
