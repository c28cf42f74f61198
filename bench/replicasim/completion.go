package replicasim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	// maxBodyBytes bounds a request body; far above any prompt within maxModelLen.
	maxBodyBytes = 8 << 20
	// minDecodeWake is the shortest sleep of a non-streaming sequence. Nobody observes its
	// tokens one by one, so it decodes several per timer when the ITL is short, which keeps
	// timer wake-ups low with hundreds of sequences running; the ITL is still re-read from the
	// batch size at every wake-up.
	minDecodeWake = 5 * time.Millisecond
	// maxPooledBytes keeps one huge request from pinning a huge buffer in the pool.
	maxPooledBytes = 1 << 20
)

// scratch is a request's reusable buffers, pooled so that the hot path allocates little.
type scratch struct {
	body   []byte
	prompt []byte
	hashes []uint64
	out    []byte
}

func (s *Server) getScratch() *scratch {
	if sc, ok := s.scratch.Get().(*scratch); ok {
		return sc
	}
	return &scratch{}
}

func (s *Server) putScratch(sc *scratch) {
	if cap(sc.body) > maxPooledBytes || cap(sc.prompt) > maxPooledBytes || cap(sc.out) > maxPooledBytes {
		return
	}
	s.scratch.Put(sc)
}

// complete serves one chat or text completion: validate, inject faults, queue for a batch
// slot, prefill, decode and answer, streaming or not.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, ep endpoint) {
	start := time.Now()
	sc := s.admit(w, r, s.metrics.requestCount)
	if sc == nil {
		return
	}
	defer s.putScratch(sc)
	var aerr *apiError
	var req completionRequest
	if req, sc.prompt, aerr = parseRequest(ep, sc.body, sc.prompt[:0]); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	seed, modelJSON := s.modelSeed, s.modelJSON
	var adapter *loraModule
	if req.Model != "" && req.Model != s.cfg.Model {
		if s.lora != nil {
			adapter = s.lora.lookup(req.Model)
		}
		if adapter == nil {
			writeAPIError(w, modelNotFound(req.Model))
			return
		}
		seed, modelJSON = adapter.seed, adapter.json
	}
	role, aerr := s.role(&req)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	promptTokens := estimateTokens(sc.prompt)
	outTokens := req.outputTokens(s.cfg.MaxTokens)
	if role == kvPrefillOnly {
		outTokens = 1 // the decode replica generates the rest
	}
	if outTokens > maxModelLen-promptTokens {
		writeAPIError(w, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens "+
			"in the messages and %d in the completion. Please reduce the length of the messages or completion.",
			maxModelLen, promptTokens, outTokens))
		return
	}

	fault, idA, idB := s.draw()
	faults := s.faults.Load()
	if fault < faults.ErrorRate {
		writeAPIError(w, &apiError{status: http.StatusInternalServerError, typ: "internal_server_error",
			message: "simulated replica failure (--error-rate)"})
		return
	}
	if fault < faults.ErrorRate+faults.HangRate {
		s.hang(r.Context())
		return
	}
	var slow time.Duration // --slow-rate: this answer is late, though the replica is working
	if fault < faults.ErrorRate+faults.HangRate+faults.SlowRate {
		slow = faults.SlowDelay
	}

	sc.hashes = blockHashes(sc.hashes[:0], seed, sc.prompt)
	if adapter != nil {
		// Its GPU slot first: a request whose adapter cannot be active does not hold a batch
		// slot either (vLLM's scheduler skips it).
		if _, err := s.lora.acquire(r.Context(), adapter, s.stopping); err != nil {
			return
		}
	}
	queuedAt := time.Now()
	queued, err := s.sched.tryAdmit()
	if err != nil {
		if adapter != nil {
			s.lora.release(adapter, false)
		}
		w.Header().Set("Retry-After", "1")
		writeAPIError(w, &apiError{status: http.StatusTooManyRequests, typ: "server_overloaded",
			message: fmt.Sprintf("replica is overloaded: all %d batch slots are busy and the waiting queue is full (%d); retry later",
				s.cfg.MaxNumSeqs, s.cfg.MaxWaiting)})
		return
	}

	ctx := r.Context()
	rc := http.NewResponseController(w)
	if req.Stream {
		// Headers go out as soon as the request is accepted, before it leaves the queue, as
		// vLLM's streaming responses do; the proxy sees the replica took it.
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
	}
	if queued != nil {
		if err := s.sched.wait(ctx, queued, s.stopping); err != nil {
			if adapter != nil {
				s.lora.release(adapter, false)
			}
			return // the client left while queued; it no longer counts as waiting
		}
	}
	s.metrics.queueDuration.Observe(time.Since(queuedAt).Seconds())
	seq := &sequence{server: s, ctx: ctx, holdsSlot: true, lora: adapter}
	if adapter != nil {
		s.lora.started(adapter)
	}
	defer seq.finish()

	// Prefill: cached whole blocks are free, the rest costs per token. vLLM always computes at
	// least the last prompt token, so a fully cached prompt still leaves one block uncached.
	// A decode replica of a disaggregated pair pulls the prompt's KV instead (pd.go).
	cachedTokens := s.cache.match(sc.hashes, (promptTokens-1)/blockTokens) * blockTokens
	s.metrics.prefixQueries.Add(float64(promptTokens))
	s.metrics.prefixHits.Add(float64(cachedTokens))
	s.metrics.truthQueries.Add(float64(promptTokens))
	s.metrics.truthHits.Add(float64(cachedTokens))
	seq.holdKV(promptTokens)
	prefill := s.cfg.TTFT + time.Duration(promptTokens-cachedTokens)*s.cfg.PrefillPerToken
	uncached := int64(promptTokens - cachedTokens)
	if role == kvRemotePrefill {
		prefill, uncached = s.cfg.TTFT+time.Duration(promptTokens)*s.cfg.KVTransferPerToken, 0
	}
	s.prefilling.Add(uncached)
	err = seq.sleep(prefill + slow)
	s.prefilling.Add(-uncached)
	if err != nil {
		return
	}
	s.cache.insert(sc.hashes, sc.prompt, int(s.genBlocksUsed.Load()))
	s.metrics.promptTokens.Add(float64(promptTokens))
	s.metrics.ttft.Observe(time.Since(start).Seconds())

	gen := generation{
		server: s, ep: ep, start: start, created: start.Unix(),
		promptTokens: promptTokens, cachedTokens: cachedTokens, outTokens: outTokens, modelJSON: modelJSON,
		kvParams: role == kvPrefillOnly,
	}
	gen.text.Seed(idA, idB)
	if req.Stream {
		if !gen.stream(seq, rc, w, sc, idA, idB, req.includeUsage()) {
			return
		}
	} else {
		if !gen.decode(seq) {
			return
		}
		seq.finish()
		out := gen.appendResponse(sc.out[:0], idA, idB)
		sc.out = out
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(out)))
		gen.recordSuccess()
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(out)
		_ = rc.Flush() // before a possible ExitAfter crash
	}
	if n := s.completed.Add(1); s.cfg.ExitAfter > 0 && n == int64(s.cfg.ExitAfter) {
		s.exit(1)
	}
}

// readBody appends the request body to dst, refusing bodies over maxBodyBytes.
// admit counts a request in counter and reads its body into a scratch the caller puts back;
// it answers 503 while the model is loading, or the body's error, and returns nil then.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, counter prometheus.Counter) *scratch {
	if !s.started() {
		writeAPIError(w, &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable",
			message: "the model is still loading; retry later"})
		return nil
	}
	counter.Inc()
	sc := s.getScratch()
	var aerr *apiError
	if sc.body, aerr = readBody(sc.body[:0], w, r); aerr != nil {
		s.putScratch(sc)
		writeAPIError(w, aerr)
		return nil
	}
	return sc
}

func readBody(dst []byte, w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	body := http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if r.ContentLength > 0 && r.ContentLength <= maxBodyBytes {
		dst = slices.Grow(dst, int(r.ContentLength)+1) // +1 so the final read sees EOF without growing
	}
	for {
		if len(dst) == cap(dst) {
			dst = slices.Grow(dst, max(512, cap(dst)))
		}
		n, err := body.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				return dst, &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
					message: fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit)}
			}
			return dst, badRequest("reading request body: %v", err)
		}
	}
}

// hang simulates a stuck replica: no answer until the client gives up. On shutdown the
// connection is cut, as a dying process would.
func (s *Server) hang(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-s.stopping:
		panic(http.ErrAbortHandler) // net/http's sanctioned way to abort a response silently
	}
}

// itl is the current inter-token latency: a bigger batch makes every decode step slower, and
// so does a prompt being prefilled beside it (Config.PrefillInterference).
func (s *Server) itl() time.Duration {
	d := s.cfg.ITL + time.Duration(s.sched.runningGauge.Load())*s.cfg.ITLPerSeq
	if f := s.cfg.PrefillInterference; f > 0 {
		if n := s.prefilling.Load(); n > 0 {
			d += time.Duration(f * float64(min(n, prefillChunkTokens)) * float64(s.cfg.PrefillPerToken))
		}
	}
	return d
}

// sequence is a request while it holds a batch slot: it owns the slot, its KV blocks and one
// reusable timer, and gives the first two back exactly once.
type sequence struct {
	server    *Server
	ctx       context.Context
	timer     *time.Timer
	holdsSlot bool
	kvBlocks  int64
	// promptBlocks are the blocks of kvBlocks that hold the prompt (the first holdKV); the
	// rest hold generated tokens.
	promptBlocks int64
	// lora is the adapter whose GPU slot the sequence holds, nil for the base model.
	lora *loraModule
}

// sleep waits d of simulated compute. It returns the context's error if the client leaves,
// and returns at once when the server is shutting down so in-flight work finishes quickly.
func (q *sequence) sleep(d time.Duration) error {
	if d <= 0 || q.server.stopped.Load() {
		return q.ctx.Err()
	}
	if q.timer == nil {
		q.timer = time.NewTimer(d)
	} else {
		q.timer.Reset(d)
	}
	select {
	case <-q.timer.C:
		return nil
	case <-q.ctx.Done():
		q.timer.Stop()
		return q.ctx.Err()
	case <-q.server.stopping:
		q.timer.Stop()
		return nil
	}
}

// holdKV records that the sequence now holds the KV of tokens tokens.
func (q *sequence) holdKV(tokens int) {
	blocks := int64((tokens + blockTokens - 1) / blockTokens)
	if q.kvBlocks == 0 {
		q.promptBlocks = blocks
	}
	if blocks != q.kvBlocks {
		q.server.kvBlocksUsed.Add(blocks - q.kvBlocks)
		q.server.genBlocksUsed.Add(max(blocks-q.promptBlocks, 0) - max(q.kvBlocks-q.promptBlocks, 0))
		q.kvBlocks = blocks
	}
}

// finish frees the batch slot and the KV blocks; later calls do nothing.
func (q *sequence) finish() {
	if q.kvBlocks != 0 {
		q.server.kvBlocksUsed.Add(-q.kvBlocks)
		q.server.genBlocksUsed.Add(-max(q.kvBlocks-q.promptBlocks, 0))
		q.kvBlocks, q.promptBlocks = 0, 0
	}
	if q.holdsSlot {
		q.holdsSlot = false
		q.server.sched.release()
	}
	if q.lora != nil {
		q.server.lora.release(q.lora, true)
		q.lora = nil
	}
	if q.timer != nil {
		q.timer.Stop()
	}
}

// generation produces one request's output tokens and encodes its responses. The text comes
// from a per-request generator seeded from the server's seeded stream, so it needs no lock.
type generation struct {
	server       *Server
	ep           endpoint
	start        time.Time
	created      int64
	promptTokens int
	cachedTokens int
	outTokens    int
	modelJSON    []byte // the model the request named: the base model or an adapter
	kvParams     bool   // a prefill-only answer: it carries kv_transfer_params (pd.go)
	text         rand.PCG
}

func (g *generation) nextWord() string {
	return vocabulary[g.text.Uint64()%uint64(len(vocabulary))]
}

// decode runs the decode steps after the first token (which prefill produced) for a
// non-streaming request; false means the client left.
func (g *generation) decode(seq *sequence) bool {
	s := g.server
	s.metrics.generationTokens.Inc()
	for done := 1; done < g.outTokens; {
		itl := s.itl()
		step := g.outTokens - done
		if itl > 0 && itl < minDecodeWake {
			step = min(step, int((minDecodeWake+itl-1)/itl))
		} else if itl > 0 {
			step = 1
		}
		if seq.sleep(time.Duration(step)*itl) != nil {
			return false
		}
		done += step
		seq.holdKV(g.promptTokens + done)
		s.metrics.generationTokens.Add(float64(step))
	}
	return true
}

// recordSuccess counts a finished request. It runs before the last bytes go out, so a client
// that has read a whole response and then scrapes /metrics always sees it counted.
func (g *generation) recordSuccess() {
	g.server.metrics.requestSuccess.Inc()
	g.server.metrics.e2e.Observe(time.Since(g.start).Seconds())
}

// stream sends one SSE chunk per token, flushed at once, then the finish chunk, the usage
// chunk if asked, and [DONE]. False means the client left.
func (g *generation) stream(seq *sequence, rc *http.ResponseController, w io.Writer, sc *scratch,
	idA, idB uint64, includeUsage bool) bool {
	s := g.server
	prefix := g.appendChunkPrefix(nil, idA, idB)
	buf := sc.out[:0]
	defer func() { sc.out = buf }()
	for i := range g.outTokens {
		if i > 0 {
			if seq.sleep(s.itl()) != nil {
				return false
			}
		}
		buf = buf[:0]
		if i == 0 && g.ep == chatEndpoint {
			buf = append(buf, prefix...)
			buf = append(buf, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		buf = append(buf, prefix...)
		word := g.nextWord()
		if g.ep == chatEndpoint {
			buf = append(buf, `{"index":0,"delta":{"content":"`...)
			buf = append(buf, word...)
			buf = append(buf, `"},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		} else {
			buf = append(buf, `{"index":0,"text":"`...)
			buf = append(buf, word...)
			buf = append(buf, `","logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		}
		if _, err := w.Write(buf); err != nil {
			return false
		}
		if rc.Flush() != nil {
			return false
		}
		seq.holdKV(g.promptTokens + i + 1)
		s.metrics.generationTokens.Inc()
	}
	seq.finish()

	buf = append(buf[:0], prefix...)
	if g.ep == chatEndpoint {
		buf = append(buf, `{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`+"\n\n"...)
	} else {
		buf = append(buf, `{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}`+"\n\n"...)
	}
	if includeUsage {
		buf = append(buf, prefix...)
		buf = append(buf, `],"usage":`...)
		buf = g.appendUsage(buf)
		buf = append(buf, "}\n\n"...)
	}
	buf = append(buf, "data: [DONE]\n\n"...)
	g.recordSuccess()
	if _, err := w.Write(buf); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// appendChunkPrefix appends the part of an SSE chunk shared by all of a stream's chunks, up to
// and including the opening bracket of choices.
func (g *generation) appendChunkPrefix(dst []byte, idA, idB uint64) []byte {
	dst = append(dst, `data: {"id":"`...)
	dst = g.appendHead(dst, idA, idB, "chat.completion.chunk", "text_completion")
	return append(dst, `"choices":[`...)
}

// appendHead appends the id, object, created and model members, with a trailing comma.
func (g *generation) appendHead(dst []byte, idA, idB uint64, chatObject, textObject string) []byte {
	object := textObject
	if g.ep == chatEndpoint {
		dst = append(dst, "chatcmpl-"...)
		object = chatObject
	} else {
		dst = append(dst, "cmpl-"...)
	}
	dst = appendID(dst, idA, idB)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, g.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, g.modelJSON...)
	return append(dst, ',')
}

// appendResponse appends a whole non-streaming response body.
func (g *generation) appendResponse(dst []byte, idA, idB uint64) []byte {
	dst = append(dst, `{"id":"`...)
	dst = g.appendHead(dst, idA, idB, "chat.completion", "text_completion")
	if g.ep == chatEndpoint {
		dst = append(dst, `"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
	} else {
		dst = append(dst, `"choices":[{"index":0,"text":"`...)
	}
	for range g.outTokens {
		dst = append(dst, g.nextWord()...)
	}
	if g.ep == chatEndpoint {
		dst = append(dst, `"},"logprobs":null,"finish_reason":"length"}],"usage":`...)
	} else {
		dst = append(dst, `","logprobs":null,"finish_reason":"length"}],"usage":`...)
	}
	dst = g.appendUsage(dst)
	if g.kvParams {
		dst = g.server.appendKVTransferParams(dst, g.promptTokens)
	}
	return append(dst, "}\n"...)
}

func (g *generation) appendUsage(dst []byte) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(g.promptTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(g.promptTokens+g.outTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(g.outTokens), 10)
	if g.server.cfg.Signals == SignalsBasic {
		return append(dst, '}')
	}
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(g.cachedTokens), 10)
	return append(dst, "}}"...)
}
