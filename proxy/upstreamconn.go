package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Every upstream connection is wrapped (upstreamConn) so that the proxy knows three things
// fasthttp does not tell it:
//
//   - whether a replica is sending anything at all (replicaHealth.progress), which keeps the
//     health checks from ejecting a replica that is slow to answer /health but streaming tokens;
//   - which connections are open, so that an ejection can close them (abortConns);
//   - whether a chunked response really ended. fasthttp reads a chunked body whose connection
//     closes exactly between two chunks as a complete body (its chunk-size parser turns an EOF
//     before the first hex digit into io.EOF), so a replica killed between two SSE events
//     would look like a stream that ended normally, without [DONE] and without the error event
//     a client needs. A connection that saw the peer's EOF while its chunked body was still
//     being parsed did not end normally (bodyCut).

// errReplicaEjected is the error of a read or write on a connection the health check closed:
// the request never got an answer and may go to another replica.
var errReplicaEjected = errors.New("proxy: replica ejected: it stopped answering health checks")

// errBodyCut is a chunked response body whose connection closed before its last chunk.
var errBodyCut = errors.New("proxy: the replica closed the connection in the middle of a chunked response")

// replicaHealth is the health state of one replica address, part of its hostClient.
type replicaHealth struct {
	// progress counts reads that returned response bytes on the replica's connections; a
	// check that sees it move knows the replica is working, whatever its health endpoint says.
	progress atomic.Uint64

	// ejected, ejectedAt and keptLogged (when "stays in rotation" was last logged) are guarded
	// by the Service's mu.
	ejected    bool
	ejectedAt  time.Time
	keptLogged time.Time

	mu    sync.Mutex
	conns map[*upstreamConn]struct{}
}

// track wraps a new upstream connection so that its reads count as progress, an ejection can
// close it, and b can bind it to the exchanges it carries.
func (h *replicaHealth) track(conn net.Conn, b *binder) *upstreamConn {
	c := &upstreamConn{Conn: conn, owner: h, binder: b}
	h.mu.Lock()
	if h.conns == nil {
		h.conns = make(map[*upstreamConn]struct{})
	}
	h.conns[c] = struct{}{}
	h.mu.Unlock()
	return c
}

// abortConns closes every open connection to the replica and reports how many it closed.
func (h *replicaHealth) abortConns() int {
	h.mu.Lock()
	conns := make([]*upstreamConn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	for _, c := range conns {
		c.aborted.Store(true)
		_ = c.Conn.Close() // fasthttp's own Close follows when its read or write fails
	}
	return len(conns)
}

// bodyCut reports whether ex's response, whose body stream just returned io.EOF, was in fact
// cut: a chunked body whose connection had seen the replica close it (see above). The
// connection is the one bound to ex (upstream.go), so no lookup and no lock is needed.
func (ex *exchange) bodyCut() bool {
	if ex.resp.Header.ContentLength() != -1 { // -1: chunked; a sized body's end is checked by fasthttp
		return false
	}
	c := ex.upstream.Load()
	return c != nil && c.peerEOF.Load()
}

// upstreamConn is one connection of a replica's upstream client: replicaHealth tracks it, and
// it knows the exchange whose request it carries (upstream.go).
type upstreamConn struct {
	net.Conn
	owner  *replicaHealth
	binder *binder
	// aborted is set by an ejection; peerEOF when a read met the replica's end of the
	// connection.
	aborted atomic.Bool
	peerEOF atomic.Bool
	closed  atomic.Bool

	// bound is the exchange whose request the connection carries (clientwatch.go); fresh is
	// true from Dial, which bound it already, to its first SetWriteDeadline. clientLeft is set
	// when the connection was closed because that exchange's client went away.
	bound      atomic.Pointer[exchange]
	fresh      bool
	clientLeft atomic.Bool
}

// SetWriteDeadline is fasthttp's first call on a connection it acquired for a request, made by
// the goroutine in HostClient.Do: the moment to learn which exchange the connection carries.
func (c *upstreamConn) SetWriteDeadline(t time.Time) error {
	if c.clientLeft.Load() {
		return errStaleConn
	}
	if c.fresh {
		c.fresh = false
	} else if ex := c.binder.take(); ex != nil {
		c.bind(ex)
	}
	return c.Conn.SetWriteDeadline(t)
}

// NetConn returns the wrapped connection.
func (c *upstreamConn) NetConn() net.Conn { return c.Conn }

func (c *upstreamConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.owner.progress.Add(1)
	}
	if err != nil {
		if err == io.EOF {
			c.peerEOF.Store(true)
		}
		switch {
		case c.clientLeft.Load():
			err = errClientLeft
		case c.aborted.Load():
			err = errReplicaEjected
		}
	}
	return n, err
}

func (c *upstreamConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	switch {
	case err == nil:
	case c.clientLeft.Load():
		err = errClientLeft
	case c.aborted.Load():
		err = errReplicaEjected
	}
	return n, err
}

func (c *upstreamConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		h := c.owner
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
	}
	return c.Conn.Close()
}
