package proxy

import (
	"bytes"
	"slices"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/tenants"
)

// Handler proxies one request: pick a replica, forward, and hand the response stream to fasthttp.
// While the service has no ready replica it first holds the request for one (hold.go). It
// returns before the response body has been streamed; the exchange releases the replica when
// the stream ends. It can be mounted in any fasthttp.Server, though Serve adds the client
// write-idle deadline, the JSON 413 for oversize bodies, the connection caps and the judgement
// at the headers that keeps refused bodies unread (prescreen.go).
//
// It runs in two phases, as Caddy's reverse proxy splits ServeHTTP from its proxy loop:
// admission decides whether and when the request goes to a replica at all (admit), and the
// proxy loop sends it to one and retries on others while that is safe (proxyLoop).
func (s *Service) Handler(ctx *fasthttp.RequestCtx) {
	s.handle(ctx, 0)
}

// handle is Handler for a request whose API key, when key > 0, was matched already: key is 1 +
// its index (a gateway matches it to route).
func (s *Service) handle(ctx *fasthttp.RequestCtx, key int32) {
	if t := s.cfg.Tracing; t != nil {
		defer t.serve(ctx, s).handled(ctx) // after recoverPanic's answer
	}
	defer s.recoverPanic(ctx)
	v := s.front.guard.bodies.take(&ctx.Request.Header)
	if v.refusal != refuseNone {
		s.refuseAtHeaders(ctx)
		return
	}
	if key == 0 {
		key = v.key
	}
	var rate rateState
	ex, snap := s.admit(ctx, key, &rate)
	if ex != nil { // else answered
		s.proxyLoop(ctx, ex, snap)
	}
	rate.write(&ctx.Response.Header) // last: an answer's own headers replace what came before
}

// admit runs every check that may answer a request before any replica sees it: the client's
// credentials, rate and body size, the body's readability, and then, holding it while there is
// no replica or no free slot, the service's caps. key is 1 + the index of the API key already
// matched at the request's headers, 0 when none was. It returns the request's exchange and the
// snapshot to route it on, or nil when it has answered the request itself; rate receives the
// client's rate-limit bucket, for the answer's headers.
func (s *Service) admit(ctx *fasthttp.RequestCtx, key int32, rate *rateState) (*exchange, *snapshot) {
	managed, ok := s.screen(ctx, key, rate)
	if !ok || s.answerModels(ctx) {
		return nil, nil
	}
	ex := s.acquireExchange()
	ex.managed = managed
	if !ex.describe(ctx, s.needs, s.cfg.MaxConcurrentStreams > 0) {
		s.refuse(ctx, ex, fasthttp.StatusBadRequest, s.errs.badJSON)
		return nil, nil
	}
	if managed != nil && !s.admitTenant(ctx, ex, rate) {
		return nil, nil
	}
	if s.classify != nil {
		s.classify(ctx, ex)
	}

	s.arrivals.Add(1)
	snap := s.snap.Load()
	var refusal []byte
	if len(snap.replicas) == 0 {
		if snap, ex.slotWaited, refusal = s.awaitReplicas(ctx, ex, snap); snap == nil {
			s.endHold(ctx, ex, refusal)
			return nil, nil
		}
	}
	// After the hold, so that requests released together by the first replica still respect
	// the cap.
	if limit := s.cfg.MaxConcurrentRequests; limit > 0 && s.inflight.Load() >= int64(limit) {
		if ex.slotWaited {
			s.slots.grant(s) // the slot it was granted goes to the next in line
		}
		s.refuse(ctx, ex, fasthttp.StatusTooManyRequests, s.errs.overloaded)
		return nil, nil
	}
	s.tokenize(ex, snap)
	// Else granted a slot while held for a first replica, or took one free as the first replica
	// came (slotHeld: counted for its tenant already).
	if s.slots != nil && !ex.slotWaited && !ex.slotHeld {
		if snap, ex.slotWaited, refusal = s.awaitSlot(ctx, ex, snap); snap == nil {
			s.endHold(ctx, ex, refusal)
			return nil, nil
		}
	}
	if !s.admitStream(ex) {
		s.refuse(ctx, ex, fasthttp.StatusTooManyRequests, s.errs.tooManyStreams)
		return nil, nil
	}
	return ex, snap
}

// screen refuses requests that no replica could ever serve (no valid API key, over the
// client's rate, too large) before they count as demand or wait for a replica. matched is
// 1 + the index of the key matched at the headers, 0 when none was. It reports whether the
// request passed; when not, it has answered it. A request that presents a managed key
// (tenancy.go) gets it back, for admitTenant.
func (s *Service) screen(ctx *fasthttp.RequestCtx, matched int32, rate *rateState) (managed *tenants.Key, ok bool) {
	key := int(matched) - 1 // which API key, for the rate limit
	if matched == 0 && (s.keys != nil || s.tenancy != nil) {
		c := presented(&ctx.Request.Header)
		if s.keys != nil {
			key, ok = s.keys.match(&c)
		}
		if !ok {
			if managed, ok = s.identify(ctx, &c, s.keys != nil); !ok {
				return nil, false
			}
		}
	}
	if s.limiter != nil && managed == nil && !s.admitRate(ctx, key, rate) {
		s.answeredSelf(ctx, nil)
		return nil, false
	}
	// The server enforces the limit while reading; this covers a Handler mounted elsewhere.
	if len(ctx.Request.Body()) > s.cfg.MaxRequestBodySize {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, s.errs.tooLarge)
		s.answeredSelf(ctx, nil)
		return nil, false
	}
	return managed, true
}

// refuseAtHeaders answers a request whose body the server did not read because the budget of
// bodies being read was spent (prescreen.go).
func (s *Service) refuseAtHeaders(ctx *fasthttp.RequestCtx) {
	writeError(ctx, fasthttp.StatusServiceUnavailable, s.errs.bodiesBusy)
	s.answeredSelf(ctx, nil)
}

// refuse answers an admitted request with status and body without sending it anywhere.
func (s *Service) refuse(ctx *fasthttp.RequestCtx, ex *exchange, status int, body []byte) {
	s.releaseExchange(ex)
	writeError(ctx, status, body)
	s.answeredSelf(ctx, nil)
}

// proxyLoop sends an admitted request to the replicas of snap, one attempt at a time, until one
// answers or retrying is no longer safe, and answers the last error when none did.
func (s *Service) proxyLoop(ctx *fasthttp.RequestCtx, ex *exchange, snap *snapshot) {
	ex.prepare(ctx)
	ex.observeRequest(ctx)
	if t := s.cfg.Tracing; t != nil {
		ex.trace = t.attach(ctx, ex)
	}
	if s.keys != nil {
		stripCredentials(&ex.req.Header)
	}
	ex.prefillHeld = s.disaggregate(ex)

	// An HTTP/1.0 client may send no Host; each replica then gets its own address.
	noHost := len(ex.req.Header.Host()) == 0
	budget := attemptBudget{max: min(s.cfg.MaxAttempts, len(snap.pick))}
	var lastErr error
	s.watch(ex, ctx.Conn())
	for ; budget.attempt < budget.max; budget.attempt++ {
		done, retry, err := s.tryReplica(ctx, ex, snap, &budget, noHost)
		if done {
			return
		}
		if err != nil {
			lastErr = err
		}
		if !retry {
			break
		}
	}

	s.upstreamError(ctx, lastErr)
	ctx.Response.Header.SetBytesKV(headerXRequestID, ex.requestID)
	s.answeredSelf(ctx, ex)
	s.releaseExchange(ex)
}

// attemptBudget is how far one request's attempts may go: at most max replicas, and no new
// attempt once retryBudget has passed since start, the first attempt's time. attempt counts
// from 0.
type attemptBudget struct {
	attempt, max int
	start        time.Time
}

// more reports whether another attempt may follow the current one.
func (b *attemptBudget) more() bool {
	return b.attempt+1 < b.max && time.Since(b.start) <= retryBudget
}

// tryReplica makes one attempt: pick a replica not tried yet, send the request to it, and judge
// the answer. It reports done when the request has been answered, its response handed to
// fasthttp or its departed client's request ended; otherwise the attempt's error (nil when no
// replica could be picked) and whether another replica may be tried.
func (s *Service) tryReplica(ctx *fasthttp.RequestCtx, ex *exchange, snap *snapshot, budget *attemptBudget, noHost bool) (done, retry bool, err error) {
	// One clock reading for the attempt: the picker's, the retry budget's and the learner's.
	now := time.Now()
	if budget.start.IsZero() {
		budget.start = now
	}
	ex.info.Now = now
	replica := ex.pick(s.picker, snap, s.slots)
	if replica == nil {
		return false, false, nil
	}
	client := snap.clientFor(replica)
	if client == nil { // a picker must return a member of the slice it was given
		s.log.Error("picker returned a replica outside the snapshot", zap.Int("replica_id", replica.ID))
		return false, false, nil
	}
	if noHost {
		ex.req.Header.SetHost(client.addr)
	}

	ex.begin(replica, client)
	if ex.trace != nil {
		ex.trace.attemptBegin(ex, now)
	}
	if ex.slotWaited {
		// Granted a slot, it may have chosen a full replica (pick): pass a slot still free on to
		// the next waiter now, rather than when some request ends.
		ex.slotWaited = false
		s.slots.taken(s, ex, true)
	}
	if s.learner != nil {
		ex.sentAt, ex.firstAt = now, time.Time{}
	}
	// An adapter loaded on demand is registered on the replica first (adapterload.go).
	if err = s.ensureAdapter(ex, replica, client); err == nil {
		err = ex.send(client)
	} else {
		replica.AdapterForget(ex.info.Adapter - 1) // not there: routing must not count on it
	}
	if err == nil {
		code := ex.resp.StatusCode()
		if code == fasthttp.StatusNotFound && ex.info.Adapter != 0 && len(s.cfg.LoadAdapters) > 0 {
			client.forgetAdapter(ex.info.Model) // the replica lost it: the next request loads it
			replica.AdapterForget(ex.info.Adapter - 1)
		}
		if !retryableStatus(code) || !budget.more() {
			ex.respond(ctx)
			return true, false, nil
		}
		// Nothing has reached the client yet: drop this answer and ask another replica.
		err = &statusError{code: code}
		ex.discardResponse()
	}
	if ex.clientLeft.Load() {
		// Nobody to answer or retry for: the replica's connection is closed already.
		ex.end()
		ctx.SetStatusCode(statusClientClosedRequest)
		ctx.SetConnectionClose()
		ctx.Response.Header.SetBytesKV(headerXRequestID, ex.requestID)
		s.answeredSelf(ctx, ex)
		s.releaseExchange(ex)
		return true, false, nil
	}
	ex.observeAttemptFailed(err)
	ex.end()
	retry = retryable(err) && budget.more()
	if ce := s.log.Check(zap.WarnLevel, "replica request failed"); ce != nil {
		ce.Write(zap.Int("replica_id", replica.ID), zap.String("addr", replica.Addr),
			zap.Int("attempt", budget.attempt+1), zap.Bool("retry", retry),
			zap.ByteString("request_id", ex.requestID), zap.Error(err))
	}
	if retry {
		ex.tried = append(ex.tried, replica)
	}
	return false, retry, err
}

// endHold answers a request that waited for a replica or a slot in vain: 503 with refusal and
// the Retry-After the line estimated (queue.go), or
// 499 and a closed connection when refusal is nil (the client left while held).
func (s *Service) endHold(ctx *fasthttp.RequestCtx, ex *exchange, refusal []byte) {
	retryAfter := ex.retryAfter
	s.releaseExchange(ex)
	if refusal == nil {
		ctx.SetStatusCode(statusClientClosedRequest)
		ctx.SetConnectionClose()
	} else {
		writeErrorAfter(ctx, fasthttp.StatusServiceUnavailable, refusal, retryAfter)
	}
	s.answeredSelf(ctx, nil)
}

// pick asks the picker for a replica of snap's pick set, leaving out those already tried for
// this request, so a retry never lands on the replica that just failed (SkyServe's retries
// can). Under a per-replica cap (slots non-nil) it offers only replicas below it, unless none is
// (a retry may exceed the cap rather than fail); but a picker that weighs each replica's queue
// itself (policy.WeighsQueues) is offered full replicas too under learned caps, which then only
// decide when to hold: it may judge that a full replica's cached prefix is worth a short wait
// in that engine's queue. Offered only the free replicas, a cache-aware picker under load
// would lose every follow-up whose replica happened to be busy (issue 33). That holds for a
// request that waited in the proxy for a slot too; if it chooses a full replica, the slot it
// was granted goes to the next waiter (tryReplica).
func (ex *exchange) pick(p policy.Picker, snap *snapshot, slots *slotQueue) *policy.Replica {
	all := snap.pick
	if slots != nil && slots.learned() && ex.svc.needs&policy.WeighsQueues != 0 {
		slots = nil
	}
	if len(ex.tried) == 0 && slots == nil {
		return p.Pick(&ex.info, all)
	}
	ex.candidates = ex.candidates[:0]
	for i, r := range all {
		if (slots == nil || slots.free(r, snap.pickCaps[i]) > 0) && !slices.Contains(ex.tried, r) {
			ex.candidates = append(ex.candidates, r)
		}
	}
	if len(ex.candidates) == 0 && slots != nil {
		for _, r := range all {
			if !slices.Contains(ex.tried, r) {
				ex.candidates = append(ex.candidates, r)
			}
		}
	}
	return p.Pick(&ex.info, ex.candidates)
}

// describe fills what the picker reads of the request (needs) and, with wantStream, whether it
// asks to stream. It reports false when the picker needs the prompt and the body is not a JSON
// object: routing cannot read it, and no replica would accept it either; unless the picker
// takes the prompt as optional (policy.PromptOptional), when the request goes on without one.
func (ex *exchange) describe(ctx *fasthttp.RequestCtx, needs policy.Needs, wantStream bool) bool {
	ex.info.Reset()
	if needs&policy.NeedsSession != 0 {
		ex.info.SessionID = ctx.Request.Header.PeekBytes(headerXSessionID)
	}
	needsPrompt := needs&policy.NeedsPrompt != 0
	if (needsPrompt || wantStream || ex.managed != nil) && ctx.IsPost() && !bytes.HasPrefix(ctx.Request.Header.ContentType(), contentTypeMultipart) {
		f, err := scanBody(ctx.Request.Body())
		if err != nil { // not JSON: no stream, and the replica will say what is wrong
			return !needsPrompt || needs&policy.PromptOptional != 0
		}
		ex.model, ex.promptLen = f.Model, len(f.Prompt)
		if needsPrompt {
			ex.info.Prompt, ex.info.Model = f.Prompt, f.Model
			if ex.svc.adapters.Len() > 0 && !ex.svc.cfg.IgnoreAdapters {
				ex.info.Adapter = ex.svc.adapters.Lookup(f.Model)
			}
			ex.chat, ex.tools = f.Chat, f.Tools
		}
		ex.stream = f.Stream
	}
	return true
}

// prepare builds the upstream request from the client's: same method, URI, headers and body,
// minus hop-by-hop headers, plus X-Forwarded-For, X-Forwarded-Proto and X-Request-Id (the
// client's when it is a sane id, else a new one).
func (ex *exchange) prepare(ctx *fasthttp.RequestCtx) {
	req := &ex.req
	ctx.Request.Header.CopyTo(&req.Header)
	req.Header.SetNoDefaultContentType(true)
	req.Header.SetProtocolBytes(protocolHTTP11)
	if uri := req.Header.RequestURI(); len(uri) > 0 && uri[0] != '/' && uri[0] != '*' {
		// Absolute form ("GET http://host/path"): replicas expect origin form.
		req.Header.SetRequestURIBytes(ctx.URI().RequestURI())
	}
	ex.scratch = stripRequestHopByHop(&req.Header, ex.scratch)
	// The body is already buffered; a replica's 100 Continue would only add a round trip.
	req.Header.DelBytes(headerExpect)
	// No copy: the client's body stays valid until its response is written, and Do has sent it
	// by then.
	req.SetBodyRaw(ctx.Request.Body())

	// X-Forwarded-For appends, as nginx's $proxy_add_x_forwarded_for does.
	xff := ex.scratch[:0]
	if prior := req.Header.PeekBytes(headerXForwardedFor); len(prior) > 0 {
		xff = append(append(xff, prior...), commaSpace...)
	}
	xff = appendIP(xff, ctx.RemoteIP())
	req.Header.SetBytesKV(headerXForwardedFor, xff)
	ex.scratch = xff
	if ctx.IsTLS() {
		req.Header.SetBytesKV(headerXForwardedProto, schemeHTTPS)
	} else {
		req.Header.SetBytesKV(headerXForwardedProto, schemeHTTP)
	}

	if id := req.Header.PeekBytes(headerXRequestID); saneRequestID(id) {
		ex.requestID = append(ex.requestID[:0], id...)
	} else {
		ex.requestID = appendRequestID(ex.requestID[:0])
		req.Header.SetBytesKV(headerXRequestID, ex.requestID)
	}
}

// respond copies the replica's status and headers to the client response and attaches the
// exchange as the body stream. Unknown-length bodies and SSE are sent chunked, which fasthttp
// flushes per chunk, with headers flushed at once so a client sees the status before the first
// token.
func (ex *exchange) respond(ctx *fasthttp.RequestCtx) {
	resp := &ex.resp
	dst := &ctx.Response.Header
	resp.Header.CopyTo(dst)
	// CopyTo also copies per-connection state of the upstream exchange; reset it for the client.
	dst.SetProtocol(protocolHTTP11)
	dst.SetNoDefaultContentType(true)
	ex.scratch = stripResponseHopByHop(dst, ex.scratch)
	if len(dst.PeekBytes(headerXRequestID)) == 0 {
		dst.SetBytesKV(headerXRequestID, ex.requestID)
	}

	body := resp.BodyStream()
	size := resp.Header.ContentLength()
	if body == nil || size == 0 {
		// No body (HEAD, 204, 304, or empty): the exchange is over already.
		ex.finish(nil)
		return
	}
	if size < 0 || isEventStream(resp.Header.ContentType()) {
		ex.sse = isEventStream(resp.Header.ContentType())
		size = -1
		ctx.Response.ImmediateHeaderFlush = true
	}
	ex.body = body
	ctx.Response.SetBodyStream(ex, size)
}

// recoverPanic keeps one request's bug from killing every stream in the process (fasthttp does
// not recover handler panics).
func (s *Service) recoverPanic(ctx *fasthttp.RequestCtx) {
	if v := recover(); v != nil {
		s.log.Error("panic while proxying a request", zap.Any("panic", v), zap.Stack("stack"))
		writeError(ctx, fasthttp.StatusInternalServerError, s.errs.internal)
		s.answeredSelf(ctx, nil)
	}
}
