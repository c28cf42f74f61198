package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// Prefill/decode disaggregation, the flow vLLM's NixlConnector and llm-d run: a completion goes
// first to a prefill replica with kv_transfer_params {"do_remote_decode": true} and max_tokens 1,
// whose answer carries the kv_transfer_params a decode replica needs to pull the prompt's KV;
// the request then goes, with those params, to a decode replica (the service's replicas), which
// streams the answer. A prefill that fails is tried on another prefill replica; when none is
// left (or the pool is empty), the request goes to a decode replica as it is, which prefills
// itself. The prefill pool has a picker of its own, the service's policy, so that prompts that
// share a prefix meet that prefix's cache there.

// maxPrefillAttempts bounds the prefill replicas one request tries.
const maxPrefillAttempts = 2

// maxPrefillAnswer bounds a prefill replica's answer: one token and the KV's block ids.
const maxPrefillAnswer = 4 << 20

// prefillPool is the service's prefill replicas, replaced whole by SetPrefillBackends.
type prefillPool struct {
	replicas []*policy.Replica
	clients  []*fasthttp.HostClient
	picker   policy.Picker
	// benched is, per replica, until when (unix nanoseconds) it is left out after failing: a
	// dead or black-holed prefill replica must not cost every request a failed attempt.
	benched []*prefillBench
}

// prefillBench is one prefill replica's backoff after failures.
type prefillBench struct {
	until    atomic.Int64
	failures atomic.Int32
}

// Prefill replicas that fail sit out prefillBenchMin, doubling with each failure in a row up
// to prefillBenchMax; one answer ends it.
const (
	prefillBenchMin = time.Second
	prefillBenchMax = 30 * time.Second
)

func (b *prefillBench) failed(now time.Time) {
	n := min(b.failures.Add(1), 6)
	b.until.Store(now.Add(min(prefillBenchMin<<(n-1), prefillBenchMax)).UnixNano())
}

func (b *prefillBench) answered() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
		b.until.Store(0)
	}
}

// prefillState is the Service's prefill pool and the mutex its changes take.
type prefillState struct {
	mu   sync.Mutex
	pool atomic.Pointer[prefillPool]
	// picker is the pool's, kept across replacements so that what it learned stays.
	picker policy.Picker
	// tokens is the prompt tokens of the completions in their prefill step (PrefillTokens),
	// and requests how many requests are in a prefill step on the pool (PrefillRequests).
	tokens, requests atomic.Int64
	// slowest is the longest prefill step lately (nanoseconds, decaying), which bounds how long
	// a prefill may take before the replica counts as hung (prefillTimeout).
	slowest atomic.Int64
	// retired are replicas that left the pool with prefill steps in flight, until those end:
	// the replica manager waits for them before it stops the replica (PrefillBusy).
	retired []*policy.Replica
}

// PrefillTokens is what the prefill pool's autoscaler scales on: the prompt tokens of the
// completions this Service is prefilling now (sent to a prefill replica, not yet answered).
// While the pool is empty it counts the prompts the decode replicas prefill instead, until
// their answer starts, so that the pool can grow from zero.
func (s *Service) PrefillTokens() int64 { return s.prefill.tokens.Load() }

// PrefillRequests is how many of InFlight are in their prefill step on a prefill replica: not
// yet on a decode replica, so not the decode pool's load.
func (s *Service) PrefillRequests() int64 { return s.prefill.requests.Load() }

// Prefill steps time out at prefillTimeoutFactor times the slowest step lately, never below
// prefillTimeoutMin (nor above the service's idle timeout): a hung prefill replica costs a
// request that long, then the request is prefilled elsewhere.
const prefillTimeoutFactor = 8

var prefillTimeoutMin = 5 * time.Second // a variable for tests

// prefillTimeout bounds the next prefill step.
func (s *Service) prefillTimeout() time.Duration {
	return min(max(prefillTimeoutFactor*time.Duration(s.prefill.slowest.Load()), prefillTimeoutMin), s.cfg.IdleTimeout)
}

// notePrefill folds a successful step's duration into slowest: the maximum, decaying by 1%
// a step so that one slow prompt long ago does not keep the bound high.
func (st *prefillState) notePrefill(took time.Duration) {
	for {
		old := st.slowest.Load()
		next := max(old-old/100, int64(took))
		if st.slowest.CompareAndSwap(old, next) {
			return
		}
	}
}

// SetPrefillBackends replaces the service's prefill replicas. Nil means the service is not
// disaggregated; an empty set, that its pool has no READY replica (every request is prefilled
// where it is decoded, and counted in PrefillTokens). Replicas at an address already in the
// pool keep their counters and connections.
func (s *Service) SetPrefillBackends(bs []Backend) error {
	st := &s.prefill
	st.mu.Lock()
	defer st.mu.Unlock()
	if bs == nil {
		if old := st.pool.Swap(nil); old != nil {
			st.retire(old.replicas, nil)
		}
		return nil
	}
	if st.picker == nil {
		p, err := policy.New(s.cfg.Policy, policy.Options{TargetQPSPerAccelerator: s.cfg.TargetQPSPerAccelerator})
		if err != nil {
			return err
		}
		st.picker = p
	}
	old := st.pool.Load()
	next := &prefillPool{picker: st.picker}
	for _, b := range bs {
		if err := validateAddr(b.Addr); err != nil {
			return fmt.Errorf("prefill replica %q: %w", b.Addr, err)
		}
		var r *policy.Replica
		var hc *fasthttp.HostClient
		bench := &prefillBench{}
		if old != nil {
			if i := slices.IndexFunc(old.replicas, func(o *policy.Replica) bool { return o.Addr == b.Addr }); i >= 0 {
				r, hc, bench = old.replicas[i], old.clients[i], old.benched[i]
			}
		}
		if r == nil {
			r = &policy.Replica{ID: b.ID, Addr: b.Addr, Accelerator: b.Accelerator, Version: b.Version}
			dial := s.dial
			hc = &fasthttp.HostClient{Addr: b.Addr, Dial: func(addr string) (net.Conn, error) { return dial(addr) },
				Name: "ferry-prefill", MaxIdemponentCallAttempts: 1, MaxResponseBodySize: maxPrefillAnswer,
				SecureErrorLogMessage: true, RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false }}
		}
		next.replicas = append(next.replicas, r)
		next.clients = append(next.clients, hc)
		next.benched = append(next.benched, bench)
	}
	if p, ok := st.picker.(policy.Preparer); ok {
		p.Prepare(next.replicas)
	}
	st.pool.Store(next)
	if old != nil {
		for i, r := range old.replicas {
			if !slices.Contains(next.replicas, r) {
				old.clients[i].CloseIdleConnections()
			}
		}
		st.retire(old.replicas, next.replicas)
	}
	return nil
}

// retire keeps the replicas of old that are not in next while they have steps in flight.
// Called under st.mu.
func (st *prefillState) retire(old, next []*policy.Replica) {
	for _, r := range old {
		if !slices.Contains(next, r) && r.InFlight.Load() > 0 {
			st.retired = append(st.retired, r)
		}
	}
}

// PrefillBusy maps each prefill replica's address (in the pool, or left it with steps in
// flight) to the prefill steps in flight there: what the replica manager waits for before it
// stops a prefill replica, as Busy is for the decode replicas.
func (s *Service) PrefillBusy() map[string]int64 {
	st := &s.prefill
	st.mu.Lock()
	defer st.mu.Unlock()
	st.retired = slices.DeleteFunc(st.retired, func(r *policy.Replica) bool { return r.InFlight.Load() == 0 })
	pool := st.pool.Load()
	if pool == nil && len(st.retired) == 0 {
		return nil
	}
	out := map[string]int64{}
	if pool != nil {
		for _, r := range pool.replicas {
			out[r.Addr] += r.InFlight.Load()
		}
	}
	for _, r := range st.retired {
		out[r.Addr] += r.InFlight.Load()
	}
	return out
}

// disaggregate runs the prefill step for a completion when the service has prefill replicas,
// and gives the upstream request the params its decode replica needs. Without prefill replicas,
// or when none could prefill it, the request is left as it is.
// It returns the prompt tokens it left counted in PrefillTokens, which dropPrefillHeld takes
// back once the answer has started: those of a request the decode replica prefills while the
// pool is empty.
func (s *Service) disaggregate(ex *exchange) int64 {
	pool := s.prefill.pool.Load()
	if pool == nil || len(ex.info.Prompt) == 0 {
		return 0
	}
	tokens := int64(len(ex.info.Tokens))
	if tokens == 0 {
		tokens = int64(len(ex.info.Prompt)+3) / 4 // llm-d's estimate without a tokenizer
	}
	s.prefill.tokens.Add(tokens)
	if len(pool.replicas) == 0 {
		return tokens
	}
	s.prefill.requests.Add(1)
	defer func() {
		s.prefill.tokens.Add(-tokens)
		s.prefill.requests.Add(-1)
	}()
	body := ex.req.Body()
	end := jsonObjectEnd(body)
	if end < 0 {
		return 0
	}
	var tried []*policy.Replica
	for attempt := 0; attempt < maxPrefillAttempts && len(tried) < len(pool.replicas); attempt++ {
		params, r, err := s.prefillOnce(ex, pool, body, end, tried)
		if err == nil {
			next := make([]byte, 0, end+len(params)+32)
			next = appendMember(append(next, body[:end]...), body[:end], `"kv_transfer_params":`)
			next = append(append(next, params...), '}')
			ex.req.SetBodyRaw(next)
			ex.req.Header.SetContentLength(len(next))
			return 0
		}
		if ce := s.log.Check(zap.WarnLevel, "prefill replica failed"); ce != nil {
			fields := []zap.Field{zap.Int("attempt", attempt+1), zap.ByteString("request_id", ex.requestID), zap.Error(err)}
			if r != nil {
				fields = append(fields, zap.Int("replica_id", r.ID), zap.String("addr", r.Addr))
			}
			ce.Write(fields...)
		}
		if r == nil {
			break
		}
		tried = append(tried, r)
	}
	// No prefill: the decode replica computes the prompt itself.
	return 0
}

// prefillOnce sends the prefill request to one replica of the pool and returns the
// kv_transfer_params of its answer.
func (s *Service) prefillOnce(ex *exchange, pool *prefillPool, body []byte, end int, tried []*policy.Replica) ([]byte, *policy.Replica, error) {
	now := time.Now()
	candidates := pool.available(tried, now)
	info := ex.info // the pick's own copy: the decode pick's estimate is the one learned from
	info.Estimate = policy.Estimate{}
	r := pool.picker.Pick(&info, candidates)
	if r == nil {
		return nil, nil, errors.New("no prefill replica to pick")
	}
	i := slices.Index(pool.replicas, r)
	hc, bench := pool.clients[i], pool.benched[i]
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	ex.req.Header.CopyTo(&req.Header)
	req.Header.SetHost(r.Addr)
	prefill := appendMember(append(make([]byte, 0, end+160), body[:end]...), body[:end],
		`"kv_transfer_params":{"do_remote_decode":true},"max_tokens":1,"max_completion_tokens":1,"stream":false,"stream_options":null}`)
	req.SetBodyRaw(prefill)
	req.Header.SetContentLength(len(prefill))
	r.InFlight.Add(1)
	err := hc.DoTimeout(req, resp, s.prefillTimeout())
	r.InFlight.Add(-1)
	if err == nil && resp.StatusCode() != fasthttp.StatusOK {
		err = fmt.Errorf("status %d: %.200s", resp.StatusCode(), resp.Body())
	}
	if err != nil {
		bench.failed(time.Now())
		s.observePrefill(time.Since(now), err)
		return nil, r, err
	}
	bench.answered()
	s.prefill.notePrefill(time.Since(now))
	params, err := prefillParams(resp.Body())
	s.observePrefill(time.Since(now), err)
	if err != nil {
		return nil, r, err
	}
	if ce := s.log.Check(zap.DebugLevel, "prefilled"); ce != nil {
		ce.Write(zap.Int("replica_id", r.ID), zap.Duration("took", time.Since(now)), zap.ByteString("request_id", ex.requestID))
	}
	return params, r, nil
}

// prefillParams reads the kv_transfer_params of a prefill replica's answer.
func prefillParams(body []byte) ([]byte, error) {
	var answer struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, fmt.Errorf("reading the prefill answer: %w", err)
	}
	if p := bytes.TrimSpace(answer.Params); len(p) == 0 || p[0] != '{' {
		return nil, errors.New("the prefill answer has no kv_transfer_params: is the replica's engine started with a KV connector (--kv-transfer-config)?")
	}
	return slices.Clone(answer.Params), nil
}

// available is the pool's replicas a request may try: not tried yet and not sitting out a
// failure; when every untried one is, the untried ones (a benched replica may have recovered).
func (pool *prefillPool) available(tried []*policy.Replica, now time.Time) []*policy.Replica {
	if len(tried) == 0 && !slices.ContainsFunc(pool.benched, func(b *prefillBench) bool { return b.until.Load() > now.UnixNano() }) {
		return pool.replicas // the common case, without allocating
	}
	var out, untried []*policy.Replica
	for i, r := range pool.replicas {
		if slices.Contains(tried, r) {
			continue
		}
		untried = append(untried, r)
		if pool.benched[i].until.Load() <= now.UnixNano() {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return untried
	}
	return out
}

// jsonObjectEnd returns the index of the '}' closing the JSON object body is, or -1 when body
// does not end in one.
func jsonObjectEnd(body []byte) int {
	end := len(bytes.TrimRight(body, " \t\r\n")) - 1
	if end < 1 || body[end] != '}' || bytes.TrimLeft(body, " \t\r\n")[0] != '{' {
		return -1
	}
	return end
}

// appendMember appends member to dst, which holds an object's text up to (not including) its
// closing brace, head, with the comma it needs. A later duplicate key wins in vLLM's parser (and
// Go's), so member overrides what the client sent.
func appendMember(dst, head []byte, member string) []byte {
	if t := bytes.TrimRight(head, " \t\r\n"); t[len(t)-1] != '{' {
		dst = append(dst, ',')
	}
	return append(dst, member...)
}

// PrefillBackends is the prefill pool as SetPrefillBackends last set it: nil when the service
// is not disaggregated. A Service that takes over an endpoint (Handover.Swap) is given it.
func (s *Service) PrefillBackends() []Backend {
	pool := s.prefill.pool.Load()
	if pool == nil {
		return nil
	}
	out := make([]Backend, len(pool.replicas))
	for i, r := range pool.replicas {
		out[i] = Backend{ID: r.ID, Addr: r.Addr, Accelerator: r.Accelerator, Version: r.Version}
	}
	return out
}

// dropPrefillHeld takes a request's prompt tokens out of PrefillTokens once its decode replica
// has prefilled it (its first byte) or it ended.
func (s *Service) dropPrefillHeld(ex *exchange) {
	if ex.prefillHeld != 0 {
		s.prefill.tokens.Add(-ex.prefillHeld)
		ex.prefillHeld = 0
	}
}
