package attach

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/proxy"
)

// firstSetsWait bounds how long an attached gateway waits, once it has the list, for the first
// replica set of every listed service before it turns ready: a service the controller cannot
// answer for (removed between the list and the poll, say) must not keep the others unserved.
const firstSetsWait = 5 * time.Second

// GatewayFollowerConfig configures a GatewayFollower.
type GatewayFollowerConfig struct {
	// Base is the proxy's own part of every service's configuration (logs, metrics, the
	// client guard, the managed keys in Tenancy): the follower names each service, and
	// ProxyConfig.Apply adds the service's. Its TLS is not used: the gateway terminates TLS
	// (Gateway.TLS).
	Base proxy.ServiceConfig
	// Gateway configures the gateway that serves Listener.
	Gateway proxy.GatewayConfig
	// Listener is where the gateway serves; Start closes it.
	Listener net.Listener
	// Home and Controllers find the controller, as FollowerConfig's.
	Home        home.Home
	Controllers []string
	// DrainTimeout bounds how long requests in flight may finish: under a service's old
	// configuration after a new one took over, in a service the list dropped, and when Start's
	// ctx ends.
	DrainTimeout time.Duration
	// DrainDelay is how long the gateway keeps serving, unready, once Start's ctx ends and
	// before it stops accepting (`ferry proxy --drain-delay`).
	DrainDelay time.Duration
	// Readiness, when set, turns ready once the controller has sent the list of services, the
	// first replica set of each listed service and its replicas their model ids (at most
	// firstSetsWait), and the managed keys (at most 2 s), and draining when Start's ctx ends.
	Readiness *proxy.Readiness
	// Logger may be nil.
	Logger *zap.Logger
}

// GatewayFollower is an attached gateway (`ferry proxy --attach-all`): one endpoint for every
// service of the controller, routed by the request's "model" (proxy.Gateway). It long-polls the
// list of services and follows each listed one as a Follower does (its replica set, its
// configuration, load reports), the service's proxy.Service in the gateway instead of on a
// listener of its own. A service that joins the list joins the gateway at its first replica
// set; one that leaves it leaves the gateway at once (its models get the gateway's
// model-not-found answer) and drains. Managed keys are synced once for every service.
type GatewayFollower struct {
	cfg  GatewayFollowerConfig
	gw   *proxy.Gateway
	ctl  *controllerConn
	keys *keySync
	log  *zap.Logger
	id   string
	// served receives the gateway's Serve result.
	served chan error
	// listed is closed at the first list of services.
	listed     chan struct{}
	listedOnce sync.Once
	// publishMu serialises publish, so the gateway ends with the last state of the slots.
	publishMu sync.Mutex
	// bg counts the followed services' loops and the drains of those dropped.
	bg sync.WaitGroup

	mu       sync.Mutex
	services map[string]*listedService
	// serving says the gateway accepts; stopping that Start's ctx ended (it never will then).
	serving, stopping bool
}

// listedService is one service of the list, as the gateway follows it.
type listedService struct {
	follow *follow
	// stopWatch ends the replica-set watch, which closes watched when it returns; stopReport
	// ends the load reports.
	stopWatch, stopReport context.CancelFunc
	watched               chan struct{}
	// slot is the service's place in the gateway, from its first replica set on; under the
	// GatewayFollower's mu.
	slot *gatewaySlot
}

// NewGatewayFollower returns an attached gateway; nothing happens until Start.
func NewGatewayFollower(cfg GatewayFollowerConfig) *GatewayFollower {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	gcfg := cfg.Gateway
	if gcfg.Logger == nil {
		gcfg.Logger = cfg.Logger.Named("gateway")
	}
	g := &GatewayFollower{
		cfg:      cfg,
		gw:       proxy.NewGateway(gcfg),
		ctl:      &controllerConn{home: cfg.Home, urls: cfg.Controllers},
		log:      cfg.Logger,
		id:       newProxyID(),
		served:   make(chan error, 1),
		listed:   make(chan struct{}),
		services: map[string]*listedService{},
	}
	g.keys = newKeySync(cfg.Base.Tenancy, g.ctl, g.id, g.log)
	return g
}

// Start serves the gateway until ctx ends, then drains requests in flight for up to
// DrainTimeout. It accepts nothing before it is ready (GatewayFollowerConfig.Readiness), as
// until then it does not know which models it serves. It closes the listener.
func (g *GatewayFollower) Start(ctx context.Context) error {
	g.log.Info("gateway attaching to every service", zap.String("endpoint", "http://"+g.cfg.Listener.Addr().String()),
		zap.String("home", g.ctl.home.Dir), zap.String("proxy_id", g.id))
	// The loops outlive ctx by the drain delay: services and replicas that change meanwhile
	// are followed.
	loops, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	stopTenants := startKeySync(ctx, g.keys)
	defer stopTenants()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		g.watchList(loops)
	}()
	go func() {
		defer wg.Done()
		g.serveWhenReady(loops)
	}()
	var serveErr error
	select {
	case <-ctx.Done():
		serveErr = g.announceDrain()
	case serveErr = <-g.served:
	}
	stopLoops()
	wg.Wait()
	g.bg.Wait() // every watch and report has ended; drains of dropped services too
	if !g.isServing() {
		g.cfg.Listener.Close()
		g.closeSlots()
		return serveErr
	}
	if serveErr != nil {
		g.closeSlots()
		return serveErr
	}
	g.log.Info("shutting down: draining requests in flight", zap.Duration("timeout", g.cfg.DrainTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), g.cfg.DrainTimeout)
	defer cancel()
	err := g.gw.Shutdown(shutdownCtx) // its connections, streams included, end first
	g.closeSlots()
	if err != nil {
		return err
	}
	return <-g.served
}

// serveWhenReady starts serving once the list, the first replica set of each listed service
// (bounded) and the managed keys (bounded) are in, unless ctx ends or a drain began first.
func (g *GatewayFollower) serveWhenReady(ctx context.Context) {
	select {
	case <-g.listed:
	case <-ctx.Done():
		return
	}
	g.awaitFirstSets(ctx)
	g.keys.await()
	g.mu.Lock()
	if g.stopping || ctx.Err() != nil {
		g.mu.Unlock()
		return
	}
	g.serving = true
	names := g.namesLocked()
	g.mu.Unlock()
	g.cfg.Readiness.Ready()
	g.log.Info("gateway serving", zap.String("endpoint", "http://"+g.cfg.Listener.Addr().String()), zap.Strings("services", names))
	go func() { g.served <- g.gw.Serve(g.cfg.Listener) }()
}

// awaitFirstSets waits until every service listed now has had the controller's first answer
// and, for a service with replicas, their model ids (the gateway routes by them), at most
// firstSetsWait in all.
func (g *GatewayFollower) awaitFirstSets(ctx context.Context) {
	g.mu.Lock()
	waits := make(map[string]*listedService, len(g.services))
	for name, ls := range g.services {
		waits[name] = ls
	}
	g.mu.Unlock()
	deadline := time.NewTimer(firstSetsWait)
	defer deadline.Stop()
	tick := time.NewTicker(slotDrainPoll)
	defer tick.Stop()
	for name, ls := range waits {
		for !g.routable(ls) {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			case <-deadline.C:
				g.log.Warn("serving before the controller sent a service's replica set, or its replicas their models: they get 404 until then",
					zap.String("service", name), zap.Duration("waited", firstSetsWait))
				return
			}
		}
	}
}

// routable reports whether the gateway can route to ls's models: the controller answered, and
// its replicas, if it has any, have reported their model ids (more than the service's name).
func (g *GatewayFollower) routable(ls *listedService) bool {
	select {
	case <-ls.follow.answered:
	default:
		return false
	}
	g.mu.Lock()
	slot := ls.slot
	g.mu.Unlock()
	if slot == nil { // a configuration the proxy cannot serve: nothing to wait for
		return true
	}
	cur := slot.current()
	return cur == nil || len(cur.Backends()) == 0 || len(cur.Models()) > 1
}

// announceDrain turns the gateway unready and, if it serves, keeps serving for the drain
// delay, closing each client connection after its next response (proxy.Readiness.DrainFor).
func (g *GatewayFollower) announceDrain() error {
	g.mu.Lock()
	g.stopping = true
	serving := g.serving
	g.mu.Unlock()
	if !serving {
		g.cfg.Readiness.Drain()
		return nil
	}
	return g.cfg.Readiness.DrainFor(g.cfg.DrainDelay, g.gw, g.served, g.log)
}

func (g *GatewayFollower) isServing() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.serving
}

// watchList long-polls the controller for the list of services and follows it (sync) until
// ctx ends. When the controller cannot be reached it keeps the services it has and retries.
func (g *GatewayFollower) watchList(ctx context.Context) {
	var after uint64
	retry := pollRetry{log: g.log, lost: "controller unavailable; fronting the last services and retrying"}
	for ctx.Err() == nil {
		list, addr, err := g.pollList(ctx, after)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			g.ctl.forget(err)
			after = 0
			if !retry.failed(ctx, err) {
				return
			}
			continue
		}
		retry.answered(addr, zap.Uint64("seq", list.Seq), zap.Strings("services", list.Services))
		if list.Seq != 0 { // 0: the controller has not restored its services yet
			g.sync(ctx, list.Services)
			g.listedOnce.Do(func() { close(g.listed) })
		}
		after = list.Seq
	}
}

// pollList is one long poll of the list; it returns the controller's address for logs.
func (g *GatewayFollower) pollList(ctx context.Context, after uint64) (ServiceList, string, error) {
	c, addr, err := g.ctl.client()
	if err != nil {
		return ServiceList{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, watchWait+watchSlack)
	defer cancel()
	list, err := PollServices(ctx, c, after, watchWait)
	return list, addr, err
}

// sync follows the services of names that it does not follow yet, and drops those it follows
// that are not in names.
func (g *GatewayFollower) sync(ctx context.Context, names []string) {
	g.mu.Lock()
	var added, gone []string
	for name := range g.services {
		if !slices.Contains(names, name) {
			gone = append(gone, name)
		}
	}
	for _, name := range names {
		if g.services[name] == nil {
			added = append(added, name)
		}
	}
	g.mu.Unlock()
	if len(added)+len(gone) == 0 {
		return
	}
	slices.Sort(gone)
	g.log.Info("services changed", zap.Strings("following", added), zap.Strings("dropping", gone))
	for _, name := range gone {
		g.drop(name)
	}
	for _, name := range added {
		g.add(ctx, name)
	}
}

// add follows a service: its replica-set watch and load reports, until ctx ends or drop.
func (g *GatewayFollower) add(ctx context.Context, name string) {
	base := g.cfg.Base
	base.Name, base.TLS = name, nil
	ls := &listedService{watched: make(chan struct{})}
	ls.follow = newFollow(name, base, g.cfg.DrainTimeout, g.ctl, g.id, g.log, func(first *proxy.Service, rs ReplicaSet) serving {
		return g.join(name, ls, first, rs)
	})
	ls.follow.listed = true
	watchCtx, stopWatch := context.WithCancel(ctx)
	reportCtx, stopReport := context.WithCancel(ctx)
	ls.stopWatch, ls.stopReport = stopWatch, stopReport
	g.mu.Lock()
	g.services[name] = ls
	g.mu.Unlock()
	g.bg.Add(2)
	go func() {
		defer g.bg.Done()
		defer close(ls.watched)
		_ = ls.follow.watch(watchCtx) // a listed service's watch ends only with its ctx
	}()
	go func() {
		defer g.bg.Done()
		ls.follow.reportLoop(reportCtx)
	}()
}

// join puts a service's first Service in the gateway; the follow calls it at the controller's
// first answer.
func (g *GatewayFollower) join(name string, ls *listedService, first *proxy.Service, rs ReplicaSet) serving {
	slot := newGatewaySlot(first, g.publish, g.log)
	g.mu.Lock()
	ls.slot = slot
	g.mu.Unlock()
	g.publish()
	g.log.Info("service joins the gateway", zap.String("service", name), zap.String("policy", policyName(rs.Config.Policy)),
		zap.Bool("auth", rs.Config.AuthRequired), zap.Int("replicas", len(rs.Backends)))
	return slot
}

// drop takes a service out of the gateway at once, and drains it in the background (counted in
// bg), reporting its load until it has drained: the controller stops its replicas only once
// no proxy has requests there.
func (g *GatewayFollower) drop(name string) {
	g.mu.Lock()
	ls := g.services[name]
	delete(g.services, name)
	g.mu.Unlock()
	if ls == nil {
		return
	}
	g.publish() // its models are unknown from now on
	ls.stopWatch()
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		defer ls.stopReport()
		<-ls.watched // no first Service can come after this
		g.mu.Lock()
		slot := ls.slot
		g.mu.Unlock()
		if slot != nil {
			slot.close(g.cfg.DrainTimeout)
			slot.wait()
		}
		g.log.Info("service left the gateway", zap.String("service", name))
	}()
}

// publish gives the gateway the current Service of every slot.
func (g *GatewayFollower) publish() {
	g.publishMu.Lock()
	defer g.publishMu.Unlock()
	g.mu.Lock()
	slots := make([]*gatewaySlot, 0, len(g.services))
	for _, ls := range g.services {
		if ls.slot != nil {
			slots = append(slots, ls.slot)
		}
	}
	g.mu.Unlock()
	svcs := make([]*proxy.Service, 0, len(slots))
	for _, slot := range slots {
		if cur := slot.current(); cur != nil {
			svcs = append(svcs, cur)
		}
	}
	g.gw.SetServices(svcs)
}

// closeSlots drains every service still followed and waits, each within the drain timeout.
func (g *GatewayFollower) closeSlots() {
	g.mu.Lock()
	var slots []*gatewaySlot
	for _, ls := range g.services {
		if ls.slot != nil {
			slots = append(slots, ls.slot)
		}
	}
	g.mu.Unlock()
	for _, slot := range slots {
		slot.close(g.cfg.DrainTimeout)
	}
	for _, slot := range slots {
		slot.wait()
	}
}

// namesLocked are the services followed, sorted; with mu held.
func (g *GatewayFollower) namesLocked() []string {
	names := make([]string, 0, len(g.services))
	for name := range g.services {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
