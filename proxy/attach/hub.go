package attach

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/proxy"
)

const (
	// reportFresh is how old a proxy's last report may be and still count. Proxies report
	// every 500 ms, so this rides out a few lost reports; a proxy silent for longer is taken
	// as gone, and a replica leaving no longer waits for it.
	reportFresh = 5 * time.Second
	// reportForget is when a silent proxy is dropped altogether (until then its arrival
	// counter is remembered, should it come back).
	reportForget = time.Minute
)

// HubConfig is what a Hub needs from the controller.
type HubConfig struct {
	// Config returns the service's proxy configuration as it is now; every answer to a poll
	// carries it, so a proxy that fetches a Seq gets the configuration of that moment. nil
	// answers the zero ProxyConfig.
	Config func() ProxyConfig
	// OnWaiting is called when a proxy reports requests waiting for a READY replica, so the
	// autoscaler decides now rather than at its next tick, as it does for the controller's own
	// proxy (proxy.ServiceConfig.OnColdRequest). It may be nil.
	OnWaiting func()
	// Stopping ends when the controller stops: then every poll answers at once rather than
	// hold the API server's shutdown for up to MaxPollWait. nil never ends.
	Stopping context.Context
	// Started is when the controller started; see Busy.
	Started time.Time
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Hub is the controller's side of one service's attached proxies: the replica set they long
// poll (a Feed) and what their load reports say, which the replica manager needs before it
// stops a leaving replica and the autoscaler counts as load. It serves the attach routes as
// that service's Service.
type Hub struct {
	cfg  HubConfig
	feed Feed

	mu sync.Mutex
	// firstPublished is when this controller first published a set of the service.
	firstPublished time.Time
	proxies        map[string]*attachedProxy
	// arrivals sums every proxy's arrivals since this controller first heard of it; it never
	// goes down, as the autoscaler takes its rate.
	arrivals uint64
	// prefill is the service's prefill pool (PublishPrefill); nil when not disaggregated.
	prefill []proxy.Backend
}

var _ Service = (*Hub)(nil)

// attachedProxy is the last report of one proxy.
type attachedProxy struct {
	report LoadReport
	at     time.Time
}

// NewHub returns a service's hub; nothing is published until Publish.
func NewHub(cfg HubConfig) *Hub {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Hub{cfg: cfg}
}

// Publish hands attached proxies a new READY set (the one the controller's own proxy got) and
// wakes their long polls.
func (h *Hub) Publish(backends []proxy.Backend) {
	if backends == nil {
		backends = []proxy.Backend{} // an empty set, not Feed's "keep the backends"
	}
	h.mu.Lock()
	if h.firstPublished.IsZero() {
		h.firstPublished = h.cfg.Now()
	}
	h.mu.Unlock()
	h.feed.Publish(backends)
}

// PublishPrefill hands attached proxies a disaggregated service's READY prefill replicas (nil:
// the service is not disaggregated) and wakes their long polls.
func (h *Hub) PublishPrefill(backends []proxy.Backend) {
	h.mu.Lock()
	h.prefill = backends
	h.mu.Unlock()
	if h.feed.Seq() != 0 {
		h.feed.Publish(nil) // a new Seq; Poll answers the prefill pool with it
	}
}

// ConfigChanged tells attached proxies that the service's proxy configuration (policy, API
// keys, limits) may have changed: they fetch it with the next Seq. Call it once Config returns
// the new one. Before the first Publish it does nothing; proxies get the configuration with
// that set.
func (h *Hub) ConfigChanged() {
	if h.feed.Seq() != 0 {
		h.feed.Publish(nil)
	}
}

// Seq is the current set's; 0 before the first Publish.
func (h *Hub) Seq() uint64 { return h.feed.Seq() }

// Poll is a long poll for the service's replica set (Feed.Wait) with its current proxy
// configuration; it answers at once once the controller is stopping.
func (h *Hub) Poll(ctx context.Context, after uint64, wait time.Duration) ReplicaSet {
	if h.cfg.Stopping != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(h.cfg.Stopping, cancel)()
	}
	rs := h.feed.Wait(ctx, after, wait)
	if h.cfg.Config != nil {
		rs.Config = h.cfg.Config()
	}
	rs.Proxies = h.sharing(h.cfg.Now())
	h.mu.Lock()
	rs.Prefill, rs.Disaggregated = h.prefill, h.prefill != nil
	h.mu.Unlock()
	return rs
}

// Report records a proxy's load report; one without a ProxyID is rpc.ErrInvalid.
func (h *Hub) Report(r LoadReport) error {
	if r.ProxyID == "" {
		return fmt.Errorf("proxy load report without a proxy id: %w", rpc.ErrInvalid)
	}
	now := h.cfg.Now()
	before := h.sharing(now)
	h.record(r, now)
	if h.sharing(now) != before && h.feed.Seq() != 0 {
		// Each proxy's share of the replicas' slots changed: tell them now, not at their
		// poll's timeout (up to DefaultPollWait).
		h.feed.Publish(nil)
	}
	if r.Waiting > 0 && h.cfg.OnWaiting != nil {
		h.cfg.OnWaiting()
	}
	return nil
}

// Busy is how many requests attached proxies still send to the replica at addr. It is at
// least 1 while a proxy that reported lately has not applied the current set (it may still
// send new requests to a replica that left it), and during the first reportFresh after the
// controller started and after it first published the service's set: proxies that followed its
// predecessor may not have found it, or that set, yet.
func (h *Hub) Busy(addr string) int64 {
	return h.busy(addr, h.feed.Seq(), h.cfg.Started, h.cfg.Now())
}

// Load sums what attached proxies reported: requests in flight or waiting for a replica in
// the latest fresh reports, and a count of their arrivals that never goes down.
func (h *Hub) Load() (inflight float64, arrivals uint64) {
	return h.load(h.cfg.Now())
}

// PrefillTokens sums the prompt tokens the proxies that reported lately are prefilling.
func (h *Hub) PrefillTokens() int64 {
	now := h.cfg.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, p := range h.proxies {
		if now.Sub(p.at) <= reportFresh {
			n += max(p.report.PrefillTokens, 0)
		}
	}
	return n
}

// record stores a report. A proxy's arrivals count from its first report on; a counter that
// goes down (the same id restarted) counts from zero again.
func (h *Hub) record(r LoadReport, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.proxies == nil {
		h.proxies = map[string]*attachedProxy{}
	}
	r.InFlight, r.PrefillInFlight = maps.Clone(r.InFlight), maps.Clone(r.PrefillInFlight)
	if p, ok := h.proxies[r.ProxyID]; ok {
		if r.Arrivals >= p.report.Arrivals {
			h.arrivals += r.Arrivals - p.report.Arrivals
		} else {
			h.arrivals += r.Arrivals
		}
		p.report, p.at = r, now
	} else {
		// What a proxy counted before this controller heard of it (all of it, after a
		// controller restart) is not load of the last decision interval.
		h.proxies[r.ProxyID] = &attachedProxy{report: r, at: now}
	}
	for id, p := range h.proxies {
		if now.Sub(p.at) > reportForget {
			delete(h.proxies, id)
		}
	}
}

// sharing is how many proxies share the replicas: those with a fresh report, at least 1. It
// travels with every poll answer without moving Seq (a proxy that joins or leaves changes no
// replica set), so proxies take a new share with their next answer, within a long poll.
func (h *Hub) sharing(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.proxies {
		if now.Sub(p.at) <= reportFresh {
			n++
		}
	}
	return max(n, 1)
}

// busy is Busy with the current Seq and the controller's start time passed in.
func (h *Hub) busy(addr string, seq uint64, started, now time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The later of the two; a zero time is before any other.
	if h.firstPublished.After(started) {
		started = h.firstPublished
	}
	var n int64
	lagging := false
	for _, p := range h.proxies {
		if now.Sub(p.at) > reportFresh {
			continue
		}
		n += max(p.report.InFlight[addr], 0) + max(p.report.PrefillInFlight[addr], 0)
		// Not "<": a proxy that followed a controller with a skewed clock may be ahead.
		lagging = lagging || p.report.Seq != seq
	}
	if lagging || (!started.IsZero() && now.Sub(started) < reportFresh) {
		n = max(n, 1)
	}
	return n
}

// load is Load at now.
func (h *Hub) load(now time.Time) (inflight float64, arrivals uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.proxies {
		if now.Sub(p.at) > reportFresh {
			continue
		}
		for _, n := range p.report.InFlight {
			inflight += float64(max(n, 0))
		}
		inflight += float64(max(p.report.Waiting, 0))
	}
	return inflight, h.arrivals
}
