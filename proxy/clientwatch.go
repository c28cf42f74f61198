package proxy

import (
	"errors"
	"net"
	"sync"
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

// clientWatch is a Service's set of exchanges whose clients are watched, an intrusive list so
// that joining and leaving it allocates nothing.
type clientWatch struct {
	mu    sync.Mutex
	head  *exchange
	epoch uint64 // ticks so far; an exchange is checked once it has seen a whole tick
	start sync.Once
	// scratch holds the candidates of one tick, checked outside mu.
	scratch []watched
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
	w.mu.Lock()
	ex.watchGen++
	ex.watchEpoch = w.epoch
	ex.watchSeen = ex.progress.Load()
	ex.clientConn = conn
	ex.watchNext = w.head
	if w.head != nil {
		w.head.watchPrev = ex
	}
	w.head = ex
	ex.watching = true
	w.mu.Unlock()
}

// unwatch removes ex from the set, if it is in it.
func (s *Service) unwatch(ex *exchange) {
	w := &s.clientWatch
	w.mu.Lock()
	if ex.watching {
		if ex.watchPrev != nil {
			ex.watchPrev.watchNext = ex.watchNext
		} else {
			w.head = ex.watchNext
		}
		if ex.watchNext != nil {
			ex.watchNext.watchPrev = ex.watchPrev
		}
		ex.watchPrev, ex.watchNext, ex.watching, ex.clientConn = nil, nil, false, nil
	}
	w.mu.Unlock()
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
		w.mu.Lock()
		w.epoch++
		w.scratch = w.scratch[:0]
		for ex := w.head; ex != nil; ex = ex.watchNext {
			if p := ex.progress.Load(); p != ex.watchSeen {
				ex.watchSeen = p // streaming: a departure shows when the next bytes are written
				continue
			}
			if ex.watchEpoch+1 < w.epoch && !ex.clientLeft.Load() {
				w.scratch = append(w.scratch, watched{ex: ex, gen: ex.watchGen, conn: ex.clientConn})
			}
		}
		w.mu.Unlock()
		for i := range w.scratch {
			c := &w.scratch[i]
			if !clientGone(c.conn) {
				continue
			}
			w.mu.Lock()
			if c.ex.watching && c.ex.watchGen == c.gen { // still the same request
				c.ex.abandon()
			}
			w.mu.Unlock()
		}
		clear(w.scratch) // do not pin pooled exchanges or connections
	}
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
