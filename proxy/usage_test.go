package proxy

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		tail string
		want tokenUsage
	}{
		"OpenAI chat completion": {
			tail: `"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,` +
				`"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}},` +
				`"service_tier":"default","system_fingerprint":null}`,
			want: tokenUsage{prompt: 19, completion: 10, cached: 0},
		},
		"vLLM members after usage": {
			tail: `}],"usage":{"prompt_tokens":9,"total_tokens":18,"completion_tokens":9,"prompt_tokens_details":null},` +
				`"prompt_logprobs":null,"kv_transfer_params":null}`,
			want: tokenUsage{prompt: 9, completion: 9, cached: -1}, // details null
		},
		"stream usage chunk": {
			tail: `data: {"id":"c","choices":[{"index":0,"delta":{"content":"!"}}],"usage":null}` + "\n\n" +
				`data: {"id":"c","choices":[],"usage":{"prompt_tokens":1234,"completion_tokens":567,"total_tokens":1801}}` + "\n\n" +
				"data: [DONE]\n\n",
			want: tokenUsage{prompt: 1234, completion: 567, cached: -1},
		},
		"stream without usage chunk": {
			tail: `data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}` + "\n\ndata: [DONE]\n\n",
			want: unknownUsage,
		},
		"whitespace": {
			tail: "{\"usage\" :\n {\n  \"completion_tokens\" : 3,\n  \"prompt_tokens\"\t:\t4\n }\n}\n",
			want: tokenUsage{prompt: 4, completion: 3, cached: -1},
		},
		"embeddings": {
			tail: `"data":[],"model":"e5","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			want: tokenUsage{prompt: 8, completion: -1, cached: -1},
		},
		"vLLM stream with cached tokens": {
			tail: `data: {"id":"c","choices":[],"usage":{"prompt_tokens":4096,"total_tokens":4100,"completion_tokens":4,` +
				`"prompt_tokens_details":{"cached_tokens":3072}}}` + "\n\ndata: [DONE]\n\n",
			want: tokenUsage{prompt: 4096, completion: 4, cached: 3072},
		},
		"usage key inside content is escaped": {
			tail: `"content":"say \"usage\":{\"prompt_tokens\":99}"}}]}`,
			want: unknownUsage,
		},
		"cut off by the start of the tail": {
			tail: `t_tokens":5,"completion_tokens":6}}`,
			want: unknownUsage,
		},
		"cut off at the end (broken stream)": {
			tail: `"usage":{"prompt_tokens":5,"completion_tok`,
			want: unknownUsage,
		},
		"not a number": {
			tail: `"usage":{"prompt_tokens":"5","completion_tokens":-6}`,
			want: unknownUsage,
		},
		"absurdly large": {
			tail: `"usage":{"prompt_tokens":12345678901234567890123,"completion_tokens":1}`,
			want: tokenUsage{prompt: -1, completion: 1, cached: -1},
		},
		"empty":     {tail: ``, want: unknownUsage},
		"null":      {tail: `{"usage":null}`, want: unknownUsage},
		"not JSON":  {tail: `<html>usage</html>`, want: unknownUsage},
		"no object": {tail: `"usage":`, want: unknownUsage},
	} {
		t.Run(name, func(t *testing.T) {
			if got := parseUsage([]byte(tc.tail)); got != tc.want {
				t.Errorf("parseUsage = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestUsageTail(t *testing.T) {
	full := strings.Repeat("x", usageTailSize)
	for name, tc := range map[string]struct {
		writes []string
		want   string
	}{
		"small":          {writes: []string{"ab", "cd"}, want: "abcd"},
		"exactly full":   {writes: []string{full[:10], full[10:]}, want: full},
		"overflow":       {writes: []string{"0123", full[4:], "ZZ"}, want: "23" + full[4:] + "ZZ"},
		"one big write":  {writes: []string{"lost" + full[:usageTailSize-2] + "ok"}, want: full[:usageTailSize-2] + "ok"},
		"big after some": {writes: []string{"lost", full}, want: full},
		"nothing":        {want: ""},
	} {
		t.Run(name, func(t *testing.T) {
			var tail usageTail
			for _, w := range tc.writes {
				tail.write([]byte(w))
			}
			if got := string(tail.bytes()); got != tc.want {
				t.Errorf("tail = %q (%d bytes), want %q (%d bytes)", got, len(got), tc.want, len(tc.want))
			}
		})
	}
}

// TestUsageTailFindsStreamUsage feeds a long stream in small reads, as a replica sends it.
func TestUsageTailFindsStreamUsage(t *testing.T) {
	var stream bytes.Buffer
	for range 500 {
		stream.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}],"usage":null}` + "\n\n")
	}
	stream.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":77,"completion_tokens":500}}` + "\n\n")
	stream.WriteString("data: [DONE]\n\n")
	var tail usageTail
	for b := stream.Bytes(); len(b) > 0; {
		n := min(len(b), 37)
		tail.write(b[:n])
		b = b[n:]
	}
	if got, want := parseUsage(tail.bytes()), (tokenUsage{prompt: 77, completion: 500, cached: -1}); got != want {
		t.Errorf("parseUsage = %+v, want %+v", got, want)
	}
}

func TestUsageDoesNotAllocate(t *testing.T) {
	body := []byte(`{"choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29}}`)
	var tail usageTail
	allocs := fewestAllocs(func() {
		tail.write(body)
		_ = parseUsage(tail.bytes())
	})
	if allocs != 0 {
		t.Errorf("%v allocations per tail write and parse, want 0", allocs)
	}
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`"usage":{"prompt_tokens":1,"completion_tokens":2}`))
	f.Add([]byte(`"usage":{"prompt_tokens":1,"x":{"completion_tokens":"`))
	f.Fuzz(func(t *testing.T, tail []byte) {
		u := parseUsage(tail)
		if u.prompt < -1 || u.completion < -1 {
			t.Errorf("parseUsage(%q) = %+v", tail, u)
		}
	})
}

func BenchmarkUsageTail(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n")
	var tail usageTail
	b.ReportAllocs()
	for b.Loop() {
		tail.write(chunk)
	}
}
