package rpc

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// The API must keep answering whoever holds the token while anyone who can reach its listener
// and does not hold it opens connections and leaves them idle: each one costs the controller a
// file descriptor, and a controller out of descriptors accepts nothing, its own CLI included.
// So a connection is trusted only once a request on it carried a valid token. Until then it
// gets HeaderTimeout to send its request, a 401 closes it, and when a listener reaches its cap
// the oldest such connection makes way for the new one. Authorised connections are never
// evicted and have no deadline while a request runs: `serve logs --follow` and the attach long
// poll last as long as they need; between requests they are closed after IdleTimeout.

// Timeouts and limits of the API server.
const (
	// HeaderTimeout bounds reading a request's headers (a TLS handshake included), from the
	// moment the connection is accepted or, on a kept-alive one, its next request begins.
	HeaderTimeout = 5 * time.Second
	// IdleTimeout closes a kept-alive connection that sends no new request for this long.
	IdleTimeout = time.Minute
	// refusalTimeout bounds writing a 401 to a client that does not read it.
	refusalTimeout = 5 * time.Second
	// maxHeaderBytes bounds a request's headers: the API's are a token and a content type.
	maxHeaderBytes = 64 << 10
	// Connection caps per listener, scaled to the descriptors the process may open (an
	// eighth of them each, so that the socket, a TCP listener and everything else the
	// controller opens still fit).
	minConnsPerListener = 16
	maxConnsPerListener = 512
)

// Server serves the API on the controller's listeners: its Unix socket, and a TCP address when
// asked for. Create with NewServer.
type Server struct {
	srv      *http.Server
	maxConns int
}

// NewServer returns a server for handler (NewHandler's). maxConns caps the connections each
// listener holds at once; 0 scales it to the process's descriptor limit. log may be nil.
func NewServer(handler http.Handler, maxConns int, log *zap.Logger) *Server {
	if maxConns <= 0 {
		maxConns = DefaultMaxConns()
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: HeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if gc := asGuarded(c); gc != nil {
				return context.WithValue(ctx, connKey{}, gc)
			}
			return ctx
		},
		ConnState: func(c net.Conn, state http.ConnState) {
			if gc := asGuarded(c); gc != nil {
				gc.state.Store(int32(state))
			}
		},
	}
	if log != nil {
		srv.ErrorLog = zap.NewStdLog(log)
	}
	return &Server{srv: srv, maxConns: maxConns}
}

// DefaultMaxConns is the per-listener connection cap for this process's descriptor limit.
func DefaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return minConnsPerListener * 4
	}
	return int(min(max(lim.Cur/8, minConnsPerListener), maxConnsPerListener))
}

// Serve serves plain HTTP on ln until Shutdown; like http.Server.Serve it returns
// http.ErrServerClosed then.
func (s *Server) Serve(ln net.Listener) error {
	return s.srv.Serve(s.guard(ln))
}

// ServeTLS serves HTTPS on ln with cfg until Shutdown.
func (s *Server) ServeTLS(ln net.Listener, cfg *tls.Config) error {
	return s.srv.Serve(tls.NewListener(s.guard(ln), cfg))
}

// Shutdown stops the listeners, closes idle connections and waits for requests in flight
// until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close closes the listeners and every connection at once.
func (s *Server) Close() error { return s.srv.Close() }

func (s *Server) guard(ln net.Listener) net.Listener {
	return &guardListener{Listener: ln, max: s.maxConns, conns: map[*guardedConn]struct{}{}}
}

// guardListener caps the connections it has accepted and not yet seen closed.
type guardListener struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns map[*guardedConn]struct{}
}

// Accept accepts the next connection. At the cap it closes the oldest connection that has not
// authenticated, or, when every connection has, the new one.
func (l *guardListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		gc := &guardedConn{Conn: c, l: l, accepted: time.Now()}
		victim := l.admit(gc)
		if victim == nil {
			return gc, nil
		}
		victim.Close()
		if victim != gc {
			return gc, nil
		}
	}
}

// admit registers gc and returns the connection to close to stay within the cap, if any.
func (l *guardListener) admit(gc *guardedConn) *guardedConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns[gc] = struct{}{}
	if len(l.conns) <= l.max {
		return nil
	}
	var oldest *guardedConn
	for c := range l.conns {
		if c == gc || c.authenticated.Load() {
			continue
		}
		if oldest == nil || c.evictBefore(oldest) {
			oldest = c
		}
	}
	if oldest == nil {
		return gc
	}
	return oldest
}

func (l *guardListener) forget(gc *guardedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, gc)
}

// guardedConn is one accepted connection.
type guardedConn struct {
	net.Conn
	l        *guardListener
	accepted time.Time
	// authenticated is set once a request on it carried a valid token.
	authenticated atomic.Bool
	// state is the latest http.ConnState.
	state     atomic.Int32
	closeOnce sync.Once
}

// evictBefore orders eviction: connections that have sent nothing go before those that have
// started a request, older before newer.
func (c *guardedConn) evictBefore(o *guardedConn) bool {
	cNew, oNew := http.ConnState(c.state.Load()) == http.StateNew, http.ConnState(o.state.Load()) == http.StateNew
	if cNew != oNew {
		return cNew
	}
	return c.accepted.Before(o.accepted)
}

func (c *guardedConn) Close() error {
	c.closeOnce.Do(func() { c.l.forget(c) })
	return c.Conn.Close()
}

// connKey is the request context key of the request's *guardedConn.
type connKey struct{}

// asGuarded finds the guardedConn under c (a *tls.Conn wraps it).
func asGuarded(c net.Conn) *guardedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	gc, _ := c.(*guardedConn)
	return gc
}

// trustConnection marks r's connection as authenticated: from now on it is kept alive and
// never evicted.
func trustConnection(r *http.Request) {
	if gc, ok := r.Context().Value(connKey{}).(*guardedConn); ok {
		gc.authenticated.Store(true)
	}
}

// refuseConnection makes the answer to r close its connection, within refusalTimeout.
func refuseConnection(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(refusalTimeout))
}
