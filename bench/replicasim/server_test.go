package replicasim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHealthFollowsStartupDelay(t *testing.T) {
	cfg := fastConfig()
	cfg.StartupDelay = time.Hour
	s, base := startServer(t, cfg)

	if r := get(t, base+"/health"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("/health while loading: status %d, want 503", r.status)
	}
	r := mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("completion while loading: status %d, want 503", r.status)
	}
	decode[errorBody](t, r.body)

	s.readyAt.Store(time.Now().UnixNano()) // the delay has elapsed
	if r := get(t, base+"/health"); r.status != http.StatusOK || len(r.body) != 0 {
		t.Fatalf("/health once loaded: status %d body %q, want 200 and empty", r.status, r.body)
	}
	if r := mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`); r.status != http.StatusOK {
		t.Fatalf("completion once loaded: status %d, want 200", r.status)
	}
}

func TestModelsAndRoot(t *testing.T) {
	cfg := fastConfig()
	cfg.Model = "meta-llama/Llama-3.1-8B-Instruct"
	_, base := startServer(t, cfg)

	r := get(t, base+"/v1/models")
	if r.status != http.StatusOK {
		t.Fatalf("/v1/models: status %d", r.status)
	}
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"` // null but for LoRA adapters (lora_test.go)
		MaxModelLen int     `json:"max_model_len"`
	}
	got := decode[struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}](t, r.body)
	if got.Object != "list" || len(got.Data) != 1 {
		t.Fatalf("/v1/models = %+v, want a list of one model", got)
	}
	m := got.Data[0]
	if m.ID != cfg.Model || m.Object != "model" || m.OwnedBy != "ferry" || m.Created == 0 {
		t.Errorf("model entry = %+v", m)
	}

	if r := get(t, base+"/"); r.status != http.StatusOK || !json.Valid(r.body) {
		t.Errorf("GET /: status %d body %q, want 200 JSON", r.status, r.body)
	}
}

func TestChatNonStream(t *testing.T) {
	_, base := startServer(t, fastConfig())
	tests := map[string]struct {
		body       string
		wantPrompt int
		wantTokens int
	}{
		"string content, max_tokens": {
			body:       `{"model":"ferry-sim","messages":[{"role":"user","content":"hello"}],"max_tokens":5}`,
			wantPrompt: tokensOf("user: hello\n"),
			wantTokens: 5,
		},
		"content parts, max_completion_tokens wins": {
			body: `{"model":"ferry-sim","messages":[{"role":"system","content":"be brief"},` +
				`{"role":"user","content":[{"type":"text","text":"hi "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}]}],` +
				`"max_tokens":3,"max_completion_tokens":7,"temperature":0.2,"n":1}`,
			wantPrompt: tokensOf("system: be brief\nuser: hi there\n"),
			wantTokens: 7,
		},
		"no model, default length": {
			body:       `{"messages":[{"role":"user","content":null},{"role":"user","content":"abc"}]}`,
			wantPrompt: tokensOf("user: \nuser: abc\n"),
			wantTokens: 8,
		},
	}

	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustPost(t, base+"/v1/chat/completions", tc.body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			got := decode[chatCompletion](t, r.body)
			if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Object != "chat.completion" || got.Model != "ferry-sim" || got.Created == 0 {
				t.Errorf("head = %q %q %q %d", got.ID, got.Object, got.Model, got.Created)
			}
			if len(got.Choices) != 1 {
				t.Fatalf("choices = %d, want 1", len(got.Choices))
			}
			c := got.Choices[0]
			if c.Message.Role != "assistant" || c.FinishReason != "length" || c.Index != 0 {
				t.Errorf("choice = %+v", c)
			}
			if words := strings.Fields(c.Message.Content); len(words) != tc.wantTokens || !strings.HasPrefix(c.Message.Content, " ") {
				t.Errorf("content %q has %d words, want %d each with a leading space", c.Message.Content, len(words), tc.wantTokens)
			}
			var want usage
			want.PromptTokens, want.CompletionTokens, want.TotalTokens = tc.wantPrompt, tc.wantTokens, tc.wantPrompt+tc.wantTokens
			if diff := cmp.Diff(want, got.Usage); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
		})
	}
}

// tokensOf is the simulator's token estimate for a rendered prompt: ceil(bytes / 4).
func tokensOf(rendered string) int { return (len(rendered) + 3) / 4 }

func TestCompletionNonStream(t *testing.T) {
	_, base := startServer(t, fastConfig())
	tests := map[string]struct {
		prompt     string
		wantPrompt int
	}{
		"string":           {`"Once upon a time"`, tokensOf("Once upon a time")},
		"array of strings": {`["Once upon ", "a time!"]`, tokensOf("Once upon a time!")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustPost(t, base+"/v1/completions", `{"model":"ferry-sim","prompt":`+tc.prompt+`,"max_tokens":4}`)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			got := decode[textCompletion](t, r.body)
			if !strings.HasPrefix(got.ID, "cmpl-") || got.Object != "text_completion" || got.Model != "ferry-sim" {
				t.Errorf("head = %q %q %q", got.ID, got.Object, got.Model)
			}
			if len(got.Choices) != 1 || got.Choices[0].FinishReason != "length" || len(strings.Fields(got.Choices[0].Text)) != 4 {
				t.Errorf("choices = %+v", got.Choices)
			}
			if got.Usage.PromptTokens != tc.wantPrompt || got.Usage.CompletionTokens != 4 || got.Usage.TotalTokens != tc.wantPrompt+4 {
				t.Errorf("usage = %+v, want prompt %d completion 4", got.Usage, tc.wantPrompt)
			}
		})
	}
}

func TestRequestIDEchoed(t *testing.T) {
	_, base := startServer(t, fastConfig())
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`))
	req.Header.Set("X-Request-Id", "req-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got != "req-42" {
		t.Errorf("X-Request-Id = %q, want req-42", got)
	}
}

func TestStream(t *testing.T) {
	_, base := startServer(t, fastConfig())
	tests := map[string]struct {
		path         string
		body         string
		wantObject   string
		wantUsage    bool
		wantTokens   int
		wantIDPrefix string
	}{
		"chat with usage": {
			path:       "/v1/chat/completions",
			body:       `{"model":"ferry-sim","messages":[{"role":"user","content":"hello"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`,
			wantObject: "chat.completion.chunk", wantUsage: true, wantTokens: 6, wantIDPrefix: "chatcmpl-",
		},
		"chat without usage": {
			path:       "/v1/chat/completions",
			body:       `{"messages":[{"role":"user","content":"hello"}],"max_tokens":3,"stream":true}`,
			wantObject: "chat.completion.chunk", wantTokens: 3, wantIDPrefix: "chatcmpl-",
		},
		"completions with usage": {
			path:       "/v1/completions",
			body:       `{"prompt":"hello","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`,
			wantObject: "text_completion", wantUsage: true, wantTokens: 4, wantIDPrefix: "cmpl-",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustPost(t, base+tc.path, tc.body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type = %q", ct)
			}
			events := parseSSE(t, r.body)
			if events[len(events)-1] != "[DONE]" {
				t.Fatalf("last event = %q, want [DONE]", events[len(events)-1])
			}
			var chunks []chunk
			for _, e := range events[:len(events)-1] {
				chunks = append(chunks, decode[chunk](t, []byte(e)))
			}
			id := chunks[0].ID
			for _, c := range chunks {
				if c.ID != id || !strings.HasPrefix(id, tc.wantIDPrefix) || c.Object != tc.wantObject || c.Model != "ferry-sim" {
					t.Errorf("chunk head = %q %q %q, want one id with prefix %q, object %q", c.ID, c.Object, c.Model, tc.wantIDPrefix, tc.wantObject)
				}
			}
			if tc.wantUsage {
				last := chunks[len(chunks)-1]
				if len(last.Choices) != 0 || last.Usage == nil {
					t.Fatalf("last chunk = %+v, want empty choices and usage", last)
				}
				if last.Usage.CompletionTokens != tc.wantTokens || last.Usage.TotalTokens != last.Usage.PromptTokens+tc.wantTokens {
					t.Errorf("usage = %+v", *last.Usage)
				}
				chunks = chunks[:len(chunks)-1]
			}
			final := chunks[len(chunks)-1]
			if len(final.Choices) != 1 || final.Choices[0].FinishReason == nil || *final.Choices[0].FinishReason != "length" {
				t.Fatalf("final chunk = %+v, want finish_reason length", final)
			}
			chunks = chunks[:len(chunks)-1]
			isChat := tc.wantObject == "chat.completion.chunk"
			if isChat {
				first := chunks[0]
				if first.Choices[0].Delta == nil || first.Choices[0].Delta.Role != "assistant" {
					t.Fatalf("first chunk = %+v, want delta.role assistant", first)
				}
				chunks = chunks[1:]
			}
			if len(chunks) != tc.wantTokens {
				t.Fatalf("%d token chunks, want %d", len(chunks), tc.wantTokens)
			}
			for _, c := range chunks {
				if c.Usage != nil || len(c.Choices) != 1 || c.Choices[0].FinishReason != nil {
					t.Fatalf("token chunk = %+v", c)
				}
				text := ""
				if isChat {
					text = c.Choices[0].Delta.Content
				} else {
					text = *c.Choices[0].Text
				}
				if !strings.HasPrefix(text, " ") || len(strings.Fields(text)) != 1 {
					t.Errorf("token %q is not one word with a leading space", text)
				}
			}
		})
	}
}

func TestSameSeedSameText(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"hello"}],"max_tokens":12}`
	var contents []string
	for range 2 {
		_, base := startServer(t, fastConfig())
		got := decode[chatCompletion](t, mustPost(t, base+"/v1/chat/completions", body).body)
		contents = append(contents, got.ID+got.Choices[0].Message.Content)
	}
	if contents[0] != contents[1] {
		t.Errorf("same seed gave different output:\n%s\n%s", contents[0], contents[1])
	}
}

// slowBody is a request that stays in prefill for an hour: it holds its batch slot until the
// client gives up or the server shuts down.
const slowBody = `{"messages":[{"role":"user","content":"hold"}],"max_tokens":2}`

func slowConfig() Config {
	cfg := fastConfig()
	cfg.TTFT = time.Hour
	return cfg
}

// TestQueueLimitAndDisconnect fills the one batch slot and the one waiting place, checks that
// the next request gets 429 and that the gauges show it, then drops the clients and checks both
// places come free.
func TestQueueLimitAndDisconnect(t *testing.T) {
	cfg := slowConfig()
	cfg.MaxNumSeqs, cfg.MaxWaiting = 1, 1
	_, base := startServer(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_, err := post(t, ctx, base+"/v1/chat/completions", slowBody)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("held request ended with %v, want context.Canceled", err)
			}
		})
	}
	waitFor(t, "one running and one waiting", func() bool {
		m := scrape(t, base)
		return m["vllm:num_requests_running"] == 1 && m["vllm:num_requests_waiting"] == 1
	})

	r := mustPost(t, base+"/v1/chat/completions", slowBody)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("third request: status %d, want 429", r.status)
	}
	if got := decode[errorBody](t, r.body); got.Error.Type != "server_overloaded" || got.Error.Message == "" {
		t.Errorf("429 body = %+v", got)
	}
	if r.header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}

	cancel()
	wg.Wait()
	waitFor(t, "slots released", func() bool {
		m := scrape(t, base)
		return m["vllm:num_requests_running"] == 0 && m["vllm:num_requests_waiting"] == 0 && m["vllm:kv_cache_usage_perc"] == 0
	})
}

func TestStreamDisconnectReleasesSlot(t *testing.T) {
	cfg := fastConfig()
	cfg.ITL = time.Hour // the stream stalls after its first token
	cfg.MaxNumSeqs = 1
	s, base := startServer(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil { // the stream has started
		t.Fatal(err)
	}
	if got := s.sched.runningGauge.Load(); got != 1 {
		t.Fatalf("running = %d mid-stream, want 1", got)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "slot released", func() bool { return s.sched.runningGauge.Load() == 0 && s.kvBlocksUsed.Load() == 0 })

	// The freed slot serves the next request (one token: no inter-token wait).
	if r := mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`); r.status != http.StatusOK {
		t.Fatalf("after disconnect: status %d", r.status)
	}
}

func TestPrefixCache(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillPerToken = time.Microsecond
	_, base := startServer(t, cfg)

	system := strings.Repeat("You are a helpful assistant for the harbor ferry company. ", 20) // > 1,000 bytes
	body := func(question string) string {
		return fmt.Sprintf(`{"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":2}`, system, question)
	}
	prompt := "system: " + system + "\nuser: when does the boat leave?\n"
	promptTokens := (len(prompt) + 3) / 4
	wantCached := min(len(prompt)/blockChars, (promptTokens-1)/blockTokens) * blockTokens

	first := decode[chatCompletion](t, mustPost(t, base+"/v1/chat/completions", body("when does the boat leave?")).body)
	second := decode[chatCompletion](t, mustPost(t, base+"/v1/chat/completions", body("when does the boat leave?")).body)
	if first.Usage.PromptTokens != promptTokens || second.Usage.PromptTokens != promptTokens {
		t.Fatalf("prompt tokens %d and %d, want %d", first.Usage.PromptTokens, second.Usage.PromptTokens, promptTokens)
	}
	if first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("cold prompt: cached_tokens = %d, want 0", first.Usage.PromptTokensDetails.CachedTokens)
	}
	if got := second.Usage.PromptTokensDetails.CachedTokens; got != wantCached || got == 0 {
		t.Errorf("repeated prompt: cached_tokens = %d, want %d", got, wantCached)
	}

	// A different question shares the system prompt's whole blocks only.
	third := decode[chatCompletion](t, mustPost(t, base+"/v1/chat/completions", body("is there a cafe on deck?")).body)
	sharedBlocks := len("system: "+system+"\nuser: ") / blockChars
	if got := third.Usage.PromptTokensDetails.CachedTokens; got != sharedBlocks*blockTokens {
		t.Errorf("shared system prompt: cached_tokens = %d, want %d", got, sharedBlocks*blockTokens)
	}

	m := scrape(t, base)
	wantQueries := float64(2*promptTokens + third.Usage.PromptTokens)
	wantHits := float64(wantCached + sharedBlocks*blockTokens)
	if m["vllm:prefix_cache_queries_total"] != wantQueries || m["vllm:prefix_cache_hits_total"] != wantHits {
		t.Errorf("prefix cache counters: queries %v hits %v, want %v and %v",
			m["vllm:prefix_cache_queries_total"], m["vllm:prefix_cache_hits_total"], wantQueries, wantHits)
	}
}

func TestPrefixCacheIsScopedByModel(t *testing.T) {
	prompt := []byte(strings.Repeat("x", 10*blockChars))
	a := blockHashes(nil, 1, prompt)
	b := blockHashes(nil, 2, prompt)
	c := newPrefixCache(100, nil)
	c.insert(a, nil, 0)
	if got := c.match(b, len(b)); got != 0 {
		t.Errorf("another model's blocks matched %d, want 0", got)
	}
	if got := c.match(a, len(a)); got != 10 {
		t.Errorf("same model matched %d blocks, want 10", got)
	}
}

func TestPrefixCacheLRU(t *testing.T) {
	c := newPrefixCache(3, nil)
	c.insert([]uint64{1, 2, 3}, nil, 0)           // freed last block first: 1 is the most recent, 3 the oldest
	if got := c.match([]uint64{2}, 1); got != 1 { // 2 becomes most recent; 3 is still the oldest
		t.Fatalf("match(2) = %d", got)
	}
	c.insert([]uint64{4}, nil, 0)
	if c.len() != 3 {
		t.Fatalf("len = %d, want capacity 3", c.len())
	}
	for h, want := range map[uint64]int{1: 1, 2: 1, 3: 0, 4: 1} {
		if got := c.match([]uint64{h}, 1); got != want {
			t.Errorf("after eviction, match(%d) = %d, want %d", h, got, want)
		}
	}
	if got := c.match([]uint64{1, 2, 3, 4}, 4); got != 2 {
		t.Errorf("a chain stops at the first miss: matched %d, want 2", got)
	}
	if got := c.match([]uint64{1, 2, 4}, 1); got != 1 {
		t.Errorf("limit ignored: matched %d, want 1", got)
	}
}

// A chain loses its tail before its head, as in vLLM, whose free-block queue takes a
// finished request's blocks last block first: under pressure a conversation keeps the
// longest prefix that fits, instead of losing its first block and with it every later one.
func TestPrefixCacheEvictsTailsFirst(t *testing.T) {
	c := newPrefixCache(6, nil)
	c.insert([]uint64{1, 2, 3, 4}, nil, 0)
	c.insert([]uint64{10, 11, 12}, nil, 0) // one block over: the oldest is the first chain's tail
	if got := c.match([]uint64{1, 2, 3, 4}, 4); got != 3 {
		t.Errorf("first chain after one eviction: matched %d, want 3 (its tail went)", got)
	}
	if got := c.match([]uint64{10, 11, 12}, 3); got != 3 {
		t.Errorf("second chain: matched %d, want 3", got)
	}
}

// Blocks that running sequences hold for their generated tokens are not free for cached
// prefixes: an insert under such pressure evicts down to what is left.
func TestPrefixCacheShrinksUnderKVPressure(t *testing.T) {
	c := newPrefixCache(10, nil)
	c.insert([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, nil, 0)
	c.insert([]uint64{20, 21}, nil, 6) // 6 blocks reserved: 4 left for the cache
	if c.len() != 4 {
		t.Fatalf("len = %d, want 4 (capacity 10 less 6 reserved)", c.len())
	}
	if got := c.match([]uint64{20, 21}, 2); got != 2 {
		t.Errorf("the new prompt's blocks: matched %d, want 2", got)
	}
	if got := c.match([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, 8); got != 2 {
		t.Errorf("the old chain under pressure: matched %d, want its first 2 blocks", got)
	}
	c.insert([]uint64{30, 31, 32, 33, 34}, nil, 100) // reserved beyond capacity: the prompt itself stays
	if got := c.match([]uint64{30, 31, 32, 33, 34}, 5); got != 5 {
		t.Errorf("a prompt under full pressure keeps its own blocks: matched %d, want 5", got)
	}
}

// vllm:cache_config_info announces the cache's size the way vLLM does, for routers that size
// their picture of a replica's cache by it.
func TestMetricsAnnounceCacheConfig(t *testing.T) {
	cfg := fastConfig()
	cfg.KVCacheBlocks = 1234
	_, base := startServer(t, cfg)
	body := string(get(t, base+"/metrics").body)
	var line string
	for l := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(l, "vllm:cache_config_info{") {
			line = l
		}
	}
	for _, want := range []string{`block_size="16"`, `num_gpu_blocks="1234"`, `enable_prefix_caching="True"`} {
		if !strings.Contains(line, want) {
			t.Errorf("vllm:cache_config_info line %q lacks %s", line, want)
		}
	}
	if !strings.HasSuffix(line, " 1") {
		t.Errorf("vllm:cache_config_info line %q: want the value 1", line)
	}
}

func TestMetricsExposeVLLMNames(t *testing.T) {
	_, base := startServer(t, fastConfig())
	mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"max_tokens":3}`)
	r := get(t, base+"/metrics")
	for _, name := range []string{
		"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:gpu_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
		"vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
	} {
		if !strings.Contains(string(r.body), name+`{`) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !strings.Contains(string(r.body), `model_name="ferry-sim"`) {
		t.Error("/metrics lacks the model_name label")
	}
	m := scrape(t, base)
	want := map[string]float64{
		"vllm:prompt_tokens_total":               float64(tokensOf("user: hello\n")),
		"vllm:generation_tokens_total":           3,
		"vllm:request_success_total":             1,
		"vllm:time_to_first_token_seconds_count": 1,
		"vllm:e2e_request_latency_seconds_count": 1,
	}
	got := map[string]float64{}
	for k := range want {
		got[k] = m[k]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters after one request (-want +got):\n%s", diff)
	}
}

func TestKVCacheUsageMoves(t *testing.T) {
	cfg := slowConfig()
	cfg.KVCacheBlocks = 10
	_, base := startServer(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// 160 bytes of prompt: 40 tokens, 3 blocks of 16.
		_, _ = post(t, ctx, base+"/v1/completions", `{"prompt":"`+strings.Repeat("a", 160)+`"}`)
	}()
	waitFor(t, "KV blocks held", func() bool { return metricValue(t, base, "vllm:kv_cache_usage_perc") == 0.3 })
	if got := metricValue(t, base, "vllm:gpu_cache_usage_perc"); got != 0.3 {
		t.Errorf("vllm:gpu_cache_usage_perc = %v, want 0.3 like kv_cache_usage_perc", got)
	}
	cancel()
	<-done
	waitFor(t, "KV blocks freed", func() bool { return metricValue(t, base, "vllm:kv_cache_usage_perc") == 0 })
}

func TestErrorInjection(t *testing.T) {
	cfg := fastConfig()
	cfg.ErrorRate = 1
	_, base := startServer(t, cfg)
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		r := mustPost(t, base+path, `{"messages":[{"role":"user","content":"hi"}],"prompt":"hi"}`)
		if r.status != http.StatusInternalServerError {
			t.Fatalf("%s: status %d, want 500", path, r.status)
		}
		got := decode[errorBody](t, r.body)
		if got.Error.Type != "internal_server_error" || got.Error.Message == "" || got.Error.Param != nil || got.Error.Code != nil {
			t.Errorf("%s: error body = %+v", path, got)
		}
	}
	if r := get(t, base+"/health"); r.status != http.StatusOK {
		t.Errorf("/health with --error-rate 1: status %d, want 200 (only completions fail)", r.status)
	}
}

func TestHangInjectionEndsWithClient(t *testing.T) {
	cfg := fastConfig()
	cfg.HangRate = 1
	_, base := startServer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	r, err := post(t, ctx, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung request returned status %d err %v, want the client's deadline", r.status, err)
	}
}

func TestExitAfter(t *testing.T) {
	cfg := fastConfig()
	cfg.ExitAfter = 2
	var mu sync.Mutex
	var codes []int
	cfg.ExitFunc = func(code int) {
		mu.Lock()
		defer mu.Unlock()
		codes = append(codes, code)
	}
	_, base := startServer(t, cfg)
	exits := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), codes...)
	}

	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	if r := mustPost(t, base+"/v1/chat/completions", chat); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	if got := exits(); len(got) != 0 {
		t.Fatalf("exited after one completion: %v", got)
	}
	// The second completion is answered in full before the crash.
	r := mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`)
	if events := parseSSE(t, r.body); events[len(events)-1] != "[DONE]" {
		t.Fatalf("second completion cut short: %q", r.body)
	}
	mustPost(t, base+"/v1/chat/completions", chat)
	if diff := cmp.Diff([]int{1}, exits()); diff != "" {
		t.Errorf("exit codes (-want +got):\n%s", diff)
	}
}

func TestBadRequests(t *testing.T) {
	_, base := startServer(t, fastConfig())
	tests := map[string]struct {
		method, path, body string
		wantStatus         int
		wantType           string
		wantCode           string
	}{
		"bad JSON":              {"POST", "/v1/chat/completions", `{"messages":`, 400, "invalid_request_error", ""},
		"not an object":         {"POST", "/v1/chat/completions", `[1,2]`, 400, "invalid_request_error", ""},
		"missing messages":      {"POST", "/v1/chat/completions", `{"model":"ferry-sim"}`, 400, "invalid_request_error", ""},
		"empty messages":        {"POST", "/v1/chat/completions", `{"messages":[]}`, 400, "invalid_request_error", ""},
		"message without role":  {"POST", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "invalid_request_error", ""},
		"content of wrong type": {"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "invalid_request_error", ""},
		"content parts garbage": {"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[1]}]}`, 400, "invalid_request_error", ""},
		"stream of wrong type":  {"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`, 400, "invalid_request_error", ""},
		"zero max_tokens":       {"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "invalid_request_error", ""},
		"over context length":   {"POST", "/v1/completions", `{"prompt":"x","max_tokens":9223372036854775807}`, 400, "invalid_request_error", ""},
		"missing prompt":        {"POST", "/v1/completions", `{"model":"ferry-sim"}`, 400, "invalid_request_error", ""},
		"empty prompt array":    {"POST", "/v1/completions", `{"prompt":[]}`, 400, "invalid_request_error", ""},
		"token-id prompt":       {"POST", "/v1/completions", `{"prompt":[1,2,3]}`, 400, "invalid_request_error", ""},
		"unknown model":         {"POST", "/v1/chat/completions", `{"model":"gpt-5","messages":[{"role":"user","content":"x"}]}`, 404, "invalid_request_error", "model_not_found"},
		"GET on completions":    {"GET", "/v1/completions", ``, 405, "invalid_request_error", ""},
		"unknown path":          {"GET", "/v2/everything", ``, 404, "invalid_request_error", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			var got errorBody
			dec := json.NewDecoder(resp.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("error body: %v", err)
			}
			gotCode := ""
			if got.Error.Code != nil {
				gotCode = *got.Error.Code
			}
			if got.Error.Type != tc.wantType || gotCode != tc.wantCode || got.Error.Param != nil || got.Error.Message == "" {
				t.Errorf("error = %+v (code %q), want type %q code %q", got.Error, gotCode, tc.wantType, tc.wantCode)
			}
		})
	}
}

func TestManyConcurrentRequests(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 8
	cfg.ITLPerSeq = 100 * time.Microsecond
	s, base := startServer(t, cfg)
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":"request %d"}],"max_tokens":4,"stream":%t}`, i, i%2 == 0)
			if r := mustPost(t, base+"/v1/chat/completions", body); r.status != http.StatusOK {
				t.Errorf("request %d: status %d: %s", i, r.status, r.body)
			}
		})
	}
	wg.Wait()
	m := scrape(t, base)
	if m["vllm:request_success_total"] != n || m["vllm:generation_tokens_total"] != 4*n {
		t.Errorf("success %v generation tokens %v, want %d and %d", m["vllm:request_success_total"], m["vllm:generation_tokens_total"], n, 4*n)
	}
	if s.sched.runningGauge.Load() != 0 || s.sched.waitingGauge.Load() != 0 || s.kvBlocksUsed.Load() != 0 {
		t.Errorf("left behind: running %d waiting %d kv %d", s.sched.runningGauge.Load(), s.sched.waitingGauge.Load(), s.kvBlocksUsed.Load())
	}
}

// TestServeShutsDownGracefully checks that ending Serve's context finishes an in-flight stream
// at once, in full, and that Serve returns nil.
func TestServeShutsDownGracefully(t *testing.T) {
	s := NewServer(slowConfig())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()

	base := "http://" + ln.Addr().String()
	streamed := make(chan response, 1)
	go func() {
		r, err := post(t, context.Background(), base+"/v1/chat/completions",
			`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
		if err != nil {
			t.Errorf("in-flight stream: %v", err)
		}
		streamed <- r
	}()
	waitFor(t, "stream in prefill", func() bool { return s.sched.runningGauge.Load() == 1 })
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve = %v, want nil", err)
	}
	r := <-streamed
	if events := parseSSE(t, r.body); len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Errorf("in-flight stream not finished: %q", r.body)
	}
	if _, err := http.Get(base + "/health"); err == nil {
		t.Error("still accepting after shutdown")
	}
}

func TestRunValidatesAndReportsAddress(t *testing.T) {
	bad := DefaultConfig()
	bad.MaxNumSeqs, bad.ErrorRate = 0, 2
	err := Run(context.Background(), bad)
	if err == nil || !strings.Contains(err.Error(), "--max-num-seqs=0") || !strings.Contains(err.Error(), "--error-rate=2") {
		t.Fatalf("Run(bad config) = %v, want both field errors", err)
	}

	cfg := fastConfig()
	cfg.Port = 0
	addrs := make(chan net.Addr, 1)
	cfg.OnListen = func(a net.Addr) { addrs <- a }
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- Run(ctx, cfg) }()
	addr := <-addrs
	if r := get(t, "http://"+addr.String()+"/health"); r.status != http.StatusOK {
		t.Errorf("/health: status %d", r.status)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Errorf("Run = %v after cancel, want nil", err)
	}
}

// --signals basic hides what many engines do not report (the cache's size, the prefix-cache
// counters, each answer's cached tokens), while the simulator's own replicasim_* counters still
// score the hit rate for a benchmark.
func TestBasicSignalsHideCacheState(t *testing.T) {
	cfg := fastConfig()
	cfg.Signals = SignalsBasic
	_, base := startServer(t, cfg)
	prompt := `{"messages":[{"role":"user","content":"` + strings.Repeat("cached words ", 40) + `"}],"max_tokens":2}`
	mustPost(t, base+"/v1/chat/completions", prompt)
	r := mustPost(t, base+"/v1/chat/completions", prompt)
	if strings.Contains(string(r.body), "prompt_tokens_details") || !strings.Contains(string(r.body), `"prompt_tokens":`) {
		t.Errorf("usage under basic signals: %s", r.body)
	}
	body := string(get(t, base+"/metrics").body)
	for _, hidden := range []string{"vllm:cache_config_info", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"} {
		if strings.Contains(body, hidden) {
			t.Errorf("/metrics under basic signals has %s", hidden)
		}
	}
	if !strings.Contains(body, "vllm:num_requests_running") {
		t.Error("/metrics under basic signals lacks vllm:num_requests_running")
	}
	m := scrape(t, base)
	if m["replicasim_prefix_cache_hits_total"] <= 0 || m["replicasim_prefix_cache_queries_total"] <= m["replicasim_prefix_cache_hits_total"] {
		t.Errorf("the simulator's own counters after a repeated prompt: hits %v of %v", m["replicasim_prefix_cache_hits_total"], m["replicasim_prefix_cache_queries_total"])
	}
}
