package replicas

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/policy"
)

// The middle phases of a plan: how many replicas of each version and kind stay, which go, and
// how many to launch.

// splitVersions divides the live replicas between the target version (current) and older
// ones (old).
func (p *pass) splitVersions() {
	for _, c := range p.alive {
		if c.current {
			p.current = append(p.current, c)
		} else {
			p.old = append(p.old, c)
		}
	}
}

// liveCurrent is how many live replicas count toward the target: current ones and launches.
func (p *pass) liveCurrent() int { return p.launching + len(p.current) }

// weighRollout counts the new version's healthy replicas (READY for min_healthy_seconds) and
// decides how many old ones the rollout keeps: rolling keeps what the new version cannot carry
// yet, blue-green all of the target until traffic switches.
func (p *pass) weighRollout() rolloutWeight {
	in, ro := p.in, p.in.Rollout
	var w rolloutWeight
	w.holding = ro != nil && (ro.State == RolloutInProgress || ro.State == RolloutFailed)
	minHealthy := in.minHealthy()
	for _, c := range p.current {
		if !c.ready || c.healthySince.IsZero() || in.Now.Sub(c.healthySince) < minHealthy {
			continue
		}
		w.healthy++
		if at := c.healthySince.Add(minHealthy); ro != nil && at.After(ro.ProgressAt) && at.After(w.progressAt) {
			w.progressAt = at
		}
	}
	// The rollout may end only once no old replica was live at the start of this pass: the
	// READY set without them is then published before anyone reads the rollout as done.
	w.oldLeft = len(p.old)
	if !w.holding || in.Desired < 0 {
		return w
	}
	switch ro.Mode {
	case configs.UpdateBlueGreen:
		w.switched = ro.Switched || w.healthy >= in.SwitchAt
		if !w.switched {
			w.keepOld = in.Desired
		}
	default:
		w.keepOld = max(0, in.Desired-w.healthy)
	}
	return w
}

// retireOld scales down the old replicas beyond keepOld, what the rollout keeps. They are one
// pool whatever their kind: the new version's mix is what counts.
func (p *pass) retireOld(keepOld int) {
	if p.in.Desired < 0 || len(p.old) <= keepOld {
		return
	}
	for i := range p.old {
		p.old[i].spot = false
	}
	p.scaleDown(p.old, map[bool]int{false: len(p.old) - keepOld}, 0, fmt.Sprintf("replaced by version %d", p.in.Target))
}

// scaleKinds splits the target between spot and on-demand (policy.Split) and scales each kind
// down to its share, but never below the target's READY replicas: a READY replica of a kind
// over its share (base_ondemand_fallback_replicas lowered, say) serves until the other kind's
// replacements are READY. While spot losses come in a run (HoldOnDemand) a dynamic fallback is
// not scaled down below the target (policy.Held). A service without spot is one pool, whatever its replicas were
// launched as.
func (p *pass) scaleKinds() kindSplit {
	if !p.in.Mix.UseSpot {
		p.launchingSpot = 0
		for i := range p.current {
			p.current[i].spot = false
		}
	}
	k := kindSplit{liveSpot: p.launchingSpot}
	readySpot := 0
	for _, c := range p.current {
		if c.spot {
			k.liveSpot++
			if c.ready {
				readySpot++
			}
		}
	}
	k.liveOnDemand = p.liveCurrent() - k.liveSpot
	spare := p.in.spare()
	k.want = policy.Split(p.in.Desired, p.in.Mix, readySpot, spare)
	if p.in.Mix.DynamicFallback {
		k.want = policy.Held(k.want, k.liveOnDemand, p.in.Desired, p.in.HoldOnDemand)
		k.want = policy.KeepStandIn(k.want, p.in.Desired, p.in.Mix, readySpot, spare, k.liveOnDemand)
	}
	if p.in.Desired >= 0 && (k.liveSpot > k.want.Spot || k.liveOnDemand > k.want.OnDemand) {
		countCrowds(p.current)
		p.scaleDown(p.current, map[bool]int{true: k.liveSpot - k.want.Spot, false: k.liveOnDemand - k.want.OnDemand}, p.in.Desired, "scaled down")
	}
	return k
}

// retireNoticed drains the replicas warned of their reclaim once the others READY make the
// target: a request sent to one now would be cut at the reclaim.
func (p *pass) retireNoticed() {
	if p.in.Desired < 0 || len(p.noticed) == 0 {
		return
	}
	readyCurrent := 0
	for _, c := range p.current {
		if c.ready && p.status[c.id] == StatusReady { // not scaled down just now
			readyCurrent++
		}
	}
	if readyCurrent >= p.in.Desired {
		n := len(p.noticed)
		p.scaleDown(p.noticed, map[bool]int{true: n, false: n}, 0, "spot interruption notice; replaced")
	}
}

// launch asks for each kind's missing replicas (split), unless that kind's launch backoff
// holds; during a rollout (weight) at most max_parallel new replicas start at once.
func (p *pass) launch(weight rolloutWeight, split kindSplit) {
	in := p.in
	if in.Desired < 0 {
		return
	}
	if n := split.want.OnDemand - split.liveOnDemand; n > 0 && !p.deferred(in.ConsecutiveFailures, in.LastFailure) {
		p.out.Launch = n
	}
	if n := split.want.Spot - split.liveSpot; n > 0 && !p.deferred(in.SpotFailures, in.SpotLastFailure) {
		p.out.LaunchSpot = n
	}
	if weight.holding {
		// Started means launched and not yet healthy.
		budget := max(0, maxParallel(in.Rollout.Policy, in.Desired)-(p.liveCurrent()-weight.healthy))
		p.out.Launch = min(p.out.Launch, budget)
		p.out.LaunchSpot = min(p.out.LaunchSpot, budget-p.out.Launch)
	}
}

// spreadSpot asks for a spread move (actions.SpreadFrom, policy.Crowded) when the service
// spreads its spot replicas (Spread) and they have settled: no launch, move, rollout or
// reclaim notice under way, nothing asked for in this pass, every current spot replica READY
// in a zone it names, and no move found no zone within SpreadAfter.
func (p *pass) spreadSpot(weight rolloutWeight) {
	in := p.in
	if !in.Spread || in.Desired < 0 || weight.holding || in.Now.Before(in.SpreadAfter) || p.launching > 0 || p.moving > 0 ||
		len(p.noticed) > 0 || p.out.Launch+p.out.LaunchSpot > 0 {
		return
	}
	var zones []policy.ZoneState
	at := map[string]int{}
	for _, c := range p.current {
		if !c.spot {
			continue
		}
		if !c.ready || p.status[c.id] != StatusReady || c.zone == "" {
			return
		}
		i, ok := at[c.zone]
		if !ok {
			i = len(zones)
			at[c.zone] = i
			zones = append(zones, policy.ZoneState{Name: c.zone})
		}
		zones[i].Spot++
	}
	if i, ok := policy.Crowded(zones); ok {
		p.out.SpreadFrom = zones[i].Name
	}
}

// deferred reports whether a kind's backoff after failures holds its launches now, and keeps
// the earliest time one is allowed again in the actions.
func (p *pass) deferred(failures int, last time.Time) bool {
	notBefore := last.Add(launchBackoff(failures))
	if failures <= 0 || !p.in.Now.Before(notBefore) {
		return false
	}
	if p.out.LaunchDeferredUntil.IsZero() || notBefore.Before(p.out.LaunchDeferredUntil) {
		p.out.LaunchDeferredUntil = notBefore
	}
	return true
}

// scaleDown takes up to excess[kind] of cands out of service, in scale-down order
// (scaleDownOrder), keeping at least readyFloor of the READY ones. With Drain, a READY one only
// leaves the READY set now and is terminated once drained.
func (p *pass) scaleDown(cands []candidate, excess map[bool]int, readyFloor int, reason string) {
	slices.SortFunc(cands, scaleDownOrder)
	ready := 0
	for _, c := range cands {
		if c.ready && p.status[c.id] == StatusReady {
			ready++
		}
	}
	for _, c := range cands {
		if excess[c.spot] <= 0 {
			continue
		}
		if c.ready {
			if ready <= readyFloor {
				continue
			}
			ready--
		}
		excess[c.spot]--
		p.move(c.id, p.status[c.id], StatusShuttingDown, reason, nil)
		switch {
		case p.in.Drain && c.ready:
		case c.inst != nil:
			p.terminate(c.id, c.inst, true)
		default:
			p.out.Forget = append(p.out.Forget, c.id)
		}
	}
}

// countCrowds sets each spot candidate's crowd: how many of cands' spot replicas share its zone.
func countCrowds(cands []candidate) {
	byZone := map[string]int{}
	for _, c := range cands {
		if c.spot && c.zone != "" {
			byZone[c.zone]++
		}
	}
	for i := range cands {
		cands[i].crowd = byZone[cands[i].zone]
	}
}

// falseFirst orders false before true.
func falseFirst(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// scaleDownOrder puts first the replicas to remove first: those not serving, then those on the
// least preferred infra (burst replicas outside the cluster), then on-demand before spot, then
// spot replicas of the most crowded zone (what a spread move undoes, and what keeps a
// scale-down from undoing the spread), then the most expensive, then the newest.
func scaleDownOrder(a, b candidate) int {
	if c := falseFirst(a.ready, b.ready); c != 0 {
		return c
	}
	if c := cmp.Compare(b.rank, a.rank); c != 0 {
		return c
	}
	if c := falseFirst(a.spot, b.spot); c != 0 {
		return c
	}
	if c := cmp.Compare(b.crowd, a.crowd); c != 0 {
		return c
	}
	if c := cmp.Compare(b.price, a.price); c != 0 {
		return c
	}
	return cmp.Compare(b.id, a.id)
}
