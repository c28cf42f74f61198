package proxy

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// ClientLimits bound what clients can make one Ferry process hold, whichever service they ask
// for: connections, each a file descriptor with its buffers, and the request bodies being read,
// which fasthttp allocates at their announced length before reading them. Every listener of a
// process (service endpoints, the gateway) shares them through one Guard, because descriptors
// and memory are the process's. Zero values select the defaults.
type ClientLimits struct {
	// MaxConnections caps the open client connections over every listener; more are answered
	// 503 (plain HTTP; over TLS they are closed) as they are accepted. Default: half the
	// process's file-descriptor limit (RLIMIT_NOFILE), at least 64, leaving the other half for
	// connections to replicas, health checks, logs and the store, so a flood of clients cannot
	// make the proxy fail to reach its replicas.
	MaxConnections int
	// MaxConnectionsPerAddr caps the open connections of one client address (an IPv6 client by
	// its /64); more are answered 429 and closed. Zero selects the default, a quarter of
	// MaxConnections but at least 16 (all of them when MaxConnections is lower), so that one
	// client opening connections and sending nothing holds at most a quarter of the slots and
	// never starves the others. NoConnectionCapPerAddr turns it off: behind a load balancer, an
	// ingress or a NAT many clients share one address.
	MaxConnectionsPerAddr int
	// MaxBufferedBodyBytes bounds the request bodies being read at once, counted at their
	// announced Content-Length (a chunked body as the service's largest allowed body) from the
	// moment its headers arrive until it is read. A request that would exceed it gets 503 with
	// Retry-After at its headers, before its body is read. Bodies of up to smallBodySize are not
	// counted: a connection's buffers are as large. A single body larger than the whole budget is
	// still read when no other counted body is. Default DefaultMaxBufferedBodyBytes.
	MaxBufferedBodyBytes int64
}

// DefaultMaxBufferedBodyBytes is the default budget for request bodies being read at once:
// sixteen bodies of the default 32 MiB limit. Clients on a local network send even large bodies
// in well under a second, so it is rarely the limit for honest traffic, while a crowd of
// clients announcing large bodies and sending them slowly (or never) can hold no more.
const DefaultMaxBufferedBodyBytes = 512 << 20

// NoConnectionCapPerAddr as ClientLimits.MaxConnectionsPerAddr caps no client address.
const NoConnectionCapPerAddr = -1

// minDefaultMaxConnectionsPerAddr keeps the default per-address cap useful to a client that
// opens a few parallel connections on a proxy with a small connection cap.
const minDefaultMaxConnectionsPerAddr = 16

// minDefaultMaxConnections keeps a process with a tiny descriptor limit serving a few clients.
const minDefaultMaxConnections = 64

func (l ClientLimits) withDefaults() ClientLimits {
	if l.MaxConnections == 0 {
		l.MaxConnections = defaultMaxConnections()
	}
	if l.MaxConnectionsPerAddr == 0 {
		l.MaxConnectionsPerAddr = max(l.MaxConnections/4, min(l.MaxConnections, minDefaultMaxConnectionsPerAddr))
	}
	if l.MaxBufferedBodyBytes == 0 {
		l.MaxBufferedBodyBytes = DefaultMaxBufferedBodyBytes
	}
	return l
}

func (l ClientLimits) validate() error {
	var errs []error
	if l.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("max connections: %d must not be negative", l.MaxConnections))
	}
	if l.MaxConnectionsPerAddr < NoConnectionCapPerAddr {
		errs = append(errs, fmt.Errorf("max connections per address: %d must be positive, 0 (the default) or %d (no cap)", l.MaxConnectionsPerAddr, NoConnectionCapPerAddr))
	}
	if l.MaxBufferedBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max buffered body bytes: %d must not be negative", l.MaxBufferedBodyBytes))
	}
	return errors.Join(errs...)
}

// defaultMaxConnections is half the soft RLIMIT_NOFILE (which Go raises to the hard limit at
// start), at least minDefaultMaxConnections.
func defaultMaxConnections() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return 4096 // no limit known: a typical one's half
	}
	return int(max(min(rl.Cur/2, 1<<30), minDefaultMaxConnections))
}

// Guard applies one process's ClientLimits. Its methods are safe for concurrent use. Make one
// per process and pass it to every ServiceConfig and GatewayConfig; those left without one
// share the process default.
type Guard struct {
	limits ClientLimits
	// open counts the client connections admitted and not closed yet.
	open atomic.Int64
	// perAddr counts open connections by client address, unless MaxConnectionsPerAddr is
	// NoConnectionCapPerAddr.
	addrMu  sync.Mutex
	perAddr map[[16]byte]int32
	// bodies is the budget of request bodies being read, and the verdicts of requests judged at
	// their headers (budget.go, prescreen.go).
	bodies bodyBudget
}

// NewGuard validates limits and returns a Guard applying them, with the defaults for zero
// values.
func NewGuard(limits ClientLimits) (*Guard, error) {
	if err := limits.validate(); err != nil {
		return nil, fmt.Errorf("client limits: %w", err)
	}
	limits = limits.withDefaults()
	g := &Guard{limits: limits}
	if limits.MaxConnectionsPerAddr > 0 {
		g.perAddr = make(map[[16]byte]int32)
	}
	g.bodies.init(limits.MaxBufferedBodyBytes)
	return g, nil
}

// Limits returns the limits g applies, defaults filled in.
func (g *Guard) Limits() ClientLimits { return g.limits }

// processGuard is the Guard of services and gateways configured without one.
var processGuard = sync.OnceValue(func() *Guard {
	g, _ := NewGuard(ClientLimits{}) // the defaults are valid
	return g
})

// guardOr is g, or the process default when g is nil.
func guardOr(g *Guard) *Guard {
	if g == nil {
		return processGuard()
	}
	return g
}

// connRefusal says why a connection was not admitted.
type connRefusal uint8

const (
	connAdmitted        connRefusal = iota
	connTooMany                     // MaxConnections
	connTooManyFromAddr             // MaxConnectionsPerAddr
)

// admitConn counts c against the caps and returns it wrapped so that closing it gives its place
// back, or reports why not; a refused connection is not counted and still open.
func (g *Guard) admitConn(c net.Conn) (net.Conn, connRefusal) {
	if g.open.Add(1) > int64(g.limits.MaxConnections) {
		g.open.Add(-1)
		return c, connTooMany
	}
	gc := &guardedConn{Conn: c, guard: g}
	if g.perAddr != nil {
		if tcp, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			gc.addr, gc.perAddr = addrKey(tcp.IP), true
			if !g.addAddr(gc.addr) {
				g.open.Add(-1)
				return c, connTooManyFromAddr
			}
		}
	}
	return gc, connAdmitted
}

// addAddr counts one more connection from addr unless it has its cap already.
func (g *Guard) addAddr(addr [16]byte) bool {
	g.addrMu.Lock()
	defer g.addrMu.Unlock()
	n := g.perAddr[addr]
	if int(n) >= g.limits.MaxConnectionsPerAddr {
		return false
	}
	g.perAddr[addr] = n + 1
	return true
}

func (g *Guard) removeAddr(addr [16]byte) {
	g.addrMu.Lock()
	defer g.addrMu.Unlock()
	if n := g.perAddr[addr]; n > 1 {
		g.perAddr[addr] = n - 1
	} else {
		delete(g.perAddr, addr)
	}
}

// OpenConnections is the number of client connections open on the process's listeners.
func (g *Guard) OpenConnections() int64 { return g.open.Load() }

// BufferedBodyBytes is how much of MaxBufferedBodyBytes the request bodies being read hold.
func (g *Guard) BufferedBodyBytes() int64 {
	n, _ := g.bodies.reading()
	return n
}

// guardedConn is an admitted client connection; closing it gives its place back, once.
type guardedConn struct {
	net.Conn
	guard   *Guard
	addr    [16]byte
	perAddr bool
	closed  atomic.Bool
}

func (c *guardedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.guard.open.Add(-1)
		if c.perAddr {
			c.guard.removeAddr(c.addr)
		}
	}
	return c.Conn.Close()
}

// NetConn returns the wrapped connection (clientGone looks through it for the socket).
func (c *guardedConn) NetConn() net.Conn { return c.Conn }

// refusalWriteTimeout bounds writing the answer to a refused connection from the accept loop. A
// fresh socket's send buffer takes it at once; a client that manages to block it loses it.
const refusalWriteTimeout = 50 * time.Millisecond

// refusalWarnEvery spaces the warnings about refused connections: a flood must not flood the
// log as well.
const refusalWarnEvery = 10 * time.Second

// guardedListener admits accepted connections through a Guard's caps and refuses the others at
// once: answered (plain HTTP only) and closed, so that a flood costs a descriptor for
// microseconds and never reaches the HTTP server.
type guardedListener struct {
	net.Listener
	guard *Guard
	// plain is true when no TLS runs above: a refused connection gets an HTTP answer.
	plain bool
	log   *zap.Logger
	// warnedAt is when a refusal was last logged; only the accept loop touches it.
	warnedAt time.Time
}

// Accept implements net.Listener.
func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		admitted, refusal := l.guard.admitConn(c)
		if refusal == connAdmitted {
			return admitted, nil
		}
		l.refuse(c, refusal)
	}
}

// Answers to refused connections, written raw: the connection never reaches the HTTP server.
var (
	refusedTooMany = rawErrorResponse("503 Service Unavailable",
		openAIError("the proxy is at its limit of client connections; retry shortly", "service_unavailable", "too_many_connections"))
	refusedTooManyFromAddr = rawErrorResponse("429 Too Many Requests",
		openAIError("too many connections from your address; reuse connections (keep-alive) or retry shortly", "rate_limit_error", "too_many_connections"))
)

func rawErrorResponse(status string, body []byte) []byte {
	head := "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n"
	return append([]byte(head), body...)
}

// refuse answers a connection over the caps, when it is plain HTTP, and closes it.
func (l *guardedListener) refuse(c net.Conn, why connRefusal) {
	if l.plain {
		answer := refusedTooMany
		if why == connTooManyFromAddr {
			answer = refusedTooManyFromAddr
		}
		_ = c.SetWriteDeadline(time.Now().Add(refusalWriteTimeout))
		_, _ = c.Write(answer)
	}
	_ = c.Close()
	now := time.Now()
	if now.Sub(l.warnedAt) < refusalWarnEvery {
		return
	}
	l.warnedAt = now
	if why == connTooManyFromAddr {
		l.log.Warn("refusing connections: a client address is at its cap", zap.Int("max_connections_per_addr", l.guard.limits.MaxConnectionsPerAddr))
	} else {
		l.log.Warn("refusing connections: the process is at its cap of client connections", zap.Int("max_connections", l.guard.limits.MaxConnections))
	}
}
