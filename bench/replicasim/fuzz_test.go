package replicasim

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzCompletionRequest feeds arbitrary bodies to both completion endpoints: whatever arrives,
// the replica answers with a status and, for errors, a well-formed OpenAI error; it never
// panics or leaks a batch slot.
func FuzzCompletionRequest(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"prompt":["a","b"],"max_tokens":1,"max_completion_tokens":2}`,
		`{"prompt":"x","max_tokens":-1}`,
		`{"messages":null}`, `{"model":7}`, `[]`, `"`, ``, `{"messages":[{"role":"user","content":{}}]}`,
	} {
		f.Add(seed)
	}
	cfg := fastConfig()
	cfg.TTFT, cfg.ITL = 0, 0
	s := NewServer(cfg)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader([]byte(body))))
			if rec.Code != http.StatusOK {
				decode[errorBody](t, rec.Body.Bytes())
			}
		}
		if s.sched.runningGauge.Load() != 0 || s.kvBlocksUsed.Load() != 0 {
			t.Fatalf("slot or KV blocks leaked after %q", body)
		}
	})
}
