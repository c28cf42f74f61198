package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
)

// `ferry proxy --attach SERVICE`: a standalone proxy that follows a service's READY replica set
// from the controller with a long poll, reports its load back, and keeps serving the last set
// it had while the controller is away, finding a restarted one (on a new address) through
// FERRY_HOME.

// Timing of an attached proxy.
const (
	// attachWatchWait is how long one long poll may be held by the controller.
	attachWatchWait = attach.DefaultPollWait
	// attachWatchSlack is added to the poll's own deadline, for a controller that vanished
	// without closing the connection.
	attachWatchSlack = 15 * time.Second
	// attachRetryMin and attachRetryMax bound the backoff between failed polls: a restarted
	// controller is found within about a second.
	attachRetryMin = 100 * time.Millisecond
	attachRetryMax = time.Second
	// attachReportEvery is how often the load report goes out (and right after a new set).
	attachReportEvery = 500 * time.Millisecond
	// attachReportTimeout bounds one report.
	attachReportTimeout = 2 * time.Second
	// attachWarnEvery spaces the warnings while the controller stays unavailable.
	attachWarnEvery = 30 * time.Second
)

// runAttached binds the listeners, then follows the service until ctx ends and drains.
func runAttached(ctx context.Context, opts proxyOptions, log *zap.Logger) error {
	h, err := home.Default()
	if err != nil {
		return err
	}
	ln, adminLn, err := bindProxyListeners(opts)
	if err != nil {
		return err
	}
	return serveAttached(ctx, opts, h, ln, adminLn, log)
}

// serveAttached serves ln for the service opts.attach of the controller of h until ctx ends;
// it accepts nothing before the controller first answered, as until then it knows neither the
// replicas nor whether the service requires an API key. It closes both listeners.
func serveAttached(ctx context.Context, opts proxyOptions, h home.Home, ln, adminLn net.Listener, log *zap.Logger) error {
	base, stopAdmin, err := proxyBaseConfig(opts, adminLn, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopAdmin()
	a := &attachment{
		service: opts.attach,
		base:    base,
		drain:   opts.shutdownTimeout,
		ln:      ln,
		ctl:     &controllerConn{home: h},
		log:     log.With(zap.String("service", opts.attach)),
		id:      newProxyID(),
		served:  make(chan error, 1),
		kick:    make(chan struct{}, 1),
	}
	log.Info("proxy attaching", zap.String("service", opts.attach), zap.String("endpoint", "http://"+ln.Addr().String()),
		zap.String("home", h.Dir), zap.String("proxy_id", a.id))

	loops, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		a.watch(loops)
	}()
	go func() {
		defer wg.Done()
		a.reportLoop(loops)
	}()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-a.served:
	}
	stopLoops()
	wg.Wait()

	hand := a.handover()
	if hand == nil {
		ln.Close()
		return serveErr
	}
	if serveErr != nil {
		return serveErr
	}
	log.Info("shutting down: draining requests in flight", zap.Int64("in_flight", hand.InFlight()), zap.Duration("timeout", opts.shutdownTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := hand.Shutdown(shutdownCtx); err != nil {
		return err
	}
	return <-a.served
}

// attachment is one attached proxy's state.
type attachment struct {
	service string
	base    proxy.ServiceConfig
	drain   time.Duration
	ln      net.Listener
	ctl     *controllerConn
	log     *zap.Logger
	id      string
	// served receives the Handover's Serve result.
	served chan error
	// kick asks the report loop to report now.
	kick chan struct{}

	mu   sync.Mutex
	hand *proxy.Handover // nil until the controller first answered
	// config and seq are what the proxy serves.
	config attach.ProxyConfig
	seq    uint64
	// current are the addresses of the set served; removed those that left it while
	// requests were still in flight there, reported until they are idle.
	current []string
	removed map[string]bool
}

func (a *attachment) handover() *proxy.Handover {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hand
}

// watch long-polls the controller for the service's replica set and applies each new one,
// until ctx ends. When the controller cannot be reached it keeps the set it has and retries,
// re-reading FERRY_HOME for the address of a restarted controller.
func (a *attachment) watch(ctx context.Context) {
	var after uint64
	var backoff time.Duration
	var lastWarn time.Time
	connected := false
	for ctx.Err() == nil {
		wait := attachWatchWait
		if a.handover() == nil {
			wait = 0 // the first answer starts serving, with or without replicas
		}
		rs, addr, err := a.poll(ctx, after, wait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// Whatever went wrong, the next poll asks the controller anew: it may be a new
			// one, with different Seqs.
			a.ctl.forget()
			after = 0
			if connected || time.Since(lastWarn) >= attachWarnEvery {
				a.log.Warn("controller unavailable; serving the last replica set and retrying", zap.Error(err))
				lastWarn = time.Now()
			} else if ce := a.log.Check(zap.DebugLevel, "controller still unavailable"); ce != nil {
				ce.Write(zap.Error(err))
			}
			connected = false
			backoff = min(max(2*backoff, attachRetryMin), attachRetryMax)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		if !connected {
			a.log.Info("connected to the controller", zap.String("controller", addr), zap.Uint64("seq", rs.Seq),
				zap.Int("replicas", len(rs.Backends)))
			connected, lastWarn, backoff = true, time.Time{}, 0
		}
		if err := a.apply(rs); err != nil {
			a.served <- err
			return
		}
		after = rs.Seq
	}
}

// poll is one long poll; it returns the controller's address for logs.
func (a *attachment) poll(ctx context.Context, after uint64, wait time.Duration) (attach.ReplicaSet, string, error) {
	c, addr, err := a.ctl.client()
	if err != nil {
		return attach.ReplicaSet{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, wait+attachWatchSlack)
	defer cancel()
	rs, err := attach.PollReplicaSet(ctx, c, a.service, after, wait)
	return rs, addr, err
}

// apply serves a replica set: the first answer starts the Handover, a new configuration hands
// the listener over to a new Service, and new backends go to every Service. A Seq of 0 (the
// controller has published no set yet) or the Seq already served changes nothing.
func (a *attachment) apply(rs attach.ReplicaSet) error {
	backends := rs.Backends
	addrs := make([]string, len(backends))
	for i, b := range backends {
		addrs[i] = b.Addr
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hand == nil {
		svc, err := proxy.NewService(rs.Config.Apply(a.base))
		if err != nil {
			return fmt.Errorf("the controller's configuration of service %q: %w", a.service, err)
		}
		if rs.Seq != 0 {
			svc.SetBackends(backends)
			a.seq, a.current = rs.Seq, addrs
		}
		a.config = rs.Config
		a.hand = proxy.NewHandover(a.ln, svc, a.log)
		go func() { a.served <- a.hand.Serve() }()
		a.log.Info("proxy serving", zap.String("endpoint", "http://"+a.ln.Addr().String()),
			zap.String("policy", policyName(rs.Config.Policy)), zap.Bool("auth", rs.Config.AuthRequired),
			zap.Strings("replicas", a.current))
		a.kickReport()
		return nil
	}
	if rs.Seq == 0 || rs.Seq == a.seq {
		return nil
	}
	if !reflect.DeepEqual(rs.Config, a.config) {
		svc, err := proxy.NewService(rs.Config.Apply(a.base))
		if err != nil {
			// A configuration this proxy cannot serve (a policy newer than its binary, say):
			// keep the old one rather than stop serving.
			a.log.Error("cannot apply the service's new proxy configuration; keeping the previous one", zap.Error(err))
		} else {
			svc.SetBackends(backends)
			a.hand.Swap(svc, a.drain)
			a.config = rs.Config
			a.log.Info("proxy configuration changed; new connections use it", zap.String("policy", policyName(rs.Config.Policy)),
				zap.Bool("auth", rs.Config.AuthRequired))
		}
	}
	a.hand.SetBackends(backends) // the new Service has them; those draining get them too
	if !slices.Equal(addrs, a.current) {
		if a.removed == nil {
			a.removed = map[string]bool{}
		}
		for _, addr := range a.current {
			if !slices.Contains(addrs, addr) {
				a.removed[addr] = true
			}
		}
		for _, addr := range addrs {
			delete(a.removed, addr)
		}
		a.log.Info("replica set changed", zap.Uint64("seq", rs.Seq), zap.Strings("replicas", addrs), zap.Strings("before", a.current))
	}
	a.seq, a.current = rs.Seq, addrs
	a.kickReport()
	return nil
}

func policyName(p string) string {
	if p == "" {
		return "least_load"
	}
	return p
}

func (a *attachment) kickReport() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// reportLoop sends the load report every attachReportEvery and after each new set, until ctx
// ends. A failed report is dropped: the next one carries the same counters.
func (a *attachment) reportLoop(ctx context.Context) {
	tick := time.NewTicker(attachReportEvery)
	defer tick.Stop()
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-a.kick:
		}
		r, ok := a.loadReport()
		if !ok {
			continue
		}
		c, _, err := a.ctl.client()
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, attachReportTimeout)
			err = attach.ReportLoad(rctx, c, a.service, r)
			cancel()
		}
		switch {
		case err == nil || ctx.Err() != nil:
		case (errors.Is(err, api.ErrInvalid) || errors.Is(err, api.ErrUnauthorized)) && time.Since(lastWarn) >= attachWarnEvery:
			// The controller is there and refuses the report: it will not count this
			// proxy's requests when it drains a replica.
			a.log.Warn("load report rejected by the controller", zap.Error(err))
			lastWarn = time.Now()
		default: // unreachable or the service unknown: the watch loop tells
			if ce := a.log.Check(zap.DebugLevel, "load report failed"); ce != nil {
				ce.Write(zap.Error(err))
			}
		}
	}
}

// loadReport is the report to send now; false before the proxy serves.
func (a *attachment) loadReport() (attach.LoadReport, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hand == nil {
		return attach.LoadReport{}, false
	}
	r := attach.LoadReport{
		ProxyID:  a.id,
		Seq:      a.seq,
		InFlight: make(map[string]int64, len(a.current)+len(a.removed)),
		Arrivals: a.hand.Arrivals(),
		Waiting:  a.hand.Waiting(),
	}
	for _, addr := range a.current {
		r.InFlight[addr] = a.hand.Busy(addr)
	}
	for addr := range a.removed {
		n := a.hand.Busy(addr)
		r.InFlight[addr] = n
		if n == 0 {
			delete(a.removed, addr) // this report tells the controller it is idle here
		}
	}
	return r, true
}

// controllerConn finds the controller through FERRY_HOME: its address in the info file and
// the token beside it, read again after forget (a restarted controller listens elsewhere).
type controllerConn struct {
	home home.Home

	mu   sync.Mutex
	c    *api.Client
	addr string
}

func (cc *controllerConn) client() (*api.Client, string, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.c != nil {
		return cc.c, cc.addr, nil
	}
	info, err := cc.home.ReadInfo()
	if err != nil {
		return nil, "", fmt.Errorf("no controller address in %s: %w", cc.home.InfoPath(), err)
	}
	token, err := cc.home.Token()
	if err != nil {
		return nil, "", err
	}
	cc.c, cc.addr = api.NewClient("http://"+info.Addr, token), info.Addr
	return cc.c, cc.addr, nil
}

// forget makes the next client() read FERRY_HOME again.
func (cc *controllerConn) forget() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.c = nil
}

// newProxyID is random per process, so the controller tells a restarted proxy from the old.
func newProxyID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
