package sim

import (
	"cmp"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ferryserve/ferry/autoscaler"
	"github.com/ferryserve/ferry/launcher/provision"
	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/replicas"
)

// This file is one policy's simulation: a loop over whole seconds that applies the fleet's
// events (spot capacity changes, replicas turning READY, drains, the load balancer's refresh,
// autoscaler decisions) at each second and replays the requests arriving within it at their
// exact times. Replicas' engines run in continuous time between those points (engine.go).

// World is what every policy's run shares: read-only once built.
type World struct {
	Model Model
	Zones []Zone
	// Notice is how long before a reclaim each cloud warns the instances it takes back.
	Notice map[Provider]time.Duration
	// MinReady is the READY count availability is scored against, the same for every policy:
	// the service's min_replicas, as SpotHedge's artifact scores it.
	MinReady int
	// OnDemandPrice is $/hour of an on-demand replica.
	OnDemandPrice float64
	// SpotOffset is where in the spot traces the simulation starts, in seconds.
	SpotOffset float64
	// Warmup is simulated before Duration and not scored: the fleet starts from its initial
	// target and settles.
	Warmup, Duration time.Duration
	SLO              SLO
	// Seed seeds the routing's tie-breaks; each policy draws from its own stream, derived
	// from Seed and its name, so a policy's result does not depend on which others run.
	Seed uint64
}

// SLO is what a request must meet to count as served well.
type SLO struct {
	// TTFT bounds the time from arrival to the first token, waiting at the proxy included.
	TTFT time.Duration
	// TPOT bounds the mean time per output token after the first.
	TPOT time.Duration
}

// epoch is the wall time the simulation's second 0 stands for; only differences matter.
var epoch = time.Date(2023, 11, 16, 0, 0, 0, 0, time.UTC)

// drainLimit bounds how long the run continues after the horizon for requests still in the
// system; any still there after it counts as failed.
const drainLimit = time.Hour

type replicaState uint8

const (
	provisioning replicaState = iota
	ready
	draining
)

// replica is one launched instance.
type replica struct {
	id    int
	spot  bool
	zone  int // index into World.Zones; -1 for on-demand
	price float64
	state replicaState
	// launchedAt is when it was launched, readyAt when its cold start ends; drainUntil when a
	// drain gives up.
	launchedAt, readyAt, drainUntil float64
	// announced is true once the load balancer knows it is READY.
	announced bool
	// warned is true once the cloud warned of its reclaim, due at reclaimAt; noticed is true
	// when the policy acts on that warning: the replica serves on, but the fleet already
	// counts it as gone.
	warned, noticed bool
	reclaimAt       float64
	// moving is set for a spread move's replica until it is READY: it does not count toward
	// the target meanwhile (replicas' replicaView.Moving).
	moving bool
	eng    *engine
}

// runner simulates one policy.
type runner struct {
	w   *World
	p   Policy
	rng *rand.Rand

	scaler  autoscaler.Scaler
	zones   *policy.Zones
	byPrice []int // zone indexes, cheapest first
	// zoneCap is each zone's spot capacity now (Unbounded for a probed zone with capacity).
	zoneCap []int
	// refusedUntil and lostUntil are, per zone, until when Ferry's provisioner tries it last
	// (PlaceFerry): after it refused a launch (the location block, which a launch that
	// succeeds there lifts) and after it took an instance back (the zone block).
	refusedUntil, lostUntil []float64
	// losses is what the policy has seen of spot losses (Ferry: the fallback's hold).
	losses policy.Losses
	// spotFailing is set from a spot launch no zone took to the next spot replica READY (the
	// replica manager's SpotFailures > 0): on-demand stands in for a missing spare only then.
	spotFailing bool
	interval    int // decision interval in seconds
	warmup      float64
	end         float64

	nextID   int
	live     []*replica // provisioning, ready and draining
	routable []*replica
	dirty    bool // routable needs a rebuild
	target   int
	// need is target without overprovision: what availability is measured against.
	need int

	held      []*request
	noneReady bool // no replica READY at the last scored second
	heldArea  float64
	heldAt    float64
	goneArea  float64 // ∫ in-flight of replicas that went away since the last decision
	inSystem  int     // requests held or in an engine
	arrived   int     // arrivals since the last decision
	lbPending int     // arrivals the load balancer has not shipped yet
	lbShipped int     // shipped, not yet read by a decision

	// spreadAfter holds spread moves back after one found no zone (replicas.SpreadRetry).
	spreadAfter float64
	// sample is decide's, reused.
	sample autoscaler.Sample
	// preempted are the latest preempted replicas, which the controller's replica manager keeps
	// among the records it shows (its newest keptEnded terminal ones), so that the cold start is
	// sampled from the same replicas in both.
	preempted []autoscaler.Replica

	res   *Result
	ttfts []float32
	tpots []float32
}

// run simulates p on arrivals from src and scores it.
func (w *World) run(p Policy, src arrivalSource) *Result {
	start := time.Now()
	r := w.newRunner(p)
	r.loop(src)
	r.finish()
	r.res.Elapsed = time.Since(start).Round(time.Millisecond).String()
	return r.res
}

func (w *World) newRunner(p Policy) *runner {
	h := fnv.New64a()
	h.Write([]byte(p.Name))
	r := &runner{
		w:            w,
		p:            p,
		rng:          rand.New(rand.NewPCG(w.Seed, h.Sum64())),
		scaler:       autoscaler.New(p.Spec),
		zoneCap:      make([]int, len(w.Zones)),
		refusedUntil: make([]float64, len(w.Zones)),
		lostUntil:    make([]float64, len(w.Zones)),
		interval:     max(1, int(p.Spec.DecisionInterval/time.Second)),
		warmup:       w.Warmup.Seconds(),
		end:          (w.Warmup + w.Duration).Seconds(),
		target:       p.Spec.InitialTarget(),
		need:         max(0, p.Spec.InitialTarget()-p.Spec.Overprovision),
		res:          &Result{Policy: p.Name, Description: p.Description},
	}
	states := make([]policy.ZoneState, len(w.Zones))
	for i, z := range w.Zones {
		states[i] = policy.ZoneState{Name: z.Name, SpotPrice: z.SpotPrice}
		r.byPrice = append(r.byPrice, i)
	}
	slices.SortStableFunc(r.byPrice, func(a, b int) int {
		return cmp.Compare(w.Zones[a].SpotPrice, w.Zones[b].SpotPrice)
	})
	if p.Placer == PlaceSpotHedge {
		r.zones = policy.NewZones(states)
	}
	return r
}

func (r *runner) scored(t float64) bool { return t >= r.warmup && t < r.end }

// loop runs second by second until the horizon, then until the system is empty.
func (r *runner) loop(src arrivalSource) {
	next, ok := src.next()
	for s := 0; ; s++ {
		t := float64(s)
		if t >= r.end && !ok && r.inSystem == 0 {
			break
		}
		if t >= r.end+drainLimit.Seconds() {
			for _, rep := range r.live {
				r.failAll(rep.eng.kill(), &r.res.Failed)
			}
			r.failAll(r.held, &r.res.Failed)
			r.held = nil
			break
		}
		r.second(s)
		for ok && next.at < t+1 {
			r.arrive(next)
			next, ok = src.next()
		}
	}
}

// second applies everything that happens at whole second s, in order.
func (r *runner) second(s int) {
	t := float64(s)
	for _, rep := range r.live {
		rep.eng.advance(t)
	}
	r.spotCapacity(t)
	r.reclaim(t)
	for _, rep := range r.live {
		if rep.state == provisioning && rep.readyAt <= t {
			rep.state, rep.moving = ready, false
			rep.announced = r.p.LBSync <= 0
			r.dirty = true
			r.spotFailing = r.spotFailing && !rep.spot
			if rep.spot && !rep.noticed && r.zones != nil {
				r.zones.Ready(r.w.Zones[rep.zone].Name)
			}
		}
	}
	r.live = slices.DeleteFunc(r.live, func(rep *replica) bool {
		if rep.state != draining || (rep.eng.inFlight() > 0 && t < rep.drainUntil) {
			return false
		}
		r.remove(rep, &r.res.Failed)
		return true
	})
	r.expireHeld(t)
	if r.p.ReportEvery > 0 {
		every := int(r.p.ReportEvery / time.Second)
		if s%every == every/2 {
			r.lbShipped += r.lbPending
			r.lbPending = 0
		}
	}
	if r.p.LBSync > 0 && s%int(r.p.LBSync/time.Second) == 0 {
		for _, rep := range r.live {
			if rep.state == ready && !rep.announced {
				rep.announced = true
				r.dirty = true
			}
		}
	}
	r.refreshRoutable()
	r.dispatchHeld(t)
	if s%r.interval == 0 {
		r.decide(s)
	}
	if r.scored(t) {
		r.account(s)
	}
}

// spotCapacity reads each zone's capacity at t. Where the zone now holds fewer spot instances
// than the policy has there, the cloud takes back exactly the excess, newest first (the order
// is the cloud's and unknown; newest keeps runs replayable): each such instance is warned now
// and reclaimed its cloud's notice later (World.Notice), or at once with no notice. Only
// instances the policy holds are warned, and nothing is known of a drop before it happens.
// Instances already warned no longer count against the zone's capacity.
func (r *runner) spotCapacity(t float64) {
	for i, z := range r.w.Zones {
		c := z.Trace.Capacity(r.w.SpotOffset + t)
		r.zoneCap[i] = c
		held := r.spotHeld(i)
		if len(held) <= c {
			continue
		}
		slices.SortFunc(held, func(a, b *replica) int { return b.id - a.id })
		notice := r.w.Notice[z.Provider].Seconds()
		acted := 0
		for _, rep := range held[:len(held)-c] {
			rep.warned, rep.reclaimAt = true, t+notice
			if r.p.Notices && notice > 0 {
				rep.noticed = true
				acted++
			}
		}
		if acted > 0 {
			r.zoneLost(i, t, acted)
		}
	}
}

// spotHeld are the policy's spot instances in zone i that the cloud has not warned.
func (r *runner) spotHeld(i int) []*replica {
	var out []*replica
	for _, rep := range r.live {
		if rep.spot && rep.zone == i && !rep.warned {
			out = append(out, rep)
		}
	}
	return out
}

// free is how many more spot instances zone i takes now.
func (r *runner) free(i int) int {
	if r.zoneCap[i] == Unbounded {
		return Unbounded
	}
	return max(0, r.zoneCap[i]-len(r.spotHeld(i)))
}

// reclaim preempts the warned instances whose notice has run out: what they hold fails. A
// policy that did not act on the warning learns of the loss only now.
func (r *runner) reclaim(t float64) {
	lost := map[int]int{}
	r.live = slices.DeleteFunc(r.live, func(rep *replica) bool {
		if !rep.warned || rep.reclaimAt > t {
			return false
		}
		if r.scored(t) {
			r.res.Preemptions++
			r.res.timeline.preemptions = append(r.res.timeline.preemptions, t-r.warmup)
		}
		if !rep.noticed {
			lost[rep.zone]++
		}
		r.keepPreempted(rep)
		r.remove(rep, &r.res.Failed)
		return true
	})
	for i := range r.w.Zones {
		if lost[i] > 0 {
			r.zoneLost(i, t, lost[i])
		}
	}
}

// zoneLost tells the placer that zone i took n spot instances back: SpotHedge marks it
// preempted, Ferry's provisioner blocks it (launcher/provision's Preempted), and each is a
// loss as the replica manager records it.
func (r *runner) zoneLost(i int, t float64, n int) {
	name := r.w.Zones[i].Name
	for range n {
		r.losses.Lost(simTime(t), name)
	}
	r.losses.Capped(simTime(t), name, r.spotCounts()[name]) // what the reclaim left there
	if r.zones != nil {
		r.zones.Preempted(name)
	}
	r.lostUntil[i] = t + provision.DefaultBlockFor.Seconds()
}

// keptEnded is how many ended replicas the controller's replica manager keeps for status
// (replicas' keepFailed).
const keptEnded = 10

// keepPreempted records a preempted replica as the manager's records keep it.
func (r *runner) keepPreempted(rep *replica) {
	ended := autoscaler.Replica{LaunchedAt: simTime(rep.launchedAt)}
	if rep.state != provisioning {
		ended.ReadyAt = simTime(rep.readyAt)
	}
	r.preempted = append(r.preempted, ended)
	if len(r.preempted) > keptEnded {
		r.preempted = r.preempted[len(r.preempted)-keptEnded:]
	}
}

// remove takes rep out of service: what it still holds fails (counted in failed).
func (r *runner) remove(rep *replica, failed *int) {
	r.goneArea += rep.eng.takeArea()
	r.failAll(rep.eng.kill(), failed)
	r.dirty = true
}

// refreshRoutable rebuilds the load balancer's view: READY replicas it has been told about.
func (r *runner) refreshRoutable() {
	if !r.dirty {
		return
	}
	r.dirty = false
	r.routable = r.routable[:0]
	for _, rep := range r.live {
		if rep.state == ready && rep.announced {
			r.routable = append(r.routable, rep)
		}
	}
}

// arrive handles one request at its arrival time.
func (r *runner) arrive(a arrival) {
	req := &request{arrival: a.at, ctx: a.ctx, gen: a.gen, scored: r.scored(a.at), met: r.readyClass()}
	if req.scored {
		r.res.Requests++
	}
	r.arrived++
	r.lbPending++
	maxLen := r.w.Model.KVCapacityTokens
	if req.ctx >= maxLen {
		// vLLM answers 400: the prompt is longer than max_model_len.
		if req.scored {
			r.res.Unservable++
		}
		return
	}
	// A prompt that fits but whose output would not stops at max_model_len, as in vLLM.
	req.gen = min(req.gen, maxLen-req.ctx)
	r.inSystem++
	if len(r.routable) > 0 {
		r.route(req, a.at)
		return
	}
	if r.p.Hold && len(r.held) < holdMaxQueued {
		r.heldArea += float64(len(r.held)) * (a.at - r.heldAt)
		r.heldAt = a.at
		r.held = append(r.held, req)
		return
	}
	r.fail(req, &r.res.Rejected)
}

// What a request found on arrival, the index into Result.Misses.
const (
	missNoneReady = iota
	missShort
	missFull
)

// readyClass is what an arriving request finds: no replica routable, fewer than
// World.MinReady, or at least that many.
func (r *runner) readyClass() int {
	switch n := len(r.routable); {
	case n == 0:
		return missNoneReady
	case n < r.w.MinReady:
		return missShort
	}
	return missFull
}

// route sends req to the READY replica with the fewest requests in flight, breaking ties at
// random: SkyServe's least_load, and Ferry's least_ttft for prompts no replica has cached (the
// trace's), which with Policy.KVRoom takes the least loaded among replicas with room for the
// request first.
func (r *runner) route(req *request, t float64) {
	var least, leastFree leastReplica
	for _, rep := range r.routable {
		rep.eng.advance(t)
		load := rep.eng.inFlight()
		least.offer(rep, load, r.rng)
		if r.p.KVRoom && rep.eng.roomFor(req) {
			leastFree.offer(rep, load, r.rng)
		}
	}
	if leastFree.rep != nil {
		leastFree.rep.eng.submit(req)
		return
	}
	least.rep.eng.submit(req)
}

// leastReplica is the least loaded of the replicas offered, ties broken at random.
type leastReplica struct {
	rep        *replica
	load, ties int
}

func (l *leastReplica) offer(rep *replica, load int, rng *rand.Rand) {
	switch {
	case l.rep == nil || load < l.load:
		*l = leastReplica{rep: rep, load: load, ties: 1}
	case load == l.load:
		l.ties++
		if rng.IntN(l.ties) == 0 {
			l.rep = rep
		}
	}
}

// dispatchHeld routes held requests once a replica is READY.
func (r *runner) dispatchHeld(t float64) {
	r.heldArea += float64(len(r.held)) * (t - r.heldAt)
	r.heldAt = t
	if len(r.routable) == 0 || len(r.held) == 0 {
		return
	}
	for _, req := range r.held {
		r.route(req, t)
	}
	r.held = r.held[:0]
}

// expireHeld fails held requests that waited as long as the proxy holds one.
func (r *runner) expireHeld(t float64) {
	r.heldArea += float64(len(r.held)) * (t - r.heldAt)
	r.heldAt = t
	limit := holdMaxWait.Seconds()
	r.held = slices.DeleteFunc(r.held, func(req *request) bool {
		if t-req.arrival < limit {
			return false
		}
		r.fail(req, &r.res.Rejected)
		return true
	})
}

// done records a request that finished on an engine.
func (r *runner) done(req *request, at float64) {
	r.inSystem--
	if !req.scored {
		return
	}
	r.res.Served++
	ttft := req.firstToken - req.arrival
	tpot := 0.0
	if req.gen > 1 {
		tpot = (at - req.firstToken) / float64(req.gen-1)
	}
	r.ttfts = append(r.ttfts, float32(ttft))
	r.tpots = append(r.tpots, float32(tpot))
	if ttft <= r.w.SLO.TTFT.Seconds() && tpot <= r.w.SLO.TPOT.Seconds() {
		r.res.MetSLO++
		return
	}
	r.res.Misses[req.met]++
}

// fail records a request that will not be served; counter is the reason's count.
func (r *runner) fail(req *request, counter *int) {
	r.inSystem--
	if req.scored {
		*counter++
		r.res.Misses[req.met]++
	}
}

func (r *runner) failAll(reqs []*request, counter *int) {
	for _, req := range reqs {
		r.fail(req, counter)
	}
}

// decide runs the autoscaler and applies its target.
func (r *runner) decide(s int) {
	t := float64(s)
	arrivals := r.arrived
	if r.p.ReportEvery > 0 {
		arrivals = r.lbShipped
		r.lbShipped = 0
	}
	r.arrived = 0

	// What the controller's scale loop reads, through the same autoscaler.Observe: the
	// in-flight count now and its mean over the interval, the engines of the replicas the load
	// balancer routes to, and every replica for the READY count and the cold start.
	area := r.goneArea + r.heldArea
	r.goneArea, r.heldArea = 0, 0
	instant := len(r.held)
	r.sample.Replicas = append(r.sample.Replicas[:0], r.preempted...)
	readySpot := 0
	for _, rep := range r.live {
		area += rep.eng.takeArea()
		instant += rep.eng.inFlight()
		sr := autoscaler.Replica{LaunchedAt: simTime(rep.launchedAt), Ready: rep.state == ready, Live: rep.state != draining}
		if rep.state != provisioning {
			sr.ReadyAt = simTime(rep.readyAt)
		}
		r.sample.Replicas = append(r.sample.Replicas, sr)
		if rep.state == ready && rep.spot && !rep.noticed {
			readySpot++
		}
	}
	r.sample.Arrivals = arrivals
	r.sample.InFlight, r.sample.InFlightMean = float64(instant), area/float64(r.interval)
	r.sample.Engines = r.sample.Engines[:0]
	if r.p.Spec.WantsEngineLoad() { // only then does Observe read them
		for _, rep := range r.routable {
			r.sample.Engines = append(r.sample.Engines, autoscaler.EngineLoad{Waiting: float64(rep.eng.queued()),
				Running: float64(rep.eng.batch()), KVCacheUsage: rep.eng.kvUsage(), Replicas: 1})
		}
	}
	r.sample.Target = r.target
	obs, st := autoscaler.Observe(r.p.Spec, r.sample)

	d := r.scaler.Decide(simTime(t), obs, st)
	if r.scored(t) {
		switch {
		case d.Target > r.target:
			r.res.ScaleUps++
		case d.Target < r.target:
			r.res.ScaleDowns++
		}
	}
	r.target = d.Target
	r.need = max(0, d.Target-d.Overprovision)
	spare := policy.Spare{SpotFailing: r.spotFailing}
	if r.p.Spare {
		spare.Spot = r.losses.Spare(simTime(t), r.spotCounts())
	}
	mix := policy.Split(d.Target, r.p.Mix, readySpot, spare)
	if r.p.SkyServe {
		mix = skyServeSplit(d.Target, r.p.Mix, readySpot)
	} else {
		if r.p.HoldFallback && spare.Spot == 0 { // a spare stands against the next loss instead
			mix = policy.Held(mix, r.liveOnDemand(), d.Target, r.losses.HoldOnDemand(simTime(t)))
		}
		mix = policy.KeepStandIn(mix, d.Target, r.p.Mix, readySpot, spare, r.liveOnDemand())
	}
	launched := r.nextID
	r.reconcile(true, mix.Spot, t)
	r.reconcile(false, mix.OnDemand, t)
	r.drainNoticed(t)
	if r.nextID == launched {
		r.spread(t)
	}
}

// spread starts a move as the replica manager does (replicas' spreadSpot, the provisioner's
// spreadTargets), for a policy with Spread: when no launch was asked this decision, every
// spot replica is READY and none warned or moving, and one zone holds most of them
// (policy.Crowded), one more spot replica goes to the first zone of policy.SpreadTargets that
// takes it. A zone that refuses is blocked as after any refused launch; when none takes it,
// moves wait replicas.SpreadRetry. Once the move is READY it counts toward the target, and
// reconcile's scale-down takes a replica of the most crowded zone.
func (r *runner) spread(t float64) {
	if !r.p.Spread || t < r.spreadAfter {
		return
	}
	counts := make([]int, len(r.w.Zones))
	for _, rep := range r.live {
		if !rep.spot || rep.state == draining {
			continue
		}
		if rep.state != ready || rep.noticed || rep.moving {
			return
		}
		counts[rep.zone]++
	}
	states := make([]policy.ZoneState, len(r.w.Zones))
	for i, z := range r.w.Zones {
		states[i] = policy.ZoneState{Name: z.Name, SpotPrice: z.SpotPrice, Active: r.refusedUntil[i] <= t && r.lostUntil[i] <= t, Spot: counts[i]}
	}
	from, crowded := policy.Crowded(states)
	if !crowded {
		return
	}
	for _, i := range policy.SpreadTargets(states, from) {
		if r.free(i) > 0 {
			r.start(true, i, t).moving = true
			r.res.SpreadMoves++
			return
		}
		r.res.RefusedSpotLaunches++
		r.refusedUntil[i] = t + provision.DefaultBlockFor.Seconds()
	}
	r.spreadAfter = t + replicas.SpreadRetry.Seconds()
}

// liveOnDemand counts the on-demand replicas provisioning or READY.
func (r *runner) liveOnDemand() int {
	n := 0
	for _, rep := range r.live {
		if !rep.spot && rep.state != draining {
			n++
		}
	}
	return n
}

// drainNoticed takes noticed replicas out of service once the others READY make the target,
// as replicas/plan.go does: a request sent to one would be cut at the reclaim.
func (r *runner) drainNoticed(t float64) {
	readyOthers, noticed := 0, 0
	for _, rep := range r.live {
		switch {
		case rep.state != ready:
		case rep.noticed:
			noticed++
		default:
			readyOthers++
		}
	}
	if noticed == 0 || readyOthers < r.target {
		return
	}
	for _, rep := range r.live {
		if rep.state == ready && rep.noticed {
			rep.state = draining
			rep.drainUntil = t + r.p.DrainTimeout.Seconds()
			r.dirty = true
		}
	}
	r.refreshRoutable()
}

// simTime is the wall time of simulated second t.
func simTime(t float64) time.Time { return epoch.Add(time.Duration(t * float64(time.Second))) }

// reconcile launches or stops replicas of one kind until want are live (provisioning or
// READY). Scale-down stops replicas not serving yet first, then the newest (as
// replicas/plan.go does).
func (r *runner) reconcile(spot bool, want int, t float64) {
	var mine []*replica
	for _, rep := range r.live {
		if rep.spot == spot && rep.state != draining && !rep.noticed && !rep.moving {
			mine = append(mine, rep)
		}
	}
	for n := len(mine); n < want; n++ {
		if !r.launch(spot, t) {
			break
		}
	}
	if len(mine) <= want {
		return
	}
	// Ferry's scale-down order (replicas' scaleDownOrder) takes spot replicas of the most
	// crowded zone first, then the dearest; SkyServe's takes the newest.
	ferryOrder := !r.p.SkyServe
	crowd := map[int]int{}
	if spot && ferryOrder {
		for _, rep := range mine {
			crowd[rep.zone]++
		}
	}
	slices.SortFunc(mine, func(a, b *replica) int {
		if (a.state == provisioning) != (b.state == provisioning) {
			if a.state == provisioning {
				return -1
			}
			return 1
		}
		if ferryOrder {
			if c := cmp.Compare(crowd[b.zone], crowd[a.zone]); c != 0 {
				return c
			}
			if c := cmp.Compare(b.price, a.price); c != 0 {
				return c
			}
		}
		return b.id - a.id
	})
	for _, rep := range mine[:len(mine)-want] {
		if rep.state == provisioning {
			r.live = slices.DeleteFunc(r.live, func(x *replica) bool { return x == rep })
			r.remove(rep, &r.res.Failed)
			continue
		}
		rep.state = draining
		rep.drainUntil = t + r.p.DrainTimeout.Seconds()
		r.dirty = true
	}
	r.refreshRoutable()
}

// launch starts one replica; false when no zone takes a spot replica now.
func (r *runner) launch(spot bool, t float64) bool {
	zone := -1
	if spot {
		if zone = r.placeSpot(t); zone < 0 {
			r.spotFailing = true
			return false
		}
	}
	r.start(spot, zone, t)
	return true
}

// start launches one replica now, in zone (an index into World.Zones) for spot.
func (r *runner) start(spot bool, zone int, t float64) *replica {
	rep := &replica{id: r.nextID, spot: spot, zone: zone, price: r.w.OnDemandPrice, launchedAt: t, readyAt: t + r.w.Model.ColdStart.Seconds()}
	if spot {
		rep.price = r.w.Zones[zone].SpotPrice
	}
	r.nextID++
	rep.eng = newEngine(&r.w.Model, t, r.done)
	r.live = append(r.live, rep)
	if r.scored(t) {
		r.res.Launches++
	}
	return rep
}

// placeSpot picks the zone for a new spot replica, trying zones until one has capacity (a
// refused launch is known at once: EC2 answers InsufficientInstanceCapacity to the call,
// Compute Engine ZONE_RESOURCE_POOL_EXHAUSTED). It returns -1 when no zone takes it.
func (r *runner) placeSpot(t float64) int {
	switch r.p.Placer {
	case PlaceSpotHedge:
		for range r.w.Zones {
			name, ok := r.zones.Place(r.spotCounts())
			if !ok {
				return -1
			}
			i := slices.IndexFunc(r.w.Zones, func(z Zone) bool { return z.Name == name })
			if r.free(i) > 0 {
				return i
			}
			r.res.RefusedSpotLaunches++
			r.zones.Preempted(name)
		}
	case PlaceFerry:
		counts := r.spotCounts()
		states := make([]policy.ZoneState, len(r.w.Zones))
		for i, z := range r.w.Zones {
			states[i] = policy.ZoneState{Name: z.Name, SpotPrice: z.SpotPrice, Active: r.refusedUntil[i] <= t && r.lostUntil[i] <= t, Spot: counts[z.Name]}
		}
		// The provisioner tries the blocked zones too, after the others (blocked() sorts
		// them last), and blocks a zone that refuses.
		for _, i := range policy.SpotOrder(states) {
			if r.free(i) > 0 {
				r.refusedUntil[i] = 0
				return i
			}
			r.res.RefusedSpotLaunches++
			r.refusedUntil[i] = t + provision.DefaultBlockFor.Seconds()
		}
		// No zone took it: each holds no more than it does now (the replica manager's
		// refusedOwned, on a launch every zone refused: launcher.ErrCapacityRefused).
		for _, z := range r.w.Zones {
			if counts[z.Name] > 0 { // as the manager, which counts only zones holding some
				r.losses.Capped(simTime(t), z.Name, counts[z.Name])
			}
		}
	case PlaceCheapest:
		for _, i := range r.byPrice {
			if r.free(i) > 0 {
				return i
			}
			r.res.RefusedSpotLaunches++
		}
	}
	return -1
}

// spotCounts is how many spot replicas the policy counts in each zone: live, not draining,
// not warned of a reclaim it acts on.
func (r *runner) spotCounts() map[string]int {
	counts := map[string]int{}
	for _, rep := range r.live {
		if rep.spot && rep.state != draining && !rep.noticed {
			counts[r.w.Zones[rep.zone].Name]++
		}
	}
	return counts
}

// account adds second s to the scored figures: replica time and cost, availability ticks,
// and the plot's per-minute samples.
func (r *runner) account(s int) {
	readySpot, readyOD := 0, 0
	for _, rep := range r.live {
		if rep.spot {
			r.res.SpotHours += 1.0 / 3600
			r.res.SpotCost += rep.price / 3600
		} else {
			r.res.OnDemandHours += 1.0 / 3600
			r.res.OnDemandCost += rep.price / 3600
		}
		if rep.state == ready {
			if rep.spot {
				readySpot++
			} else {
				readyOD++
			}
		}
	}
	if readySpot+readyOD == 0 {
		if !r.noneReady {
			r.res.NoneReadySpells++
		}
		r.res.NoneReadySeconds++
	}
	r.noneReady = readySpot+readyOD == 0
	since := s - int(r.warmup)
	if since%availabilityTick == 0 {
		r.res.Ticks++
		if readySpot+readyOD >= r.w.MinReady {
			r.res.AvailableTicks++
		}
		if readySpot+readyOD >= r.need {
			r.res.OwnTargetTicks++
		}
	}
	if since%60 == 0 {
		r.res.timeline.add(readySpot, readyOD, r.need)
	}
}

// availabilityTick is SpotHedge's: availability is the share of 30 s ticks with at least
// World.MinReady READY replicas, the same count for every policy. OwnTargetTicks counts, for
// comparison, the ticks with the policy's own target (without num_overprovision) READY.
const availabilityTick = 30

// finish derives the result's ratios and percentiles.
func (r *runner) finish() {
	res := r.res
	if res.Requests > 0 {
		res.SLOAttainment = float64(res.MetSLO) / float64(res.Requests)
	}
	if res.Ticks > 0 {
		res.Availability = float64(res.AvailableTicks) / float64(res.Ticks)
		res.OwnTargetAvailability = float64(res.OwnTargetTicks) / float64(res.Ticks)
	}
	res.Cost = res.SpotCost + res.OnDemandCost
	res.NormalizedCost = res.SpotHours + 3*res.OnDemandHours
	res.TTFTp50, res.TTFTp99 = percentiles(r.ttfts)
	res.TPOTp50, res.TPOTp99 = percentiles(r.tpots)
}

// percentiles returns the nearest-rank p50 and p99 of v in seconds.
func percentiles(v []float32) (p50, p99 float64) {
	if len(v) == 0 {
		return 0, 0
	}
	slices.Sort(v)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(v)))) - 1
		return float64(v[max(0, min(i, len(v)-1))])
	}
	return at(0.50), at(0.99)
}
