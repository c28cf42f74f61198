package replicasim

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// errQueueFull is returned by admit when both the batch and the waiting queue are full; the
// handler turns it into a 429 so the proxy can send the request elsewhere.
var errQueueFull = errors.New("replicasim: waiting queue is full")

// scheduler is the continuous-batching admission control: at most maxRunning sequences hold a
// batch slot, the rest wait in FIFO order, and a finished or abandoned sequence hands its slot
// straight to the head of the queue. It only decides who runs; each sequence times its own
// prefill and decode steps, so there is no global step loop to wake when nothing happens.
type scheduler struct {
	maxRunning int
	maxWaiting int

	mu      sync.Mutex
	running int
	head    *waiter // oldest waiter
	tail    *waiter
	waiting int

	// Mirrors of running and waiting for lock-free reads by /metrics and the ITL model.
	runningGauge atomic.Int64
	waitingGauge atomic.Int64
}

// waiter is one queued sequence; granted is closed when it is given a batch slot.
type waiter struct {
	granted    chan struct{}
	prev, next *waiter
	queued     bool // still in the list (guarded by scheduler.mu)
}

func newScheduler(maxRunning, maxWaiting int) *scheduler {
	return &scheduler{maxRunning: maxRunning, maxWaiting: maxWaiting}
}

// tryAdmit takes a batch slot at once if one is free and nobody is queued ahead; otherwise it
// queues a waiter (nil, nil when admitted). The split lets a streaming handler send its headers
// while queued, as vLLM does, but answer 429 before any byte when the queue is full.
func (s *scheduler) tryAdmit() (*waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running < s.maxRunning && s.head == nil {
		s.running++
		s.runningGauge.Store(int64(s.running))
		return nil, nil
	}
	if s.waiting >= s.maxWaiting {
		return nil, errQueueFull
	}
	w := &waiter{granted: make(chan struct{}), queued: true, prev: s.tail}
	if s.tail != nil {
		s.tail.next = w
	} else {
		s.head = w
	}
	s.tail = w
	s.waiting++
	s.waitingGauge.Store(int64(s.waiting))
	return w, nil
}

// wait blocks until w holds a batch slot or ctx ends. On ctx's end the waiter leaves the queue
// at once, so an abandoned request never occupies a slot; if the slot was granted in the same
// instant it is given back.
func (s *scheduler) wait(ctx context.Context, w *waiter, stopping <-chan struct{}) error {
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	case <-stopping:
		// Shutting down: queued requests are finished quickly rather than dropped, so they
		// still need a slot; keep waiting for one, or for the client to leave.
		select {
		case <-w.granted:
			return nil
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	if w.queued {
		s.unlinkLocked(w)
		s.mu.Unlock()
		return ctx.Err()
	}
	s.mu.Unlock()
	s.release() // granted concurrently with the cancellation
	return ctx.Err()
}

// release gives a batch slot back, handing it to the oldest waiter if there is one.
func (s *scheduler) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.head; w != nil {
		s.unlinkLocked(w)
		close(w.granted) // the slot passes over; running is unchanged
		return
	}
	s.running--
	s.runningGauge.Store(int64(s.running))
}

func (s *scheduler) unlinkLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		s.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		s.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	s.waiting--
	s.waitingGauge.Store(int64(s.waiting))
}
