package proxy

import (
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// This file closes a replica's request when its client goes away before the response is done.
// An LLM request can wait minutes in a replica's queue and then generate for minutes more; a
// client that gave up (a timeout, a closed tab, a cancelled SDK call) should stop that work and
// free its place in least_load's and the autoscaler's counts. vLLM aborts a request when its
// connection closes, so closing the upstream connection is the signal.
//
// Two halves, neither of which fasthttp provides:
//
//   - Noticing the client left while nothing is being written to it (waiting for the response
//     header, or for a stream's first chunk): every clientWatchInterval a watcher asks the
//     client sockets of the exchanges in flight, without reading them, whether the peer shut
//     down or reset (Linux: poll for POLLRDHUP, which sees a FIN even behind unread bytes such
//     as a TLS close_notify; elsewhere recv with MSG_PEEK|MSG_DONTWAIT). This is what nginx
//     does (ngx_http_upstream_check_broken_connection), from its event loop. Like nginx without
//     proxy_ignore_client_abort, a client that half-closes after its request counts as gone.
//   - Knowing which upstream connection carries the exchange, so that it can be closed:
//     fasthttp picks it inside HostClient.Do and does not say (upstream.go binds them).

// clientWatchInterval is how often client sockets are peeked at; a request older than one
// interval is checked on each tick, so a departure is noticed within two.
const clientWatchInterval = 500 * time.Millisecond

// errClientLeft ends an exchange whose client went away: its upstream connection was closed on
// purpose, and the request must not be retried.
var errClientLeft = errors.New("proxy: the client closed its connection before the response was done")

// clientWatch is a Service's set of exchanges whose clients are watched: intrusive lists, so
// that joining and leaving allocates nothing, in shards, so that requests joining and leaving
// at once rarely wait for one another. Each exchange stays in the shard it was made for; only
// the watcher walks them all.
type clientWatch struct {
	shards []watchShard
	// made counts the exchanges made, to spread them over the shards.
	made atomic.Uint32
	// epoch counts ticks; an exchange is checked once it has seen a whole tick.
	epoch atomic.Uint64
	start sync.Once
	// candidates are the exchanges one tick peeks at, outside the shards' locks. Only the
	// watcher uses them.
	candidates []watched
}

// watchShard is one list of watched exchanges, padded to its own cache line so that shards
// locked by different cores do not slow each other.
type watchShard struct {
	mu   sync.Mutex
	head *exchange
	_    [48]byte
}

// init sizes the shards to the cores (four per core, a power of two): a request holds its
// shard for a few pointer writes, so with this many two requests rarely meet.
func (w *clientWatch) init() {
	n := 1
	for n < 4*runtime.GOMAXPROCS(0) {
		n *= 2
	}
	w.shards = make([]watchShard, n)
}

// shardIndex returns the shard of a new exchange.
func (w *clientWatch) shardIndex() uint32 {
	return (w.made.Add(1) - 1) & uint32(len(w.shards)-1)
}

type watched struct {
	ex   *exchange
	gen  uint64
	conn net.Conn
}

// watch adds ex, whose client is on conn, to the set; the watcher starts with the first.
func (s *Service) watch(ex *exchange, conn net.Conn) {
	if conn == nil {
		return
	}
	w := &s.clientWatch
	w.start.Do(func() { go s.watchClients() })
	sh := &w.shards[ex.watchShard]
	sh.mu.Lock()
	ex.watchGen++
	ex.watchEpoch = w.epoch.Load()
	ex.watchSeen = ex.progress.Load()
	ex.clientConn = conn
	ex.watchNext = sh.head
	if sh.head != nil {
		sh.head.watchPrev = ex
	}
	sh.head = ex
	ex.watching = true
	sh.mu.Unlock()
}

// unwatch removes ex from the set, if it is in it.
func (s *Service) unwatch(ex *exchange) {
	// Only ex's own request writes watching, so it may read it without the lock: an exchange
	// answered before it was watched takes no lock at all.
	if !ex.watching {
		return
	}
	sh := &s.clientWatch.shards[ex.watchShard]
	sh.mu.Lock()
	if ex.watchPrev != nil {
		ex.watchPrev.watchNext = ex.watchNext
	} else {
		sh.head = ex.watchNext
	}
	if ex.watchNext != nil {
		ex.watchNext.watchPrev = ex.watchPrev
	}
	ex.watchPrev, ex.watchNext, ex.watching, ex.clientConn = nil, nil, false, nil
	sh.mu.Unlock()
}

// watchClients peeks at the watched clients every clientWatchInterval until the service stops.
func (s *Service) watchClients() {
	tick := time.NewTicker(clientWatchInterval)
	defer tick.Stop()
	w := &s.clientWatch
	for {
		select {
		case <-s.stopped:
			return
		case <-tick.C:
		}
		epoch := w.epoch.Add(1)
		w.candidates = w.candidates[:0]
		for i := range w.shards {
			w.candidates = w.shards[i].candidates(epoch, w.candidates)
		}
		for i := range w.candidates {
			c := &w.candidates[i]
			if !clientGone(c.conn) {
				continue
			}
			sh := &w.shards[c.ex.watchShard]
			sh.mu.Lock()
			if c.ex.watching && c.ex.watchGen == c.gen { // still the same request
				c.ex.abandon()
			}
			sh.mu.Unlock()
		}
		clear(w.candidates) // do not pin pooled exchanges or connections
	}
}

// candidates appends the shard's exchanges that are worth a peek at tick epoch: watched for a
// whole tick, and with no response bytes since the last tick.
func (sh *watchShard) candidates(epoch uint64, dst []watched) []watched {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for ex := sh.head; ex != nil; ex = ex.watchNext {
		if p := ex.progress.Load(); p != ex.watchSeen {
			ex.watchSeen = p // streaming: a departure shows when the next bytes are written
			continue
		}
		if ex.watchEpoch+1 < epoch && !ex.clientLeft.Load() {
			dst = append(dst, watched{ex: ex, gen: ex.watchGen, conn: ex.clientConn})
		}
	}
	return dst
}

// abandon marks ex's client gone and closes the upstream connection carrying its request, so
// the replica stops working on it and the blocked read returns.
func (ex *exchange) abandon() {
	ex.clientLeft.Store(true)
	if c := ex.upstream.Load(); c != nil {
		c.closeFor(ex)
	}
	if sm := ex.svc.obs.metrics; sm != nil {
		sm.clientAborts.Inc()
	}
}

// clientGone reports whether conn's peer has closed or reset it. Connections that cannot be
// peeked at (in-memory ones in tests) are never reported gone.
func clientGone(conn net.Conn) bool {
	for range 8 { // unwrap our own and TLS wrappers down to the socket
		if sc, ok := conn.(syscall.Conn); ok {
			rc, err := sc.SyscallConn()
			if err != nil {
				return false
			}
			return peekGone(rc)
		}
		nc, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			return false
		}
		conn = nc.NetConn()
	}
	return false
}
