package proxy

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// newServer is the client-facing HTTP server of a service or a gateway: the same limits and
// timeouts on every listener a client can reach.
func newServer(handler fasthttp.RequestHandler, onError func(*fasthttp.RequestCtx, error), maxBody int, log *zap.Logger) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:      handler,
		ErrorHandler: onError,
		// ReadTimeout limits a slow request; WriteTimeout stays 0 because fasthttp applies it to
		// the whole response, which would cut long streams. Stalled clients are instead caught
		// by the per-write idle deadline on accepted connections (see wrapListener).
		ReadTimeout:        requestReadTimeout,
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

// wrapListener gives accepted connections the per-write idle deadline and, with tlsConfig,
// terminates TLS. TLS goes over the idle-deadline conn, so the deadline covers the raw socket
// writes and fasthttp still sees a *tls.Conn (ctx.IsTLS, X-Forwarded-Proto: https).
func wrapListener(ln net.Listener, idle time.Duration, tlsConfig *tls.Config) net.Listener {
	var wrapped net.Listener = &writeIdleListener{Listener: ln, idle: idle}
	if tlsConfig != nil {
		wrapped = tls.NewListener(wrapped, tlsConfig)
	}
	return wrapped
}
