package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// newServer is the client-facing HTTP server of a service or a gateway: the same limits and
// timeouts on every listener a client can reach, and requests judged at their headers
// (prescreen.go).
func newServer(handler fasthttp.RequestHandler, onError func(*fasthttp.RequestCtx, error), onHeaders func(*fasthttp.RequestHeader) fasthttp.RequestConfig,
	maxBody int, readTimeout time.Duration, log *zap.Logger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:        handler,
		ErrorHandler:   onError,
		HeaderReceived: onHeaders,
		// ReadTimeout limits a slow request; WriteTimeout stays 0 because fasthttp applies it to
		// the whole response, which would cut long streams. Stalled clients are instead caught
		// by the per-write idle deadline on accepted connections (see wrapListener).
		ReadTimeout:        readTimeout,
		IdleTimeout:        keepAliveIdleTimeout,
		MaxRequestBodySize: maxBody,
		ReadBufferSize:     readBufferSize,
		// Upstream headers pass through as they are: no invented Server or Content-Type.
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// A proxy forwards multipart bodies (audio uploads); parsing them would be wasted work.
		DisablePreParseMultipartForm: true,
		// Keep-alive clients are told to go away while the service drains.
		CloseOnShutdown:       true,
		SecureErrorLogMessage: true,
		Logger:                fasthttpLogger{log},
	}
}

// wrapListener is how a client reaches the HTTP server: accept errors that pass are waited out
// (accept.go), connections beyond the Guard's caps refused (guard.go), accepted connections get
// the per-write idle deadline and, with tlsConfig, TLS is terminated. TLS goes over the
// idle-deadline conn, so the deadline covers the raw socket writes and fasthttp still sees a
// *tls.Conn (ctx.IsTLS, X-Forwarded-Proto: https).
func wrapListener(ln net.Listener, idle time.Duration, tlsConfig *tls.Config, guard *Guard, log *zap.Logger) net.Listener {
	capped := &guardedListener{Listener: newRetryingListener(ln, log), guard: guard, plain: tlsConfig == nil, log: log}
	var wrapped net.Listener = &writeIdleListener{Listener: capped, idle: idle}
	if tlsConfig != nil {
		wrapped = tls.NewListener(wrapped, tlsConfig)
	}
	return wrapped
}

// frontend is the client-facing side shared by a Service and a Gateway: the fasthttp server and
// the listeners it serves on.
type frontend struct {
	server *fasthttp.Server
	// guard caps the client connections of every listener; log gets their accept errors.
	guard *Guard
	log   *zap.Logger

	mu        sync.Mutex
	listeners []net.Listener
	closed    bool
}

// serve wraps ln (idle deadline, TLS) and serves it until shutdown, then returns nil.
func (f *frontend) serve(ln net.Listener, idle time.Duration, tlsConfig *tls.Config) error {
	wrapped := wrapListener(ln, idle, tlsConfig, f.guard, f.log)
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		_ = ln.Close()
		return ErrClosed
	}
	f.listeners = append(f.listeners, wrapped)
	f.mu.Unlock()
	return f.server.Serve(wrapped)
}

// shutdown stops accepting, tells keep-alive clients to close and waits for the server's
// connections to finish or ctx to end.
func (f *frontend) shutdown(ctx context.Context) error {
	f.mu.Lock()
	f.closed = true
	listeners := f.listeners
	f.listeners = nil
	f.mu.Unlock()
	// Closing the listeners here covers a serve that has not registered with the server yet;
	// the server's own close of the same listeners then reports net.ErrClosed.
	for _, ln := range listeners {
		_ = ln.Close()
	}
	if err := f.server.ShutdownWithContext(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
