package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// smallBodySize is the announced body size up to which a request is not counted in the body
// budget and a presented API key is checked only once its body is read: a connection's read and
// write buffers are about as large, so the connection caps bound these bodies too, and most
// chat requests are smaller, so their path stays free of locks and of a second key hash.
const smallBodySize = 16 << 10

// bodyBudget bounds the request bodies being read at once across a process, by their announced
// length: fasthttp allocates a body's Content-Length (or a chunk's size) before reading it, so a
// crowd of clients announcing large bodies and sending nothing could otherwise hold gigabytes
// for a read timeout each. A server decides at a request's headers (prescreen.go) and leaves its
// verdict here, keyed by the request's header, for the handler to take: fasthttp's
// HeaderReceived hook sees only the header.
//
// A verdict whose request never reaches a handler (the client left between headers and body in
// a way fasthttp does not report) is dropped when the same pooled header starts its next
// request, or, once expired, when a reservation needs its room: its body cannot still be being
// read after the server's read timeout.
type bodyBudget struct {
	limit int64
	// count is len(pending), read without the lock: the request path's only cost while no
	// counted body is being read.
	count atomic.Int64

	mu      sync.Mutex
	used    int64
	pending map[*fasthttp.RequestHeader]verdict
}

// verdict is what a server decided about a request at its headers.
type verdict struct {
	// refusal is why the request is answered without its body being read; refuseNone admits it.
	refusal refusal
	// reserved is the budget held while the body is read.
	reserved int64
	// key is 1 + the index of the API key matched at the headers, 0 when none was checked.
	key int32
	// expires is when the verdict is stale, in unix nanoseconds.
	expires int64
}

// refusal is why a request was refused at its headers.
type refusal uint8

const (
	refuseNone   refusal = iota
	refuseBodies         // 503: the body budget is spent
)

func (b *bodyBudget) init(limit int64) {
	b.limit = limit
	b.pending = make(map[*fasthttp.RequestHeader]verdict)
}

// reserve holds n bytes for the body of the request with header h, unless the budget would be
// exceeded; a body larger than the whole budget is admitted when no other is counted. key is
// kept for the handler (see verdict).
func (b *bodyBudget) reserve(h *fasthttp.RequestHeader, n int64, key int32, now, expires int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropLocked(h)
	if b.used > 0 && b.used+n > b.limit {
		b.sweepLocked(now)
		if b.used > 0 && b.used+n > b.limit {
			return false
		}
	}
	b.used += n
	b.pending[h] = verdict{reserved: n, key: key, expires: expires}
	b.count.Store(int64(len(b.pending)))
	return true
}

// refuse leaves a refusal for the request with header h.
func (b *bodyBudget) refuse(h *fasthttp.RequestHeader, why refusal, expires int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dropLocked(h)
	b.pending[h] = verdict{refusal: why, expires: expires}
	b.count.Store(int64(len(b.pending)))
}

// take returns and forgets the verdict for the request with header h, giving its reservation
// back: its body has been read, or will not be. Without one it returns the zero verdict (admit,
// key unchecked), from a single atomic load while nothing is pending.
func (b *bodyBudget) take(h *fasthttp.RequestHeader) verdict {
	if b.count.Load() == 0 {
		return verdict{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.pending[h]
	b.dropLocked(h)
	return v
}

// dropLocked forgets h's verdict, if any, and gives its reservation back.
func (b *bodyBudget) dropLocked(h *fasthttp.RequestHeader) {
	v, ok := b.pending[h]
	if !ok {
		return
	}
	b.used -= v.reserved
	delete(b.pending, h)
	b.count.Store(int64(len(b.pending)))
}

// sweepLocked drops the verdicts expired at now.
func (b *bodyBudget) sweepLocked(now int64) {
	for h, v := range b.pending {
		if v.expires <= now {
			b.dropLocked(h)
		}
	}
}

// reading returns the bytes reserved for bodies being read and the verdicts pending.
func (b *bodyBudget) reading() (bytes int64, verdicts int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, len(b.pending)
}

// expiry is when a verdict made now by a server with this read timeout is stale.
func expiry(now time.Time, readTimeout time.Duration) int64 {
	return now.Add(readTimeout + time.Second).UnixNano()
}
