package policy

import (
	"math"

	"github.com/cespare/xxhash/v2"
)

// sessionAffinity sends every request of a session (the X-Session-Id header) to the same
// replica, so a multi-turn conversation finds its earlier turns in that replica's prefix cache.
//
// It is rendezvous (highest-random-weight) hashing with bounded loads: each replica gets a
// pseudo-random weight from hash(session, replica ID), and the request goes to the replica with
// the highest weight among those whose in-flight count is below
// ceil(c × (total in-flight + 1) / replicas) (Mirrokni, Thorup and Zadimoghaddam, "Consistent
// Hashing with Bounded Loads", 2018). So:
//   - a session stays on its replica while that replica is within the bound;
//   - adding or removing a replica moves only the sessions that rank it first, about 1/n of
//     them, because every other replica's weight for a session is unchanged (a ring would need
//     virtual nodes to get the same evenness; rendezvous hashing needs no state at all);
//   - a hot session cannot pile onto one replica: past the bound its requests go to the
//     session's second choice, which is the same replica for every such request.
//
// The bound always leaves a replica eligible: the least loaded one holds at most the mean,
// which is below the bound since c ≥ 1. Requests without a session id go to the least loaded
// replica.
type sessionAffinity struct {
	factor   float64
	fallback leastLoad
}

// Needs reports that the picker reads the session id.
func (*sessionAffinity) Needs() Needs { return NeedsSession }

func (p *sessionAffinity) Pick(req *Request, replicas []*Replica) *Replica {
	if len(req.SessionID) == 0 || len(replicas) == 0 {
		return p.fallback.Pick(req, replicas)
	}
	var total int64
	for _, r := range replicas {
		total += r.InFlight.Load()
	}
	capacity := int64(math.Ceil(p.factor * float64(total+1) / float64(len(replicas))))
	key := xxhash.Sum64(req.SessionID)
	var best *Replica
	var bestWeight uint64
	for _, r := range replicas {
		if r.InFlight.Load() >= capacity {
			continue
		}
		if w := rendezvousWeight(key, r.ID); best == nil || w > bestWeight {
			best, bestWeight = r, w
		}
	}
	if best == nil {
		// Only when in-flight counts moved between the two passes.
		return p.fallback.Pick(req, replicas)
	}
	return best
}

// rendezvousWeight is replica id's weight for key: a 64-bit mix of both (the murmur3 finalizer
// over the key xor a mix of the id), so weights for one key are independent across replicas.
// Replica IDs are never reused within a service, so a replacement replica gets new weights
// rather than inheriting sessions whose cache it does not have.
func rendezvousWeight(key uint64, id int) uint64 {
	return fmix64(key ^ fmix64(uint64(id)+0x9e3779b97f4a7c15))
}

// fmix64 is murmur3's 64-bit finalizer: a bijection whose every output bit depends on every
// input bit.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
