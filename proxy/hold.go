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
// hung up meanwhile (see hold below).
func (s *Service) awaitReplicas(ctx *fasthttp.RequestCtx, snap *snapshot) (*snapshot, []byte) {
	s.coldRequest()
	if s.cfg.MaxQueuedRequests < 0 {
		return nil, s.errs.noReplicas
	}
	if !s.enterWaiting() {
		return nil, s.errs.queueFull
	}
	defer s.leaveWaiting()

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

// enterWaiting counts a request as held (Waiting, the waiting gauge) unless MaxQueuedRequests
// are held already, whatever they wait for; leaveWaiting undoes it.
func (s *Service) enterWaiting() bool {
	if s.waiting.Add(1) > int64(s.cfg.MaxQueuedRequests) {
		s.waiting.Add(-1)
		return false
	}
	s.obs.waitBegin()
	return true
}

func (s *Service) leaveWaiting() {
	s.waiting.Add(-1)
	s.obs.waitEnd()
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

// holdOutcome is how one wait of a held request ended.
type holdOutcome int

const (
	holdWoken holdOutcome = iota
	holdClientGone
	holdExpired
	holdShutdown
)

// hold is the waiting a held request does, whatever it waits for (a first replica, a free
// slot): bounded by MaxQueueWait, ended by the service or server shutting down, and by the
// client hanging up, which the socket is peeked for every clientWatchInterval so that a
// departed client stops counting as demand and holding a place in the queue.
type hold struct {
	s          *Service
	ctx        *fasthttp.RequestCtx
	timer      *time.Timer
	tick       *time.Ticker
	peek       <-chan time.Time
	serverDone <-chan struct{}
	span       holdSpan // tracing.go; nil when the request is not traced
}

func (s *Service) newHold(ctx *fasthttp.RequestCtx) *hold {
	h := &hold{s: s, ctx: ctx, timer: time.NewTimer(s.cfg.MaxQueueWait)}
	if t := s.cfg.Tracing; t != nil {
		h.span = t.startHold(ctx, s)
	}
	// The server's Done closes when it shuts down: a Gateway in front of this service is
	// drained before the service is, and its held requests must not make it wait. A RequestCtx
	// built by hand (a zero value) has no server and no connection: Done would dereference nil.
	if ctx.Conn() != nil {
		h.serverDone = ctx.Done()
		h.tick = time.NewTicker(clientWatchInterval)
		h.peek = h.tick.C
	}
	return h
}

func (h *hold) stop() {
	if h.span != nil {
		h.span.End()
	}
	h.timer.Stop()
	if h.tick != nil {
		h.tick.Stop()
	}
}

// wait returns when ready fires or the hold ends.
func (h *hold) wait(ready <-chan struct{}) holdOutcome {
	for {
		select {
		case <-h.peek:
			if clientGone(h.ctx.Conn()) {
				return holdClientGone
			}
		case <-ready:
			return holdWoken
		case <-h.timer.C:
			return holdExpired
		case <-h.s.stopped:
			return holdShutdown
		case <-h.serverDone:
			return holdShutdown
		}
	}
}
