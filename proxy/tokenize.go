package proxy

import (
	"bytes"
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/policy"
)

// Token ids for requests the engines report their caches for. An engine's KV-cache events
// (ServiceConfig.KVEvents) name blocks of token ids, so matching a prompt against them needs
// the prompt's ids as that engine computes them: its chat template applied, its tokenizer run.
// The engine's own /tokenize (vLLM's, and SGLang's) gives exactly those, for any model, at the
// cost of a round trip before the pick (BenchmarkTokenize; `make bench-routing` reports it per
// request as ferry_tokenize_duration_seconds). Without an answer within tokenizeTimeout the
// request goes on with the byte index's guess: tokenizing must never cost more than it saves.

// KVIndexes gives the index of the engine at an address, fed by its KV-cache events
// (proxy/kvevents: a Listener engines publish to, or a Subscriber connecting to each engine).
// A Service asks once per replica address it routes to, when it first does.
type KVIndexes interface {
	For(addr string) *policy.KVBlocks
}

// kvForgetter is a KVIndexes that holds something per address (a Subscriber's connection): a
// Service tells it when it stops routing to an address it asked For.
type kvForgetter interface {
	Forget(addr string)
}

const (
	// tokenizeTimeout bounds the round trip. vLLM tokenizes a 4k-token chat in a few
	// milliseconds; a replica slower than this is busy enough that asking it costs more
	// than a guess.
	tokenizeTimeout = 50 * time.Millisecond
	// maxTokenizeBody bounds the answer read (a 128k-token prompt's ids are about 1 MiB).
	maxTokenizeBody = 4 << 20
)

var (
	tokenizePath      = []byte("/tokenize")
	keyTokens         = []byte("tokens")
	errTokenizeAnswer = errors.New("tokenize: no token ids in the answer")
)

// tokenizeClient returns the client of c's replica for /tokenize, creating it: its own
// connections, since only the handler's Do may use c.hc (clientwatch.go).
func (s *Service) tokenizeClient(c *hostClient) *fasthttp.HostClient {
	if hc := c.tokenize.Load(); hc != nil {
		return hc
	}
	dial := s.dial
	hc := &fasthttp.HostClient{
		Addr:                      c.addr,
		Dial:                      func(addr string) (net.Conn, error) { return dial(addr) },
		MaxConns:                  64,
		MaxIdemponentCallAttempts: 1,
		MaxResponseBodySize:       maxTokenizeBody,
		NoDefaultUserAgentHeader:  true,
		SecureErrorLogMessage:     true,
	}
	if !c.tokenize.CompareAndSwap(nil, hc) {
		return c.tokenize.Load()
	}
	return hc
}

// tokenize fills ex.info.Tokens from one of snap's replicas whose engine reports its cache,
// when the picker reads prompts and the request has one. Errors leave Tokens empty.
func (s *Service) tokenize(ex *exchange, snap *snapshot) {
	if s.cfg.KVEvents == nil || len(ex.info.Prompt) == 0 || s.needs&policy.NeedsPrompt == 0 {
		return
	}
	// Round robin over the replicas that report, so that one replica's tokenizer is not
	// every request's.
	n := len(snap.pick)
	start := int(s.tokenizeNext.Add(1))
	var c *hostClient
	for i := range n {
		r := snap.pick[(start+i)%n]
		if kv := r.KV(); kv != nil && kv.Live() {
			c = snap.clientFor(r)
			break
		}
	}
	if c == nil {
		return
	}
	start2 := time.Now()
	err := s.fetchTokens(ex, s.tokenizeClient(c))
	s.obs.observeTokenize(time.Since(start2), err)
	if err != nil {
		ex.info.Tokens = ex.info.Tokens[:0]
	}
}

// fetchTokens asks hc's /tokenize for the request's token ids: vLLM's TokenizeChatRequest for a
// chat (its messages and tools, with the generation prompt a chat completion adds) or its
// TokenizeCompletionRequest for a prompt.
func (s *Service) fetchTokens(ex *exchange, hc *fasthttp.HostClient) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURIBytes(tokenizePath)
	req.Header.SetHost(hc.Addr)
	req.Header.SetContentType("application/json")
	body := append(req.Body()[:0], `{"model":"`...)
	body = append(body, ex.info.Model...)
	if ex.chat {
		body = append(body, `","add_generation_prompt":true,"messages":`...)
		body = append(body, ex.info.Prompt...)
		if len(ex.tools) > 0 {
			body = append(body, `,"tools":`...)
			body = append(body, ex.tools...)
		}
	} else {
		body = append(body, `","prompt":`...)
		body = append(body, ex.info.Prompt...)
	}
	req.SetBodyRaw(append(body, '}'))
	if err := hc.DoTimeout(req, resp, tokenizeTimeout); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return errTokenizeAnswer
	}
	var ok bool
	ex.info.Tokens, ok = parseTokenIDs(ex.info.Tokens[:0], resp.Body())
	if !ok {
		return errTokenizeAnswer
	}
	return nil
}

// parseTokenIDs appends the ids of body's top-level "tokens" array ({"count": n,
// "max_model_len": m, "tokens": [ids...], "token_strs": ...}) to dst, in whatever order the
// members come: the other members are skipped as JSON values, so a "tokens" inside one of them
// (a token's text) is not taken for the ids. The array is read once, as it is parsed. It
// reports false when there is no such array of ids, or the answer is not a JSON object.
func parseTokenIDs(dst []uint32, body []byte) ([]uint32, bool) {
	s, ok := topMember(body, keyTokens)
	if !ok || !s.eat('[') {
		return dst, false
	}
	for {
		s.space()
		var id uint64
		digits := 0
		for ; s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9'; s.i++ {
			if digits++; digits > 10 {
				return dst, false
			}
			id = id*10 + uint64(s.b[s.i]-'0')
		}
		if digits == 0 || id > 1<<32-1 {
			return dst, false // not an id, or an empty array
		}
		dst = append(dst, uint32(id))
		s.space()
		if s.eat(']') {
			return dst, true
		}
		if !s.eat(',') {
			return dst, false
		}
	}
}

// topMember returns a scanner at the value of the top-level member key (as written: no
// escapes) of the JSON object body, scanning the members before it as whole values.
func topMember(body, key []byte) (jsonScanner, bool) {
	s := jsonScanner{b: body}
	s.space()
	if !s.eat('{') {
		return s, false
	}
	for {
		name, ok := s.memberKey()
		if !ok {
			return s, false
		}
		if bytes.Equal(name, key) {
			return s, true
		}
		if !s.value(1) {
			return s, false
		}
		if more, ok := s.nextMember(); !more || !ok {
			return s, false
		}
	}
}
