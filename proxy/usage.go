package proxy

import "bytes"

// usageTailSize bounds how much of a response body is kept for reading token usage. OpenAI
// servers put "usage" at the very end: as the last member of a non-streaming body (vLLM adds a
// few short members after it) and, with stream_options.include_usage, in the last chunk before
// "data: [DONE]". That chunk is about 400 bytes with a long model name and the *_details
// objects, so 1 KiB holds it with room to spare while costing one small memmove per read.
const usageTailSize = 1 << 10

// usageTail is the last usageTailSize bytes of a response body. It is a fixed array inside the
// pooled exchange, so keeping it allocates nothing.
type usageTail struct {
	buf [usageTailSize]byte
	n   int
}

// write appends p, dropping the oldest bytes beyond the capacity.
func (t *usageTail) write(p []byte) {
	switch {
	case len(p) >= len(t.buf):
		t.n = copy(t.buf[:], p[len(p)-len(t.buf):])
	case t.n+len(p) <= len(t.buf):
		t.n += copy(t.buf[t.n:], p)
	default:
		keep := len(t.buf) - len(p)
		copy(t.buf[:keep], t.buf[t.n-keep:t.n])
		copy(t.buf[keep:], p)
		t.n = len(t.buf)
	}
}

func (t *usageTail) bytes() []byte { return t.buf[:t.n] }

// tokenUsage is what a response reported of its token counts; -1 means not reported. cached is
// usage.prompt_tokens_details.cached_tokens, the prompt tokens the engine's prefix cache held.
type tokenUsage struct {
	prompt, completion, cached int64
}

var unknownUsage = tokenUsage{prompt: -1, completion: -1, cached: -1}

var (
	keyUsage            = []byte(`"usage"`)
	keyPromptTokens     = []byte(`"prompt_tokens"`)
	keyCompletionTokens = []byte(`"completion_tokens"`)
	keyCachedTokens     = []byte(`"cached_tokens"`)
)

// parseUsage reads the token counts of the last "usage" object in tail, the end of a response
// body, without allocating. It is a scanner, not a JSON parser: the quoted key "usage" cannot
// occur inside a JSON string (its quotes would be escaped there), so the last occurrence is the
// response's own usage member. Streams repeat "usage":null in every chunk; only the final usage
// chunk has an object. A missing, null or truncated usage yields unknownUsage; an embeddings
// response has no completion_tokens and yields only the prompt count.
func parseUsage(tail []byte) tokenUsage {
	i := bytes.LastIndex(tail, keyUsage)
	if i < 0 {
		return unknownUsage
	}
	s := jsonScanner{b: tail, i: i + len(keyUsage)}
	s.space()
	if !s.eat(':') {
		return unknownUsage
	}
	s.space()
	start := s.i
	if s.i >= len(s.b) || s.b[s.i] != '{' || !s.value(0) {
		return unknownUsage // null, or cut off by the tail's start or a broken stream
	}
	obj := tail[start:s.i]
	return tokenUsage{prompt: intMember(obj, keyPromptTokens), completion: intMember(obj, keyCompletionTokens),
		cached: intMember(obj, keyCachedTokens)}
}

// intMember returns the non-negative integer value of member key (quoted) in the JSON object
// obj, or -1. Nested objects do not repeat usage's top-level names (prompt_tokens_details holds
// cached_tokens, and only it has that name), so the first occurrence is the member.
func intMember(obj, key []byte) int64 {
	i := bytes.Index(obj, key)
	if i < 0 {
		return -1
	}
	s := jsonScanner{b: obj, i: i + len(key)}
	s.space()
	if !s.eat(':') {
		return -1
	}
	s.space()
	var v int64
	digits := 0
	for ; s.i < len(obj) && obj[s.i] >= '0' && obj[s.i] <= '9'; s.i++ {
		if digits++; digits > 18 { // beyond any real count; also keeps v from overflowing
			return -1
		}
		v = v*10 + int64(obj[s.i]-'0')
	}
	if digits == 0 {
		return -1
	}
	return v
}
