package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// bodyFields are the top-level fields of an OpenAI request body that routing reads. Each is a
// sub-slice of the body (no copy): Model is the string's contents between its quotes, still
// JSON-escaped; Prompt is the raw JSON value of "messages" or "prompt". Stream tells whether the
// request asks for a streamed response, as the replica will read it (see streamRequested).
type bodyFields struct {
	Model  []byte
	Prompt []byte
	// Chat is set when Prompt is "messages"; Tools is the raw "tools" value, which a chat
	// template renders into the prompt (tokenize.go).
	Chat   bool
	Tools  []byte
	Stream bool
}

var (
	errBodyNotObject = errors.New("request body is not a JSON object")
	errBodySyntax    = errors.New("request body is not valid JSON")
)

var (
	keyModel    = []byte("model")
	keyMessages = []byte("messages")
	keyPrompt   = []byte("prompt")
	keyStream   = []byte("stream")
	keyTools    = []byte("tools")
)

// scanBody validates that body is one JSON object and returns its routing fields, in one pass
// and without allocating. Unlike encoding/json it does not decode values it does not need, so it
// costs about a memory scan of the body; the replica still does the full validation.
func scanBody(body []byte) (bodyFields, error) {
	var f bodyFields
	s := jsonScanner{b: body}
	s.space()
	if !s.eat('{') {
		return f, errBodyNotObject
	}
	s.space()
	if s.eat('}') {
		return f, s.end()
	}
	for {
		key, ok := s.memberKey()
		if !ok {
			return f, errBodySyntax
		}
		valStart := s.i
		if !s.value(0) {
			return f, errBodySyntax
		}
		val := body[valStart:s.i]
		switch {
		case bytes.Equal(key, keyModel):
			if len(val) >= 2 && val[0] == '"' {
				f.Model = val[1 : len(val)-1]
			}
		case bytes.Equal(key, keyMessages), bytes.Equal(key, keyPrompt):
			f.Prompt, f.Chat = val, key[0] == 'm'
		case bytes.Equal(key, keyTools):
			f.Tools = val
		case jsonKeyIs(key, keyStream):
			// The last "stream" wins, as in the replica's JSON decoder.
			f.Stream = streamRequested(val)
		}
		more, ok := s.nextMember()
		if !ok {
			return f, errBodySyntax
		}
		if !more {
			return f, s.end()
		}
	}
}

// jsonKeyIs reports whether the raw (still escaped) object key equals want, an ASCII name, once
// unescaped as a replica's JSON decoder would: a limit keyed on a field must not be dodged by
// writing "str\u0065am".
func jsonKeyIs(raw, want []byte) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return bytes.Equal(raw, want)
	}
	n := 0
	for i := 0; i < len(raw); n++ {
		c := raw[i]
		i++
		if c == '\\' {
			if i >= len(raw) {
				return false
			}
			switch e := raw[i]; e {
			case 'u':
				if len(raw)-i < 5 {
					return false
				}
				var r rune
				for _, h := range raw[i+1 : i+5] {
					r = r<<4 | rune(unhex(h))
				}
				i += 5
				if r >= 0x80 { // want is ASCII
					return false
				}
				c = byte(r)
			case 'b':
				c, i = '\b', i+1
			case 'f':
				c, i = '\f', i+1
			case 'n':
				c, i = '\n', i+1
			case 'r':
				c, i = '\r', i+1
			case 't':
				c, i = '\t', i+1
			default: // '"', '\\', '/'
				c, i = e, i+1
			}
		}
		if n >= len(want) || want[n] != c {
			return false
		}
	}
	return n == len(want)
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// streamRequested reads a "stream" value the way the replica's request validation may: vLLM's
// and TGI's are lax (pydantic and serde), so 1 and "true" stream too. Only values that surely
// read as false — false, null, a zero, or a string such as "false", "0", "no" or "off" — do not
// count; anything else counts as a stream, so a limit on streams errs on the side of applying.
func streamRequested(val []byte) bool {
	switch {
	case len(val) == 0:
		return false
	case string(val) == "true":
		return true
	case string(val) == "false", string(val) == "null":
		return false
	case val[0] == '-' || (val[0] >= '0' && val[0] <= '9'):
		return !isZeroNumber(val)
	case val[0] == '"':
		return !falseWord(val[1 : len(val)-1])
	}
	return true
}

// isZeroNumber reports whether a valid JSON number is zero: no digit before the exponent is
// other than 0.
func isZeroNumber(num []byte) bool {
	for _, c := range num {
		switch {
		case c == 'e' || c == 'E':
			return true
		case c >= '1' && c <= '9':
			return false
		}
	}
	return true
}

// falseWord reports whether a JSON string's raw contents are one of the words lax boolean
// parsing reads as false. An escaped string never is here: it counts as a stream.
func falseWord(s []byte) bool {
	if len(s) > 5 {
		return false
	}
	var lower [5]byte
	for i, c := range s {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	switch string(lower[:len(s)]) {
	case "false", "0", "no", "off", "f", "n":
		return true
	}
	return false
}

// maxJSONDepth bounds nesting, so a body of a million '[' cannot exhaust the stack.
const maxJSONDepth = 128

// jsonScanner skips over JSON values. It accepts exactly RFC 8259 JSON except that it does not
// check UTF-8 validity or the digits of \u escapes' surrogate pairs.
type jsonScanner struct {
	b []byte
	i int
	// nextQuote and nextSlash are where the next quote and backslash at or after some
	// earlier position are (len(b): none); below i they are stale (skipPlain).
	nextQuote, nextSlash int
}

// memberKey reads an object member's key and its colon, and returns the key as written
// (without its quotes, escapes kept), the scanner left at the value.
func (s *jsonScanner) memberKey() ([]byte, bool) {
	s.space()
	start := s.i
	if !s.str() {
		return nil, false
	}
	key := s.b[start+1 : s.i-1]
	s.space()
	if !s.eat(':') {
		return nil, false
	}
	s.space()
	return key, true
}

// nextMember reads what follows a member's value: a comma (more: another member follows) or
// the object's closing brace.
func (s *jsonScanner) nextMember() (more, ok bool) {
	s.space()
	if s.eat('}') {
		return false, true
	}
	return true, s.eat(',')
}

func (s *jsonScanner) end() error {
	s.space()
	if s.i != len(s.b) {
		return errBodySyntax
	}
	return nil
}

func (s *jsonScanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *jsonScanner) value(depth int) bool {
	if s.i >= len(s.b) || depth > maxJSONDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		return s.str()
	case c == '{':
		s.i++
		s.space()
		if s.eat('}') {
			return true
		}
		for {
			s.space()
			if !s.str() {
				return false
			}
			s.space()
			if !s.eat(':') {
				return false
			}
			s.space()
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.eat('}') {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	case c == '[':
		s.i++
		s.space()
		if s.eat(']') {
			return true
		}
		for {
			s.space()
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.eat(']') {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	}
	return false
}

func (s *jsonScanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

func (s *jsonScanner) str() bool {
	if !s.eat('"') {
		return false
	}
	for s.i < len(s.b) {
		s.skipPlain()
		if s.i >= len(s.b) {
			break
		}
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			s.i++
			if s.i >= len(s.b) {
				return false
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.b)-s.i < 5 {
					return false
				}
				for _, h := range s.b[s.i+1 : s.i+5] {
					if !isHex(h) {
						return false
					}
				}
				s.i += 5
			default:
				return false
			}
		case c < 0x20:
			return false
		default:
			s.i++
		}
	}
	return false
}

// skipPlain moves past plain text in a string: to the next quote or backslash, or to the
// 8-byte word holding the first control character before them (which str then refuses).
// Prompts are long strings of plain text: the quote and the backslash are found by
// bytes.IndexByte (vector instructions), each at most once per occurrence, since the scanner
// remembers where the next ones are; control characters are looked for a word at a time
// (SWAR). A 4k-token chat body scans in a fifth of the time a byte at a time took
// (BenchmarkScanAndPick).
func (s *jsonScanner) skipPlain() {
	if s.nextQuote < s.i {
		s.nextQuote = indexFrom(s.b, s.i, '"')
	}
	if s.nextSlash < s.i {
		s.nextSlash = indexFrom(s.b, s.i, '\\')
	}
	end := min(s.nextQuote, s.nextSlash)
	// A byte's high bit survives (x - 0x20) &^ x only where the byte of x is below 0x20.
	const highs, controls = 0x8080808080808080, 0x20 * 0x0101010101010101
	seg := s.b[s.i:end]
	for len(seg) >= 32 {
		w0, w1 := binary.LittleEndian.Uint64(seg[0:8]), binary.LittleEndian.Uint64(seg[8:16])
		w2, w3 := binary.LittleEndian.Uint64(seg[16:24]), binary.LittleEndian.Uint64(seg[24:32])
		if ((w0-controls)&^w0|(w1-controls)&^w1|(w2-controls)&^w2|(w3-controls)&^w3)&highs != 0 {
			break
		}
		seg = seg[32:]
	}
	for _, c := range seg {
		if c < 0x20 {
			s.i = end - len(seg) // str looks at these bytes one by one
			return
		}
	}
	s.i = end
}

// indexFrom is the index of the first c in b at or after i, or len(b).
func indexFrom(b []byte, i int, c byte) int {
	if j := bytes.IndexByte(b[i:], c); j >= 0 {
		return i + j
	}
	return len(b)
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func (s *jsonScanner) number() bool {
	s.eat('-')
	switch {
	case s.eat('0'):
	case s.digits() == 0:
		return false
	}
	if s.eat('.') && s.digits() == 0 {
		return false
	}
	if s.eat('e') || s.eat('E') {
		if !s.eat('+') {
			s.eat('-')
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}

func (s *jsonScanner) digits() int {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - start
}
