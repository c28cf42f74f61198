package attach

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/proxy"
)

// serving is where a followed service's proxy.Service takes requests: a Handover on the
// proxy's own listener (Follower), or the service's slot in a gateway (GatewayFollower,
// gatewaySlot). Both keep a Service that a new configuration replaced until it has drained,
// and count its load with the current one's, so the load report covers both. It is the part
// of proxy.Handover's methods a follow uses.
type serving interface {
	// Swap makes next the Service requests go to and drains the current one within
	// drainTimeout.
	Swap(next *proxy.Service, drainTimeout time.Duration)
	// SetBackends and SetPrefillBackends reach the current Service and those draining.
	SetBackends(bs []proxy.Backend)
	SetPrefillBackends(bs []proxy.Backend) error
	// Busy, Arrivals, Waiting, PrefillTokens and PrefillBusy are the load report's, summed
	// over the current Service and those draining (Arrivals over every Service it had).
	Busy(addr string) int64
	Arrivals() uint64
	Waiting() int64
	PrefillTokens() int64
	PrefillBusy() map[string]int64
}

var _ serving = (*proxy.Handover)(nil)

// follow is one service as an attached proxy follows it: the long poll of its replica set,
// applied to a serving, and the load reports back. A Follower runs one, on its listener; a
// GatewayFollower one per listed service, in its gateway.
type follow struct {
	service string
	base    proxy.ServiceConfig
	drain   time.Duration
	ctl     *controllerConn
	log     *zap.Logger
	id      string
	// start serves the first Service, made at the controller's first answer; it returns where
	// the follow puts later ones. It runs with mu held.
	start func(first *proxy.Service, rs ReplicaSet) serving
	// listed says the service is one of a gateway's list: a configuration the proxy cannot
	// serve at first leaves the service out of the gateway, rather than stop the proxy, and a
	// 404 means the service was removed (the list will say so), not that the controller moved.
	listed bool
	// kick asks the report loop to report now.
	kick chan struct{}
	// answered is closed at the controller's first answer, served or not.
	answered     chan struct{}
	answeredOnce sync.Once

	mu    sync.Mutex
	front serving // nil until the controller first answered
	// config, shares and seq are what the proxy serves.
	config ProxyConfig
	shares int
	seq    uint64
	// current are the addresses of the set served; removed those that left it while
	// requests were still in flight there, reported until they are idle.
	current []string
	removed map[string]bool
}

// newFollow returns a follow of service; nothing happens until watch and reportLoop run.
func newFollow(service string, base proxy.ServiceConfig, drain time.Duration, ctl *controllerConn, id string, log *zap.Logger,
	start func(*proxy.Service, ReplicaSet) serving) *follow {
	return &follow{service: service, base: base, drain: drain, ctl: ctl, id: id, log: log.With(zap.String("service", service)),
		start: start, kick: make(chan struct{}, 1), answered: make(chan struct{})}
}

// serving returns where the service takes requests; nil before the controller first answered.
func (w *follow) serving() serving {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.front
}

// watch long-polls the controller for the service's replica set and applies each new one,
// until ctx ends (nil) or a first configuration cannot be served (its error; for a listed
// service it is logged and the next Seq tried). When the controller cannot be reached it keeps
// the set it has and retries, re-reading FERRY_HOME for the address of a restarted controller.
func (w *follow) watch(ctx context.Context) error {
	var after uint64
	retry := pollRetry{log: w.log, lost: "controller unavailable; serving the last replica set and retrying"}
	for ctx.Err() == nil {
		wait := watchWait
		if after == 0 && w.serving() == nil {
			wait = 0 // the first answer starts serving, with or without replicas
		}
		rs, addr, err := w.poll(ctx, after, wait)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !w.listed || !errors.Is(err, rpc.ErrNotFound) {
				// Whatever went wrong, the next poll asks the controller anew: it may be a
				// new one, with different Seqs.
				w.ctl.forget(err)
			}
			after = 0
			if !retry.failed(ctx, err) {
				return nil
			}
			continue
		}
		retry.answered(addr, zap.Uint64("seq", rs.Seq), zap.Int("replicas", len(rs.Backends)))
		err = w.apply(rs)
		w.answeredOnce.Do(func() { close(w.answered) })
		if err != nil && !w.listed {
			return err
		}
		if err != nil {
			w.log.Error("cannot serve the service's proxy configuration; leaving it out of the gateway until it changes", zap.Error(err))
		}
		after = rs.Seq
	}
	return nil
}

// pollRetry paces a long poll that failed and says so: a warning when the controller is lost
// and every warnEvery while it stays away, a line when it answers again; between tries a
// backoff from retryMin doubling to retryMax.
type pollRetry struct {
	log *zap.Logger
	// lost is the warning's message.
	lost      string
	backoff   time.Duration
	lastWarn  time.Time
	connected bool
}

// failed logs err and waits out the backoff; false when ctx ended first.
func (p *pollRetry) failed(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if p.connected || time.Since(p.lastWarn) >= warnEvery {
		p.log.Warn(p.lost, zap.Error(err))
		p.lastWarn = time.Now()
	} else if ce := p.log.Check(zap.DebugLevel, "controller still unavailable"); ce != nil {
		ce.Write(zap.Error(err))
	}
	p.connected = false
	p.backoff = min(max(2*p.backoff, retryMin), retryMax)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(p.backoff):
		return true
	}
}

// answered notes an answer from the controller at addr, logged with fields when it was lost.
func (p *pollRetry) answered(addr string, fields ...zap.Field) {
	if !p.connected {
		p.log.Info("connected to the controller", append([]zap.Field{zap.String("controller", addr)}, fields...)...)
		p.connected, p.lastWarn, p.backoff = true, time.Time{}, 0
	}
}

// poll is one long poll; it returns the controller's address for logs.
func (w *follow) poll(ctx context.Context, after uint64, wait time.Duration) (ReplicaSet, string, error) {
	c, addr, err := w.ctl.client()
	if err != nil {
		return ReplicaSet{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, wait+watchSlack)
	defer cancel()
	rs, err := PollReplicaSet(ctx, c, w.service, after, wait)
	return rs, addr, err
}

// apply serves a replica set: the first answer starts serving (start), a new configuration
// swaps in a new Service, and new backends go to every Service. A Seq of 0 (the controller has
// published no set yet) or the Seq already served changes nothing.
func (w *follow) apply(rs ReplicaSet) error {
	backends := rs.Backends
	addrs := make([]string, len(backends))
	for i, b := range backends {
		addrs[i] = b.Addr
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.front == nil {
		svc, err := proxy.NewService(w.serviceConfig(rs))
		if err != nil {
			return fmt.Errorf("the controller's configuration of service %q: %w", w.service, err)
		}
		if rs.Seq != 0 {
			svc.SetBackends(backends)
			w.setPrefill(svc.SetPrefillBackends, rs)
			w.seq, w.current = rs.Seq, addrs
		}
		w.config, w.shares = rs.Config, rs.Proxies
		w.front = w.start(svc, rs)
		w.kickReport()
		return nil
	}
	if rs.Seq == 0 || rs.Seq == w.seq && rs.Proxies == w.shares {
		return nil
	}
	if !reflect.DeepEqual(rs.Config, w.config) || rs.Proxies != w.shares {
		w.reconfigure(rs)
	}
	w.front.SetBackends(backends) // the new Service has them; those draining get them too
	w.setPrefill(w.front.SetPrefillBackends, rs)
	if !slices.Equal(addrs, w.current) {
		if w.removed == nil {
			w.removed = map[string]bool{}
		}
		for _, addr := range w.current {
			if !slices.Contains(addrs, addr) {
				w.removed[addr] = true
			}
		}
		for _, addr := range addrs {
			delete(w.removed, addr)
		}
		w.log.Info("replica set changed", zap.Uint64("seq", rs.Seq), zap.Strings("replicas", addrs), zap.Strings("before", w.current))
	}
	w.seq, w.current = rs.Seq, addrs
	w.kickReport()
	return nil
}

// reconfigure swaps in a Service of rs's configuration; with mu held.
func (w *follow) reconfigure(rs ReplicaSet) {
	svc, err := proxy.NewService(w.serviceConfig(rs))
	if err != nil {
		// A configuration this proxy cannot serve (a policy newer than its binary, say):
		// keep the old one rather than stop serving.
		w.log.Error("cannot apply the service's new proxy configuration; keeping the previous one", zap.Error(err))
		return
	}
	svc.SetBackends(rs.Backends)
	w.setPrefill(svc.SetPrefillBackends, rs)
	w.front.Swap(svc, w.drain)
	w.config, w.shares = rs.Config, rs.Proxies
	msg := "proxy configuration changed; new connections use it"
	if w.listed {
		msg = "proxy configuration changed; new requests use it" // a gateway's connections are its own
	}
	w.log.Info(msg, zap.String("policy", policyName(rs.Config.Policy)),
		zap.Bool("auth", rs.Config.AuthRequired), zap.Int("proxies_sharing_replicas", rs.Proxies))
}

// serviceConfig is the proxy configuration of rs: the service's, with this proxy's share of
// each replica.
func (w *follow) serviceConfig(rs ReplicaSet) proxy.ServiceConfig {
	cfg := rs.Config.Apply(w.base)
	cfg.ReplicaShares = rs.Proxies
	return cfg
}

func policyName(p string) string {
	if p == "" {
		return proxy.DefaultPolicy
	}
	return p
}

func (w *follow) kickReport() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// reportLoop sends the load report every reportEvery and after each new set, until ctx
// ends. A failed report is dropped: the next one carries the same counters.
func (w *follow) reportLoop(ctx context.Context) {
	tick := time.NewTicker(reportEvery)
	defer tick.Stop()
	var lastWarn time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-w.kick:
		}
		r, ok := w.loadReport()
		if !ok {
			continue
		}
		c, _, err := w.ctl.client()
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, reportTimeout)
			err = ReportLoad(rctx, c, w.service, r)
			cancel()
		}
		switch {
		case err == nil || ctx.Err() != nil:
		case (errors.Is(err, rpc.ErrInvalid) || errors.Is(err, rpc.ErrUnauthorized) || errors.Is(err, rpc.ErrForbidden)) && time.Since(lastWarn) >= warnEvery:
			// The controller is there and refuses the report: it will not count this
			// proxy's requests when it drains a replica.
			w.log.Warn("load report rejected by the controller", zap.Error(err))
			lastWarn = time.Now()
		default: // unreachable or the service unknown: the watch loop tells
			if ce := w.log.Check(zap.DebugLevel, "load report failed"); ce != nil {
				ce.Write(zap.Error(err))
			}
		}
	}
}

// loadReport is the report to send now; false before the proxy serves.
func (w *follow) loadReport() (LoadReport, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.front == nil {
		return LoadReport{}, false
	}
	r := LoadReport{
		ProxyID:  w.id,
		Seq:      w.seq,
		InFlight: make(map[string]int64, len(w.current)+len(w.removed)),
		Arrivals: w.front.Arrivals(),
		Waiting:  w.front.Waiting(),

		PrefillTokens:   w.front.PrefillTokens(),
		PrefillInFlight: w.front.PrefillBusy(),
	}
	for _, addr := range w.current {
		r.InFlight[addr] = w.front.Busy(addr)
	}
	for addr := range w.removed {
		n := w.front.Busy(addr)
		r.InFlight[addr] = n
		if n == 0 {
			delete(w.removed, addr) // this report tells the controller it is idle here
		}
	}
	return r, true
}

// setPrefill applies a set's prefill pool with set; a replica address the proxy cannot use
// leaves the pool as it was, and is logged.
func (w *follow) setPrefill(set func([]proxy.Backend) error, rs ReplicaSet) {
	var prefill []proxy.Backend // not disaggregated
	if rs.Disaggregated {
		prefill = append([]proxy.Backend{}, rs.Prefill...)
	}
	if err := set(prefill); err != nil {
		w.log.Error("cannot apply the service's prefill pool; keeping the previous one", zap.Error(err))
	}
}
