package proxy

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/tenants"
)

// Late binding. A request that finds every replica at its cap of requests in flight waits in
// the proxy, by class and then by tenant in turns (queue.go), and goes to whichever replica
// frees a slot first. An
// engine such as vLLM queues what exceeds its batch (max_num_seqs) itself, but a request queued
// there is committed to that replica: it waits for one of that replica's sequences to end,
// perhaps a long generation, while another replica frees a slot sooner. Holding it here makes
// one queue served by every replica instead of one queue per replica, which is what shortens
// the TTFT tail under bursts (bench/routing: docs/measurements.md, "Late binding"). Knative's
// activator does the same for containerConcurrency.
//
// The cap is MaxInFlightPerReplica when set. By default it is each replica's batch size as
// learned from its engine metrics (learnedCap, scrape.go), and a replica whose
// size is not known yet has no cap. A learned cap only ever delays a request: when holding is
// off, the queue is full or the wait expires, the request is sent on as it would be without a
// cap, to be queued by the engine; but a batch request is refused with 503, as it is shed
// first. A configured cap refuses every class with 503 instead.
//
// The cap is per proxy: standalone proxies attached to one service each enforce it on the
// requests they send. Within a proxy it is exact for requests that take their slot under the
// line's lock (a tenant's, and any that found others waiting): the slot stays reserved until the
// request counts in its replica's InFlight. A request without a tenant that finds nobody waiting
// takes its slot without the lock, so two of those arriving at the same instant can each take
// the last slot. It keeps work out of the engines' queues; the engines still enforce their
// batch size.
//
// A service with the cap turned off has no slotQueue and pays one nil check. With it, a
// request that finds a free replica and nobody waiting pays one or two atomic loads per
// replica and no lock; the lock is taken only while requests wait.
type slotQueue struct {
	// limit is the configured cap; 0 means each replica's learned batch size. shares (≥ 1)
	// divides either among the proxies that share the replicas.
	limit  int64
	shares int64
	// line holds the requests waiting for a slot, in class and fair-share order (queue.go,
	// fairqueue.go), with the lock taken only while requests wait and the count (queued) that
	// releasers read without it. Each waiter's channel has room for the one grant it will
	// receive.
	line waitLine
}

// learnedCap is what late binding learns about one replica: its batch size, and when it may next
// be probed beyond it. It belongs to one policy.Replica (a relabelled replica starts over), is
// written by that replica's scraper alone and read by the request path; pickers never read it,
// so it lives here rather than in policy.Replica.
type learnedCap struct {
	// size is the largest decode batch the replica was seen running once it had been seen
	// full: its engine's max_num_seqs, or what its KV cache holds. Zero until the scraper has
	// seen the replica saturated.
	size atomic.Int64
	// probeAfter is when, in unix nanoseconds, the replica may next take one request beyond
	// size, to find out whether it was learned too low. The scraper backs probes off while they
	// keep finding the engine full.
	probeAfter atomic.Int64
}

// raise records that the replica was seen running n requests at once (while others waited, or
// beyond the size learned so far), and reports whether that raised the learned size. The size
// only grows: an engine never runs more than its batch, so the largest such count is the batch
// size, and a smaller one (a KV cache briefly full) is not a limit to keep.
func (c *learnedCap) raise(n int64) bool {
	if n <= c.size.Load() {
		return false
	}
	c.size.Store(n)
	return true
}

// newSlotQueue returns the queue for MaxInFlightPerReplica = limit: nil (no cap) when
// negative, learned caps when zero.
func newSlotQueue(limit, shares int) *slotQueue {
	if limit < 0 {
		return nil
	}
	shares = max(shares, 1)
	if limit > 0 {
		limit = max(limit/shares, 1)
	}
	return &slotQueue{limit: int64(limit), shares: int64(shares)}
}

// learned reports whether the caps are the replicas' learned batch sizes, which never refuse a
// request.
func (q *slotQueue) learned() bool { return q.limit == 0 }

// free returns how many more requests r, whose learned cap is learned, can take under its cap;
// noCap when it has none.
//
// A learned cap may be too low: learned from a moment when the KV cache, not the batch, was
// full, or from a long prefill step that kept a request waiting. Since the proxy then never
// sends more, the engine would never show a bigger batch. So now and then (probeAfter, set by
// the scraper) a replica at its cap whose engine reported an empty queue at its last fresh
// scrape takes one request beyond it: if the engine runs it, the next scrape sees more running
// than the cap, the cap grows and the next probe may follow at once; if the engine is full
// after all, that one request waits there, and probes back off (scrape.go).
func (q *slotQueue) free(r *policy.Replica, learned *learnedCap) int64 {
	if q.limit > 0 {
		return q.limit - r.InFlight.Load()
	}
	limit := learned.size.Load()
	if limit == 0 {
		return noCap
	}
	limit = (limit + q.shares - 1) / q.shares
	n := r.InFlight.Load()
	if n >= limit && mayProbe(r, learned) {
		limit++
	}
	return limit - n
}

// mayProbe reports whether r's probe time has come and its last scrape, if fresh, found no
// request waiting in the engine.
func mayProbe(r *policy.Replica, learned *learnedCap) bool {
	now := time.Now().UnixNano()
	if now < learned.probeAfter.Load() {
		return false
	}
	m := r.LoadMetrics()
	return m.Waiting == 0 && now-m.UpdatedAt < int64(policy.DefaultMetricsStaleAfter)
}

// noCap is free's answer for a replica without a cap: more than any queue holds.
const noCap = math.MaxInt32

// freeSlots returns how many more requests the replicas of snap's pick set can take, counting
// at most max.
func (q *slotQueue) freeSlots(snap *snapshot, max int) int {
	n := 0
	for i, r := range snap.pick {
		if free := q.free(r, snap.pickCaps[i]); free > 0 {
			n += int(min(free, noCap))
			if n >= max {
				return max
			}
		}
	}
	return n
}

// grant hands free slots of s's current snapshot to the waiters first in line (fairQueue.pop:
// by class, then tenants in turns), as many as there are free slots. A request ending calls it,
// and so does every new snapshot (a replica joined or came back from ejection). A granted waiter
// is out of the queue; if a newcomer took the slot before it looked, it queues again at the head
// of its tenant's line.
func (q *slotQueue) grant(s *Service) {
	l := &q.line
	if l.queued.Load() == 0 {
		return
	}
	l.mu.Lock()
	snap := s.snap.Load()
	granted := int(l.granted.Load())
	free := max(q.freeSlots(snap, l.order.len()+granted)-granted, 0)
	now := time.Now().UnixNano()
	n := 0
	for ; n < free; n++ {
		w := l.order.popEligible(func(tenant string) bool { return q.mayTake(tenant, snap, now) })
		if w == nil { // the waiters' tenants keep headroom for others
			break
		}
		q.took(w.tenant)
		w.ch <- struct{}{}
	}
	if n > 0 {
		l.granted.Add(int64(n))
		l.queued.Add(-int64(n))
		l.drain.add(now, n)
	}
	l.mu.Unlock()
}

// taken ends a granted waiter's reservation (it began on a replica, or gave up: then its slot
// goes to the next in line).
func (q *slotQueue) taken(s *Service, ex *exchange, passOn bool) {
	if !ex.slotReserved {
		return
	}
	ex.slotReserved = false
	q.line.granted.Add(-1)
	if passOn {
		q.grant(s)
	}
}

// enqueue adds a waiter at its place in line, asking at now. It returns false, enqueuing
// nothing, when a slot is free (not granted to a waiter yet to take it) and nobody waits ahead.
func (q *slotQueue) enqueue(w *waiter, s *Service, now int64) bool {
	l := &q.line
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queued.Add(1)
	if (l.order.len() == 0 || w.tenant != "") && q.tryTake(w.tenant, s.snap.Load(), now) {
		l.queued.Add(-1)
		return false
	}
	l.order.push(w)
	return true
}

// takeFree is enqueue's first step alone, for a tenant's request that finds no line: it takes a
// free slot of snap at once, and counts it for the tenant, when the tenant may take one. It does
// not join the line's count (queued), so it costs one lock and no wait bookkeeping; when it
// fails the request goes on to enqueue, which orders itself against releasers. The slot is
// reserved as a grant is (tryTake).
func (q *slotQueue) takeFree(tenant string, snap *snapshot, now int64) bool {
	l := &q.line
	l.mu.Lock()
	defer l.mu.Unlock()
	return q.tryTake(tenant, snap, now)
}

// tryTake notes the tenant's ask and takes a slot of snap for it when one is free and the
// tenant may take it; l.mu is held. A tenant's request may pass waiters whose tenants keep
// headroom: there is a free slot while they wait only because they may not take it (grant gives
// free slots at once).
//
// The slot it takes is reserved, counted in granted as a waiter's grant is, until the request
// begins on a replica and counts in its InFlight (taken): without that the next request under
// the lock would still see the slot free and take it too. The caller sets ex.slotReserved.
func (q *slotQueue) tryTake(tenant string, snap *snapshot, now int64) bool {
	q.line.tenants.note(tenant, now)
	if granted := int(q.line.granted.Load()); q.freeSlots(snap, granted+1) > granted && q.mayTake(tenant, snap, now) {
		q.took(tenant)
		q.line.granted.Add(1)
		return true
	}
	return false
}

// leave takes a waiter that gives up out of the queue. A grant that reached it meanwhile is
// passed on, so that the slot is not left idle while others wait; a waiter shed meanwhile
// (w.shed, readable once leave returns) had no slot to pass on.
func (q *slotQueue) leave(w *waiter, s *Service) {
	l := &q.line
	l.mu.Lock()
	if w.queue != nil {
		l.order.remove(w)
		l.queued.Add(-1)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	select {
	case <-w.ch:
		if !w.shed { // granted meanwhile: its slot goes to the next in line
			q.line.granted.Add(-1)
			q.grant(s)
		}
	default:
	}
}

// awaitSlot returns a snapshot with a replica below its cap, at once when there is one and
// nobody waits, or after waiting in line for one; waited says a slot is reserved for it (tryTake).
// It holds a request for a first replica too (awaitReplicas), so that the first replica's slots
// go in the same order. Under learned caps, a request that cannot wait (holding off, queue full,
// wait expired) gets the current snapshot anyway, and the picker's choice among full replicas,
// unless it is a batch request or there is no replica. Otherwise it is refused: it returns nil
// and the body of the 503 to answer, and ex.retryAfter. It returns nil and the shutdown answer
// when the service or server is shutting down, and nil, nil when the client hung up while
// waiting. Waiting requests count in Waiting, as demand the replicas have not seen, and share
// MaxQueuedRequests and MaxQueueWait with requests held for a first replica.
func (s *Service) awaitSlot(ctx *fasthttp.RequestCtx, ex *exchange, snap *snapshot) (_ *snapshot, waited bool, _ []byte) {
	q := s.slots
	arrived := ctx.Time() // headroom's window is 30 s: the request's arrival will do
	if arrived.IsZero() { // a RequestCtx not from a fasthttp.Server
		arrived = time.Now()
	}
	now := arrived.UnixNano()
	if len(snap.replicas) > 0 {
		if ex.tenant == "" && q.line.queued.Load() == 0 && q.line.granted.Load() == 0 && q.freeSlots(snap, 1) > 0 {
			return snap, false, nil
		}
		if ex.tenant != "" && q.takeFree(ex.tenant, snap, now) {
			ex.slotReserved, ex.slotHeld = true, true
			return snap, true, nil
		}
	}
	if s.cfg.MaxQueuedRequests < 0 {
		snap, refusal := s.noSlot(ex, snap, noShed, s.errs.noReplicas, s.errs.slotsBusy)
		return snap, false, refusal
	}
	if !s.enterWaiting(ex) {
		snap, refusal := s.noSlot(ex, snap, shedQueueFull, s.errs.queueFull, s.errs.slotsQueueFull)
		return snap, false, refusal
	}
	defer s.leaveWaiting(ex)

	w := ex.waiter()
	if !q.enqueue(w, s, now) {
		ex.slotReserved, ex.slotHeld = true, w.tenant != ""
		return s.snap.Load(), true, nil
	}
	defer s.obs.queueEnd(s.obs.queueBegin())
	h := s.newHold(ctx)
	defer h.stop()
	for {
		switch h.wait(nil, w.ch) {
		case holdSignalled:
			if w.shed {
				return nil, false, s.shedAnswer(ex)
			}
			// Granted: the slot is held for it until it begins on a replica (tryReplica) or
			// gives up (releaseExchange), so nobody arriving meanwhile can take it.
			ex.slotReserved, ex.slotHeld = true, w.tenant != ""
			return s.snap.Load(), true, nil
		case holdClientGone:
			q.leave(w, s)
			return nil, false, nil
		case holdExpired:
			if q.leave(w, s); w.shed {
				return nil, false, s.shedAnswer(ex)
			}
			snap, refusal := s.noSlot(ex, s.snap.Load(), shedExpired, s.errs.noReplicaTimeout, s.errs.slotsTimeout)
			return snap, false, refusal
		case holdShutdown:
			q.leave(w, s)
			return nil, false, s.errs.shuttingDown
		}
	}
}

// noSlot is awaitSlot's answer to a request that cannot wait for a slot: sent on anyway under
// learned caps, unless it is a batch request; refused under a configured cap, with cold when
// there is no replica at all and busy otherwise. reason is what ferry_requests_shed_total counts
// a refusal as; noShed for a request that never asked to wait (holding off).
func (s *Service) noSlot(ex *exchange, snap *snapshot, reason int, cold, busy []byte) (*snapshot, []byte) {
	refusal := busy
	if len(snap.replicas) == 0 {
		refusal = cold
	} else if s.slots.learned() && ex.class > tenants.PriorityBatch {
		return snap, nil
	}
	if reason != noShed {
		s.obs.shed(ex.class, reason)
	}
	return nil, s.refuseWaiting(ex, refusal)
}
