package policy

// powerOfTwo is "the power of two choices" (Mitzenmacher): sample two distinct replicas at
// random and send the request to the one with fewer in-flight requests. It reads two counters
// instead of all of them, and unlike least_load it does not send a burst of simultaneous picks,
// all seeing the same stale minimum, to one replica: each pick sees a different random pair.
// With equal loads the first sample wins, which is itself uniformly random.
type powerOfTwo struct {
	rand func() uint64
}

func (p *powerOfTwo) Pick(_ *Request, replicas []*Replica) *Replica {
	n := uint64(len(replicas))
	switch n {
	case 0:
		return nil
	case 1:
		return replicas[0]
	}
	// One draw gives both samples: 32 random bits each are plenty for any replica count, and
	// the modulo bias (n / 2³²) is negligible.
	x := p.rand()
	i := (x & 0xffffffff) % n
	j := (x >> 32) % (n - 1)
	if j >= i {
		j++ // j is uniform over the other n-1 replicas
	}
	a, b := replicas[i], replicas[j]
	if b.InFlight.Load() < a.InFlight.Load() {
		return b
	}
	return a
}
