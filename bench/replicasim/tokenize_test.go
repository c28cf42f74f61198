package replicasim

import (
	"encoding/binary"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []uint64  `json:"tokens"`
	TokenStrs   *[]string `json:"token_strs"`
}

// le is the token of up to four bytes.
func le(s string) uint64 {
	var b [4]byte
	copy(b[:], s)
	return uint64(binary.LittleEndian.Uint32(b[:]))
}

func TestTokenize(t *testing.T) {
	cfg := fastConfig()
	cfg.Signals = SignalsBasic // vLLM always has /tokenize, whatever it reports of its cache
	_, base := startServer(t, cfg)
	tests := map[string]struct {
		body       string
		wantTokens []uint64
		wantStrs   *[]string
	}{
		"prompt, short last token zero-padded": {
			body:       `{"model":"ferry-sim","prompt":"abcdefghi"}`,
			wantTokens: []uint64{le("abcd"), le("efgh"), le("i")},
		},
		"prompt without a model": {
			body:       `{"prompt":"abcd"}`,
			wantTokens: []uint64{le("abcd")},
		},
		"messages render as chat completions do": {
			body:       `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}`,
			wantTokens: []uint64{le("user"), le(": hi"), le("\n")},
		},
		"token strings on request": {
			body:       `{"prompt":"abcdef","return_token_strs":true}`,
			wantTokens: []uint64{le("abcd"), le("ef")},
			wantStrs:   &[]string{"abcd", "ef"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustPost(t, base+"/tokenize", tt.body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			got := decode[tokenizeResponse](t, r.body)
			want := tokenizeResponse{Count: len(tt.wantTokens), MaxModelLen: maxModelLen, Tokens: tt.wantTokens, TokenStrs: tt.wantStrs}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if got := metricValue(t, base, "replicasim_tokenize_requests_total"); got != float64(len(tests)) {
		t.Errorf("replicasim_tokenize_requests_total = %v, want %d", got, len(tests))
	}
}

// /tokenize of a chat counts exactly the prompt tokens the completion reports.
func TestTokenizeCountsCompletionPromptTokens(t *testing.T) {
	_, base := startServer(t, fastConfig())
	messages := `"messages":[{"role":"system","content":"Be brief. Always."},{"role":"user","content":[{"type":"text","text":"What is a ferry?"}]}]`
	tok := decode[tokenizeResponse](t, mustPost(t, base+"/tokenize", `{`+messages+`}`).body)
	done := decode[chatCompletion](t, mustPost(t, base+"/v1/chat/completions", `{`+messages+`,"max_tokens":1}`).body)
	if tok.Count != done.Usage.PromptTokens || len(tok.Tokens) != tok.Count {
		t.Errorf("/tokenize count %d (%d tokens), completion prompt_tokens %d", tok.Count, len(tok.Tokens), done.Usage.PromptTokens)
	}
}

func TestTokenizeErrors(t *testing.T) {
	s, base := startServer(t, fastConfig())
	tests := map[string]struct {
		body       string
		wantStatus int
		wantCode   *string
	}{
		"unknown model":               {`{"model":"gpt-5","prompt":"x"}`, http.StatusNotFound, new("model_not_found")},
		"not JSON":                    {`{"prompt":`, http.StatusBadRequest, nil},
		"neither prompt nor messages": {`{"model":"ferry-sim"}`, http.StatusBadRequest, nil},
		"prompt of a wrong type":      {`{"prompt":12}`, http.StatusBadRequest, nil},
		"empty messages":              {`{"messages":[]}`, http.StatusBadRequest, nil},
		"message without a role":      {`{"messages":[{"content":"x"}]}`, http.StatusBadRequest, nil},
		"continue and generation prompt": {
			`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`, http.StatusBadRequest, nil,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustPost(t, base+"/tokenize", tt.body)
			if r.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tt.wantStatus, r.body)
			}
			got := decode[errorBody](t, r.body)
			if got.Error.Type != "invalid_request_error" || !cmp.Equal(got.Error.Code, tt.wantCode) || got.Error.Message == "" {
				t.Errorf("error %+v", got.Error)
			}
		})
	}
	if r := get(t, base+"/tokenize"); r.status != http.StatusMethodNotAllowed {
		t.Errorf("GET /tokenize: status %d, want 405", r.status)
	}
	s.readyAt.Store(time.Now().Add(time.Hour).UnixNano())
	if r := mustPost(t, base+"/tokenize", `{"prompt":"x"}`); r.status != http.StatusServiceUnavailable {
		t.Errorf("/tokenize while loading: status %d, want 503", r.status)
	}
}
