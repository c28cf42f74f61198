package sim

// This file is one replica's inference engine: vLLM's v0 scheduling, as a fluid model.
//
// Requests routed to the replica wait FIFO. Whenever no prefill is running, the scheduler
// admits waiting requests from the head while the batch has room (fewer than MaxSeqs
// sequences) and the KV cache can hold the request's prompt and whole output, up to
// MaxBatchedTokens prompt tokens per step, and prefills them in one step, during which
// nobody decodes. The prefill yields each request's first token. Then all running sequences
// decode together, one token per decode step, whose length depends on the batch (Model).
//
// Instead of stepping through every ~30 ms decode step, the engine jumps from event to event
// (a prefill ends, a sequence finishes): between two events the batch is fixed, so every
// sequence advances by the same number of steps. A sequence's end is the step count at which it
// will have produced its last token, kept in a heap, so one event costs O(log batch).
//
// Reserving the whole output at admission is what TGI does with max_new_tokens; vLLM instead
// admits on the prompt's blocks and, when the cache runs out mid-decode, preempts the newest
// sequence and recomputes it later. Reserving avoids modelling recomputation; with the trace's
// short outputs (211 tokens on average against 1,155 prompt tokens) it admits about 8% fewer
// sequences than vLLM would at a full cache.

// request is one request's life.
type request struct {
	arrival  float64
	ctx, gen int
	// scored is false for requests of the warm-up, which count nowhere.
	scored bool
	// met is what the request found on arrival (missNoneReady, missShort, missFull), for
	// Result.Misses.
	met int
	// firstToken is when the first token was produced (end of its prefill).
	firstToken float64
	// startStep is the engine's decode step count when the request joined the batch, with
	// its first token already out; finishStep = startStep + gen − 1.
	startStep, finishStep float64
}

// engine is one replica's scheduler and batch.
type engine struct {
	m *Model
	// done receives each request that finished, with its finish time.
	done func(r *request, at float64)

	// now is the time the engine has been advanced to; steps counts decode steps (fractional
	// between events).
	now   float64
	steps float64

	waiting    []*request
	waitHead   int
	prefill    []*request
	prefillEnd float64
	// prefillTokens is the prompt tokens of the prefill step running.
	prefillTokens int
	running       finishHeap
	// ctxSum and startSum over running sequences give the tokens held in the KV cache:
	// Σ (ctx + 1 + steps − startStep).
	ctxSum, startSum float64
	// reserved is Σ (ctx + gen) over prefilling and running requests, the KV cache promised.
	reserved int

	// area is ∫ in-flight dt since the last takeArea, for the time-averaged concurrency.
	area float64
}

func newEngine(m *Model, now float64, done func(*request, float64)) *engine {
	return &engine{m: m, now: now, done: done}
}

// inFlight counts the requests the replica holds: waiting, prefilling and decoding.
func (e *engine) inFlight() int {
	return len(e.waiting) - e.waitHead + len(e.prefill) + len(e.running)
}

// queued is the engine's waiting queue (vllm:num_requests_waiting).
func (e *engine) queued() int { return len(e.waiting) - e.waitHead }

// batch is the requests admitted to the batch, prefilling or decoding
// (vllm:num_requests_running).
func (e *engine) batch() int { return len(e.prefill) + len(e.running) }

// kvUsage is the share of the KV cache holding tokens now (vllm:kv_cache_usage_perc): the
// decoding sequences' tokens, and the prompts being prefilled, whose blocks vLLM allocates when
// it schedules the prefill.
func (e *engine) kvUsage() float64 {
	return (e.kvTokens() + float64(e.prefillTokens)) / float64(e.m.KVCapacityTokens)
}

func (e *engine) kvTokens() float64 {
	n := float64(len(e.running))
	return e.ctxSum + n*(1+e.steps) - e.startSum
}

// accrue moves the clock to t, integrating in-flight.
func (e *engine) accrue(t float64) {
	if t > e.now {
		e.area += float64(e.inFlight()) * (t - e.now)
		e.now = t
	}
}

// takeArea returns ∫ in-flight dt since the previous call.
func (e *engine) takeArea() float64 {
	a := e.area
	e.area = 0
	return a
}

// advance runs the engine until time to, handing every finished request to done.
func (e *engine) advance(to float64) {
	for {
		if len(e.prefill) > 0 {
			if e.prefillEnd > to {
				e.accrue(to)
				return
			}
			e.accrue(e.prefillEnd)
			e.finishPrefill()
			e.schedule()
			continue
		}
		n := len(e.running)
		if n == 0 {
			e.accrue(to)
			return
		}
		step := e.m.DecodeStep(n, e.kvTokens())
		next := e.running[0].finishStep
		at := e.now + (next-e.steps)*step
		if at > to {
			e.steps += (to - e.now) / step
			e.accrue(to)
			return
		}
		e.accrue(at)
		e.steps = next
		for len(e.running) > 0 && e.running[0].finishStep <= e.steps+1e-9 {
			r := e.running.pop()
			e.ctxSum -= float64(r.ctx)
			e.startSum -= r.startStep
			e.finish(r)
		}
		if len(e.running) == 0 {
			// Drop float drift once the batch is empty.
			e.ctxSum, e.startSum = 0, 0
		}
		e.schedule()
	}
}

// roomFor reports whether the engine would start r at once as a proxy can tell from outside: no
// request waits in it (vllm:num_requests_waiting), its batch has a free sequence, and the KV
// cache's free tokens (vllm:kv_cache_usage_perc of its size) hold r's prompt. It does not know
// r's output length, which the engine reserves too, so r may still wait there.
func (e *engine) roomFor(r *request) bool {
	return e.queued() == 0 && e.batch() < e.m.MaxSeqs &&
		e.kvUsage()*float64(e.m.KVCapacityTokens)+float64(r.ctx) <= float64(e.m.KVCapacityTokens)
}

// submit queues r at the engine's current time (advance to the arrival first).
func (e *engine) submit(r *request) {
	e.waiting = append(e.waiting, r)
	e.schedule()
}

// schedule starts a prefill step if none runs and the head of the queue fits.
func (e *engine) schedule() {
	if len(e.prefill) > 0 {
		return
	}
	tokens := 0
	for e.waitHead < len(e.waiting) {
		r := e.waiting[e.waitHead]
		if len(e.running)+len(e.prefill) >= e.m.MaxSeqs ||
			e.reserved+r.ctx+r.gen > e.m.KVCapacityTokens ||
			(len(e.prefill) > 0 && tokens+r.ctx > e.m.MaxBatchedTokens) {
			break
		}
		e.waiting[e.waitHead] = nil
		e.waitHead++
		e.prefill = append(e.prefill, r)
		e.reserved += r.ctx + r.gen
		tokens += r.ctx
	}
	if e.waitHead > 64 && e.waitHead*2 > len(e.waiting) {
		n := copy(e.waiting, e.waiting[e.waitHead:])
		clear(e.waiting[n:])
		e.waiting = e.waiting[:n]
		e.waitHead = 0
	}
	if len(e.prefill) > 0 {
		e.prefillEnd = e.now + e.m.PrefillTime(tokens)
		e.prefillTokens = tokens
	}
}

// finishPrefill gives the prefilled requests their first token and puts them in the batch.
func (e *engine) finishPrefill() {
	for i, r := range e.prefill {
		e.prefill[i] = nil
		r.firstToken = e.now
		if r.gen <= 1 {
			e.finish(r)
			continue
		}
		r.startStep = e.steps
		r.finishStep = e.steps + float64(r.gen-1)
		e.ctxSum += float64(r.ctx)
		e.startSum += r.startStep
		e.running.push(r)
	}
	e.prefill = e.prefill[:0]
	e.prefillTokens = 0
}

func (e *engine) finish(r *request) {
	e.reserved -= r.ctx + r.gen
	e.done(r, e.now)
}

// kill empties the replica (preemption, or the end of a drain) and returns what it held.
func (e *engine) kill() []*request {
	var out []*request
	out = append(out, e.waiting[e.waitHead:]...)
	out = append(out, e.prefill...)
	out = append(out, e.running...)
	e.waiting, e.waitHead, e.prefill, e.running = nil, 0, nil, nil
	e.ctxSum, e.startSum, e.reserved, e.prefillTokens = 0, 0, 0, 0
	return out
}

// finishHeap is a min-heap of running requests by finishStep.
type finishHeap []*request

func (h *finishHeap) push(r *request) {
	*h = append(*h, r)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s[p].finishStep <= s[i].finishStep {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *finishHeap) pop() *request {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = nil
	s = s[:last]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].finishStep < s[m].finishStep {
			m = l
		}
		if r < len(s) && s[r].finishStep < s[m].finishStep {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}
