package proxy

import (
	"bytes"
	"net/netip"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Access log sampling, per service: in each second the first accessLogFirst lines are written,
// then every accessLogThereafter-th. A quiet service logs every request; one at 10,000 requests
// a second writes about 200 lines a second instead of stalling on its log sink, and the metrics
// still count every request. Sampling is per Service, so a flood on one service cannot crowd
// another's lines out, and requests refused for their API key are sampled apart from the rest
// (with the same budget), so a flood of wrong keys cannot crowd out the requests served.
const (
	accessLogTick       = time.Second
	accessLogFirst      = 100
	accessLogThereafter = 100
)

// accessLogMessage is the message of every access log line; the sampler counts by message.
const accessLogMessage = "request"

// maxLoggedURI caps the request target copied for the access log, so a client sending an 8 KiB
// path cannot make every line of it 8 KiB.
const maxLoggedURI = 512

// newAccessLogger wraps the configured access logger with the sampler and the service field.
// Caller annotation is turned off: every line would name the same line of this file, at the
// cost of a runtime.Caller per line.
func newAccessLogger(l *zap.Logger, service string) *zap.Logger {
	return sampledAccessLogger(l, zap.String("service", service))
}

// sampledAccessLogger wraps l with the access log sampler and tags every line with who.
func sampledAccessLogger(l *zap.Logger, who zap.Field) *zap.Logger {
	return l.WithOptions(
		zap.WithCaller(false),
		zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return newSampler(c, accessLogTick, accessLogFirst, accessLogThereafter)
		}),
	).With(who)
}

// accessRecord is one finished request as the access log reports it. Its byte slices alias
// request and exchange buffers; logAccess copies what it writes.
//
// It deliberately has no place for headers, the query string or bodies: those carry API keys
// (Authorization, Cookie, ?key=...) and user content, which must never reach a log.
type accessRecord struct {
	requestID []byte
	method    []byte
	uri       []byte // request target; only its path is logged
	clientIP  netip.Addr
	status    int
	replicaID int // -1 when the proxy answered itself
	attempts  int
	duration  time.Duration
	ttft      time.Duration // -1 when there was no 2xx body
	bytesOut  int64
	usage     tokenUsage
	problem   string // what went wrong: an upstream error kind, "client_closed", or ""
	// unauthorized marks a request refused for its API key: its line goes through the
	// refused-key sampler.
	unauthorized bool
}

// logAccess writes r's line at Info, if the logger's level and sampler let it through; only then
// are the fields built, so a dropped line costs a level check and a sampler counter.
func (o *observability) logAccess(r *accessRecord) {
	log := o.accessLog
	if r.unauthorized {
		log = o.refusedLog
	}
	ce := log.Check(zap.InfoLevel, accessLogMessage)
	if ce == nil {
		return
	}
	fields := make([]zap.Field, 0, 14)
	fields = append(fields,
		zap.String("request_id", string(r.requestID)),
		zap.String("method", string(r.method)),
		zap.String("path", loggedPath(r.uri)),
		zap.Int("status", r.status),
	)
	if r.replicaID >= 0 {
		fields = append(fields, zap.Int("replica_id", r.replicaID))
	}
	fields = append(fields,
		zap.Int("attempts", r.attempts),
		zap.Duration("duration", r.duration),
	)
	if r.ttft >= 0 {
		fields = append(fields, zap.Duration("ttft", r.ttft))
	}
	fields = append(fields, zap.Int64("bytes_out", r.bytesOut))
	if r.usage.prompt >= 0 {
		fields = append(fields, zap.Int64("prompt_tokens", r.usage.prompt))
	}
	if r.usage.completion >= 0 {
		fields = append(fields, zap.Int64("completion_tokens", r.usage.completion))
	}
	if r.problem != "" {
		fields = append(fields, zap.String("error", r.problem))
	}
	if r.clientIP.IsValid() {
		fields = append(fields, zap.String("client_ip", r.clientIP.String()))
	}
	ce.Write(fields...)
}

// requestPath returns the path of a request target (RFC 9112 §3.2), without the query string,
// and for the absolute form without scheme, credentials and host.
func requestPath(uri []byte) []byte {
	absolute := len(uri) > 0 && uri[0] != '/' && uri[0] != '*' // not origin or asterisk form
	if i := bytes.Index(uri, []byte("://")); absolute && i >= 0 {
		rest := uri[i+3:]
		if j := bytes.IndexAny(rest, "/?#"); j >= 0 && rest[j] == '/' {
			uri = rest[j:]
		} else {
			uri = []byte("/")
		}
	}
	if i := bytes.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	return uri
}

// appendLoggedURI appends uri to dst, capped at maxLoggedURI bytes. A cut can only shorten the
// path or drop part of the query string, which requestPath discards anyway.
func appendLoggedURI(dst, uri []byte) []byte {
	return append(dst, uri[:min(len(uri), maxLoggedURI)]...)
}

// loggedPath is the path of a request target as access log lines show it: no query string, at
// most maxLoggedURI bytes.
func loggedPath(uri []byte) string {
	path := requestPath(uri)
	return string(path[:min(len(path), maxLoggedURI)])
}

// clientAddr is the address of the connection's peer, without allocating. It is the direct
// client, not X-Forwarded-For, which the client controls.
func clientAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	addr, _ := netip.AddrFromSlice(ctx.RemoteIP())
	return addr.Unmap()
}
