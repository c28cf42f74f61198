package proxy

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/tenants"
)

// Priority and fair share under overload. Every request waiting in the proxy, held for a first
// replica (hold.go) or queued for a free slot (slots.go), waits in one waitLine per service,
// ordered by fairQueue (fairqueue.go): by class, then by tenant in turns. The line has room for
// MaxQueuedRequests; when it is full, a request sheds a waiter of a lower class (the newest of
// the lowest class waiting) or, in its own class but batch, the newest of a tenant at least two
// requests heavier than its own; else it is refused. A shed request gets 503 with Retry-After
// at once, and so does a batch request that finds the line full or outwaits MaxQueueWait, even
// where a learned cap would send a standard one on to an engine's queue: batch work is
// sheddable, the rest is only late.
//
// A request's class and tenant come from Service.classify, which reads them from its API key.

// waitLine is the lock and order of one service's waiting requests. With late binding on it
// belongs to the slot queue, whose grants pop it; without, only requests held for a first
// replica wait in it (Service.held), all woken at once by the replica, and it serves shedding
// alone.
type waitLine struct {
	mu    sync.Mutex
	order fairQueue
	// drain is the rate at which grants take waiters out, for Retry-After.
	drain drainRate
	// queued counts the waiters in order, and under late binding those about to join it too:
	// it is raised before a waiter checks for a free slot and read by releasers after they
	// free one, so that one of the two always sees the other (Go's atomics are sequentially
	// consistent): no wake-up is lost (slots.go).
	queued atomic.Int64
	// granted counts the slots granted to waiters that have not taken them yet (begun on a
	// replica, or given up): they are not free for anyone else, so that a slot freed meanwhile
	// goes to the next in line and a granted waiter never finds its slot gone (slots.go).
	granted atomic.Int64
	// tenants are the slots each tenant holds, for headroom (headroom.go); guarded by mu.
	tenants tenantSlots
}

// line returns the waitLine s's waiting requests share.
func (s *Service) line() *waitLine {
	if s.slots != nil {
		return &s.slots.line
	}
	return &s.held
}

// enterWaiting counts ex as waiting (Waiting, the waiting gauges) unless MaxQueuedRequests wait
// already, whatever they wait for, and no waiter can be shed to make room (shedFor); it reports
// whether ex may wait. leaveWaiting undoes it.
func (s *Service) enterWaiting(ex *exchange) bool {
	if s.waiting.Add(1) > int64(s.cfg.MaxQueuedRequests) {
		s.waiting.Add(-1)
		if !s.shedFor(ex) {
			return false
		}
	}
	ex.wait.shed = false
	s.obs.waitBegin(ex.class)
	return true
}

// leaveWaiting ends ex's wait. A shed request's count went to the request it made room for.
func (s *Service) leaveWaiting(ex *exchange) {
	if !ex.wait.shed {
		s.waiting.Add(-1)
	}
	s.obs.waitEnd(ex.class)
}

// shedFor takes the waiter fairQueue.victim names for ex out of the line and wakes it as shed,
// handing its place in Waiting to ex. It reports false when there is none.
func (s *Service) shedFor(ex *exchange) bool {
	l := s.line()
	l.mu.Lock()
	v := l.order.victim(classIndex(ex.class), ex.tenant)
	if v == nil {
		l.mu.Unlock()
		return false
	}
	l.order.remove(v)
	l.queued.Add(-1)
	v.shed = true
	v.ch <- struct{}{}
	class := v.class
	l.mu.Unlock()
	s.obs.shed(classPriority(class), shedEvicted)
	return true
}

// classPriority is the priority of class index c (classIndex's inverse).
func classPriority(c int) tenants.Priority { return tenants.Priority(1 - c) }

// shedAnswer is the answer of a request that was shed from the line.
func (s *Service) shedAnswer(ex *exchange) []byte {
	ex.retryAfter = s.retryAfter()
	return s.errs.shed
}

// refuseWaiting is the answer of a request that cannot wait any longer, or at all, with refusal:
// its Retry-After estimated from how fast the line drains.
func (s *Service) refuseWaiting(ex *exchange, refusal []byte) []byte {
	ex.retryAfter = s.retryAfter()
	return refusal
}

// Retry-After for a request refused by the line: the time the line takes to drain at the rate
// grants took waiters out lately, within [1 s, maxRetryAfter]; 1 s while nothing was granted
// lately (a cold start, or replicas busy with long generations), as the proxy's other 503s.
const maxRetryAfter = 60

func (s *Service) retryAfter() int {
	l := s.line()
	l.mu.Lock()
	n, rate := l.order.len(), l.drain.perSecond(time.Now().UnixNano())
	l.mu.Unlock()
	if rate < 1.0/maxRetryAfter {
		return 1
	}
	return int(min(max(math.Ceil(float64(n+1)/rate), 1), maxRetryAfter))
}

// drainRate estimates the rate of an event (grants) as an exponentially decaying count: each
// event adds 1/τ and the sum decays by e^(-t/τ), so a steady rate r converges to r. Guarded by
// its owner's lock.
type drainRate struct {
	at     int64 // unix nanoseconds of the last update; 0 before the first
	perSec float64
}

// drainWindow is τ: long enough to smooth bursts of grants, short enough to follow a change of
// load within a minute.
const drainWindow = 10 * time.Second

func (d *drainRate) add(now int64, n int) {
	d.perSec = d.perSecond(now) + float64(n)/drainWindow.Seconds()
	d.at = now
}

func (d *drainRate) perSecond(now int64) float64 {
	if d.at == 0 || now <= d.at {
		return d.perSec
	}
	return d.perSec * math.Exp(-float64(now-d.at)/float64(drainWindow))
}

// Why a request left the line unserved, as ferry_requests_shed_total's reason.
const (
	shedEvicted   = iota // taken out to make room for a higher class or a lighter tenant
	shedQueueFull        // refused: MaxQueuedRequests waited and none could be shed
	shedExpired          // waited MaxQueueWait in vain
	numShedReasons

	noShed = -1 // not counted: the request never asked to wait
)

var shedReasonNames = [numShedReasons]string{"evicted", "queue_full", "wait_expired"}

// writeErrorAfter is writeError with a Retry-After of seconds, when above 1.
func writeErrorAfter(ctx *fasthttp.RequestCtx, status int, body []byte, seconds int) {
	writeError(ctx, status, body)
	if seconds > 1 {
		var b [8]byte
		ctx.Response.Header.SetBytesKV(headerRetryAfter, strconv.AppendInt(b[:0], int64(seconds), 10))
	}
}
