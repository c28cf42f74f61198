package proxy

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/tenants"
)

// exchange is one proxied request, from pick to the end of its response stream, and the body
// stream fasthttp writes to the client. It is pooled: the upstream request and response, the
// retry bookkeeping and the scratch buffers are reused across requests.
//
// Lifetime: Handler takes an exchange from the pool; if the replica answered with a body, respond
// hands the exchange to ctx.Response.SetBodyStream and Handler returns. fasthttp then reads the
// body through Read and calls CloseWithError exactly once, when the body is written, when writing
// fails (the client went away), or when it resets the response; it drops its reference at that
// point, so finish can return the exchange to the pool.
type exchange struct {
	svc  *Service
	req  fasthttp.Request
	resp fasthttp.Response

	replica *policy.Replica
	client  *hostClient
	// body is the upstream response stream while the client is being fed.
	body io.Reader
	// prefillHeld is the prompt tokens this request keeps counted in PrefillTokens while a
	// decode replica prefills it (pd.go), until its first byte or its end.
	prefillHeld int64
	// readErr is the first upstream read error other than EOF (a stalled or broken replica).
	readErr error
	// sse is set when the response is an event stream; pending is what is left to send of the
	// error event that ends a stream cut by the replica.
	sse     bool
	pending []byte
	// finished guards finish against a second close; true while the exchange is idle in the pool.
	finished atomic.Bool

	// stream is set when the request asks for a streamed response and MaxConcurrentStreams
	// is on; streamSlot while it holds one of the service's stream slots (limits.go).
	stream, streamSlot bool

	// info is what the picker reads of the request; it aliases the client request's buffers
	// (but for Tokens, its own). chat and tools are what /tokenize needs besides (tokenize.go).
	info       policy.Request
	chat       bool
	tools      []byte
	tried      []*policy.Replica
	candidates []*policy.Replica
	// slotWaited is set when the request holds a slot reserved for it (late binding: granted
	// after waiting, or taken under the line's lock) and has not been sent yet; tryReplica then
	// ends the reservation and passes on a slot it left free.
	slotWaited bool
	// slotReserved is set while the request holds a slot it was granted and has not taken yet
	// (waitLine.granted).
	slotReserved bool
	// slotHeld is set while the request's tenant counts a slot for it (headroom.go).
	slotHeld bool
	// class and tenant are where the request waits when it must (queue.go): its priority and
	// who it shares the replicas fairly with (an API key's id; "" is every anonymous request),
	// set by Service.classify. wait is its place in line; its channel is kept across requests.
	// retryAfter is the Retry-After, in seconds, of a refusal by the line (0: the default).
	class      tenants.Priority
	tenant     string
	wait       waiter
	retryAfter int
	requestID  []byte
	scratch    []byte

	// obs is what metrics and the access log record of the request (metrics.go).
	obs exchangeObs
	// trace is the request's spans (tracing.go); nil when it is not traced.
	trace *requestTrace

	// Tenancy (tenancy.go): the managed key the request presented, what describe read of its
	// model and prompt for the key's scope and estimate, and the charge its answer settles.
	managed   *tenants.Key
	model     []byte
	promptLen int
	ticket    tenants.Ticket
	// sentAt and firstAt time the attempt that answered, from sending it to the replica's
	// first body byte. sentAt is set for a picker that learns from TTFT (Service.learner), zero
	// otherwise; firstAt always (metrics read it too).
	sentAt, firstAt time.Time

	// Client watching (clientwatch.go). binding is true while the handler holds the replica's
	// binder; upstream is the connection carrying the request; clientLeft is set when the
	// client went away. watchShard is the exchange's shard of the Service's clientWatch, set
	// when it is made; the other watch fields are guarded by that shard's mu.
	binding              bool
	upstream             atomic.Pointer[upstreamConn]
	clientLeft           atomic.Bool
	watchShard           uint32
	watching             bool
	watchGen, watchEpoch uint64
	// progress counts reads that brought response bytes; watchSeen is its value at the
	// watcher's last look. A response that is moving needs no peek: writing it notices a
	// departed client.
	progress             atomic.Uint32
	watchSeen            uint32
	clientConn           net.Conn
	watchPrev, watchNext *exchange
}

var _ fasthttp.ReadCloserWithError = (*exchange)(nil)

// begin counts the request against a replica, its client and the service. The replica's count
// is what least_load balances on, so it is taken before the request is sent.
func (ex *exchange) begin(r *policy.Replica, c *hostClient) {
	ex.replica, ex.client = r, c
	r.InFlight.Add(1)
	if a := ex.info.Adapter; a != 0 {
		r.AdapterBegin(a - 1)
	}
	c.acquire()
	ex.svc.inflight.Add(1)
	ex.observeBegin(c)
}

// end undoes begin. The upstream connection must already be back in the pool or closed, so a
// retired client's final release can close it.
func (ex *exchange) end() {
	ex.unbind()
	ex.replica.InFlight.Add(-1)
	if a := ex.info.Adapter; a != 0 {
		ex.replica.AdapterEnd(a - 1)
	}
	ex.client.release()
	ex.svc.inflight.Add(-1)
	if q := ex.svc.slots; q != nil {
		q.gave(ex)
		q.grant(ex.svc)
	}
	ex.observeEnd()
	ex.replica, ex.client = nil, nil
}

// discardResponse drops a replica's answer that will not be sent (it is being retried
// elsewhere). Its connection is closed rather than pooled: an unread body would be parsed as the
// next response on it.
func (ex *exchange) discardResponse() {
	if rc, ok := ex.resp.BodyStream().(fasthttp.ReadCloserWithError); ok {
		_ = rc.CloseWithError(errRetried)
	}
	_ = ex.resp.CloseBodyStream()
	ex.resp.Reset()
}

var errRetried = errors.New("proxy: response discarded for a retry")

// Read feeds the replica's body to the client connection. When the replica's stream breaks
// mid-way (reset, crash, idle timeout), an SSE client gets a final OpenAI-shaped error event and
// a clean end of stream, so SDKs raise an APIError instead of hanging or reporting a truncated
// chunk; nothing can be retried once bytes have gone out.
func (ex *exchange) Read(p []byte) (int, error) {
	if ex.pending != nil {
		n := copy(p, ex.pending)
		ex.pending = ex.pending[n:]
		if len(ex.pending) == 0 {
			return n, io.EOF
		}
		return n, nil
	}
	n, err := ex.body.Read(p)
	if n > 0 {
		ex.progress.Add(1)
		if ex.firstAt.IsZero() { // for the learner and the metrics alike (observeRead)
			ex.firstAt = time.Now()
			ex.svc.dropPrefillHeld(ex)
			if ex.trace != nil {
				ex.trace.firstToken(ex.firstAt)
			}
		}
	}
	if err == io.EOF && ex.bodyCut() { // fasthttp can take a cut chunked body for a whole one
		err = errBodyCut
	}
	if err != nil && err != io.EOF && ex.clientLeft.Load() {
		// We closed the replica's connection: nobody is left to send an error event to.
		return n, errClientLeft
	}
	ex.observeRead(p[:n])
	if err != nil && err != io.EOF && ex.readErr == nil {
		ex.readErr = err
		if ex.sse {
			ex.pending = ex.svc.errs.streamCut
			return n, nil
		}
	}
	return n, err
}

// CloseWithError is fasthttp's end-of-stream call; err is non-nil when the body was not fully
// delivered.
func (ex *exchange) CloseWithError(err error) error {
	ex.finish(err)
	return nil
}

// finish releases everything the exchange holds, once. An upstream body that was not read to the
// end has its connection closed rather than pooled: an unread remainder would be parsed as the
// next response on that connection.
func (ex *exchange) finish(err error) {
	if !ex.finished.CompareAndSwap(false, true) {
		return
	}
	if err == nil && ex.readErr != nil {
		// The client got a clean end (the error event) but the upstream connection is broken.
		err = ex.readErr
	}
	if !ex.unbind() && err == nil {
		// The client left and its watcher closed the connection: it must not be pooled.
		err = errClientLeft
	}
	if ex.body != nil {
		if rc, ok := ex.body.(fasthttp.ReadCloserWithError); ok && err != nil {
			_ = rc.CloseWithError(err) // discards the connection
		}
		ex.body = nil
	}
	_ = ex.resp.CloseBodyStream() // pools the connection only if the body was read to EOF

	if ex.readErr != nil || err != nil {
		ex.logStreamEnd(err)
	}
	usage := unknownUsage
	if code := ex.resp.StatusCode(); code >= 200 && code <= 299 && (ex.svc.obs.on() || ex.svc.learner != nil || ex.ticket.Open() || ex.trace != nil) {
		usage = parseUsage(ex.obs.tail.bytes()) // once, for all
	}
	ex.settleTenant(usage, true, err)
	ex.observeFinish(err, usage)
	if ex.trace != nil {
		ex.trace.finish(ex, err, usage)
	}
	ex.learn(err, usage)
	ex.end()
	ex.svc.releaseExchange(ex)
}

// learn tells a learning picker how a streamed answer went: its time to first byte and to the
// end, and the token usage the engine reported in its last chunk, against what the picker
// estimated (policy.Request.Estimate). Only a whole 2xx event stream counts: a non-streamed
// answer's first byte comes after its last token, and a cut stream's end says nothing about
// the replica's pace.
func (ex *exchange) learn(err error, usage tokenUsage) {
	l := ex.svc.learner
	if l == nil || ex.sentAt.IsZero() || ex.firstAt.IsZero() || !ex.sse || err != nil || ex.readErr != nil {
		return
	}
	if code := ex.resp.StatusCode(); code < 200 || code > 299 {
		return
	}
	l.Learn(ex.replica, ex.info.Estimate, policy.Outcome{
		TTFT: ex.firstAt.Sub(ex.sentAt), Total: time.Since(ex.sentAt),
		PromptTokens: usage.prompt, CachedTokens: usage.cached,
	})
}

func (ex *exchange) logStreamEnd(err error) {
	log := ex.svc.log
	if ex.readErr != nil {
		msg := "replica stream failed"
		if isTimeout(ex.readErr) {
			msg = "replica stream idle timeout"
		}
		if ce := log.Check(zap.WarnLevel, msg); ce != nil {
			ce.Write(zap.Int("replica_id", ex.replica.ID), zap.String("addr", ex.replica.Addr),
				zap.ByteString("request_id", ex.requestID), zap.Error(ex.readErr))
		}
		return
	}
	if ce := log.Check(zap.DebugLevel, "client stopped reading the response"); ce != nil {
		ce.Write(zap.Int("replica_id", ex.replica.ID), zap.ByteString("request_id", ex.requestID), zap.Error(err))
	}
}

func (s *Service) acquireExchange() *exchange {
	ex := s.exchanges.Get().(*exchange)
	ex.finished.Store(false)
	return ex
}

func (s *Service) releaseExchange(ex *exchange) {
	if ex.trace != nil {
		ex.trace.release()
		ex.trace = nil
	}
	s.unwatch(ex)
	s.dropPrefillHeld(ex)
	ex.clientLeft.Store(false)
	ex.progress.Store(0)
	ex.finished.Store(true)
	s.releaseStream(ex)
	ex.req.Reset() // drops the reference to the client's body
	ex.resp.Reset()
	ex.readErr = nil
	ex.sse, ex.pending = false, nil
	ex.settleTenant(unknownUsage, false, nil) // a request no replica answered gives its estimate back
	ex.managed, ex.model, ex.promptLen = nil, nil, 0
	ex.obs.reset()
	ex.sentAt, ex.firstAt = time.Time{}, time.Time{}
	ex.info.Reset()
	ex.chat, ex.tools = false, nil
	clear(ex.tried) // do not pin replicas of old snapshots
	ex.tried = ex.tried[:0]
	ex.slotWaited = false
	if ex.slotReserved || ex.slotHeld { // granted a slot, it never began: the next in line gets it
		s.slots.gave(ex)
		s.slots.taken(s, ex, false)
		s.slots.grant(s)
	}
	ex.class, ex.tenant, ex.retryAfter = tenants.PriorityStandard, "", 0
	ex.wait.tenant = ""
	clear(ex.candidates)
	ex.candidates = ex.candidates[:0]
	s.exchanges.Put(ex)
}

// waiter returns the request's place in line, ready to join it.
func (ex *exchange) waiter() *waiter {
	w := &ex.wait
	if w.ch == nil {
		w.ch = make(chan struct{}, 1)
	}
	w.class, w.tenant = classIndex(ex.class), ex.tenant
	return w
}
