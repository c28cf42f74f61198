package proxy

import "time"

// Headroom for other tenants. Fair turns in the line (fairqueue.go) decide who gets the next
// slot that frees, but a tenant whose requests hold every slot still makes another tenant's
// request wait for one of them to end: about a stream's length divided by the slots, which on a
// small batch of long answers is several times the request's own time to first token. So while
// more than one tenant has sent requests lately (headroomWindow), no tenant may hold more than
// the proxy's slots less what the others hold and two spares per replica (the spares at most a
// quarter of the slots, the whole reserve at most half): a tenant that saturates the fleet
// leaves the others what they use and room for their next requests, which then start at once. A tenant alone keeps every slot. Requests
// without a managed key are one tenant, "", which headroom does not limit.
//
// It applies under a configured cap (max_in_flight_per_replica) and under learned caps once
// every replica's batch is known. The counts live under the line's lock, which a request with a
// tenant takes when it gets a slot and when it ends; anonymous requests never take it for this.

// headroomWindow is how recently a second tenant must have asked for headroom to hold.
const headroomWindow = 30 * time.Second

// tenantSlots are the slots each tenant holds (taken or granted) and when each last asked for
// one. Guarded by waitLine.mu.
type tenantSlots struct {
	held map[string]int
	sum  int // of held
	seen map[string]int64
	// prunedAt is when seen last lost the tenants that stopped asking: pruning walks every
	// tenant, so it runs at most once a second, and only while two or more are in seen.
	prunedAt int64
}

// note records that tenant asked for a slot at now; l.mu is held.
func (ts *tenantSlots) note(tenant string, now int64) {
	if tenant == "" {
		return
	}
	if ts.seen == nil {
		ts.seen, ts.held = map[string]int64{}, map[string]int{}
	}
	ts.seen[tenant] = now
}

// crowded reports whether two tenants or more asked for slots within headroomWindow (a second
// longer for a tenant that stopped, until the next pruning); l.mu is held. A tenant forgotten
// here keeps its count in held until its requests end.
func (ts *tenantSlots) crowded(now int64) bool {
	if len(ts.seen) >= 2 && now-ts.prunedAt >= int64(time.Second) {
		ts.prunedAt = now
		for t, at := range ts.seen {
			if now-at > int64(headroomWindow) {
				delete(ts.seen, t)
			}
		}
	}
	return len(ts.seen) >= 2
}

// mayTake reports whether tenant may take one more slot of snap's replicas now; l.mu is held.
func (q *slotQueue) mayTake(tenant string, snap *snapshot, now int64) bool {
	ts := &q.line.tenants
	if tenant == "" || !ts.crowded(now) {
		return true
	}
	total := 0
	for i, r := range snap.pick {
		free := q.free(r, snap.pickCaps[i])
		if free >= noCap {
			return true // a replica without a known cap: no total to keep headroom in
		}
		total += int(free + r.InFlight.Load())
	}
	// What the others hold stays theirs, and the spare stays free for their next requests.
	others := ts.sum - ts.held[tenant]
	return ts.held[tenant] < total-min(total/2, others+headroom(total, len(snap.pick)))
}

// headroom is the spare slots of total over replicas a crowding tenant leaves to the others,
// beyond what they hold: two per replica, so that a burst of their requests finds one (one per
// replica let 1–2 % of a light tenant's requests wait for a stream to end in bench/tenants), at
// most a quarter of the slots, so that a small batch is not left mostly idle.
func headroom(total, replicas int) int { return min(2*replicas, total/4) }

// took counts a slot ex's tenant got (granted, or free when it arrived); l.mu is held.
func (q *slotQueue) took(tenant string) {
	if tenant != "" && q.line.tenants.held != nil {
		q.line.tenants.held[tenant]++
		q.line.tenants.sum++
	}
}

// gave ends the slot ex's tenant held, once: its request ended or gave up.
func (q *slotQueue) gave(ex *exchange) {
	if !ex.slotHeld {
		return
	}
	ex.slotHeld = false
	l := &q.line
	l.mu.Lock()
	if n := l.tenants.held[ex.tenant]; n > 1 {
		l.tenants.held[ex.tenant] = n - 1
		l.tenants.sum--
	} else if n == 1 {
		delete(l.tenants.held, ex.tenant)
		l.tenants.sum--
	}
	l.mu.Unlock()
}
