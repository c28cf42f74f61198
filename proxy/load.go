package proxy

import (
	"slices"
	"time"

	"github.com/ferryserve/ferry/policy"
)

// Load signals for the autoscaler and drain queries for the replica manager. Both poll about
// once a second, so they read what the request path already maintains (atomics, the current
// snapshot) and add nothing to it. See also InFlight, Waiting and Arrivals.

// ReplicaLoad is one replica's load as the proxy sees it.
type ReplicaLoad struct {
	ID   int
	Addr string
	// InFlight counts requests sent to the replica whose response has not finished streaming.
	InFlight int64
	// Waiting, Running and KVCacheUsage are the engine's own view (queued requests, requests
	// in the decode batch, used share of the KV cache from 0 to 1), as last scraped from its
	// /metrics. They are zero when Scraped is false.
	Waiting      float64
	Running      float64
	KVCacheUsage float64
	// Scraped reports a scrape no older than policy.DefaultMetricsStaleAfter: false when the
	// service does not scrape (see ServiceConfig.ScrapeEngineMetrics), before the first scrape,
	// and when the replica's endpoint stopped answering, so that old values never pass for a
	// current load.
	Scraped bool
}

// ReplicaLoad returns the load of each replica of the current snapshot, in the order
// SetBackends received them.
func (s *Service) ReplicaLoad() []ReplicaLoad {
	replicas := s.snap.Load().replicas
	out := make([]ReplicaLoad, len(replicas))
	now := time.Now().UnixNano()
	for i, r := range replicas {
		out[i] = ReplicaLoad{ID: r.ID, Addr: r.Addr, InFlight: r.InFlight.Load()}
		m := r.LoadMetrics()
		if m.UpdatedAt != 0 && now-m.UpdatedAt <= int64(policy.DefaultMetricsStaleAfter) {
			out[i].Waiting, out[i].Running, out[i].KVCacheUsage = float64(m.Waiting), float64(m.Running), m.KVCacheUsage
			out[i].Scraped = true
		}
	}
	return out
}

// Busy returns how many requests are still using the upstream client of replica address addr,
// streams included: those of the current snapshot's client and of clients SetBackends has
// removed but whose streams have not ended. A replica manager scaling down removes the replica
// with SetBackends, then terminates it once Busy reads 0, so no stream is cut.
//
// A request that loaded the snapshot just before the removal counts once it starts its attempt,
// a moment later; a manager that polls Busy on its next pass rather than right after
// SetBackends does not miss it.
func (s *Service) Busy(addr string) int64 {
	n := s.PrefillBusy()[addr] // a prefill replica's steps (pd.go)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.snap.Load().clients {
		if c.addr == addr {
			n += c.active.Load()
		}
	}
	s.pruneDraining()
	for _, c := range s.draining {
		if c.addr == addr {
			n += c.active.Load()
		}
	}
	return n
}

// pruneDraining forgets retired clients whose last request has ended. Called under s.mu.
func (s *Service) pruneDraining() {
	s.draining = slices.DeleteFunc(s.draining, func(c *hostClient) bool { return c.active.Load() == 0 })
}
