package proxy

import "github.com/ferryserve/ferry/tenants"

// The order in which waiting requests get a replica (a free slot under late binding, slots.go)
// and which of them is shed when too many wait. Requests wait by class first: every
// interactive request before any standard one, every standard one before any batch one. Within
// a class, tenants (an API key; every anonymous request is one tenant) take turns, one grant
// each in a round (deficit round robin with a quantum of one request and every weight 1, which
// is what weighted fair queuing comes to when every request costs the same): a tenant with fifty
// requests waiting delays another tenant's single request by at most one grant, since a tenant
// that starts waiting joins the round just before the tenant whose turn is next.
//
// A request's cost is not known before it runs (its output length), so a turn is a request and
// not tokens; the engines' own batches share a replica's compute among the requests granted.
//
// fairQueue is the bookkeeping alone: no lock (its owner's mutex guards it), no channel, no
// clock, so that its order can be tested by itself. Every operation is O(1) but victim's
// same-class search, O(tenants waiting in the class). It holds at most the waiters pushed and
// not popped or removed, plus a free list of as many tenant records as were ever waiting at
// once.
type fairQueue struct {
	classes [numClasses]classQueue
	n       int
	// spare are tenant records of tenants that stopped waiting, for the next ones to start.
	spare []*tenantQueue
}

// numClasses is the number of priority classes: interactive, standard, batch.
const numClasses = 3

// classIndex is p's place in fairQueue.classes, 0 first served: interactive 0, standard 1,
// batch 2. A priority outside the three named ones counts as the nearest of them.
func classIndex(p tenants.Priority) int {
	switch {
	case p >= tenants.PriorityInteractive:
		return 0
	case p <= tenants.PriorityBatch:
		return 2
	}
	return 1
}

// classNames are the three classes as metrics and logs name them, by classIndex.
var classNames = [numClasses]string{
	tenants.PriorityInteractive.String(), tenants.PriorityStandard.String(), tenants.PriorityBatch.String(),
}

// waiter is one request waiting in a fairQueue. It lives in the request's exchange, so waiting
// allocates nothing once the exchange has waited before.
type waiter struct {
	// ch receives the request's one wake-up: a grant, or that it was shed (shed is then set
	// before the send). It has room for it, so the sender never blocks.
	ch chan struct{}
	// class and tenant place the request in the queue; set before push.
	class  int
	tenant string
	// shed is set, by the owner of the queue under its lock, when the waiter was taken out to
	// make room for a request of a higher class or a lighter tenant; it is read after the
	// wake-up.
	shed bool

	// Links while queued: queue is its tenant's record (nil when not queued); prev and next
	// are the tenant's waiters in arrival order, older and newer the class's.
	queue        *tenantQueue
	prev, next   *waiter
	older, newer *waiter
}

// tenantQueue is one tenant's waiters in one class, oldest first, and its place in the class's
// round of tenants.
type tenantQueue struct {
	name       string
	head, tail *waiter
	n          int
	// prev and next link the class's waiting tenants in a ring, in the order of their turns.
	prev, next *tenantQueue
}

// classQueue is one class's waiters.
type classQueue struct {
	tenants map[string]*tenantQueue
	// turn is the tenant served next; nil when nobody waits. The ring runs through next.
	turn *tenantQueue
	// oldest and newest end the class's waiters in arrival order (shedding takes the newest).
	oldest, newest *waiter
	n              int
}

func (q *fairQueue) len() int { return q.n }

// push adds w at the end of its tenant's line; a tenant that had nobody waiting joins the round
// just before the tenant whose turn is next, so that every other waiting tenant is served at
// most once before it.
func (q *fairQueue) push(w *waiter) {
	cq := &q.classes[w.class]
	t := q.tenantFor(cq, w.tenant)
	w.queue, w.prev, w.next = t, t.tail, nil
	if t.tail != nil {
		t.tail.next = w
	} else {
		t.head = w
	}
	t.tail = w
	t.n++
	w.older, w.newer = cq.newest, nil
	if cq.newest != nil {
		cq.newest.newer = w
	} else {
		cq.oldest = w
	}
	cq.newest = w
	cq.n++
	q.n++
}

// pop takes out the next waiter to serve: the first class with anyone waiting, the tenant whose
// turn it is, its oldest request; the turn passes to the next tenant. Nil when nobody waits.
func (q *fairQueue) pop() *waiter {
	for c := range q.classes {
		cq := &q.classes[c]
		if cq.n == 0 {
			continue
		}
		t := cq.turn
		w := t.head
		cq.turn = t.next
		q.remove(w)
		return w
	}
	return nil
}

// popEligible is pop among the tenants ok accepts: the first class with such a tenant waiting,
// the first of them in turn from the class's turn, its oldest request; the turn passes to the
// tenant after it. O(tenants waiting) when the tenant whose turn it is may not take a slot.
func (q *fairQueue) popEligible(ok func(tenant string) bool) *waiter {
	for c := range q.classes {
		cq := &q.classes[c]
		if cq.n == 0 {
			continue
		}
		t := cq.turn
		for range len(cq.tenants) {
			if ok(t.name) {
				w := t.head
				cq.turn = t.next
				q.remove(w)
				return w
			}
			t = t.next
		}
	}
	return nil
}

// remove takes w out of the queue, wherever it is; it does nothing when w is not queued.
func (q *fairQueue) remove(w *waiter) {
	t := w.queue
	if t == nil {
		return
	}
	cq := &q.classes[w.class]
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		t.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		t.tail = w.prev
	}
	if w.older != nil {
		w.older.newer = w.newer
	} else {
		cq.oldest = w.newer
	}
	if w.newer != nil {
		w.newer.older = w.older
	} else {
		cq.newest = w.older
	}
	w.queue, w.prev, w.next, w.older, w.newer = nil, nil, nil, nil, nil
	t.n--
	cq.n--
	q.n--
	if t.n == 0 {
		q.dropTenant(cq, t)
	}
}

// victim returns the waiter to shed so that a request of class index c from tenant can wait
// instead, or nil when none should go: the newest waiter of the lowest class below c; else,
// for a class above batch, the newest waiter of the tenant with the most requests waiting in c
// when that tenant has at least two more than tenant, so that a tenant that fills the queue
// cannot keep a lighter one out of it. A batch request never sheds another batch request.
func (q *fairQueue) victim(c int, tenant string) *waiter {
	for lower := numClasses - 1; lower > c; lower-- {
		if cq := &q.classes[lower]; cq.n > 0 {
			return cq.newest
		}
	}
	cq := &q.classes[c]
	if c == numClasses-1 || cq.turn == nil {
		return nil
	}
	heaviest := cq.turn
	for t := cq.turn.next; t != cq.turn; t = t.next {
		if t.n > heaviest.n {
			heaviest = t
		}
	}
	own := 0
	if t := cq.tenants[tenant]; t != nil {
		own = t.n
	}
	if heaviest.name == tenant || heaviest.n < own+2 {
		return nil
	}
	return heaviest.tail
}

// tenantFor returns tenant's record in cq, making one (its turn just before cq.turn) when the
// tenant has nobody waiting.
func (q *fairQueue) tenantFor(cq *classQueue, tenant string) *tenantQueue {
	if t := cq.tenants[tenant]; t != nil {
		return t
	}
	var t *tenantQueue
	if n := len(q.spare); n > 0 {
		t, q.spare[n-1] = q.spare[n-1], nil
		q.spare = q.spare[:n-1]
	} else {
		t = &tenantQueue{}
	}
	t.name = tenant
	if cq.tenants == nil {
		cq.tenants = make(map[string]*tenantQueue)
	}
	cq.tenants[tenant] = t
	if cq.turn == nil {
		t.prev, t.next = t, t
		cq.turn = t
	} else {
		linkBefore(t, cq.turn)
	}
	return t
}

// dropTenant takes a tenant with nobody left waiting out of cq's round and keeps its record.
func (q *fairQueue) dropTenant(cq *classQueue, t *tenantQueue) {
	if t.next == t {
		cq.turn = nil
	} else if cq.turn == t {
		cq.turn = t.next
	}
	unlinkTenant(t)
	delete(cq.tenants, t.name)
	*t = tenantQueue{}
	q.spare = append(q.spare, t)
}

// linkBefore puts t into a ring just before at.
func linkBefore(t, at *tenantQueue) {
	t.prev, t.next = at.prev, at
	at.prev.next = t
	at.prev = t
}

// unlinkTenant takes t out of its ring, leaving it a ring of its own.
func unlinkTenant(t *tenantQueue) {
	t.prev.next = t.next
	t.next.prev = t.prev
	t.prev, t.next = t, t
}
