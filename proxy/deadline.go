package proxy

import (
	"net"
	"sync/atomic"
	"time"
)

// deadlineConn keeps a connection's deadline ahead of its last read or write, so the timeout
// measures idleness, not the length of the exchange (Caddy's tcpRWTimeoutConn). A whole-request
// timeout would cut a long SSE stream; an idle deadline only ends one that has stalled.
//
// Setting a deadline on every call costs a runtime timer update per syscall (190 ns against
// 60 ns, BenchmarkIdleDeadline; about 1% of the proxy's CPU per small request). Instead each deadline is set idle plus a slack of idle/8
// ahead, and moved only once less than idle remains: a connection is cut after between idle and
// 9/8 idle of silence, with one timer update per idle/8 of traffic rather than one per chunk.
//
// Deadlines set by the connection's owner (fasthttp sets its own between requests) pass through
// and are overridden at the next read or write.
//
// Whether a deadline needs moving is judged on the monotonic clock alone (monoNow), one clock
// read where time.Now takes two: reading clocks was 9 % of the request path's CPU
// (TestHotPathWithinBudget's profile); the wall clock is read only to set a deadline.
type deadlineConn struct {
	net.Conn
	readIdle  time.Duration // 0 leaves reads to the owner's deadlines
	writeIdle time.Duration // 0 leaves writes to the owner's deadlines
	// readUntil and writeUntil are the deadlines this wrapper last set, on monoNow's clock;
	// 0 when the owner's is in force.
	readUntil  atomic.Int64
	writeUntil atomic.Int64
}

// deadlineSlackDiv sets the slack: deadlines run idle + idle/deadlineSlackDiv ahead.
const deadlineSlackDiv = 8

// NetConn returns the wrapped connection.
func (c *deadlineConn) NetConn() net.Conn { return c.Conn }

func (c *deadlineConn) Read(p []byte) (int, error) {
	if c.readIdle > 0 {
		if err := c.extend(&c.readUntil, c.readIdle, c.Conn.SetReadDeadline); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if c.writeIdle > 0 {
		if err := c.extend(&c.writeUntil, c.writeIdle, c.Conn.SetWriteDeadline); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
}

// extend moves a deadline to now + idle + slack unless the one in force is at least idle away.
func (c *deadlineConn) extend(until *atomic.Int64, idle time.Duration, set func(time.Time) error) error {
	now := monoNow()
	if until.Load()-now >= int64(idle) {
		return nil
	}
	ahead := idle + idle/deadlineSlackDiv
	if err := set(time.Now().Add(ahead)); err != nil {
		return err
	}
	until.Store(now + int64(ahead))
	return nil
}

// monoEpoch anchors monoNow; monoNow is nanoseconds since it on the monotonic clock, never 0.
var monoEpoch = time.Now()

func monoNow() int64 { return int64(time.Since(monoEpoch)) + 1 }

// The owner's deadlines replace ours until the next read or write sets ours again. An owner
// that clears a deadline (a zero time) where we keep an idle one leaves ours in force, without
// touching the connection: fasthttp's client clears both before every request it sends, and
// forwarding that, then setting ours again at the next read and write, cost four runtime timer
// updates per request (TestHotPathWithinBudget).

func (c *deadlineConn) SetDeadline(t time.Time) error {
	if t.IsZero() && c.readIdle > 0 && c.writeIdle > 0 {
		return nil
	}
	c.readUntil.Store(0)
	c.writeUntil.Store(0)
	return c.Conn.SetDeadline(t)
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() && c.readIdle > 0 {
		return nil
	}
	c.readUntil.Store(0)
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	if t.IsZero() && c.writeIdle > 0 {
		return nil
	}
	c.writeUntil.Store(0)
	return c.Conn.SetWriteDeadline(t)
}

// writeIdleListener gives every accepted client connection a per-write idle deadline. The server's
// WriteTimeout would cover a whole response; this instead catches a client that stops reading a
// stream (its socket buffer full) without closing, which would otherwise pin the replica slot and
// the upstream connection forever. Reads keep the server's ReadTimeout and IdleTimeout.
type writeIdleListener struct {
	net.Listener
	idle time.Duration
}

func (l *writeIdleListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &deadlineConn{Conn: c, writeIdle: l.idle}, nil
}
