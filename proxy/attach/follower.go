package attach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/proxy"
)

// Timing of a Follower.
const (
	// watchWait is how long one long poll may be held by the controller.
	watchWait = DefaultPollWait
	// watchSlack is added to the poll's own deadline, for a controller that vanished without
	// closing the connection.
	watchSlack = 15 * time.Second
	// retryMin and retryMax bound the backoff between failed polls: a restarted controller is
	// found within about a second.
	retryMin = 100 * time.Millisecond
	retryMax = time.Second
	// reportEvery is how often the load report goes out (and right after a new set).
	reportEvery = 500 * time.Millisecond
	// reportTimeout bounds one report.
	reportTimeout = 2 * time.Second
	// warnEvery spaces the warnings while the controller stays unavailable.
	warnEvery = 30 * time.Second
)

// FollowerConfig configures a Follower.
type FollowerConfig struct {
	// Service is the name of the controller's service to follow.
	Service string
	// Base is the proxy's own part of its configuration (name, TLS, logs, metrics);
	// ProxyConfig.Apply adds the service's.
	Base proxy.ServiceConfig
	// Listener is where the proxy serves; Start closes it.
	Listener net.Listener
	// Home is the FERRY_HOME of the controller, or a copy of what a proxy needs of it
	// (controller.json, proxy.token, controller.crt): its address and token are read there,
	// again after every failure, as a restarted controller listens elsewhere.
	Home home.Home
	// Controllers, when set, are the API URLs of several controllers of which one leads
	// (`ferry proxy --controller`): the proxy follows whichever answers, trying the next on any
	// failure, and reads only the attach token and certificate from Home.
	Controllers []string
	// DrainTimeout bounds how long requests in flight may finish: under an old configuration
	// after a new one took over, and when Start's ctx ends.
	DrainTimeout time.Duration
	// DrainDelay is how long the proxy keeps serving, unready, once Start's ctx ends and before
	// it stops accepting, while it keeps following the service (`ferry proxy --drain-delay`).
	DrainDelay time.Duration
	// Readiness, when set, turns ready at the controller's first answer (the proxy then has
	// the service's configuration and replica set, possibly empty, which it holds requests
	// for) and a sync has brought the managed keys (Base.Tenancy; at most 2 s), and draining
	// when Start's ctx ends.
	Readiness *proxy.Readiness
	// Logger may be nil.
	Logger *zap.Logger
}

// Follower is an attached proxy (`ferry proxy --attach SERVICE`): it serves a service's READY
// replica set, which it follows from the controller with a long poll, reports its load back,
// and keeps serving the last set it had while the controller is away.
type Follower struct {
	service    string
	base       proxy.ServiceConfig
	drain      time.Duration
	drainDelay time.Duration
	ready      *proxy.Readiness
	ln         net.Listener
	ctl        *controllerConn
	// rootLog is the Logger as given; log names the service.
	rootLog *zap.Logger
	log     *zap.Logger
	id      string
	// served receives the Handover's Serve result.
	served chan error
	// kick asks the report loop to report now.
	kick chan struct{}
	// keysKnown is closed at the first sync of managed keys that succeeded (tenantLoop).
	keysKnown chan struct{}

	mu   sync.Mutex
	hand *proxy.Handover // nil until the controller first answered
	// config, shares and seq are what the proxy serves.
	config ProxyConfig
	shares int
	seq    uint64
	// current are the addresses of the set served; removed those that left it while
	// requests were still in flight there, reported until they are idle.
	current []string
	removed map[string]bool
}

// NewFollower returns a follower; nothing happens until Start.
func NewFollower(cfg FollowerConfig) *Follower {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Follower{
		service:    cfg.Service,
		base:       cfg.Base,
		drain:      cfg.DrainTimeout,
		drainDelay: cfg.DrainDelay,
		ready:      cfg.Readiness,
		ln:         cfg.Listener,
		ctl:        &controllerConn{home: cfg.Home, urls: cfg.Controllers},
		rootLog:    log,
		log:        log.With(zap.String("service", cfg.Service)),
		id:         newProxyID(),
		served:     make(chan error, 1),
		kick:       make(chan struct{}, 1),
		keysKnown:  make(chan struct{}),
	}
}

// Start serves the service until ctx ends, then drains requests in flight for up to
// DrainTimeout. It accepts nothing before the controller first answered, as until then it
// knows neither the replicas nor whether the service requires an API key. It closes the
// listener.
func (f *Follower) Start(ctx context.Context) error {
	f.rootLog.Info("proxy attaching", zap.String("service", f.service), zap.String("endpoint", "http://"+f.ln.Addr().String()),
		zap.String("home", f.ctl.home.Dir), zap.String("proxy_id", f.id))

	// The loops outlive ctx by the drain delay: replicas that change meanwhile are followed.
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		f.watch(loops)
	}()
	// Managed keys' use is synced until the drain below has ended, and once more after.
	tenantCtx, stopTenants := context.WithCancel(context.WithoutCancel(ctx))
	tenantsDone := make(chan struct{})
	go func() {
		defer close(tenantsDone)
		if f.base.Tenancy != nil {
			f.tenantLoop(tenantCtx)
		}
	}()
	defer func() {
		stopTenants()
		<-tenantsDone
	}()
	go func() {
		defer wg.Done()
		f.reportLoop(loops)
	}()
	var serveErr error
	select {
	case <-ctx.Done():
		serveErr = f.announceDrain()
	case serveErr = <-f.served:
	}
	stopLoops()
	wg.Wait()

	hand := f.handover()
	if hand == nil {
		f.ln.Close()
		return serveErr
	}
	if serveErr != nil {
		return serveErr
	}
	f.rootLog.Info("shutting down: draining requests in flight", zap.Int64("in_flight", hand.InFlight()), zap.Duration("timeout", f.drain))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), f.drain)
	defer cancel()
	if err := hand.Shutdown(shutdownCtx); err != nil {
		return err
	}
	return <-f.served
}

// announceDrain turns the proxy unready and, if it serves, keeps serving for the drain delay,
// closing each client connection after its next response (proxy.Readiness.DrainFor).
func (f *Follower) announceDrain() error {
	hand := f.handover()
	if hand == nil {
		f.ready.Drain()
		return nil
	}
	return f.ready.DrainFor(f.drainDelay, hand, f.served, f.rootLog)
}

func (f *Follower) handover() *proxy.Handover {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hand
}

// watch long-polls the controller for the service's replica set and applies each new one,
// until ctx ends. When the controller cannot be reached it keeps the set it has and retries,
// re-reading FERRY_HOME for the address of a restarted controller.
func (f *Follower) watch(ctx context.Context) {
	var after uint64
	var backoff time.Duration
	var lastWarn time.Time
	connected := false
	for ctx.Err() == nil {
		wait := watchWait
		if f.handover() == nil {
			wait = 0 // the first answer starts serving, with or without replicas
		}
		rs, addr, err := f.poll(ctx, after, wait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Whatever went wrong, the next poll asks the controller anew: it may be a new
			// one, with different Seqs.
			f.ctl.forget(err)
			after = 0
			if connected || time.Since(lastWarn) >= warnEvery {
				f.log.Warn("controller unavailable; serving the last replica set and retrying", zap.Error(err))
				lastWarn = time.Now()
			} else if ce := f.log.Check(zap.DebugLevel, "controller still unavailable"); ce != nil {
				ce.Write(zap.Error(err))
			}
			connected = false
			backoff = min(max(2*backoff, retryMin), retryMax)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		if !connected {
			f.log.Info("connected to the controller", zap.String("controller", addr), zap.Uint64("seq", rs.Seq),
				zap.Int("replicas", len(rs.Backends)))
			connected, lastWarn, backoff = true, time.Time{}, 0
		}
		if err := f.apply(rs); err != nil {
			f.served <- err
			return
		}
		after = rs.Seq
	}
}

// poll is one long poll; it returns the controller's address for logs.
func (f *Follower) poll(ctx context.Context, after uint64, wait time.Duration) (ReplicaSet, string, error) {
	c, addr, err := f.ctl.client()
	if err != nil {
		return ReplicaSet{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, wait+watchSlack)
	defer cancel()
	rs, err := PollReplicaSet(ctx, c, f.service, after, wait)
	return rs, addr, err
}

// apply serves a replica set: the first answer starts the Handover, a new configuration hands
// the listener over to a new Service, and new backends go to every Service. A Seq of 0 (the
// controller has published no set yet) or the Seq already served changes nothing.
func (f *Follower) apply(rs ReplicaSet) error {
	backends := rs.Backends
	addrs := make([]string, len(backends))
	for i, b := range backends {
		addrs[i] = b.Addr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hand == nil {
		svc, err := proxy.NewService(f.serviceConfig(rs))
		if err != nil {
			return fmt.Errorf("the controller's configuration of service %q: %w", f.service, err)
		}
		if rs.Seq != 0 {
			svc.SetBackends(backends)
			f.setPrefill(svc.SetPrefillBackends, rs)
			f.seq, f.current = rs.Seq, addrs
		}
		f.config, f.shares = rs.Config, rs.Proxies
		f.hand = proxy.NewHandover(f.ln, svc, f.log)
		hand := f.hand
		go func() {
			// Connections that arrive meanwhile wait in the listener's backlog.
			f.awaitKeys()
			f.ready.Ready() // not after a drain began: Ready only moves a proxy out of starting
			f.served <- hand.Serve()
		}()
		f.log.Info("proxy serving", zap.String("endpoint", "http://"+f.ln.Addr().String()),
			zap.String("policy", policyName(rs.Config.Policy)), zap.Bool("auth", rs.Config.AuthRequired),
			zap.Strings("replicas", f.current))
		f.kickReport()
		return nil
	}
	if rs.Seq == 0 || rs.Seq == f.seq && rs.Proxies == f.shares {
		return nil
	}
	if !reflect.DeepEqual(rs.Config, f.config) || rs.Proxies != f.shares {
		svc, err := proxy.NewService(f.serviceConfig(rs))
		if err != nil {
			// A configuration this proxy cannot serve (a policy newer than its binary, say):
			// keep the old one rather than stop serving.
			f.log.Error("cannot apply the service's new proxy configuration; keeping the previous one", zap.Error(err))
		} else {
			svc.SetBackends(backends)
			f.setPrefill(svc.SetPrefillBackends, rs)
			f.hand.Swap(svc, f.drain)
			f.config, f.shares = rs.Config, rs.Proxies
			f.log.Info("proxy configuration changed; new connections use it", zap.String("policy", policyName(rs.Config.Policy)),
				zap.Bool("auth", rs.Config.AuthRequired), zap.Int("proxies_sharing_replicas", rs.Proxies))
		}
	}
	f.hand.SetBackends(backends) // the new Service has them; those draining get them too
	f.setPrefill(f.hand.SetPrefillBackends, rs)
	if !slices.Equal(addrs, f.current) {
		if f.removed == nil {
			f.removed = map[string]bool{}
		}
		for _, addr := range f.current {
			if !slices.Contains(addrs, addr) {
				f.removed[addr] = true
			}
		}
		for _, addr := range addrs {
			delete(f.removed, addr)
		}
		f.log.Info("replica set changed", zap.Uint64("seq", rs.Seq), zap.Strings("replicas", addrs), zap.Strings("before", f.current))
	}
	f.seq, f.current = rs.Seq, addrs
	f.kickReport()
	return nil
}

// serviceConfig is the proxy configuration of rs: the service's, with this proxy's share of
// each replica.
func (f *Follower) serviceConfig(rs ReplicaSet) proxy.ServiceConfig {
	cfg := rs.Config.Apply(f.base)
	cfg.ReplicaShares = rs.Proxies
	return cfg
}

func policyName(p string) string {
	if p == "" {
		return proxy.DefaultPolicy
	}
	return p
}

func (f *Follower) kickReport() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// reportLoop sends the load report every reportEvery and after each new set, until ctx
// ends. A failed report is dropped: the next one carries the same counters.
func (f *Follower) reportLoop(ctx context.Context) {
	tick := time.NewTicker(reportEvery)
	defer tick.Stop()
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.kick:
		}
		r, ok := f.loadReport()
		if !ok {
			continue
		}
		c, _, err := f.ctl.client()
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, reportTimeout)
			err = ReportLoad(rctx, c, f.service, r)
			cancel()
		}
		switch {
		case err == nil || ctx.Err() != nil:
		case (errors.Is(err, rpc.ErrInvalid) || errors.Is(err, rpc.ErrUnauthorized) || errors.Is(err, rpc.ErrForbidden)) && time.Since(lastWarn) >= warnEvery:
			// The controller is there and refuses the report: it will not count this
			// proxy's requests when it drains a replica.
			f.log.Warn("load report rejected by the controller", zap.Error(err))
			lastWarn = time.Now()
		default: // unreachable or the service unknown: the watch loop tells
			if ce := f.log.Check(zap.DebugLevel, "load report failed"); ce != nil {
				ce.Write(zap.Error(err))
			}
		}
	}
}

// loadReport is the report to send now; false before the proxy serves.
func (f *Follower) loadReport() (LoadReport, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hand == nil {
		return LoadReport{}, false
	}
	r := LoadReport{
		ProxyID:  f.id,
		Seq:      f.seq,
		InFlight: make(map[string]int64, len(f.current)+len(f.removed)),
		Arrivals: f.hand.Arrivals(),
		Waiting:  f.hand.Waiting(),

		PrefillTokens:   f.hand.PrefillTokens(),
		PrefillInFlight: f.hand.PrefillBusy(),
	}
	for _, addr := range f.current {
		r.InFlight[addr] = f.hand.Busy(addr)
	}
	for addr := range f.removed {
		n := f.hand.Busy(addr)
		r.InFlight[addr] = n
		if n == 0 {
			delete(f.removed, addr) // this report tells the controller it is idle here
		}
	}
	return r, true
}

// setPrefill applies a set's prefill pool with set; a replica address the proxy cannot use
// leaves the pool as it was, and is logged.
func (f *Follower) setPrefill(set func([]proxy.Backend) error, rs ReplicaSet) {
	var prefill []proxy.Backend // not disaggregated
	if rs.Disaggregated {
		prefill = append([]proxy.Backend{}, rs.Prefill...)
	}
	if err := set(prefill); err != nil {
		f.log.Error("cannot apply the service's prefill pool; keeping the previous one", zap.Error(err))
	}
}
