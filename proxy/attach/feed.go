package attach

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ferryserve/ferry/proxy"
)

// Feed holds one service's replica set for long polls: Publish moves Seq and wakes every Wait.
// The zero value is ready to use, with Seq 0 (nothing published).
type Feed struct {
	mu       sync.Mutex
	seq      uint64
	backends []proxy.Backend
	// changed is closed, and replaced, when seq moves.
	changed chan struct{}
}

// Publish replaces the backends (nil keeps them: a configuration change) and moves Seq.
//
// The first Seq is the wall clock in nanoseconds, later ones count up from it, so a
// restarted controller's Seqs are above any its predecessor handed out and a proxy still on
// the old set is seen to lag.
func (f *Feed) Publish(backends []proxy.Backend) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if backends != nil {
		f.backends = slices.Clone(backends)
	}
	next := f.seq + 1
	if now := time.Now().UnixNano(); f.seq == 0 && now > 0 && uint64(now) > next {
		next = uint64(now)
	}
	f.seq = next
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// Seq returns the current Seq; 0 before the first Publish.
func (f *Feed) Seq() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// Wait returns the current set (Seq and Backends; the caller adds the rest) as soon as it is
// not the one a proxy at Seq after has: at once when a set was published and Seq differs from
// after, else once Publish moves Seq, wait passes or ctx ends, whichever is first. A Seq above
// after is the usual answer; one below means the proxy followed another controller.
func (f *Feed) Wait(ctx context.Context, after uint64, wait time.Duration) ReplicaSet {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		f.mu.Lock()
		rs := ReplicaSet{Seq: f.seq, Backends: slices.Clone(f.backends)}
		if rs.Backends == nil {
			rs.Backends = []proxy.Backend{}
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		changed := f.changed
		f.mu.Unlock()
		if (rs.Seq != 0 && rs.Seq != after) || timeout == nil {
			return rs
		}
		select {
		case <-changed:
		case <-timeout:
			timeout = nil // answer with the set as it is now
		case <-ctx.Done():
			timeout = nil
		}
	}
}
