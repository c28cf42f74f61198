package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"
)

// errorBodies holds the proxy's own error responses, rendered once per service in the OpenAI
// error shape ({"error":{"message","type","code"}}) so that OpenAI SDKs surface them as API
// errors and the error path allocates nothing. They never echo request content: no headers (the
// Authorization header in particular), no body.
type errorBodies struct {
	noReplicas     []byte // 503: nothing to route to
	replicasBusy   []byte // 503: every tried replica's connection pool was full
	unreachable    []byte // 502: no tried replica could be connected to
	badGateway     []byte // 502: a replica broke the exchange
	timeout        []byte // 504: a replica went silent past the idle timeout
	tooLarge       []byte // 413
	headerTooLarge []byte // 431
	requestTimeout []byte // 408
	badRequest     []byte // 400: not HTTP
	badJSON        []byte // 400: the body is not a JSON object
	internal       []byte // 500
	unauthorized   []byte // 401
	authFailures   []byte // 429: too many failed API key attempts from one address
	bodiesBusy     []byte // 503: the process's budget of request bodies being read is spent
	streamCut      []byte // the SSE event that ends a stream the replica broke
	overloaded     []byte // 429: the service's concurrency limit
	rateLimited    []byte // 429: the client's rate limit (limits.go)
	tooManyStreams []byte // 429: the service's limit of concurrent streams (limits.go)

	// Answers to a request held for a replica (hold.go); see withHoldBodies.
	queueFull        []byte // 503: MaxQueuedRequests already wait
	noReplicaTimeout []byte // 503: no replica within MaxQueueWait
	shuttingDown     []byte // 503: the service or its listener shut down while it waited

	// Answers to a request waiting for a slot under MaxInFlightPerReplica (slots.go).
	slotsBusy      []byte // 503: every replica is at the cap and holding is off
	slotsQueueFull []byte // 503: MaxQueuedRequests already wait
	slotsTimeout   []byte // 503: no slot within MaxQueueWait
	shed           []byte // 503: taken out of the line for a request of a higher class or a lighter tenant (queue.go)
}

func newErrorBodies(service string, maxBody int) errorBodies {
	return errorBodies{
		noReplicas: openAIError(fmt.Sprintf("no ready replicas for service %q", service),
			"service_unavailable", "no_ready_replicas"),
		replicasBusy: openAIError(fmt.Sprintf("all replicas of service %q are at their connection limit", service),
			"service_unavailable", "replicas_busy"),
		unreachable: openAIError(fmt.Sprintf("no replica of service %q could be reached", service),
			"upstream_error", "replica_unreachable"),
		badGateway: openAIError(fmt.Sprintf("a replica of service %q failed to answer", service),
			"upstream_error", "replica_error"),
		timeout: openAIError(fmt.Sprintf("a replica of service %q timed out", service),
			"upstream_error", "replica_timeout"),
		tooLarge: openAIError(fmt.Sprintf("request body is larger than the limit of %d bytes", maxBody),
			"invalid_request_error", "request_too_large"),
		headerTooLarge: openAIError("request headers are too large",
			"invalid_request_error", "request_header_too_large"),
		requestTimeout: openAIError("timed out reading the request",
			"invalid_request_error", "request_timeout"),
		badRequest: openAIError("malformed HTTP request",
			"invalid_request_error", "bad_request"),
		badJSON: openAIError("request body is not a valid JSON object",
			"invalid_request_error", "invalid_json"),
		internal: openAIError(fmt.Sprintf("internal error in the proxy of service %q", service),
			"server_error", "internal_error"),
		streamCut: sseFrame(openAIError(fmt.Sprintf("the replica serving this stream for service %q failed mid-stream", service),
			"upstream_error", "stream_interrupted")),
		unauthorized: openAIError("missing or incorrect API key: send it as \"Authorization: Bearer KEY\"",
			"invalid_request_error", "invalid_api_key"),
		authFailures: openAIError("too many requests with a missing or incorrect API key from your address; retry after the seconds in Retry-After",
			"rate_limit_error", "too_many_auth_failures"),
		bodiesBusy: openAIError("the proxy is reading as many request bodies as it may hold at once; retry shortly",
			"service_unavailable", "server_busy"),
		overloaded: openAIError(fmt.Sprintf("service %q is at its limit of concurrent requests; retry shortly", service),
			"rate_limit_error", "rate_limit_exceeded"),
	}
}

// withHoldBodies adds the answers of a request held for a replica, which name the service's
// queue limits so that a client (or its operator) can tell a cold start that took too long from
// a flood.
func (e errorBodies) withHoldBodies(service string, maxQueued int, maxWait time.Duration) errorBodies {
	e.queueFull = openAIError(fmt.Sprintf("service %q has no ready replica and %d requests are already waiting for one; retry shortly", service, maxQueued),
		"service_unavailable", "queue_full")
	e.noReplicaTimeout = openAIError(fmt.Sprintf("service %q had no ready replica within %v", service, maxWait),
		"service_unavailable", "no_replica_timeout")
	e.slotsBusy = openAIError(fmt.Sprintf("every replica of service %q is at its limit of requests in flight; retry shortly", service),
		"service_unavailable", "replicas_busy")
	e.slotsQueueFull = openAIError(fmt.Sprintf("every replica of service %q is at its limit of requests in flight and %d requests are already waiting; retry shortly", service, maxQueued),
		"service_unavailable", "queue_full")
	e.slotsTimeout = openAIError(fmt.Sprintf("no replica of service %q had a free slot within %v", service, maxWait),
		"service_unavailable", "queue_timeout")
	e.shed = openAIError(fmt.Sprintf("service %q is overloaded and shed this request to serve requests of a higher priority or of tenants with fewer waiting; retry after the seconds in Retry-After", service),
		"service_unavailable", "request_shed")
	e.shuttingDown = openAIError(fmt.Sprintf("service %q is shutting down", service),
		"service_unavailable", "shutting_down")
	return e
}

func openAIError(message, typ, code string) []byte {
	type detail struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	body, err := json.Marshal(struct {
		Error detail `json:"error"`
	}{detail{Message: message, Type: typ, Code: code}})
	if err != nil { // unreachable: only strings are marshalled
		return []byte(`{"error":{"message":"internal error","type":"server_error","code":"internal_error"}}`)
	}
	return body
}

// sseFrame frames a JSON payload as one Server-Sent Event, the way OpenAI streams errors.
func sseFrame(payload []byte) []byte {
	return append(append([]byte("data: "), payload...), "\n\n"...)
}

var (
	headerRetryAfter = []byte("Retry-After")
	retryAfterOne    = []byte("1")
	contentTypeJSON  = []byte("application/json")
)

// writeError replaces whatever response ctx holds with one of the prebuilt error bodies. 503s
// and 429s carry Retry-After: 1, which OpenAI SDKs honour.
func writeError(ctx *fasthttp.RequestCtx, status int, body []byte) {
	ctx.Response.Reset()
	ctx.Response.Header.SetNoDefaultContentType(true)
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(contentTypeJSON)
	if status == fasthttp.StatusServiceUnavailable || status == fasthttp.StatusTooManyRequests {
		ctx.Response.Header.SetBytesKV(headerRetryAfter, retryAfterOne)
	}
	ctx.Response.SetBodyRaw(body)
}

// statusClientClosedRequest is nginx's 499, recorded (never sent) for a request whose client
// left before its response was done.
const statusClientClosedRequest = 499

// upstreamError answers a request whose last attempt failed with err.
func (s *Service) upstreamError(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case err == nil: // no attempt was made: every replica vanished between snapshot and pick
		writeError(ctx, fasthttp.StatusServiceUnavailable, s.errs.noReplicas)
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		writeError(ctx, fasthttp.StatusServiceUnavailable, s.errs.replicasBusy)
	case errors.As(err, new(*dialError)):
		writeError(ctx, fasthttp.StatusBadGateway, s.errs.unreachable)
	case isTimeout(err):
		writeError(ctx, fasthttp.StatusGatewayTimeout, s.errs.timeout)
	default:
		writeError(ctx, fasthttp.StatusBadGateway, s.errs.badGateway)
	}
}

// requestError is the server's ErrorHandler: the request could not be read, so the handler never
// ran. It answers in the same JSON shape as every other proxy error.
func (s *Service) requestError(ctx *fasthttp.RequestCtx, err error) {
	s.front.guard.bodies.take(&ctx.Request.Header) // the body will not be read further
	s.errs.writeRequestError(ctx, err)
	s.rejectedRequest(ctx)
}

// writeRequestError answers a request the server could not read.
func (e *errorBodies) writeRequestError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, e.tooLarge)
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, e.headerTooLarge)
	case isTimeout(err):
		writeError(ctx, fasthttp.StatusRequestTimeout, e.requestTimeout)
	default:
		writeError(ctx, fasthttp.StatusBadRequest, e.badRequest)
	}
}
