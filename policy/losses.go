package policy

import (
	"slices"
	"time"
)

// Losses is what a service has seen of spot capacity being taken back (reclaim notices,
// preemptions) and learns from it how long to keep the on-demand fallback once spot is READY
// again (Split releases it at once).
//
// Spot losses come in runs: a zone that took instances back often takes more, or all of them,
// within the hour, and a replacement is a whole cold start away. Releasing the fallback as soon
// as spot replicas are READY leaves the service with nothing standing when the next loss of the
// run comes, and a loss of every zone at once (the probed traces lose whole zones) then leaves
// no replica READY until the replacements' cold start ends. So the fallback is held while the
// last loss is more recent than what the gaps between recent losses say a run lasts: the
// HoldQuantile of the gaps seen within the last HoldLookback, at most HoldMost; with fewer
// than HoldMinGaps such gaps losses are not coming in runs and nothing is held. A service
// whose spot is calm pays nothing for it; one on volatile capacity keeps its fallback through
// the run. What is held is at most what the run's largest loss took, and one more (Split's
// one more): a fallback standing because spot capacity ran short, not because it was taken
// back, goes as soon as spot is READY. The state is small and plain, for the controller to
// save across restarts.
//
// Losses also keeps what the zones showed of their spot capacity against the service's own
// fleet (Capped): how many of its spot replicas a zone held when every zone refused a spot
// launch, or when a reclaim left some of them there. A zone that holds that many again holds
// all it held at its ceiling, and the next dip of its capacity takes a replica, with a cold
// start before a replacement serves; a zone below it has room to lose some capacity first.
// While a zone holding spot replicas sits at a ceiling seen within HoldLookback the service
// runs a spare (Spare, Split): one more spot replica, or an on-demand one when spot cannot
// hold it, as SkyServe+SpotHedge does all the time. Where the zones hold more than the fleet
// uses, or lose whole zones at once (a ceiling of none is an outage, not a tight zone), no
// ceiling is seen and nothing is paid for it.
type Losses struct {
	// Last is when the latest loss was seen; zero before any.
	Last time.Time `json:"last,omitzero"`
	// Gaps are the times between losses, oldest first, at most keepGaps of them.
	Gaps []time.Duration `json:"gaps,omitempty"`
	// Sizes are the instances each loss took, oldest first, the last one Last's: one more
	// than Gaps once a loss is seen.
	Sizes []int `json:"sizes,omitempty"`
	// Zones are the losses per zone ("us-east-1a", "gcp/us-central1-b": what the caller
	// names), for `serve status -v`.
	Zones map[string]ZoneLosses `json:"zones,omitempty"`
}

// ZoneLosses is what one zone took back.
type ZoneLosses struct {
	// Count is the losses recorded in the zone (a notice, a preemption), Last the latest.
	Count int       `json:"count"`
	Last  time.Time `json:"last"`
	// Ceiling is how many of the service's spot replicas the zone held when it last showed it
	// would hold no more (Capped), CeilingAt when; zero before any.
	Ceiling   int       `json:"ceiling,omitempty"`
	CeilingAt time.Time `json:"ceiling_at,omitzero"`
}

const (
	// LossMerge is how close losses are taken as one: a zone's instances warned together,
	// the notices of one reclaim arriving one by one.
	LossMerge = time.Minute
	// HoldQuantile, HoldLookback, HoldMinGaps and HoldMost are Losses.Hold's rule.
	HoldQuantile = 0.25
	HoldLookback = 24 * time.Hour
	HoldMinGaps  = 3
	HoldMost     = 30 * time.Minute
	// keepGaps bounds the history.
	keepGaps = 64
)

// Lost records an instance lost in zone at t (zone may be empty). Losses within LossMerge of
// the last are the same loss for the hold.
func (l *Losses) Lost(t time.Time, zone string) {
	if zone != "" {
		if l.Zones == nil {
			l.Zones = map[string]ZoneLosses{}
		}
		z := l.Zones[zone]
		z.Count++
		z.Last = t
		l.Zones[zone] = z
	}
	if !l.Last.IsZero() && t.Sub(l.Last) <= LossMerge {
		// The same loss, its notices still arriving: the gap to the next starts from here,
		// so that a reclaim drawn out over minutes does not read as a run of short gaps.
		l.Last = maxTime(l.Last, t)
		if n := len(l.Sizes); n > 0 {
			l.Sizes[n-1]++
		}
		return
	}
	if !l.Last.IsZero() {
		l.Gaps = append(l.Gaps, t.Sub(l.Last))
		if len(l.Gaps) > keepGaps {
			l.Gaps = slices.Delete(l.Gaps, 0, len(l.Gaps)-keepGaps)
		}
	}
	l.Sizes = append(l.Sizes, 1)
	if len(l.Sizes) > keepGaps+1 {
		l.Sizes = slices.Delete(l.Sizes, 0, len(l.Sizes)-keepGaps-1)
	}
	l.Last = t
}

// Capped records that zone held no more than held of the service's spot replicas at t: every
// zone refused a spot launch then, or a reclaim left held there. A zone left with none was out
// of spot, which says nothing of how much it holds when it has some: not recorded, and it
// drops a ceiling recorded within LossMerge before, which the same reclaim's earlier notices
// left (a zone's notices arrive one by one).
func (l *Losses) Capped(t time.Time, zone string, held int) {
	if zone == "" {
		return
	}
	z, ok := l.Zones[zone]
	if held <= 0 {
		if ok && z.Ceiling > 0 && t.Sub(z.CeilingAt) <= LossMerge {
			z.Ceiling, z.CeilingAt = 0, time.Time{}
			l.Zones[zone] = z
		}
		return
	}
	if l.Zones == nil {
		l.Zones = map[string]ZoneLosses{}
	}
	z.Ceiling, z.CeilingAt = held, t
	l.Zones[zone] = z
}

// Spare is how many spare spot replicas the service runs beyond its target at now (Split): one
// while a zone holds at least as many of its spot replicas (held, live ones per zone) as at a
// ceiling seen within HoldLookback, else none.
func (l *Losses) Spare(now time.Time, held map[string]int) int {
	for zone, z := range l.Zones {
		if z.Ceiling > 0 && now.Sub(z.CeilingAt) <= HoldLookback && held[zone] >= z.Ceiling {
			return 1
		}
	}
	return 0
}

// Hold is how long after the last loss the fallback is kept, as of now (see Losses).
func (l *Losses) Hold(now time.Time) time.Duration { return holdFor(l.RecentGaps(now)) }

// holdFor is the hold recent gaps learn (Hold); it sorts them.
func holdFor(recent []time.Duration) time.Duration {
	if len(recent) < HoldMinGaps {
		return 0
	}
	slices.Sort(recent)
	return min(recent[int(HoldQuantile*float64(len(recent)-1))], HoldMost)
}

// RecentGaps are the gaps between the losses of the last HoldLookback before now, newest
// first: what Hold learns from.
func (l *Losses) RecentGaps(now time.Time) []time.Duration {
	var recent []time.Duration
	end := l.Last
	for i := len(l.Gaps) - 1; i >= 0 && now.Sub(end) <= HoldLookback; i-- {
		recent = append(recent, l.Gaps[i])
		end = end.Add(-l.Gaps[i])
	}
	return recent
}

// Holding reports whether the fallback is held at now.
func (l *Losses) Holding(now time.Time) bool {
	return !l.Last.IsZero() && now.Sub(l.Last) < l.Hold(now)
}

// HoldOnDemand is how many live on-demand replicas the hold keeps at now: none when not
// holding, else the largest loss among the recent ones (those Hold learns from) and one more.
// The replica manager asks it at every pass: the gaps are read once.
func (l *Losses) HoldOnDemand(now time.Time) int {
	recent := l.RecentGaps(now)
	losses := len(recent) + 1 // the losses at both ends of those gaps
	if l.Last.IsZero() || now.Sub(l.Last) >= holdFor(recent) {
		return 0
	}
	largest := 0
	for _, n := range l.Sizes[max(0, len(l.Sizes)-losses):] {
		largest = max(largest, n)
	}
	return largest + 1
}

// Held is the on-demand count a service keeps given Split's want and the on-demand replicas
// live now: the fallback does not shrink below keep (HoldOnDemand) while it lasts (it may
// still grow), and never past the target.
func Held(want Mix, liveOnDemand, target, keep int) Mix {
	want.OnDemand = max(want.OnDemand, min(liveOnDemand, max(target, 0), keep))
	return want
}

// KeepStandIn keeps, on top of want (Split's), an on-demand stand-in for a missing spare that is
// live already until the spare is READY on spot, whether spot launches fail now or not (Held).
// Its launch needs a failed spot launch (Spare.SpotFailing); its staying does not, so a failure
// count that resets (a replica READY again after a failed probe, a restarted controller, the
// spot replacement of another loss coming READY) does not drain a stand-in that the next spot
// launch would fail to replace.
func KeepStandIn(want Mix, target int, m MixSpec, readySpot int, spare Spare, liveOnDemand int) Mix {
	if spare.Spot <= 0 || spare.SpotFailing || !m.DynamicFallback {
		return want
	}
	standing := Split(target, m, readySpot, Spare{Spot: spare.Spot, SpotFailing: true})
	return Held(want, liveOnDemand, target, standing.OnDemand)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
