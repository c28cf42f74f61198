package attach

import (
	"context"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/home"
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
// replica set, which it follows from the controller with a long poll (follow), reports its load
// back, and keeps serving the last set it had while the controller is away.
type Follower struct {
	service    string
	drain      time.Duration
	drainDelay time.Duration
	ready      *proxy.Readiness
	ln         net.Listener
	ctl        *controllerConn
	// rootLog is the Logger as given; log names the service.
	rootLog *zap.Logger
	log     *zap.Logger
	id      string
	follow  *follow
	keys    *keySync
	// served receives the Handover's Serve result.
	served chan error

	mu   sync.Mutex
	hand *proxy.Handover // nil until the controller first answered
}

// NewFollower returns a follower; nothing happens until Start.
func NewFollower(cfg FollowerConfig) *Follower {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	f := &Follower{
		service:    cfg.Service,
		drain:      cfg.DrainTimeout,
		drainDelay: cfg.DrainDelay,
		ready:      cfg.Readiness,
		ln:         cfg.Listener,
		ctl:        &controllerConn{home: cfg.Home, urls: cfg.Controllers},
		rootLog:    log,
		log:        log.With(zap.String("service", cfg.Service)),
		id:         newProxyID(),
		served:     make(chan error, 1),
	}
	f.follow = newFollow(cfg.Service, cfg.Base, cfg.DrainTimeout, f.ctl, f.id, log, f.start)
	f.keys = newKeySync(cfg.Base.Tenancy, f.ctl, f.id, f.log)
	return f
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
		if err := f.follow.watch(loops); err != nil {
			f.served <- err
		}
	}()
	// Managed keys' use is synced until the drain below has ended, and once more after.
	stopTenants := startKeySync(ctx, f.keys)
	defer stopTenants()
	go func() {
		defer wg.Done()
		f.follow.reportLoop(loops)
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

// startKeySync runs k until the returned stop, which waits for its last sync; ctx's values
// only are kept, as the sync outlives the drain.
func startKeySync(ctx context.Context, k *keySync) (stop func()) {
	tenantCtx, stopTenants := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.run(tenantCtx)
	}()
	return func() {
		stopTenants()
		<-done
	}
}

// start serves the first Service on the listener through a Handover, once a sync has brought
// the managed keys (keySync.await); the follow calls it at the controller's first answer.
func (f *Follower) start(svc *proxy.Service, rs ReplicaSet) serving {
	hand := proxy.NewHandover(f.ln, svc, f.log)
	f.mu.Lock()
	f.hand = hand
	f.mu.Unlock()
	go func() {
		// Connections that arrive meanwhile wait in the listener's backlog.
		f.keys.await()
		f.ready.Ready() // not after a drain began: Ready only moves a proxy out of starting
		f.served <- hand.Serve()
	}()
	var replicas []string
	if rs.Seq != 0 {
		for _, b := range rs.Backends {
			replicas = append(replicas, b.Addr)
		}
	}
	f.log.Info("proxy serving", zap.String("endpoint", "http://"+f.ln.Addr().String()),
		zap.String("policy", policyName(rs.Config.Policy)), zap.Bool("auth", rs.Config.AuthRequired),
		zap.Strings("replicas", replicas))
	return hand
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
