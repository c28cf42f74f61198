package proxy

import (
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Holding requests while a service has no ready replica, as Knative's activator does for a
// revision scaled to zero: the request waits in the proxy until SetBackends publishes a
// replica, then takes the normal path (pick, forward, retries). Without it, the first request
// to a service scaled to zero would be refused, and so would every retry during the minutes a
// cold start takes.
//
// Only the empty-snapshot branch of Handler comes here, so a service with replicas pays
// nothing: no lock, no timer, no allocation.

// coldRequestEvery rate-limits OnColdRequest: one call tells the controller all it needs, and
// a burst of a thousand requests at a cold service must not become a thousand goroutines.
const coldRequestEvery = 100 * time.Millisecond

// readySignal returns the ready channel of next, about to replace old: nil when next has
// replicas, old's channel while the service stays empty (so requests already waiting on it are
// woken by the eventual replica), and a new one when the service has just become empty.
func readySignal(old, next *snapshot) chan struct{} {
	switch {
	case len(next.replicas) > 0:
		return nil
	case len(old.replicas) == 0:
		return old.ready
	default:
		return make(chan struct{})
	}
}

// awaitReplicas holds a request that found snap without replicas until a snapshot with
// replicas is published, and returns it. When it gives up instead it returns nil and the body
// of the 503 to answer: holding is disabled, too many requests already wait, the wait expired,
// or the service or the server it runs in is shutting down. It returns nil, nil when the client
// hung up meanwhile (see hold in slots.go).
func (s *Service) awaitReplicas(ctx *fasthttp.RequestCtx, snap *snapshot) (*snapshot, []byte) {
	s.coldRequest()
	if s.cfg.MaxQueuedRequests < 0 {
		return nil, s.errs.noReplicas
	}
	if s.waiting.Add(1) > int64(s.cfg.MaxQueuedRequests) {
		s.waiting.Add(-1)
		return nil, s.errs.queueFull
	}
	s.obs.waitBegin()
	defer func() {
		s.waiting.Add(-1)
		s.obs.waitEnd()
	}()

	h := s.newHold(ctx)
	defer h.stop()
	for {
		switch h.wait(snap.ready) {
		case holdClientGone:
			return nil, nil
		case holdExpired:
			return nil, s.errs.noReplicaTimeout
		case holdShutdown:
			return nil, s.errs.shuttingDown
		}
		// The replicas may have gone again before this request looked: wait on the new
		// empty snapshot's signal.
		if snap = s.snap.Load(); len(snap.replicas) > 0 {
			return snap, nil
		}
	}
}

// coldRequest calls OnColdRequest, at most once per coldRequestEvery.
func (s *Service) coldRequest() {
	hook := s.cfg.OnColdRequest
	if hook == nil {
		return
	}
	now := time.Now().UnixNano()
	last := s.lastCold.Load()
	if now-last < int64(coldRequestEvery) || !s.lastCold.CompareAndSwap(last, now) {
		return
	}
	// Its own goroutine: the hook is the controller's code, and whatever it does (a channel
	// send that blocks, a lock held elsewhere) must not hold up the request or the handler's
	// goroutine. A panic in it is logged, not allowed to kill the process.
	go func() {
		defer func() {
			if v := recover(); v != nil {
				s.log.Error("panic in OnColdRequest", zap.Any("panic", v), zap.Stack("stack"))
			}
		}()
		hook()
	}()
}

// Waiting returns the number of requests currently held for a replica. Together with
// Arrivals it is what an autoscaler reads of a service scaled to zero: demand the replicas
// have not seen yet.
func (s *Service) Waiting() int64 { return s.waiting.Load() }

// Arrivals returns how many requests have reached the routing stage since the service
// started: every request that passed the API-key, body-size and JSON checks, including those
// then held, refused for want of a replica, or shed by MaxConcurrentRequests. It is a counter,
// so an autoscaler takes the rate between two reads; it costs the request path one atomic add.
func (s *Service) Arrivals() uint64 { return s.arrivals.Load() }
