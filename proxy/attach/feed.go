package attach

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ferryserve/ferry/proxy"
)

// board is a value that long polls wait on: each change moves its Seq and wakes every wait. The
// zero value holds the zero T at Seq 0 (nothing published). Feed and ServiceFeed are boards.
type board[T any] struct {
	mu    sync.Mutex
	seq   uint64
	value T
	// changed is closed, and replaced, when seq moves.
	changed chan struct{}
}

// update applies change to the value under the board's lock and, unless it reports that
// nothing changed, moves Seq and wakes every wait.
//
// The first Seq is the wall clock in nanoseconds, later ones count up from it, so a
// restarted controller's Seqs are above any its predecessor handed out and a proxy still on
// the old value is seen to lag.
func (b *board[T]) update(change func(*T) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !change(&b.value) {
		return
	}
	next := b.seq + 1
	if now := time.Now().UnixNano(); b.seq == 0 && now > 0 && uint64(now) > next {
		next = uint64(now)
	}
	b.seq = next
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

// current returns the Seq; 0 before the first update.
func (b *board[T]) current() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}

// wait returns the Seq and the value as read (a copy, under the lock) as soon as it is not the
// one a proxy at Seq after has: at once when something was published and Seq differs from
// after, else once update moves Seq, wait passes or ctx ends, whichever is first. A Seq above
// after is the usual answer; one below means the proxy followed another controller.
func (b *board[T]) wait(ctx context.Context, after uint64, wait time.Duration, read func(T) T) (uint64, T) {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		b.mu.Lock()
		seq, value := b.seq, read(b.value)
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		changed := b.changed
		b.mu.Unlock()
		if (seq != 0 && seq != after) || timeout == nil {
			return seq, value
		}
		select {
		case <-changed:
		case <-timeout:
			timeout = nil // answer with the value as it is now
		case <-ctx.Done():
			timeout = nil
		}
	}
}

// Feed holds one service's replica set for long polls: Publish moves Seq and wakes every Wait.
// The zero value is ready to use, with Seq 0 (nothing published).
type Feed struct {
	board board[[]proxy.Backend]
}

// Publish replaces the backends (nil keeps them: a configuration change) and moves Seq.
//
// The first Seq is the wall clock in nanoseconds, later ones count up from it, so a
// restarted controller's Seqs are above any its predecessor handed out and a proxy still on
// the old set is seen to lag.
func (f *Feed) Publish(backends []proxy.Backend) {
	f.board.update(func(cur *[]proxy.Backend) bool {
		if backends != nil {
			*cur = slices.Clone(backends)
		}
		return true
	})
}

// Seq returns the current Seq; 0 before the first Publish.
func (f *Feed) Seq() uint64 { return f.board.current() }

// Wait returns the current set (Seq and Backends; the caller adds the rest) as soon as it is
// not the one a proxy at Seq after has: at once when a set was published and Seq differs from
// after, else once Publish moves Seq, wait passes or ctx ends, whichever is first. A Seq above
// after is the usual answer; one below means the proxy followed another controller.
func (f *Feed) Wait(ctx context.Context, after uint64, wait time.Duration) ReplicaSet {
	seq, backends := f.board.wait(ctx, after, wait, func(bs []proxy.Backend) []proxy.Backend {
		if bs == nil {
			return []proxy.Backend{}
		}
		return slices.Clone(bs)
	})
	return ReplicaSet{Seq: seq, Backends: backends}
}
