package proxy

import (
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/tenants"
)

// Tenancy is the process's managed API keys (`ferry keys`) and the ledger their limits are kept
// in, shared by every Service and the gateway of the process. The controller hands it the
// directory of keys; an attached proxy gets it from the controller with its config.
//
// A service that requires a key (service.auth) accepts a managed key whose scope allows it, on
// top of its own keys; a service that requires none still identifies a managed key a client
// presents, so its limits and usage apply. A request with a managed key is admitted against the
// key's and its team's limits once its body is read (admitTenant), and settled when its answer
// ends with the tokens the engine reported, or counted from the stream when it reported none.
// The service's own per-key rate limit applies to the service's own keys only.
type Tenancy struct {
	index  atomic.Pointer[tenants.Index]
	ledger *tenants.Ledger
	// models interns the model names requests name, so that a request's usage row does not
	// allocate its model's name: copied on write, read without a lock.
	models   atomic.Pointer[map[string]string]
	modelsMu sync.Mutex
}

// NewTenancy returns a Tenancy that admits against l (a new ledger when nil) and knows no key yet.
func NewTenancy(l *tenants.Ledger) *Tenancy {
	if l == nil {
		l = tenants.NewLedger()
	}
	return &Tenancy{ledger: l}
}

// SetDirectory replaces the keys, teams and prices; requests already admitted keep theirs.
func (t *Tenancy) SetDirectory(d tenants.Directory) {
	t.index.Store(tenants.NewIndex(d))
}

// Version is the directory version in use (0 before the first).
func (t *Tenancy) Version() int64 { return t.index.Load().Version() }

// Ledger is where the process's managed keys are charged; the caller syncs it with the hub.
func (t *Tenancy) Ledger() *tenants.Ledger { return t.ledger }

// lookup finds the active or expired managed key c is; nil when it is none of them (or t is
// nil). The map lookup is on the key's SHA-256, so its timing says nothing about the key.
func (t *Tenancy) lookup(c *credential) *tenants.Key {
	if t == nil || len(c.key) == 0 {
		return nil
	}
	x := t.index.Load()
	if x.Empty() {
		return nil
	}
	return x.Lookup(*c.digest())
}

// allows reports whether c is a managed key that is active now.
func (t *Tenancy) allows(c *credential) bool {
	k := t.lookup(c)
	return k != nil && k.Active(time.Now())
}

// identify finds the managed key of a request to the service, when the service's own keys did
// not match. It reports false when it answered the request: a managed key that expired or was
// revoked, or, where the service requires a key, none at all.
func (s *Service) identify(ctx *fasthttp.RequestCtx, c *credential, required bool) (*tenants.Key, bool) {
	k := s.tenancy.lookup(c)
	switch {
	case k == nil && required:
		s.unauthorized(ctx)
		return nil, false
	case k != nil && !k.Active(ctx.Time()): // the request's arrival: no clock read of its own
		refuseKey(ctx, s.authFailures, &s.errs)
		ctx.Response.SetBodyRaw(openAIError("The API key has expired or was revoked.", "invalid_request_error", "invalid_api_key"))
		s.recordSelfAnswer(ctx, nil, ctx.Time(), true)
		return nil, false
	}
	return k, true
}

// admitTenant checks an identified request against its key's scope and limits, once describe
// has read its model and prompt. It charges the request and keeps the ticket for the answer's
// end, or answers it (404 outside the key's scope, 429 over a limit) and reports false. The
// key's windows go into the answer's x-ratelimit-* headers either way.
func (s *Service) admitTenant(ctx *fasthttp.RequestCtx, ex *exchange, rate *rateState) bool {
	k, t := ex.managed, s.tenancy
	raw, _ := unescapedModel(ex.model)
	model := t.intern(raw)
	if !k.Allows(s.cfg.Name, model) {
		s.refuse(ctx, ex, fasthttp.StatusNotFound, modelNotFound(raw))
		return false
	}
	x := t.index.Load()
	d, tk := t.ledger.Admit(k, x.Team(k), s.cfg.Name, model, x.Price(model), estimateTokens(ex.promptLen), ctx.Time())
	rate.setTenant(d)
	if !d.OK {
		typ, code := "tokens", "rate_limit_exceeded"
		if d.Budget {
			typ, code = "insufficient_quota", "insufficient_quota"
		}
		s.refuse(ctx, ex, fasthttp.StatusTooManyRequests, openAIError(tenantRefusal(d), typ, code))
		if d.RetryAfter > 0 {
			setRetryAfter(ctx, d.RetryAfter)
		}
		return false
	}
	ex.ticket = tk
	ex.class, ex.tenant = k.Priority, k.ID
	if k.PriorityHeader {
		ex.class = k.ClassFor(string(ctx.Request.Header.PeekBytes(headerXFerryPriority)))
	}
	return true
}

// maxInterned bounds the interned model names: beyond, a name is allocated per request, so
// clients naming endless models cannot grow the table.
const maxInterned = 4096

// intern returns b as a string, the same string for every request that names it.
func (t *Tenancy) intern(b []byte) string {
	if m := t.models.Load(); m != nil {
		if s, ok := (*m)[string(b)]; ok {
			return s
		}
	}
	s := string(b)
	t.modelsMu.Lock()
	defer t.modelsMu.Unlock()
	old := t.models.Load()
	if old != nil && len(*old) >= maxInterned {
		return s
	}
	next := map[string]string{}
	if old != nil {
		next = maps.Clone(*old)
	}
	next[s] = s
	t.models.Store(&next)
	return s
}

var headerXFerryPriority = []byte("X-Ferry-Priority")

func tenantRefusal(d tenants.Decision) string {
	msg := "Rate limit reached: " + d.Refusal + "."
	if d.TooLarge {
		msg = "Request too large: " + d.Refusal + "."
	} else if d.RetryAfter > 0 {
		msg += fmt.Sprintf(" Please try again in %s.", d.RetryAfter.Round(time.Second))
	}
	return msg
}

// estimateTokens guesses a prompt's tokens from its JSON's length: about four bytes a token in
// English text (OpenAI's rule of thumb), at least one. The answer's usage corrects it.
func estimateTokens(promptBytes int) int64 { return int64(promptBytes/4) + 1 }

// settleTenant completes a request's charge when its answer ends: the engine's counts when it
// reported them, else the estimate for the prompt and the stream's events for the output (an
// event a token, as vLLM and TGI stream them, less the closing [DONE]). A request that no
// replica answered gives its estimate back and counts as an error.
func (ex *exchange) settleTenant(usage tokenUsage, answered bool, err error) {
	if !ex.ticket.Open() {
		return
	}
	in, out := usage.prompt, usage.completion
	if !answered {
		in, out = 0, 0
	} else if out < 0 {
		out = max(ex.obs.events-1, 0)
	}
	code := ex.resp.StatusCode()
	failed := !answered || err != nil || code < 200 || code > 299
	ex.svc.tenancy.ledger.Settle(&ex.ticket, in, out, failed, time.Now())
}

// countsEvents reports whether the stream's events must be counted though metrics are off: a
// managed key is charged for what it received.
func (ex *exchange) countsEvents() bool { return ex.ticket.Open() }

var (
	headerRateLimitTokens     = []byte("X-Ratelimit-Limit-Tokens")
	headerRateRemainingTokens = []byte("X-Ratelimit-Remaining-Tokens")
	headerRateResetTokens     = []byte("X-Ratelimit-Reset-Tokens")
)

// setTenant puts a managed key's windows in the headers: its request window replaces the
// service's per-key bucket (which does not apply to managed keys), and its token window adds
// the -tokens headers.
func (r *rateState) setTenant(d tenants.Decision) {
	if w := d.Requests; w.Limit > 0 {
		r.set, r.limit, r.remaining, r.reset = true, w.Limit, w.Remaining, w.Reset
	}
	if w := d.Tokens; w.Limit > 0 {
		r.tokens, r.tokLimit, r.tokRemaining, r.tokReset = true, w.Limit, w.Remaining, w.Reset
	}
}

func (r rateState) writeTokens(h *fasthttp.ResponseHeader) {
	if !r.tokens {
		return
	}
	var buf [24]byte
	h.SetCanonical(headerRateLimitTokens, strconv.AppendInt(buf[:0], r.tokLimit, 10))
	h.SetCanonical(headerRateRemainingTokens, strconv.AppendInt(buf[:0], r.tokRemaining, 10))
	h.SetCanonical(headerRateResetTokens, appendReset(buf[:0], r.tokReset))
}

// appendReset appends OpenAI's spelling of a reset: Go's duration to the millisecond, at least
// 1 ms when anything is left to reset. Appending keeps the string off the heap.
func appendReset(dst []byte, d time.Duration) []byte {
	reset := d.Round(time.Millisecond)
	if d > 0 && reset == 0 {
		reset = time.Millisecond
	}
	return append(dst, reset.String()...)
}
