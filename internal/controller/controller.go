// Package controller wires Ferry's control plane together: the store, the provisioner, and per
// service a proxy listener (proxy), a replica manager (replicas), a scale loop (autoscaler) and
// a hub for attached proxies (proxy/attach), behind the API the CLI talks to (internal/api).
// It decides nothing itself: how many replicas is the autoscaler's, which kind and zone
// policy's, their lifecycle, rollouts and the service's status the replica manager's. What is
// here is the daemon's lifecycle (controller.go), starting, stopping and describing services
// (services.go), updates (update.go), and adapters that let the packages read each other
// (scaling.go, attach.go, gateway.go, metrics.go).
//
// Locks: c.mu guards the services map only and is never held while another lock is taken or
// the disk is written; s.mu guards one service's fields, likewise. Every long-lived goroutine
// recovers panics (c.spawn).
package controller

import (
	"context"
	"errors"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/internal/leader"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
	"github.com/ferryserve/ferry/proxy/kvevents"
	"github.com/ferryserve/ferry/replicas"
)

// ErrAlreadyRunning means another controller holds this home's lock.
var ErrAlreadyRunning = errors.New("a controller is already running for this FERRY_HOME")

// Options configure a controller.
type Options struct {
	Home home.Home
	// Store says where the state is: SQLite in Home (the default) or the Kubernetes API
	// (store.go).
	Store StoreOptions
	// Webhook serves the FerryService validating webhook (webhook.go).
	Webhook WebhookOptions
	// ExternalMetrics serves the external metrics API an HPA of the attached proxies reads
	// (extmetrics.go).
	ExternalMetrics ExternalMetricsOptions
	// Endpoints, when set, give each FerryService a Kubernetes Service (and an HTTPRoute)
	// leading to the release's attached gateway proxies (endpoints.go).
	Endpoints EndpointOptions
	// Listen is a TCP address for the API besides its Unix socket (attached proxies on other
	// machines need one); empty or ListenerOff for none, the default.
	Listen string
	// APITLSCert and APITLSKey make Listen serve HTTPS; an address off loopback requires them.
	APITLSCert, APITLSKey string
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
	// Supervisor is the ferry binary, for local replicas on a fixed port (local.Options).
	Supervisor string
	// GatewayAddr is the shared endpoint where a request's "model" picks the service; empty or
	// ListenerOff disables it. If the default address is taken the controller runs without a gateway
	// (logged); any other address that cannot be bound is an error.
	GatewayAddr string
	// MetricsAddr is the admin listener serving Prometheus /metrics and /healthz, apart from
	// service traffic; empty or ListenerOff disables it. Like GatewayAddr, a taken default
	// address is logged and skipped, while any other address that cannot be bound is an error.
	MetricsAddr string
	// KVEventsAddr, when set, is the ZeroMQ endpoint (tcp://HOST:PORT) the controller binds for
	// replicas' KV-cache events, which every service's proxy then routes by (proxy/kvevents).
	KVEventsAddr string
	// KVEventsPort, when set instead, is the port of every replica's own publisher (vLLM's
	// default binds tcp://*:5557), which the controller connects to.
	KVEventsPort int
	// MetricsToken, when set, protects the metrics listener's /metrics with "Authorization:
	// Bearer TOKEN" (what a Prometheus scrape config's credentials_file sends); /healthz stays
	// open.
	MetricsToken string
	// BlockFor is how long a location that had no capacity is skipped; 0 is
	// provision.DefaultBlockFor.
	BlockFor time.Duration
	// JobWatchInterval and JobRetryInterval pace the jobs manager: how often a running gang
	// is looked at, and how often jobs waiting for capacity try again (0: the jobs defaults).
	JobWatchInterval time.Duration
	JobRetryInterval time.Duration
	// PreemptionCooldown is how long a job preempted for a higher-priority one, by the job
	// queue or by a local replica, is safe from another preemption (0: 5m).
	PreemptionCooldown time.Duration
	// WindowLead is how long before a reservation's end its replicas are replaced (0:
	// launcher.DefaultWindowLead).
	WindowLead time.Duration
	// ClientLimits cap the client connections and the request bodies being read over every
	// service endpoint and the gateway together (proxy.Guard); zero values are the defaults.
	ClientLimits proxy.ClientLimits
	// OTLP says where the spans of every service's requests and the gateway's go; with no
	// endpoint here or in the environment (OTEL_EXPORTER_OTLP_ENDPOINT), tracing is off.
	OTLP proxy.OTLPConfig
	// Elector, when set, makes this controller one of several over shared state: it follows
	// (forwards its API to the leader, runs nothing) until the Elector makes it lead.
	Elector *leader.Elector
	// UsagePersistInterval is how often the tenants' usage the proxies reported is written to
	// the store (0: 2 s); it is written at shutdown too.
	UsagePersistInterval time.Duration
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

// watchNotices relays each infra's preemption notices to the jobs manager and to the
// services' replica managers (replicas.RelayNotices). It runs once both exist.
func (c *Controller) watchNotices(ctx context.Context, notifiers map[string]launcher.PreemptionNotifier) {
	for name, n := range notifiers {
		in := n.Notices(ctx)
		out := make(chan launcher.Notice, cap(in))
		// Not in c.wg: they end with ctx, which Start cancels only after waiting on c.wg.
		c.spawn(nil, "notice tee", func() {
			defer close(out)
			for notice := range in {
				if c.jobs.Notice(notice) {
					continue // a job's node, not a replica
				}
				select {
				case out <- notice:
				case <-ctx.Done():
					return
				}
			}
		})
		c.spawn(nil, "notice relay", func() { replicas.RelayNotices(ctx, name, out, c.managers, c.log) })
	}
}

// managers are the replica managers of every service.
func (c *Controller) managers() []*replicas.Manager {
	var out []*replicas.Manager
	for _, s := range c.serviceList() {
		out = append(out, s.mgr)
	}
	return out
}

// serviceList is every running service, ordered by name: taken under c.mu, used after it.
func (c *Controller) serviceList() []*service {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*service, 0, len(c.services))
	for _, s := range c.services {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *service) int { return strings.Compare(a.name, b.name) })
	return out
}

// Controller is the daemon. Create with New, run with Start.
type Controller struct {
	opts      Options
	log       *zap.Logger
	store     store.Store
	infras    *infra.Set
	provider  *provision.Provisioner
	startedAt time.Time
	// apiSocket is the API's Unix socket; apiAddr its TCP address, "" without one.
	apiSocket string
	apiAddr   string

	stopOnce sync.Once
	stopCh   chan struct{}

	// ctx is Start's context; service goroutines derive from it.
	ctx context.Context
	wg  sync.WaitGroup

	gateway     *proxy.Gateway
	gatewayAddr string // bound address, empty without a gateway
	// guard applies ClientLimits to every service endpoint and the gateway.
	guard *proxy.Guard
	// kvEvents hears the replicas' KV-cache events (Options.KVEventsAddr); nil without.
	kvEvents kvevents.Source
	// tracing records the spans of every service's requests and the gateway's (Options.OTLP);
	// nil when off.
	tracing *proxy.Tracing

	// registry holds the controller's metrics; metrics are the proxy metrics in it, shared by
	// every service and the gateway. They are served on metricsAddr until stopAdmin (nil and
	// empty when off).
	registry    *prometheus.Registry
	metrics     *proxy.Metrics
	control     *controlPlaneMetrics
	stopAdmin   func(context.Context)
	metricsAddr string

	// jobs runs every job on the same provisioner (jobs.go).
	jobs *jobs.Manager

	// tenantState is the API keys' directory and the usage hub (tenants.go); tenancy the
	// managed keys and ledger of the controller's own proxies (tenantsync.go).
	tenantState  *tenantState
	tenancy      *proxy.Tenancy
	usageMetrics *usageMetrics

	// Leadership (leadership.go). leadMu guards closeState, which lead sets; leadWG counts a
	// lead in progress; leaderErr carries a failed lead or lost leadership to Start; api is
	// the leader's API handler once this controller leads (nil while it follows), when
	// leading is closed.
	leading    chan struct{}
	leadMu     sync.Mutex
	closeState func()
	leadWG     sync.WaitGroup
	leaderErr  chan error
	api        atomic.Pointer[http.Handler]

	// attachList is the list of services attached gateways long-poll (attach.go); listMu
	// serialises its publishing, and listRestored says the stored services are restored.
	attachList   attach.ServiceFeed
	listMu       sync.Mutex
	listRestored bool

	mu       sync.Mutex
	services map[string]*service
	// creating holds the names of services being created, with the endpoint port each has
	// bound, until they are in services (CreateService writes the store with c.mu released).
	creating map[string]int
}

// New prepares a controller; nothing runs until Start.
func New(opts Options) *Controller {
	opts.defaults()
	return &Controller{opts: opts, log: opts.Logger, stopCh: make(chan struct{}), services: map[string]*service{},
		creating: map[string]int{}, leaderErr: make(chan error, 1), leading: make(chan struct{}), tenantState: newTenantState(time.Now()), tenancy: newTenancy()}
}

// Start takes the home lock, serves the API and, unless it must first win an election
// (Options.Elector, leadership.go), restores every service (adopting its running replicas);
// it blocks until ctx ends, Stop is called or leadership is lost. Replicas keep running after
// it returns: a restarted controller, or the next leader, adopts them.
func (c *Controller) Start(ctx context.Context) (err error) {
	h := c.opts.Home
	unlock, err := lockHome(h)
	if err != nil {
		return err
	}
	defer unlock()
	tokens, err := apiTokens(h)
	if err != nil {
		return err
	}
	lns, err := listenAPI(h, c.opts.Listen, apiTLS{c.opts.APITLSCert, c.opts.APITLSKey})
	if err != nil {
		return err
	}
	defer lns.close()
	c.apiSocket, c.apiAddr = lns.socketPath, lns.tcpAddr()
	c.startedAt = time.Now()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.ctx = ctx
	defer c.stopMetrics()
	stopWebhook, err := c.startWebhook()
	if err != nil {
		return err
	}
	defer stopWebhook()
	stopExternalMetrics, err := c.startExternalMetrics(ctx, tokens)
	if err != nil {
		return err
	}
	defer stopExternalMetrics()
	if err := c.startAdmin(); err != nil {
		return err
	}
	defer c.flushTraces()
	defer c.stopLeading()
	var handler http.Handler
	if c.opts.Elector == nil {
		if err := c.lead(ctx); err != nil {
			return err
		}
		handler = c.leaderHandler(tokens)
	} else {
		handler = c.campaign(ctx, tokens)
	}
	srv := api.NewServer(handler, 0, c.log.Named("api"))
	serveErr := lns.serve(c, srv)
	if err := h.WriteInfo(home.Info{PID: os.Getpid(), Socket: c.apiSocket, Addr: c.apiAddr, TLS: lns.tlsConfig != nil,
		Version: c.opts.Version, StartedAt: c.startedAt}); err != nil {
		return err
	}
	c.log.Info("controller started", zap.String("socket", c.apiSocket), zap.String("api", c.apiAddr), zap.String("home", h.Dir), zap.Int("pid", os.Getpid()))

	select {
	case <-ctx.Done():
	case <-c.stopCh:
	case err = <-serveErr:
	case err = <-c.leaderErr:
	}
	c.log.Info("controller stopping")
	cancel()
	c.shutdown(srv)
	if info, e := h.ReadInfo(); e == nil && info.PID == os.Getpid() {
		os.Remove(h.InfoPath())
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// lead opens the state and starts everything only the leader runs: every stored service with
// its replica manager and scale loop (adopting running replicas and rollouts), the gateway,
// the jobs manager (adopting jobs in flight), the notice relay and the status loop, until ctx
// ends. stopLeading undoes it.
func (c *Controller) lead(ctx context.Context) error {
	closeState, err := c.openState()
	if err != nil {
		return err
	}
	c.leadMu.Lock()
	c.closeState = closeState
	c.leadMu.Unlock()
	if err := c.startTenants(ctx); err != nil {
		return err
	}
	c.startTenancy(ctx)
	if err := c.startGateway(); err != nil {
		return err
	}
	// Breaker probes and the janitor: leftovers an earlier controller kept in the store are
	// stopped once their infras answer (launcher/provision/janitor.go).
	c.spawn(&c.wg, "provisioner", func() {
		if err := c.provider.Run(ctx, c.store); err != nil {
			c.log.Error("provisioner janitor stopped", zap.Error(err))
		}
	})
	if err := c.restore(); err != nil {
		return err
	}
	c.servicesRestored()
	if err := c.startJobs(ctx); err != nil {
		return err
	}
	if err := c.watchFerryServices(ctx); err != nil {
		return err
	}
	c.watchNotices(ctx, c.infras.Notifiers())
	c.spawn(&c.wg, "status loop", func() { c.statusLoop(ctx) })
	return nil
}

// stopLeading stops the jobs manager (its goroutines end with Start's context) and closes
// the state lead opened; Start defers it.
func (c *Controller) stopLeading() {
	c.leadWG.Wait()
	c.leadMu.Lock()
	defer c.leadMu.Unlock()
	if c.jobs != nil {
		c.jobs.Stop()
	}
	if c.closeState != nil {
		c.closeState()
	}
}

// leaderHandler is the API as the leader serves it.
func (c *Controller) leaderHandler(tokens api.Tokens) http.Handler {
	log := c.log.Named("api")
	routes := append(c.attachRoutes(), c.jobRoutes()...)
	routes = append(routes, c.proxyLoadRoute())
	return api.NewHandler(c, tokens, log, append(routes, api.TenantRoutes(c, log)...)...)
}

// apiTokens are the home's controller token and attach token, made on first use.
func apiTokens(h home.Home) (api.Tokens, error) {
	full, err := h.Token()
	if err != nil {
		return api.Tokens{}, err
	}
	attach, err := h.ProxyToken()
	return api.Tokens{Full: full, Attach: attach}, err
}

// lockHome takes the home's lock, which one controller holds at a time.
func lockHome(h home.Home) (unlock func(), err error) {
	if err := h.Ensure(); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(h.LockPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, ErrAlreadyRunning
	}
	return func() { lock.Close() }, nil
}

// openState opens the store and the enabled infras (the provisioner over them).
func (c *Controller) openState() (closeState func(), err error) {
	h := c.opts.Home
	c.store, err = c.openStore()
	if err != nil {
		return nil, err
	}
	infras, err := infra.Open(h, infra.Options{PathPrepend: c.opts.PathPrepend, Supervisor: c.opts.Supervisor, Logger: c.log, BlockFor: c.opts.BlockFor, WindowLead: c.opts.WindowLead,
		KubeQPS: c.opts.Store.QPS, KubeBurst: c.opts.Store.Burst, PreemptionCooldown: c.opts.PreemptionCooldown})
	if err != nil {
		c.store.Close()
		return nil, err
	}
	for name, err := range infras.Problems {
		c.log.Warn("infra disabled", zap.String("infra", name), zap.Error(err))
	}
	c.infras = infras
	c.provider = infras.Provisioner
	return func() {
		infras.Close()
		c.store.Close()
	}, nil
}

// startAdmin makes the client guard and the metrics, and serves the metrics listener: a
// follower serves /healthz too.
func (c *Controller) startAdmin() error {
	guard, err := proxy.NewGuard(c.opts.ClientLimits)
	if err != nil {
		return err
	}
	c.guard = guard
	if err := c.initMetrics(); err != nil {
		return err
	}
	if err := c.listenKVEvents(); err != nil {
		return err
	}
	if c.tracing, err = proxy.StartOTLP(c.ctx, c.opts.OTLP); err != nil {
		return err
	}
	if c.tracing != nil {
		c.log.Info("exporting request traces over OTLP")
	}
	return c.startMetrics()
}

// flushTraces sends the spans still buffered once the services have drained, within 5 s.
func (c *Controller) flushTraces() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.tracing.Shutdown(ctx); err != nil {
		c.log.Warn("flushing request traces", zap.Error(err))
	}
}

// shutdown stops the API, the gateway and every service's loops and listener, leaving replicas
// running for the next controller to adopt.
func (c *Controller) shutdown(srv *api.Server) {
	c.leadWG.Wait() // a lead in progress (its context has ended) adds no service after this
	shutCtx, shutCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer shutCancel()
	_ = srv.Shutdown(shutCtx)
	if c.gateway != nil {
		_ = c.gateway.Shutdown(shutCtx)
	}
	for _, s := range c.serviceList() {
		s.stop(shutCtx)
	}
	c.wg.Wait()
	c.flushTenancy()
	c.persistUsage() // what the proxies reported until they stopped
	if c.kvEvents != nil {
		_ = c.kvEvents.Close()
	}
}

// spawn runs fn in a goroutine counted in wg (when not nil), logging a panic instead of
// crashing the controller: every service, and the replicas they hold, would go with it.
func (c *Controller) spawn(wg *sync.WaitGroup, what string, fn func()) {
	if wg != nil {
		wg.Add(1)
	}
	go func() {
		if wg != nil {
			defer wg.Done()
		}
		defer c.recoverPanic(what)
		fn()
	}()
}

// recoverPanic logs a recovered panic; deferred directly by the goroutine it protects.
func (c *Controller) recoverPanic(what string) {
	if p := recover(); p != nil {
		c.log.Error("recovered panic", zap.String("in", what), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
	}
}

// restoreParallel is how many services restore starts at once. A new leader restores every
// service before it publishes any: one after the other, 100 services took 3.3 s of a takeover
// on a loaded 2-core host (issue 36 allows 5 s for the whole of it).
const restoreParallel = 8

// restore brings back every stored service and finishes any interrupted serve down, starting
// restoreParallel services at a time (startService is safe to call concurrently, as
// CreateService does). It returns once every service has been started or has failed to.
func (c *Controller) restore() error {
	list, err := c.store.ListServices()
	if err != nil {
		return err
	}
	sem := make(chan struct{}, restoreParallel)
	var wg sync.WaitGroup
	for _, rec := range list {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c.restoreOne(rec)
		})
	}
	wg.Wait()
	return nil
}

// restoreOne starts one stored service, and takes it down when a serve down was interrupted.
func (c *Controller) restoreOne(rec store.Service) {
	if rec.Status == api.ServiceShuttingDown {
		c.log.Info("finishing interrupted serve down", zap.String("service", rec.Name))
		s, err := c.startService(rec, nil)
		if err != nil {
			c.log.Error("restore service", zap.String("service", rec.Name), zap.Error(err))
			return
		}
		c.spawn(&c.wg, "serve down", func() { _ = c.down(c.ctx, s) })
		return
	}
	if _, err := c.startService(rec, nil); err != nil {
		c.log.Error("restore service", zap.String("service", rec.Name), zap.Error(err))
	}
}

// Stop makes Start return.
func (c *Controller) Stop() { c.stopOnce.Do(func() { close(c.stopCh) }) }

// Status implements api.Backend.
func (c *Controller) Status() api.ControllerStatus {
	c.mu.Lock()
	n := len(c.services)
	c.mu.Unlock()
	st := api.ControllerStatus{PID: os.Getpid(), Socket: c.apiSocket, Addr: c.apiAddr, Home: c.opts.Home.Dir, Version: c.opts.Version,
		StartedAt: c.startedAt, Services: n}
	if c.gatewayAddr != "" {
		st.Gateway = "http://" + c.gatewayAddr
	}
	st.Metrics = c.metricsURL()
	return st
}

var _ api.Backend = (*Controller)(nil)
