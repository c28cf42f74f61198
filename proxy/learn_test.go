package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/policy"
)

// startPrefillSim serves a simulated vLLM replica whose prefill costs time per uncached token,
// with a prefix cache, on loopback.
func startPrefillSim(t *testing.T) *upstream {
	t.Helper()
	cfg := replicasim.DefaultConfig()
	cfg.TTFT, cfg.ITL, cfg.ITLPerSeq = time.Millisecond, time.Millisecond, 0
	cfg.PrefillPerToken = 2 * time.Microsecond
	cfg.MaxTokens = 3
	return startUpstream(t, "sim", replicasim.NewServer(cfg).Handler().ServeHTTP)
}

// chatTurns returns the body of turn n (from 1) of a conversation: a system prompt, then n user
// messages each followed by its answer but the last, all long enough to fill cache blocks.
func chatTurns(conversation, n int, stream bool) string {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []message{{Role: "system", Content: strings.Repeat("You are a careful assistant. ", 40)}}
	for i := 1; i <= n; i++ {
		msgs = append(msgs, message{Role: "user", Content: strings.Repeat(fmt.Sprintf("conversation %d question %d. ", conversation, i), 60)})
		if i < n {
			msgs = append(msgs, message{Role: "assistant", Content: strings.Repeat(fmt.Sprintf("answer %d. ", i), 80)})
		}
	}
	body, _ := json.Marshal(map[string]any{
		"model": "ferry-sim", "messages": msgs, "max_tokens": 3,
		"stream": stream, "stream_options": map[string]bool{"include_usage": true},
	})
	return string(body)
}

// cachedTokensOf reads usage.prompt_tokens_details.cached_tokens from a stream's usage chunk.
func cachedTokensOf(t *testing.T, stream string) int {
	t.Helper()
	for line := range strings.SplitSeq(stream, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(data, `"usage"`) {
			continue
		}
		var chunk struct {
			Usage *struct {
				Details *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err == nil && chunk.Usage != nil && chunk.Usage.Details != nil {
			return chunk.Usage.Details.Cached
		}
	}
	t.Fatalf("no cached_tokens in the stream %q", stream)
	return 0
}

// With least_ttft, every turn of a conversation after the first finds the earlier turns in the
// prefix cache of the replica it lands on, over four replicas; the default spreads by load.
func TestLeastTTFTFollowsConversations(t *testing.T) {
	var backends []Backend
	for i := range 4 {
		backends = append(backends, Backend{ID: i + 1, Addr: startPrefillSim(t).addr(), Version: 1})
	}
	_, base := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT}, backends...)
	c := newClient(t)
	const conversations, turns = 6, 4
	for turn := 1; turn <= turns; turn++ {
		for conv := range conversations {
			r := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatTurns(conv, turn, true)),
				"Content-Type", "application/json")
			if r.status != http.StatusOK {
				t.Fatalf("conversation %d turn %d: status %d %s", conv, turn, r.status, r.body)
			}
			cached := cachedTokensOf(t, r.body)
			if turn > 1 && cached < 400 {
				t.Errorf("conversation %d turn %d: %d cached tokens, want its earlier turns' (over 400)", conv, turn, cached)
			}
		}
	}
}

// countingLearner passes Learn on to the real picker and keeps what it was told.
type countingLearner struct {
	policy.Learner
	mu    sync.Mutex
	calls []learnCall
}

type learnCall struct {
	replica int
	est     policy.Estimate
	out     policy.Outcome
}

func (l *countingLearner) Learn(r *policy.Replica, est policy.Estimate, out policy.Outcome) {
	l.mu.Lock()
	l.calls = append(l.calls, learnCall{replica: r.ID, est: est, out: out})
	l.mu.Unlock()
	l.Learner.Learn(r, est, out)
}

// A learning picker hears of every whole streamed 2xx answer, with the estimate its pick made,
// the times measured from sending and the engine's reported prompt and cached tokens, and of
// nothing else.
func TestLearnerHearsOfStreamedAnswers(t *testing.T) {
	sim := startPrefillSim(t)
	svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT}, Backend{ID: 7, Addr: sim.addr(), Version: 1})
	learner := &countingLearner{Learner: svc.learner}
	svc.learner = learner
	c := newClient(t)
	for _, body := range []string{
		chatTurns(1, 1, true),
		chatTurns(1, 2, false), // not streamed: not learned from
		`{"model":"nope","messages":[{"role":"user","content":"hi"}],"stream":true}`, // 404
		chatTurns(2, 1, true),
	} {
		do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Content-Type", "application/json")
	}
	learner.mu.Lock()
	defer learner.mu.Unlock()
	if len(learner.calls) != 2 {
		t.Fatalf("Learn called %d times, want 2 (the streamed 2xx answers): %+v", len(learner.calls), learner.calls)
	}
	for i, call := range learner.calls {
		if call.replica != 7 || call.out.TTFT <= 0 || call.out.Total < call.out.TTFT {
			t.Errorf("Learn(%+v): want replica 7 and 0 < ttft ≤ total", call)
		}
		if call.out.PromptTokens <= 0 || call.out.CachedTokens < 0 || call.out.CachedTokens >= call.out.PromptTokens {
			t.Errorf("Learn(%+v): want the engine's reported prompt and cached tokens", call)
		}
		if i == 1 && call.out.CachedTokens == 0 { // the second conversation opens on the first's system prompt
			t.Errorf("Learn(%+v): the shared system prompt was not reported cached", call)
		}
		if want := int64((len(chatTurns(1, 1, true)) - 1) / 4); call.est.Tokens < want/2 {
			t.Errorf("Learn(%+v): estimate of %d tokens, want about the messages' length / 4", call, call.est.Tokens)
		}
	}
}
