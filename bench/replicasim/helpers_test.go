package replicasim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fastConfig is a replica whose simulated latencies are tiny, so tests run quickly; they never
// assert on wall-clock time, only on observed state.
func fastConfig() Config {
	cfg := DefaultConfig()
	cfg.TTFT = time.Millisecond
	cfg.PrefillPerToken = 0
	cfg.ITL = time.Millisecond
	cfg.ITLPerSeq = 0
	cfg.MaxTokens = 8
	return cfg
}

// startServer serves a replica built from cfg on a loopback listener for the test's lifetime.
func startServer(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	s := NewServer(cfg)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.stop() // unblock hung or slow handlers so Close does not wait on them
		ts.Close()
	})
	return s, ts.URL
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func post(t testing.TB, ctx context.Context, url, body string) (response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}, err
}

func mustPost(t testing.TB, url, body string) response {
	t.Helper()
	r, err := post(t, context.Background(), url, body)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return r
}

func get(t testing.TB, url string) response {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func decode[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %T from %s: %v", v, b, err)
	}
	return v
}

// waitFor polls cond until it holds, failing the test after a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// metricValue scrapes /metrics and returns the sum of the samples of the named series.
func metricValue(t testing.TB, base, name string) float64 {
	t.Helper()
	v, ok := scrape(t, base)[name]
	if !ok {
		t.Fatalf("metric %s missing from /metrics", name)
	}
	return v
}

func scrape(t testing.TB, base string) map[string]float64 {
	t.Helper()
	r := get(t, base+"/metrics")
	if r.status != http.StatusOK {
		t.Fatalf("/metrics: status %d", r.status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		series := line[:sp]
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			t.Fatalf("bad metric line %q", line)
		}
		name := series
		if i := strings.IndexByte(series, '{'); i >= 0 {
			name = series[:i]
		}
		out[name] += v
	}
	return out
}

// parseSSE splits a stream into its "data:" payloads, failing on anything else.
func parseSSE(t testing.TB, body []byte) []string {
	t.Helper()
	var events []string
	for block := range strings.SplitSeq(string(body), "\n\n") {
		if block == "" {
			continue
		}
		data, ok := strings.CutPrefix(block, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("malformed SSE event %q", block)
		}
		events = append(events, data)
	}
	return events
}

// Response shapes, decoded strictly so that a stray or misspelt member fails the test.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chatCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason string    `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

type textCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int       `json:"index"`
		Text         string    `json:"text"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason string    `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         *string   `json:"text"`
		Logprobs     *struct{} `json:"logprobs"`
		FinishReason *string   `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}
