package autoscaler

import (
	"math"
	"slices"
	"time"
)

// This file is what the windowed policies learn about the service's own replicas when a knob
// is left at its default: how long a replacement takes to come back (the cold start: the
// stable and panic windows), how many requests a replica holds before new ones queue (its
// capacity: the in-flight target), how much the target grows within a cold start (the
// headroom), and how long a request stays when nothing is missing (to tell a lost replica's
// queue from new load: backlog). Knative's constants assume pods that start in seconds and
// serve ~100 requests at once; an LLM replica on a GPU takes minutes to start and holds a
// handful of sequences, and which of the two a service is can be read from what its replicas
// do.

// ColdStartOf is the cold start a caller passes as Observation.ColdStart: the median of the
// launch-to-READY times of the service's replicas that have been READY (the controller:
// ReadyAt − LaunchedAt of its replica records; the simulator the same of its replicas). The
// median, so that one replica stuck on a slow image pull does not set the service's pace. It
// returns 0, unknown, for no sample; samples ≤ 0 are ignored.
func ColdStartOf(samples []time.Duration) time.Duration {
	var s []time.Duration
	for _, d := range samples {
		if d > 0 {
			s = append(s, d)
		}
	}
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// stableWindowFor is the stable window of a spec that leaves it unset, for an observed cold
// start (0: unknown). Knative's 60 s is many of its pods' cold starts; for a replica that
// takes minutes to come back, a 60 s window gives up capacity that the next minute wants
// again, and every such scale-down costs a cold start of unavailability and billing. The
// window is StableWindowPerColdStart cold starts (SkyServe's 20-minute downscale delay is
// five of the ~4-minute GPU cold starts it was written for), never below Knative's 60 s and
// never above MaxStableWindow.
func stableWindowFor(coldStart time.Duration) time.Duration {
	return min(max(DefaultStableWindow, StableWindowPerColdStart*coldStart), MaxStableWindow)
}

// capacity learns how many requests one replica holds at once from what the engines report:
// requests in their batches (vllm:num_requests_running) against the share of the KV cache
// those requests fill (vllm:kv_cache_usage_perc). An engine admits a request only while its KV
// cache has room for it, so running ÷ KV use is the number of requests of the current mix a
// full cache holds. It is a ratio of sums over capacityWindow, so that busy moments weigh more
// than quiet ones and one odd batch does not move it.
type capacity struct {
	running, used *window
}

func newCapacity() *capacity {
	return &capacity{running: newWindow(capacityWindow), used: newWindow(capacityWindow)}
}

// record adds one observation's engine load. A sample needs a KV cache at least
// minCapacityKVUsage full: below it a single short request makes the ratio swing.
func (c *capacity) record(now time.Time, e *EngineLoad) {
	if e == nil || e.Replicas <= 0 || e.Running <= 0 || e.KVCacheUsage < minCapacityKVUsage {
		return
	}
	c.running.record(now, e.Running)
	c.used.record(now, e.KVCacheUsage*float64(e.Replicas))
}

// perReplica is the learned capacity in requests per replica, 0 while fewer than
// minCapacitySamples samples of the last capacityWindow back it.
func (c *capacity) perReplica(now time.Time) float64 {
	c.running.expire(now)
	c.used.expire(now)
	running, n := c.running.total()
	used, _ := c.used.total()
	if n < minCapacitySamples || used <= 0 {
		return 0
	}
	return running / used
}

// targetInflightFor is the in-flight target per replica for a replica holding slots requests
// at once: the load at which a request finds its replica full (and waits for a running one
// to finish, seconds for an LLM, past any time-to-first-token SLO) no more than
// DefaultQueueingTolerance of the time. That is Erlang's C formula, each replica an M/M/c
// queue with c = slots: at 0.3% a replica of 6 slots may carry 1.37 requests on average, one
// of 16 slots 7.1, one of 64 44, one of 256 214 — the bigger the batch, the closer to full it
// can run. Least-load routing pools replicas somewhat, so this errs on the side of capacity.
// The target is at least minTargetInflight: below one request per replica Erlang asks for
// fleets no one pays for.
func targetInflightFor(slots float64) float64 {
	return max(minTargetInflight, erlangCLoad(slots, DefaultQueueingTolerance))
}

// erlangC is the probability that an arrival finds all c servers busy at offered load a
// (erlangs), for c ≥ 1 and 0 ≤ a: Erlang B by its recursion, then C from B.
func erlangC(c int, a float64) float64 {
	if a >= float64(c) {
		return 1
	}
	b := 1.0
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	return float64(c) * b / (float64(c) - a*(1-b))
}

// erlangCLoad is the largest offered load at which erlangC stays within p, for a fractional
// number of servers by linear interpolation between its floor and ceiling (so that a learned
// capacity drifting across an integer moves the target smoothly).
func erlangCLoad(slots, p float64) float64 {
	if !(slots >= 1) {
		return 0
	}
	slots = min(slots, maxErlangServers)
	lo := math.Floor(slots)
	load := func(c int) float64 {
		l, h := 0.0, float64(c)
		for range 50 {
			m := (l + h) / 2
			if erlangC(c, m) <= p {
				l = m
			} else {
				h = m
			}
		}
		return l
	}
	a := load(int(lo))
	if frac := slots - lo; frac > 0 {
		a += frac * (load(int(lo)+1) - a)
	}
	return a
}

// headroom learns how many replicas a service should run above its target so that the target
// is READY when it grows: a replica asked for now serves only a cold start later, so whatever
// the target grows by within one cold start is missing meanwhile, unless it was already running.
// Each second it takes the growth of the target over the last cold start (the target now less
// its least value over that span); each minute keeps its largest; and the headroom is the
// HeadroomObjective quantile of the minutes seen, the last headroomWindow of them. With the
// headroom in place the target is met whenever it grew by no more than that, which the last
// day says is HeadroomObjective of the time. A service younger than a day has seen fewer
// minutes, so its quantile is nearer their maximum: it pays for caution while it knows its load
// least (counting the minutes not seen yet as quiet ones made a new service's headroom the
// growth of its 15th busiest minute, and cost its first day 0.9 points of availability in
// `ferry sim`). Preempted replicas are not
// counted: a zone's loss takes more replicas at once than a headroom a service could afford.
type headroom struct {
	// recent is the target over the last cold start, as a monotonic deque for its minimum:
	// values strictly increasing from the front.
	recent []sample
	// minute is the index (minutes since start) of the current minute, and minuteMax its
	// largest growth so far.
	start     time.Time
	minute    int64
	minuteMax int
	// ring holds the largest growth of each of the last headroomWindow minutes; counts[g] is
	// how many of them grew by g.
	ring   []int
	counts []int
	// seen counts the minutes pushed, up to the ring's length.
	seen int
	// value is the current headroom.
	value int
}

func newHeadroom() *headroom {
	return &headroom{ring: make([]int, int(headroomWindow/time.Minute)), counts: []int{int(headroomWindow / time.Minute)}}
}

// record takes the target (without overprovision) decided at now with cold start coldStart
// (0: unknown, no headroom) and returns the headroom to add.
func (h *headroom) record(now time.Time, target int, coldStart time.Duration) int {
	if coldStart <= 0 {
		return 0
	}
	if h.start.IsZero() {
		h.start = now
	}
	for len(h.recent) > 0 && h.recent[len(h.recent)-1].v >= float64(target) {
		h.recent = h.recent[:len(h.recent)-1]
	}
	h.recent = append(h.recent, sample{at: now, v: float64(target)})
	for now.Sub(h.recent[0].at) >= coldStart {
		h.recent = h.recent[1:]
	}
	growth := target - int(h.recent[0].v)
	if m := int64(now.Sub(h.start) / time.Minute); m > h.minute {
		h.push(h.minute, h.minuteMax)
		// Minutes without a decision saw no growth; a ring of them clears every minute.
		for skipped := h.minute + 1; skipped < m && skipped-h.minute <= int64(len(h.ring)); skipped++ {
			h.push(skipped, 0)
		}
		h.minute, h.minuteMax = m, 0
	}
	h.minuteMax = max(h.minuteMax, growth)
	return h.value
}

// push records minute's largest growth g, in place of the minute a window earlier.
func (h *headroom) push(minute int64, g int) {
	i := int(minute % int64(len(h.ring)))
	h.counts[h.ring[i]]--
	h.ring[i] = g
	for len(h.counts) <= g {
		h.counts = append(h.counts, 0)
	}
	h.counts[g]++
	h.seen = min(h.seen+1, len(h.ring))
	// The smallest headroom that the growth of all but (1 − objective) of the minutes fits in.
	allowed := int((1 - HeadroomObjective) * float64(h.seen))
	above := 0
	h.value = 0
	for g := len(h.counts) - 1; g > 0; g-- {
		above += h.counts[g]
		if above > allowed {
			h.value = g
			break
		}
	}
}

// backlog keeps a fleet that lost replicas from reading its own queue as new load. When READY
// replicas vanish while the target still wants them (a zone was preempted, a replica failed),
// the survivors' queues and the requests the proxy holds grow with every second until the
// replacements are READY a cold start later, and so does in-flight. Read as demand, that buys
// tens of replicas, which arrive when the replacements do and stay a stable window, and a
// learned headroom then takes the jump for growth to prepare for. New load shows in arrivals,
// and Little's law turns arrivals into in-flight: in-flight = arrival rate × time in system. So
// backlog learns the time in system while the fleet is whole (∫ in-flight dt ÷ arrivals over
// capacityWindow), and from a loss until the fleet is whole again and its queue has drained
// caps the demand at what the arrivals of the last panic window imply, or the current target,
// whichever is more: a burst during a shortfall still scales, as its arrivals say so. A fleet
// short only because it is growing (new replicas in their cold start) is not capped: its queue
// is the load's.
type backlog struct {
	// occupancy (∫ in-flight dt, per decision) and arrived are the whole fleet's samples.
	occupancy, arrived *window
	// recent are the arrivals of the last panic window, one sample per decision of interval.
	recent   *window
	interval time.Duration
	last     time.Time
	// prevReady is the READY count of the previous decision; recovering is true from a loss
	// until READY reaches the target again and demand is back within what arrivals imply.
	prevReady  int
	recovering bool
}

// newBacklog's recent window takes the panic window's span at each decision; interval is the
// decision interval.
func newBacklog(interval time.Duration) *backlog {
	return &backlog{occupancy: newWindow(capacityWindow), arrived: newWindow(capacityWindow), recent: newWindow(DefaultPanicWindow), interval: interval}
}

// correct records obs (st and target are the fleet before this decision) and returns demand,
// capped while the fleet recovers from a loss.
func (b *backlog) correct(now time.Time, obs Observation, st State, target int, targetInflight, demand float64) float64 {
	dt := 0.0
	if !b.last.IsZero() {
		dt = now.Sub(b.last).Seconds()
	}
	b.last = now
	b.recent.record(now, float64(obs.Arrivals))
	lost := st.Ready < target && (st.Ready < b.prevReady || st.Ready == 0)
	b.prevReady = st.Ready
	b.recovering = b.recovering || lost
	if !b.recovering {
		if st.Ready >= target && dt > 0 {
			b.occupancy.record(now, obs.InFlight*dt)
			b.arrived.record(now, float64(obs.Arrivals))
		}
		return demand
	}
	b.occupancy.expire(now)
	b.arrived.expire(now)
	occupancy, n := b.occupancy.total()
	arrived, _ := b.arrived.total()
	if n < minCapacitySamples || arrived <= 0 {
		b.recovering = false
		return demand
	}
	recent, decisions := b.recent.total()
	rate := recent / (float64(decisions) * b.interval.Seconds())
	timeInSystem := occupancy / arrived
	limit := max(float64(target), rate*timeInSystem/targetInflight)
	if st.Ready >= target && demand <= limit {
		// Whole again, and the queue the loss left behind has drained.
		b.recovering = false
	}
	return min(demand, limit)
}
