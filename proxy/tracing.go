package proxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Traces: OpenTelemetry spans for each request, with the GenAI semantic conventions' names,
// and W3C trace context passed on to the replicas. Off (a nil *Tracing) it costs the request
// path one nil check per hook; on, a span tree per request:
//
//	gateway | <service>       server: the whole request, to the end of its stream
//	├── hold                  waiting for a first replica or a free slot (hold.go), when it did
//	├── pick                  the picker's choice, once per attempt
//	└── chat <model>          client: one attempt on a replica, its stream included; the
//	                          first body byte is its "first_token" event; a failed attempt
//	                          ends in error and the next attempt is a sibling
//
// A client's traceparent is continued; each attempt sends the replica a traceparent naming its
// own span. Spans carry the model, the operation, the token counts the answer reported, the
// status and the replica, and never a header's value, a query string or a body.

// tracerName is the instrumentation scope of Ferry's spans.
const tracerName = "github.com/ferryserve/ferry/proxy"

// Tracing records the spans of the requests of every Service and Gateway it is given to
// (ServiceConfig.Tracing, GatewayConfig.Tracing); nil records none. One Tracing serves a
// process, like Metrics. Make it with NewTracing over any TracerProvider, or StartOTLP.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// shutdown flushes and stops the provider StartOTLP made; nil for a caller's provider.
	shutdown func(context.Context) error
}

// NewTracing records spans through tp, which the caller keeps and shuts down.
func NewTracing(tp trace.TracerProvider) *Tracing {
	return &Tracing{tracer: tp.Tracer(tracerName), prop: propagation.TraceContext{}}
}

// Shutdown sends the spans still buffered and stops the exporter StartOTLP made; it does
// nothing for a Tracing made with NewTracing. Call it after the services have drained, so
// that their last streams' spans go out too.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// Span and attribute names of Ferry's own, beside the semantic conventions'.
const (
	spanGateway    = "gateway"
	spanHold       = "hold"
	spanPick       = "pick"
	eventFirstByte = "first_token"

	attrService   = attribute.Key("ferry.service")
	attrReplicaID = attribute.Key("ferry.replica.id")
	attrAttempt   = attribute.Key("ferry.attempt")
	attrRequestID = attribute.Key("ferry.request_id")
	attrHoldFor   = attribute.Key("ferry.hold.for")
	attrPolicy    = attribute.Key("ferry.policy")

	// The GenAI conventions' names, which semconv packages after v1.40.0 no longer carry.
	attrGenAIOperation     = attribute.Key("gen_ai.operation.name")
	attrGenAIRequestModel  = attribute.Key("gen_ai.request.model")
	attrGenAIResponseModel = attribute.Key("gen_ai.response.model")
	attrGenAIInputTokens   = attribute.Key("gen_ai.usage.input_tokens")
	attrGenAIOutputTokens  = attribute.Key("gen_ai.usage.output_tokens")
	attrGenAICachedTokens  = attribute.Key("gen_ai.usage.cache_read.input_tokens")
)

// traceKey is the RequestCtx user value under which a request's *requestTrace travels from the
// gateway to the service and from the handler to the hold.
type traceKey struct{}

// requestTrace is one request's spans. It is made by the gateway or the service that first
// sees the request; the exchange that carries the request to a replica ends it when its
// stream ends (finish), else the handler that made it does when it returns (handled).
type requestTrace struct {
	t *Tracing
	// ctx carries the request's span, the parent of the others.
	ctx  context.Context
	span trace.Span
	// operation and model are the GenAI names of the request, once known (attach).
	operation, model string
	// attempt is the upstream attempt in progress or streaming; nil between attempts.
	attempt trace.Span
	// ex is the exchange carrying the request while it holds it; ended is set once span ended.
	ex    *exchange
	ended bool
}

// holdSpan is a hold's span (hold.go), nil when the request is not traced.
type holdSpan = trace.Span

// beginGateway starts the span of a request the gateway received; nil for the gateway's own
// health check, which load balancers poll and nobody traces.
func (t *Tracing) beginGateway(ctx *fasthttp.RequestCtx) *requestTrace {
	if bytes.Equal(ctx.Path(), pathHealth) {
		return nil
	}
	rt := t.begin(ctx, spanGateway)
	ctx.SetUserValue(traceKey{}, rt)
	return rt
}

// serve returns the trace of a request s handles: the gateway's when it came through one,
// else a new one under the service's name.
func (t *Tracing) serve(ctx *fasthttp.RequestCtx, s *Service) *requestTrace {
	rt, ok := ctx.UserValue(traceKey{}).(*requestTrace)
	if !ok {
		rt = t.begin(ctx, s.cfg.Name)
		ctx.SetUserValue(traceKey{}, rt)
	}
	if rt.span.IsRecording() {
		rt.span.SetAttributes(attrService.String(s.cfg.Name))
	}
	return rt
}

// begin starts a request's server span, continuing the client's trace when it sent a
// traceparent.
func (t *Tracing) begin(ctx *fasthttp.RequestCtx, name string) *requestTrace {
	parent := t.prop.Extract(context.Background(), headerCarrier{&ctx.Request.Header})
	rt := &requestTrace{t: t, operation: operationName(ctx.Path())}
	rt.ctx, rt.span = t.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ctx.Time()))
	if !rt.span.IsRecording() {
		return rt // not sampled: only its context is passed on
	}
	rt.span.SetAttributes(semconv.HTTPRequestMethodKey.String(string(ctx.Method())), semconv.URLPath(string(ctx.Path())))
	if rt.operation != "" {
		rt.span.SetAttributes(attrGenAIOperation.String(rt.operation))
	}
	return rt
}

// handled ends the request's span when its handler returns, unless an exchange still carries
// the request (a stream being written: finish ends it) or it has ended already.
func (rt *requestTrace) handled(ctx *fasthttp.RequestCtx) {
	if rt == nil || rt.ex != nil || rt.ended {
		return
	}
	rt.end(ctx.Response.StatusCode())
}

func (rt *requestTrace) end(status int) {
	rt.ended = true
	rt.span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	if status >= 500 {
		rt.span.SetStatus(codes.Error, strconv.Itoa(status))
	}
	rt.span.End()
}

// attach gives the request's trace to the exchange that carries it to the replicas, with
// what the exchange knows of it: its id and model. It returns nil when the request has no
// trace (a Handler called outside Service.handle).
func (t *Tracing) attach(ctx *fasthttp.RequestCtx, ex *exchange) *requestTrace {
	rt, ok := ctx.UserValue(traceKey{}).(*requestTrace)
	if !ok {
		return nil
	}
	rt.ex = ex
	if !rt.span.IsRecording() {
		return rt
	}
	model := ex.model
	if len(model) == 0 && ctx.IsPost() && !bytes.HasPrefix(ctx.Request.Header.ContentType(), contentTypeMultipart) {
		if f, err := scanBody(ctx.Request.Body()); err == nil {
			model = f.Model
		}
	}
	if m, ok := unescapedModel(model); ok && len(m) > 0 {
		rt.model = string(m)
		rt.span.SetAttributes(attrGenAIRequestModel.String(rt.model))
	}
	rt.span.SetAttributes(attrRequestID.String(string(ex.requestID)))
	return rt
}

// startHold starts the span of a request held for a replica or a slot; nil when the request
// is not traced.
func (t *Tracing) startHold(ctx *fasthttp.RequestCtx, s *Service) holdSpan {
	rt, ok := ctx.UserValue(traceKey{}).(*requestTrace)
	if !ok {
		return nil
	}
	what := "slot"
	if len(s.snap.Load().replicas) == 0 {
		what = "replica"
	}
	if !rt.span.IsRecording() {
		return nil
	}
	_, span := t.tracer.Start(rt.ctx, spanHold, trace.WithAttributes(attrHoldFor.String(what)))
	return span
}

// attemptBegin records the pick that began at picked and starts the span of the attempt on
// the replica it chose, whose traceparent goes to the replica with the request.
func (rt *requestTrace) attemptBegin(ex *exchange, picked time.Time) {
	t, r := rt.t, ex.replica
	if !rt.span.IsRecording() { // not sampled: the replica continues the request's context
		t.prop.Inject(rt.ctx, headerCarrier{&ex.req.Header})
		return
	}
	replica := attrReplicaID.Int(r.ID)
	_, pick := t.tracer.Start(rt.ctx, spanPick, trace.WithTimestamp(picked),
		trace.WithAttributes(replica, attrPolicy.String(ex.svc.cfg.Policy)))
	pick.End()

	attrs := []attribute.KeyValue{replica, attrAttempt.Int(ex.obs.attempts)}
	if host, port, err := net.SplitHostPort(r.Addr); err == nil {
		attrs = append(attrs, semconv.ServerAddress(host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.ServerPort(p))
		}
	}
	name := "upstream"
	if rt.operation != "" {
		attrs = append(attrs, attrGenAIOperation.String(rt.operation))
		name = rt.operation
		if rt.model != "" {
			name += " " + rt.model
		}
	}
	if rt.model != "" {
		attrs = append(attrs, attrGenAIRequestModel.String(rt.model))
	}
	var ctx context.Context
	ctx, rt.attempt = t.tracer.Start(rt.ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	t.prop.Inject(ctx, headerCarrier{&ex.req.Header})
}

// attemptFailed ends the current attempt's span in error.
func (rt *requestTrace) attemptFailed(err error) {
	span := rt.attempt
	if span == nil {
		return
	}
	rt.attempt = nil
	kind := attemptErrorKind(err).String()
	if se := (*statusError)(nil); errors.As(err, &se) {
		span.SetAttributes(semconv.HTTPResponseStatusCode(se.code))
	}
	span.SetAttributes(semconv.ErrorTypeKey.String(kind))
	span.RecordError(err)
	span.SetStatus(codes.Error, kind)
	span.End()
}

// firstToken marks the answer's first body byte on the attempt that streams it.
func (rt *requestTrace) firstToken(at time.Time) {
	if rt.attempt != nil {
		rt.attempt.AddEvent(eventFirstByte, trace.WithTimestamp(at))
	}
}

// finish ends the spans of a request whose answer has been streamed (exchange.finish): the
// attempt's and the request's, with the status, the token counts the answer reported and how
// the stream ended; err is fasthttp's, non-nil when the client did not get the whole body.
func (rt *requestTrace) finish(ex *exchange, err error, usage tokenUsage) {
	rt.ended = true
	if !rt.span.IsRecording() {
		rt.span.End()
		return
	}
	status := ex.resp.StatusCode()
	attrs := make([]attribute.KeyValue, 0, 5)
	attrs = append(attrs, semconv.HTTPResponseStatusCode(status))
	if usage.prompt >= 0 {
		attrs = append(attrs, attrGenAIInputTokens.Int64(usage.prompt))
	}
	if usage.completion >= 0 {
		attrs = append(attrs, attrGenAIOutputTokens.Int64(usage.completion))
	}
	if usage.cached >= 0 {
		attrs = append(attrs, attrGenAICachedTokens.Int64(usage.cached))
	}
	if status >= 200 && status <= 299 {
		if m := responseModel(ex.obs.tail.bytes()); len(m) > 0 {
			attrs = append(attrs, attrGenAIResponseModel.String(string(m)))
		}
	}
	failure := ""
	switch {
	case ex.readErr != nil && isTimeout(ex.readErr):
		failure = upstreamTimeout.String()
	case ex.readErr != nil:
		failure = upstreamStreamCut.String()
	case err != nil:
		failure = "client_closed"
	}
	// A client span fails from 400 on, a server span from 500 (the HTTP conventions).
	if rt.attempt != nil {
		endWith(rt.attempt, attrs, failure, status >= 400 || ex.readErr != nil, status)
		rt.attempt = nil
	}
	endWith(rt.span, attrs, failure, status >= 500 || ex.readErr != nil, status)
}

// endWith ends span with attrs, marked failed (error.type failure, else the status) when
// failed.
func endWith(span trace.Span, attrs []attribute.KeyValue, failure string, failed bool, status int) {
	span.SetAttributes(attrs...)
	if failure != "" {
		span.SetAttributes(semconv.ErrorTypeKey.String(failure))
	}
	if failed {
		span.SetStatus(codes.Error, cmpOr(failure, strconv.Itoa(status)))
	}
	span.End()
}

// release lets go of the exchange (releaseExchange): an attempt still open ends here, its client
// having left or the request having been answered by the proxy.
func (rt *requestTrace) release() {
	rt.ex = nil
	if rt.attempt != nil {
		rt.attempt.SetStatus(codes.Error, "abandoned")
		rt.attempt.End()
		rt.attempt = nil
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// operationName is the GenAI operation of an OpenAI API path; "" for another path.
func operationName(path []byte) string {
	switch {
	case bytes.HasSuffix(path, []byte("/chat/completions")):
		return "chat"
	case bytes.HasSuffix(path, []byte("/completions")):
		return "text_completion"
	case bytes.HasSuffix(path, []byte("/embeddings")):
		return "embeddings"
	}
	return ""
}

var keyQuotedModel = []byte(`"model"`)

// responseModel is the value of the last "model" member in the tail of a response body: the
// last chunk's of a stream, the body's own when the body is short. It returns nil when the
// tail holds none, or one cut off or escaped.
func responseModel(tail []byte) []byte {
	i := bytes.LastIndex(tail, keyQuotedModel)
	if i < 0 {
		return nil
	}
	s := jsonScanner{b: tail, i: i + len(keyQuotedModel)}
	s.space()
	if !s.eat(':') {
		return nil
	}
	s.space()
	if !s.eat('"') {
		return nil
	}
	end := bytes.IndexByte(tail[s.i:], '"')
	if end < 0 {
		return nil
	}
	m := tail[s.i : s.i+end]
	if bytes.IndexByte(m, '\\') >= 0 {
		return nil
	}
	return m
}

// headerCarrier lets the W3C propagator read a client's traceparent and write a replica's.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }

func (c headerCarrier) Set(key, value string) { c.h.Set(key, value) }

func (c headerCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

var _ propagation.TextMapCarrier = headerCarrier{}
