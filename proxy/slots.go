package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/policy"
)

// Late binding. With MaxInFlightPerReplica set, a request that finds every replica with that
// many requests in flight waits in the proxy, first come first served, and goes to whichever
// replica frees a slot first. An engine such as vLLM queues what exceeds its batch
// (max_num_seqs) itself, but a request queued there is committed to that replica: it waits for
// one of that replica's sequences to end, perhaps a long generation, while another replica
// frees a slot sooner. Holding it here makes one queue served by every replica instead of one
// queue per replica, which is what shortens the TTFT tail under bursts (bench/routing: see the
// README). Knative's activator does the same for containerConcurrency.
//
// The cap is per proxy: standalone proxies attached to one service each enforce it on the
// requests they send.
//
// A service without the cap has no slotQueue and pays one nil check. With it, a request that
// finds a free replica and nobody waiting pays one atomic load per replica and no lock; the
// lock is taken only while requests wait.
type slotQueue struct {
	limit int64
	// queued counts waiters in list. It is raised before a waiter checks for a free slot and
	// read by releasers after they free one, so that one of the two always sees the other
	// (Go's atomics are sequentially consistent): no wake-up is lost.
	queued atomic.Int64
	mu     sync.Mutex
	list   []chan struct{} // FIFO; each channel has room for the one grant it will receive
}

func newSlotQueue(limit int) *slotQueue {
	if limit <= 0 {
		return nil
	}
	return &slotQueue{limit: int64(limit)}
}

// freeSlots returns how many more requests the replicas of pick can take, counting at most
// max.
func (q *slotQueue) freeSlots(pick []*policy.Replica, max int) int {
	n := 0
	for _, r := range pick {
		if free := q.limit - r.InFlight.Load(); free > 0 {
			n += int(free)
			if n >= max {
				return max
			}
		}
	}
	return n
}

// grant hands free slots of s's current snapshot to the oldest waiters, as many as there are free slots. A
// request ending calls it, and so does every new snapshot (a replica joined or came back from
// ejection). A granted waiter is out of the list; if a newcomer took the slot before it
// looked, it queues again at the head.
func (q *slotQueue) grant(s *Service) {
	if q.queued.Load() == 0 {
		return
	}
	q.mu.Lock()
	n := q.freeSlots(s.snap.Load().pick, len(q.list))
	for i := range n {
		q.list[i] <- struct{}{}
	}
	if n > 0 {
		clear(q.list[:n])
		q.list = q.list[n:]
		q.queued.Add(-int64(n))
	}
	q.mu.Unlock()
}

// enqueue adds a waiter at the tail, or at the head when it was granted a slot someone else
// took. It returns false, enqueuing nothing, when a slot is free and nobody waits ahead.
func (q *slotQueue) enqueue(w chan struct{}, s *Service, head bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queued.Add(1)
	if (head || len(q.list) == 0) && q.freeSlots(s.snap.Load().pick, 1) > 0 {
		q.queued.Add(-1)
		return false
	}
	if head {
		q.list = append(q.list, nil)
		copy(q.list[1:], q.list)
		q.list[0] = w
	} else {
		q.list = append(q.list, w)
	}
	return true
}

// leave takes a waiter that gives up out of the list. A grant that reached it meanwhile is
// passed on, so that the slot is not left idle while others wait.
func (q *slotQueue) leave(w chan struct{}, s *Service) {
	q.mu.Lock()
	for i, c := range q.list {
		if c == w {
			q.list = append(q.list[:i], q.list[i+1:]...)
			q.queued.Add(-1)
			q.mu.Unlock()
			return
		}
	}
	q.mu.Unlock()
	select {
	case <-w:
		q.grant(s)
	default:
	}
}

// awaitSlot returns a snapshot with a replica below the cap, at once when there is one and
// nobody waits, or after waiting in line for one. When it gives up it returns nil and the body
// of the 503 to answer (queue full, wait expired, shutting down), or nil, nil when the client
// hung up while waiting. Waiting requests count in Waiting, as demand the replicas have not
// seen, and share MaxQueuedRequests and MaxQueueWait with requests held for a first replica.
func (s *Service) awaitSlot(ctx *fasthttp.RequestCtx, snap *snapshot) (*snapshot, []byte) {
	q := s.slots
	if q.queued.Load() == 0 && q.freeSlots(snap.pick, 1) > 0 {
		return snap, nil
	}
	if s.cfg.MaxQueuedRequests < 0 {
		return nil, s.errs.slotsBusy
	}
	if !s.enterWaiting() {
		return nil, s.errs.slotsQueueFull
	}
	defer s.leaveWaiting()

	w := make(chan struct{}, 1)
	if !q.enqueue(w, s, false) {
		return s.snap.Load(), nil
	}
	h := s.newHold(ctx)
	defer h.stop()
	for {
		switch h.wait(w) {
		case holdWoken:
			if q.enqueue(w, s, true) {
				continue
			}
			return s.snap.Load(), nil
		case holdClientGone:
			q.leave(w, s)
			return nil, nil
		case holdExpired:
			q.leave(w, s)
			return nil, s.errs.slotsTimeout
		case holdShutdown:
			q.leave(w, s)
			return nil, s.errs.shuttingDown
		}
	}
}
