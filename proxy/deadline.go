package proxy

import (
	"net"
	"time"
)

// deadlineConn moves a connection's deadline forward before every read and write, so the timeout
// measures idleness, not the length of the exchange (Caddy's tcpRWTimeoutConn). A whole-request
// timeout would cut a long SSE stream; an idle deadline only ends one that has stalled.
//
// Deadlines set by the connection's owner (fasthttp sets zero deadlines between requests) pass
// through and are overridden at the next read or write.
type deadlineConn struct {
	net.Conn
	readIdle  time.Duration // 0 leaves reads to the owner's deadlines
	writeIdle time.Duration // 0 leaves writes to the owner's deadlines
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	if c.readIdle > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(c.readIdle)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Read(p)
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if c.writeIdle > 0 {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.writeIdle)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
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
