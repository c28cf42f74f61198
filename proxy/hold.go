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
// of the 503 to answer: holding is disabled, too many requests already wait and none could be
// shed, it was shed itself (queue.go), the wait expired, or the service or the server it runs
// in is shutting down. It returns nil, nil when the client hung up meanwhile (see hold below).
// Under late binding the slot queue holds it (awaitSlot), so that the first replica's slots go
// in class and fair-share order; waited then says it was granted one.
func (s *Service) awaitReplicas(ctx *fasthttp.RequestCtx, ex *exchange, snap *snapshot) (_ *snapshot, waited bool, _ []byte) {
	s.coldRequest()
	if s.slots != nil {
		return s.awaitSlot(ctx, ex, snap)
	}
	if s.cfg.MaxQueuedRequests < 0 {
		return nil, false, s.errs.noReplicas
	}
	if !s.enterWaiting(ex) {
		s.obs.shed(ex.class, shedQueueFull)
		return nil, false, s.refuseWaiting(ex, s.errs.queueFull)
	}
	defer s.leaveWaiting(ex)

	w := ex.waiter()
	h := s.newHold(ctx)
	defer h.stop()
	for {
		s.held.join(w)
		outcome := h.wait(snap.ready, w.ch)
		if outcome == holdSignalled || s.held.leave(w) {
			if outcome == holdClientGone {
				return nil, false, nil
			}
			return nil, false, s.shedAnswer(ex)
		}
		switch outcome {
		case holdClientGone:
			return nil, false, nil
		case holdExpired:
			s.obs.shed(ex.class, shedExpired)
			return nil, false, s.refuseWaiting(ex, s.errs.noReplicaTimeout)
		case holdShutdown:
			return nil, false, s.errs.shuttingDown
		}
		// The replicas may have gone again before this request looked: wait on the new
		// empty snapshot's signal.
		if snap = s.snap.Load(); len(snap.replicas) > 0 {
			return snap, false, nil
		}
	}
}

// join puts w in a line that only sheds (Service.held): replicas wake its waiters all at once.
func (l *waitLine) join(w *waiter) {
	l.mu.Lock()
	l.order.push(w)
	l.queued.Add(1)
	l.mu.Unlock()
}

// leave takes w out of a line that only sheds, and reports whether it was shed meanwhile
// (the one wake-up such a line sends, which it drains: the hold did not receive it).
func (l *waitLine) leave(w *waiter) (shed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.queue != nil {
		l.order.remove(w)
		l.queued.Add(-1)
		return false
	}
	<-w.ch // sent under l.mu, before w left the line
	return true
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

// Waiting returns the number of requests currently waiting in the proxy: held for a first
// replica, or queued for a free slot under late binding (slots.go). Together with Arrivals it is
// what an autoscaler reads of a service scaled to zero or saturated: demand the replicas have
// not seen yet.
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
	holdSignalled
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

// wait returns when ready fires (holdWoken), a value comes on signal (holdSignalled), or the
// hold ends; either channel may be nil.
func (h *hold) wait(ready, signal <-chan struct{}) holdOutcome {
	for {
		select {
		case <-h.peek:
			if clientGone(h.ctx.Conn()) {
				return holdClientGone
			}
		case <-ready:
			return holdWoken
		case <-signal:
			return holdSignalled
		case <-h.timer.C:
			return holdExpired
		case <-h.s.stopped:
			return holdShutdown
		case <-h.serverDone:
			return holdShutdown
		}
	}
}
