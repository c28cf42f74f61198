package controller

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/replicas"
)

// Standalone proxies (`ferry proxy --attach`) follow a service's replica set through the
// controller API and report their load back. This file holds the controller's half: the
// service's set for their long polls, and what their reports add to the drain check and to
// the autoscaler's load.

const (
	// reportFresh is how old a proxy's last report may be and still count. Proxies report
	// every 500 ms, so this rides out a few lost reports; a proxy silent for longer is taken
	// as gone, and a replica leaving no longer waits for it.
	reportFresh = 5 * time.Second
	// reportForget is when a silent proxy is dropped altogether (until then its arrival
	// counter is remembered, should it come back).
	reportForget = time.Minute
)

// attachState is one service's state for attached proxies. Its zero value is ready to use.
type attachState struct {
	feed api.ReplicaSetFeed

	mu sync.Mutex
	// firstPublished is when this controller first published a set of the service.
	firstPublished time.Time
	proxies        map[string]*attachedProxy
	// arrivals sums every proxy's arrivals since this controller first heard of it; it never
	// goes down, as the autoscaler takes its rate.
	arrivals uint64
}

// attachedProxy is the last report of one proxy.
type attachedProxy struct {
	report api.ProxyLoadReport
	at     time.Time
}

// published records a new READY set of s for attached proxies and wakes their long polls.
func (c *Controller) published(s *service, eps []replicas.Endpoint) {
	bs := make([]api.AttachedBackend, len(eps))
	for i, e := range eps {
		bs[i] = api.AttachedBackend{ID: e.ReplicaID, Addr: e.Addr, Accelerator: e.Accelerator, Version: e.Version}
	}
	s.attach.mu.Lock()
	if s.attach.firstPublished.IsZero() {
		s.attach.firstPublished = time.Now()
	}
	s.attach.mu.Unlock()
	s.attach.feed.Publish(bs)
}

// configChanged tells attached proxies that the service's proxy configuration (policy, API
// keys, limits) may have changed: they fetch it with the next Seq. Call it after s.task was
// replaced. Before the first published set it does nothing; proxies get the configuration
// with that set.
func (c *Controller) configChanged(s *service) {
	if s.attach.feed.Seq() != 0 {
		s.attach.feed.Publish(nil)
	}
}

// attachedTask is the service's current task; an update may replace it.
func (s *service) attachedTask() *configs.Task {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.task
}

// ReplicaSet implements api.Backend: a long poll for the service's replica set.
func (c *Controller) ReplicaSet(ctx context.Context, name string, after uint64, wait time.Duration) (api.ReplicaSet, error) {
	s, err := c.serviceNamed(name)
	if err != nil {
		return api.ReplicaSet{}, err
	}
	if c.ctx != nil {
		// A stopping controller answers its polls at once rather than hold its API server's
		// shutdown for up to a minute.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(c.ctx, cancel)()
	}
	rs := s.attach.feed.Wait(ctx, after, wait)
	rs.Service = name
	if t := s.attachedTask(); t != nil {
		rs.Config = api.ProxyConfigFor(t.Service)
	}
	return rs, nil
}

// ReportProxyLoad implements api.Backend.
func (c *Controller) ReportProxyLoad(name string, r api.ProxyLoadReport) error {
	if r.ProxyID == "" {
		return fmt.Errorf("proxy load report without a proxy id: %w", api.ErrInvalid)
	}
	s, err := c.serviceNamed(name)
	if err != nil {
		return err
	}
	s.attach.record(r, time.Now())
	if r.Waiting > 0 {
		// A request waits at a proxy for a replica: decide now, as the local proxy's
		// OnColdRequest does, rather than at the next tick.
		s.pokeScaler()
	}
	return nil
}

func (c *Controller) serviceNamed(name string) (*service, error) {
	c.mu.Lock()
	s, ok := c.services[name]
	c.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("service %q: %w", name, api.ErrNotFound)
	}
	return s, nil
}

// busy is how many requests still use the replica at addr, in this process's proxy and in
// every attached proxy. It is at least 1 while a proxy that reported lately has not applied
// the current set (it may still send new requests to a replica that left it), and during the
// first reportFresh after the controller started and after it first published the service's
// set: proxies that followed its predecessor may not have found it, or that set, yet.
func (c *Controller) busy(s *service, addr string) int64 {
	return s.front.Busy(addr) + s.attach.busy(addr, s.attach.feed.Seq(), c.startedAt, time.Now())
}

// remoteLoad sums what attached proxies reported: requests in flight or waiting for a replica
// in the latest fresh reports, and a count of their arrivals that never goes down.
func (c *Controller) remoteLoad(s *service) (inflight float64, arrivals uint64) {
	return s.attach.load(time.Now())
}

// record stores a report. A proxy's arrivals count from its first report on; a counter that
// goes down (the same id restarted) counts from zero again.
func (a *attachState) record(r api.ProxyLoadReport, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proxies == nil {
		a.proxies = map[string]*attachedProxy{}
	}
	r.InFlight = maps.Clone(r.InFlight)
	if p, ok := a.proxies[r.ProxyID]; ok {
		if r.Arrivals >= p.report.Arrivals {
			a.arrivals += r.Arrivals - p.report.Arrivals
		} else {
			a.arrivals += r.Arrivals
		}
		p.report, p.at = r, now
	} else {
		// What a proxy counted before this controller heard of it (all of it, after a
		// controller restart) is not load of the last decision interval.
		a.proxies[r.ProxyID] = &attachedProxy{report: r, at: now}
	}
	for id, p := range a.proxies {
		if now.Sub(p.at) > reportForget {
			delete(a.proxies, id)
		}
	}
}

// busy is the attached proxies' part of controller.busy, with the current Seq and the
// controller's start time passed in.
func (a *attachState) busy(addr string, seq uint64, started, now time.Time) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	// The later of the two; a zero time is before any other.
	if a.firstPublished.After(started) {
		started = a.firstPublished
	}
	var n int64
	lagging := false
	for _, p := range a.proxies {
		if now.Sub(p.at) > reportFresh {
			continue
		}
		n += max(p.report.InFlight[addr], 0)
		// Not "<": a proxy that followed a controller with a skewed clock may be ahead.
		lagging = lagging || p.report.Seq != seq
	}
	if lagging || (!started.IsZero() && now.Sub(started) < reportFresh) {
		n = max(n, 1)
	}
	return n
}

// load is remoteLoad at now.
func (a *attachState) load(now time.Time) (inflight float64, arrivals uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.proxies {
		if now.Sub(p.at) > reportFresh {
			continue
		}
		for _, n := range p.report.InFlight {
			inflight += float64(max(n, 0))
		}
		inflight += float64(max(p.report.Waiting, 0))
	}
	return inflight, a.arrivals
}
