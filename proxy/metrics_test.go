package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferryserve/ferry/bench/replicasim"
)

func newTestMetrics(t testing.TB) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// sample is one series as gathered: a counter's or gauge's value, or a histogram's count and sum.
type sample struct {
	value, count, sum float64
}

// gatherSeries returns the series of the named metric whose labels are exactly labels (name,
// value pairs), and whether it exists.
func gatherSeries(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (sample, bool) {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if !cmp.Equal(want, got) {
				continue
			}
			switch {
			case m.Counter != nil:
				return sample{value: m.GetCounter().GetValue()}, true
			case m.Gauge != nil:
				return sample{value: m.GetGauge().GetValue()}, true
			case m.Histogram != nil:
				return sample{count: float64(m.GetHistogram().GetSampleCount()), sum: m.GetHistogram().GetSampleSum()}, true
			}
		}
	}
	return sample{}, false
}

// seriesValue is gatherSeries for a counter or gauge that must exist.
func seriesValue(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	s, ok := gatherSeries(t, g, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return s.value
}

// requestsTotal sums ferry_requests_total over all series: it is complete once every request
// has finished, which happens just after the client has read its last byte.
func requestsTotal(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == "ferry_requests_total" {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func waitForRequests(t *testing.T, g prometheus.Gatherer, n float64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%v requests counted", n), func() bool { return requestsTotal(t, g) >= n })
}

const (
	requestsHeader = `
# HELP ferry_requests_total Finished requests by final status code and the replica that answered ("none": the proxy answered itself).
# TYPE ferry_requests_total counter
`
	upstreamErrorsHeader = `
# HELP ferry_upstream_errors_total Failed attempts and broken responses by replica and kind (dial, pool_full, reset, timeout, status_5xx, stream_cut).
# TYPE ferry_upstream_errors_total counter
`
)

// upstreamErrors renders every error kind of one replica, with the given non-zero counts.
func upstreamErrors(service, replica string, counts map[string]int) string {
	var b strings.Builder
	for kind := noUpstreamError + 1; kind < numUpstreamErrorKinds; kind++ {
		fmt.Fprintf(&b, "ferry_upstream_errors_total{kind=%q,replica=%q,service=%q} %d\n", kind, replica, service, counts[kind.String()])
	}
	return b.String()
}

func TestMetricsCountRequestsByReplicaAndCode(t *testing.T) {
	m, reg := newTestMetrics(t)
	ok := startUpstream(t, "ok", okHandler)
	failing := startUpstream(t, "failing", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotImplemented) // not retried: another replica would answer the same
	})
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", Metrics: m}, backendsOf(ok, failing)...)
	c := newClient(t)
	for range 4 {
		do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`))
	}
	waitForRequests(t, reg, 4)

	want := requestsHeader + `
ferry_requests_total{code="200",replica="1",service="llama"} 2
ferry_requests_total{code="501",replica="2",service="llama"} 2
` + upstreamErrorsHeader + upstreamErrors("llama", "1", nil) + upstreamErrors("llama", "2", map[string]int{"status_5xx": 2})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ferry_requests_total", "ferry_upstream_errors_total"); err != nil {
		t.Error(err)
	}
	if d, _ := gatherSeries(t, reg, "ferry_request_duration_seconds", "service", "llama"); d.count != 4 || d.sum <= 0 {
		t.Errorf("duration histogram count %v sum %v, want 4 observations", d.count, d.sum)
	}
	if ttft, _ := gatherSeries(t, reg, "ferry_time_to_first_token_seconds", "service", "llama"); ttft.count != 2 {
		t.Errorf("TTFT histogram count = %v, want 2 (the 2xx responses)", ttft.count)
	}
	sm := svc.obs.metrics
	if got := testutil.ToFloat64(sm.retries); got != 0 {
		t.Errorf("retries = %v, want 0", got)
	}
	waitFor(t, "in-flight gauge back to 0", func() bool { return testutil.ToFloat64(sm.inFlight) == 0 })
}

// TestMetricsProxyAnswers: responses the proxy writes itself count under replica "none", carry a
// request id, and failed attempts count against their replicas.
func TestMetricsProxyAnswers(t *testing.T) {
	m, reg := newTestMetrics(t)
	svc, base := startProxy(t, ServiceConfig{Metrics: m, MaxQueuedRequests: -1})
	c := newClient(t)

	res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`))
	if res.status != http.StatusServiceUnavailable || res.header.Get("X-Request-Id") == "" {
		t.Errorf("no replicas: %d with X-Request-Id %q, want 503 with a generated id", res.status, res.header.Get("X-Request-Id"))
	}
	res = do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "X-Request-Id", "client-7")
	if got := res.header.Get("X-Request-Id"); got != "client-7" {
		t.Errorf("no replicas: X-Request-Id = %q, want the client's", got)
	}

	svc.SetBackends([]Backend{{ID: 1, Addr: deadAddr(t)}, {ID: 2, Addr: deadAddr(t)}})
	res = do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`))
	if res.status != http.StatusBadGateway || res.header.Get("X-Request-Id") == "" {
		t.Errorf("dead replicas: %d with X-Request-Id %q, want 502 with an id", res.status, res.header.Get("X-Request-Id"))
	}

	want := requestsHeader + `
ferry_requests_total{code="502",replica="none",service="llama"} 1
ferry_requests_total{code="503",replica="none",service="llama"} 2
` + upstreamErrorsHeader + upstreamErrors("llama", "1", map[string]int{"dial": 1}) + upstreamErrors("llama", "2", map[string]int{"dial": 1})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ferry_requests_total", "ferry_upstream_errors_total"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(svc.obs.metrics.retries); got != 1 {
		t.Errorf("retries = %v, want 1 (the second dead replica)", got)
	}
	if d, _ := gatherSeries(t, reg, "ferry_request_duration_seconds", "service", "llama"); d.count != 3 {
		t.Errorf("duration observations = %v, want 3", d.count)
	}
	if ttft, _ := gatherSeries(t, reg, "ferry_time_to_first_token_seconds", "service", "llama"); ttft.count != 0 {
		t.Errorf("TTFT observations = %v, want none for proxy errors", ttft.count)
	}
}

func TestMetricsRetriedStatus(t *testing.T) {
	m, reg := newTestMetrics(t)
	busy := startUpstream(t, "busy", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	healthy := startUpstream(t, "healthy", okHandler)
	_, base := startProxy(t, ServiceConfig{Policy: "round_robin", Metrics: m}, backendsOf(busy, healthy)...)
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)); res.status != 200 {
		t.Fatalf("status %d, want 200 from the healthy replica", res.status)
	}
	waitForRequests(t, reg, 1)
	want := requestsHeader + `
ferry_requests_total{code="200",replica="2",service="llama"} 1
` + upstreamErrorsHeader + upstreamErrors("llama", "1", map[string]int{"status_5xx": 1}) + upstreamErrors("llama", "2", nil)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ferry_requests_total", "ferry_upstream_errors_total"); err != nil {
		t.Error(err)
	}
	if got := seriesValue(t, reg, "ferry_retries_total", "service", "llama"); got != 1 {
		t.Errorf("retries = %v, want 1", got)
	}
}

// TestMetricsStreamTiming: time to first token is measured to the first body byte, not to the
// response header, and the in-flight gauge covers the whole stream.
func TestMetricsStreamTiming(t *testing.T) {
	const firstTokenDelay = 40 * time.Millisecond
	g := newGate()
	u := startUpstream(t, "sse", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the header goes out at once, as vLLM does
		time.Sleep(firstTokenDelay)
		sseEvent(w, "first")
		g.block(r.Context())
		sseEvent(w, "[DONE]")
	})
	m, reg := newTestMetrics(t)
	_, base := startProxy(t, ServiceConfig{Metrics: m}, backendsOf(u)...)
	t.Cleanup(g.open)

	_, r := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, r); got != "data: first" {
		t.Fatalf("first event = %q", got)
	}
	if got := seriesValue(t, reg, "ferry_requests_in_flight", "service", "llama"); got != 1 {
		t.Errorf("in flight during the stream = %v, want 1", got)
	}
	time.Sleep(firstTokenDelay) // the rest of the stream takes a while longer
	g.open()
	if _, err := io.ReadAll(r); err != nil {
		t.Fatal(err)
	}
	waitForRequests(t, reg, 1)

	ttft, _ := gatherSeries(t, reg, "ferry_time_to_first_token_seconds", "service", "llama")
	duration, _ := gatherSeries(t, reg, "ferry_request_duration_seconds", "service", "llama")
	if ttft.count != 1 || ttft.sum < firstTokenDelay.Seconds() {
		t.Errorf("TTFT: %v observations summing to %vs, want 1 of at least %v", ttft.count, ttft.sum, firstTokenDelay)
	}
	if duration.count != 1 || duration.sum < ttft.sum+firstTokenDelay.Seconds() {
		t.Errorf("duration: %v observations summing to %vs, want 1 covering the whole stream (TTFT %vs + %v)",
			duration.count, duration.sum, ttft.sum, firstTokenDelay)
	}
	if got := seriesValue(t, reg, "ferry_requests_in_flight", "service", "llama"); got != 0 {
		t.Errorf("in flight after the stream = %v, want 0", got)
	}
}

func TestMetricsStreamCut(t *testing.T) {
	u := startUpstream(t, "cut", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		sseEvent(w, "first")
		conn, buf, err := w.(http.Hijacker).Hijack() // the replica crashes: connection reset
		if err != nil {
			panic(err)
		}
		_ = buf.Flush()
		_ = conn.(*net.TCPConn).SetLinger(0)
		_ = conn.Close()
	})
	m, reg := newTestMetrics(t)
	_, base := startProxy(t, ServiceConfig{Metrics: m}, backendsOf(u)...)
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
	if !strings.Contains(res.body, "stream_interrupted") {
		t.Fatalf("body %q does not end with the stream error event", res.body)
	}
	waitForRequests(t, reg, 1)
	want := requestsHeader + `
ferry_requests_total{code="200",replica="1",service="llama"} 1
` + upstreamErrorsHeader + upstreamErrors("llama", "1", map[string]int{"stream_cut": 1})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ferry_requests_total", "ferry_upstream_errors_total"); err != nil {
		t.Error(err)
	}
}

// startReplicaSim serves a simulated vLLM replica on loopback.
func startReplicaSim(t *testing.T) *upstream {
	t.Helper()
	cfg := replicasim.DefaultConfig()
	cfg.TTFT, cfg.ITL, cfg.ITLPerSeq, cfg.PrefillPerToken = time.Millisecond, time.Millisecond, 0, 0
	cfg.MaxTokens = 7
	sim := replicasim.NewServer(cfg)
	return startUpstream(t, "sim", sim.Handler().ServeHTTP)
}

type reportedUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// usageOf reads the usage a response reported, from a JSON body or the last usage chunk of an
// SSE stream, as a client SDK would.
func usageOf(t *testing.T, body string) (reportedUsage, bool) {
	t.Helper()
	var u struct{ Usage *reportedUsage }
	if !strings.HasPrefix(body, "data: ") {
		if err := json.Unmarshal([]byte(body), &u); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		return *u.Usage, true
	}
	var last *reportedUsage
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		if err := json.Unmarshal([]byte(data), &u); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if u.Usage != nil {
			last = u.Usage
		}
	}
	if last == nil {
		return reportedUsage{}, false
	}
	return *last, true
}

func TestMetricsTokenUsage(t *testing.T) {
	sim := startReplicaSim(t)
	for name, tc := range map[string]struct {
		path, body string
		wantUsage  bool
	}{
		"chat": {
			path: "/v1/chat/completions", wantUsage: true,
			body: `{"messages":[{"role":"user","content":"count the tokens of this prompt"}]}`,
		},
		"chat stream with usage": {
			path: "/v1/chat/completions", wantUsage: true,
			body: `{"messages":[{"role":"user","content":"hello there"}],"stream":true,"stream_options":{"include_usage":true}}`,
		},
		"completions stream with usage": {
			path: "/v1/completions", wantUsage: true,
			body: `{"prompt":"a somewhat longer prompt for the completions endpoint","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		},
		"chat stream without usage": {
			path: "/v1/chat/completions",
			body: `{"messages":[{"role":"user","content":"hello"}],"stream":true}`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			m, reg := newTestMetrics(t)
			_, base := startProxy(t, ServiceConfig{Metrics: m}, backendsOf(sim)...)
			res := do(t, newClient(t), http.MethodPost, base+tc.path, strings.NewReader(tc.body), "Content-Type", "application/json")
			if res.status != http.StatusOK {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			want, reported := usageOf(t, res.body)
			if reported != tc.wantUsage {
				t.Fatalf("replica reported usage: %v, want %v", reported, tc.wantUsage)
			}
			waitForRequests(t, reg, 1)
			prompt, _ := gatherSeries(t, reg, "ferry_prompt_tokens_total", "service", "llama")
			completion, _ := gatherSeries(t, reg, "ferry_completion_tokens_total", "service", "llama")
			got := reportedUsage{PromptTokens: int(prompt.value), CompletionTokens: int(completion.value)}
			want.PromptTokensDetails = got.PromptTokensDetails // counted in TestMetricsCachedPromptTokens
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("token counters (-reported by the replica +counted):\n%s", diff)
			}
			if tc.wantUsage && got.CompletionTokens == 0 {
				t.Error("the replica reported no completion tokens; the test proves nothing")
			}
		})
	}
}

// The engine's reported cached tokens are counted, so that cached ÷ prompt tokens is the hit
// rate routing achieved: a prompt sent twice is cached the second time.
func TestMetricsCachedPromptTokens(t *testing.T) {
	sim := startReplicaSim(t)
	m, reg := newTestMetrics(t)
	_, base := startProxy(t, ServiceConfig{Metrics: m}, backendsOf(sim)...)
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("a prompt worth caching ", 60) + `"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`
	var want int
	for i := range 2 {
		res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Content-Type", "application/json")
		if res.status != http.StatusOK {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
		u, _ := usageOf(t, res.body)
		want += u.PromptTokensDetails.CachedTokens
		waitForRequests(t, reg, float64(i+1))
	}
	got, _ := gatherSeries(t, reg, "ferry_cached_prompt_tokens_total", "service", "llama")
	if want == 0 || int(got.value) != want {
		t.Errorf("ferry_cached_prompt_tokens_total = %v, want the %d cached tokens the replica reported (not 0)", got.value, want)
	}
}

// TestMetricsReplicaSeriesDeleted: a removed replica's series stay while its stream runs, so
// its final counts are recorded, and go once it has finished; a new replica id on the same
// address replaces the old id's series.
func TestMetricsReplicaSeriesDeleted(t *testing.T) {
	g := newGate()
	handler := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			heldStreamHandler(g)(w, r)
			return
		}
		okHandler(w, r)
	}
	a, b := startUpstream(t, "a", handler), startUpstream(t, "b", handler)
	m, reg := newTestMetrics(t)
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", Metrics: m}, backendsOf(a, b)...)
	t.Cleanup(g.open)
	c := newClient(t)

	do(t, c, http.MethodGet, base+"/v1/models", nil) // a
	resp, stream := openStream(t, c, base+"/stream") // b
	if got := readEvent(t, stream); got != "data: first" || resp.Header.Get("X-Upstream") != "b" {
		t.Fatalf("stream: %q from %q, want first from b", got, resp.Header.Get("X-Upstream"))
	}
	hasReplica := func(id string) bool {
		_, requests := gatherSeries(t, reg, "ferry_requests_total", "service", "llama", "replica", id, "code", "200")
		_, errs := gatherSeries(t, reg, "ferry_upstream_errors_total", "service", "llama", "replica", id, "kind", "dial")
		return requests || errs
	}

	svc.SetBackends(backendsOf(a)) // b is removed while its stream runs
	if _, ok := gatherSeries(t, reg, "ferry_upstream_errors_total", "service", "llama", "replica", "2", "kind", "dial"); !ok {
		t.Error("replica 2's series went while its stream was still running")
	}
	g.open()
	if _, err := io.ReadAll(stream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica 2's series to go", func() bool { return !hasReplica("2") })
	if !hasReplica("1") {
		t.Error("replica 1's series went with replica 2's")
	}

	// Replica 9 takes over a's address: replica 1's series go at once.
	svc.SetBackends([]Backend{{ID: 9, Addr: a.addr(), Version: 1}})
	do(t, c, http.MethodGet, base+"/v1/models", nil)
	waitForRequests(t, reg, 1)
	if hasReplica("1") || !hasReplica("9") {
		t.Errorf("after relabelling: replica 1 present %v, replica 9 present %v; want only 9", hasReplica("1"), hasReplica("9"))
	}
}

// TestMetricsSharedByServices: services keep separate series in one Metrics; Services of the same
// name (a replacement starting before the old one drains) share theirs, which go with the last.
func TestMetricsSharedByServices(t *testing.T) {
	m, reg := newTestMetrics(t)
	u := startUpstream(t, "u", okHandler)
	newSvc := func(name string) *Service {
		svc, err := NewService(ServiceConfig{Name: name, Metrics: m, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		svc.SetBackends(backendsOf(u))
		return svc
	}
	a1, a2, b := newSvc("a"), newSvc("a"), newSvc("b")
	for _, svc := range []*Service{a1, a2, a2, b} {
		if status := serveOne(t, svc); status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
	}
	if got := seriesValue(t, reg, "ferry_requests_total", "service", "a", "replica", "1", "code", "200"); got != 3 {
		t.Errorf("service a requests = %v, want 3 (both Services named a)", got)
	}
	if got := seriesValue(t, reg, "ferry_requests_total", "service", "b", "replica", "1", "code", "200"); got != 1 {
		t.Errorf("service b requests = %v, want 1", got)
	}

	shutdown := func(svc *Service) {
		if err := svc.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	shutdown(a1)
	shutdown(a1) // twice must not drop a2's reference
	if _, ok := gatherSeries(t, reg, "ferry_request_duration_seconds", "service", "a"); !ok {
		t.Error("service a's series went while a Service named a still runs")
	}
	shutdown(a2)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "service" && l.GetValue() == "a" {
					t.Errorf("%s still has a series of service a after its last Service shut down", f.GetName())
				}
			}
		}
	}
	if got := seriesValue(t, reg, "ferry_requests_total", "service", "b", "replica", "1", "code", "200"); got != 1 {
		t.Errorf("service b requests after a's shutdown = %v, want 1", got)
	}
	shutdown(b)
}

// serveOne sends one request through svc's Handler over an in-memory connection and waits for
// it to be recorded.
func serveOne(t *testing.T, svc *Service) int {
	t.Helper()
	ln := fasthttputil.NewInmemoryListener()
	server := &fasthttp.Server{Handler: svc.Handler}
	go func() { _ = server.Serve(ln) }()
	defer func() { _ = server.Shutdown() }()
	c := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	status, _, err := c.Post(nil, "http://svc/v1/chat/completions", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request to finish", func() bool { return svc.InFlight() == 0 })
	return status
}

func TestNewMetricsRegistersAllOrNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	other, _ := newTestMetrics(t)
	squatter := other.completionTokens // registered under the same name by someone else
	reg.MustRegister(squatter)
	_, err := NewMetrics(reg)
	if !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		t.Fatalf("NewMetrics over a taken name = %v, want an AlreadyRegisteredError", err)
	}
	reg.Unregister(squatter)
	if _, err := NewMetrics(reg); err != nil {
		t.Fatalf("NewMetrics after the failed attempt: %v (it left collectors registered)", err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("a second Metrics on the same registry was accepted")
	}
}

func TestReplicaMetricsOutOfRangeStatus(t *testing.T) {
	m, _ := newTestMetrics(t)
	rm := m.acquireReplica("s", 1)
	for _, code := range []int{-1, 0, 99, 200, 599, 600, 1000} {
		rm.countRequest(code)
	}
	want := requestsHeader + `
ferry_requests_total{code="200",replica="1",service="s"} 1
ferry_requests_total{code="599",replica="1",service="s"} 1
ferry_requests_total{code="other",replica="1",service="s"} 5
`
	if err := testutil.CollectAndCompare(replicaCollector{m}, strings.NewReader(want), "ferry_requests_total"); err != nil {
		t.Error(err)
	}
	rm.release()
	if n := testutil.CollectAndCount(replicaCollector{m}); n != 0 {
		t.Errorf("%d series after the last release, want 0", n)
	}
}

func TestAdminHandler(t *testing.T) {
	m, reg := newTestMetrics(t)
	_, base := startProxy(t, ServiceConfig{Metrics: m, MaxQueuedRequests: -1}) // no replicas: one 503
	c := newClient(t)
	do(t, c, http.MethodGet, base+"/v1/models", nil)
	waitForRequests(t, reg, 1)

	admin := httptest.NewServer(AdminHandler(reg, "", nil)) // a real loopback listener
	t.Cleanup(admin.Close)

	res := do(t, c, http.MethodGet, admin.URL+"/metrics", nil)
	wantLine := `ferry_requests_total{code="503",replica="none",service="llama"} 1`
	if res.status != http.StatusOK || !slices.Contains(strings.Split(res.body, "\n"), wantLine) {
		t.Errorf("/metrics: %d, want 200 with %q in:\n%s", res.status, wantLine, res.body)
	}
	for _, tc := range []struct {
		method, path string
		wantStatus   int
		wantBody     string
	}{
		{http.MethodGet, "/healthz", http.StatusOK, "ok\n"},
		{http.MethodHead, "/metrics", http.StatusOK, ""},
		{http.MethodPost, "/metrics", http.StatusMethodNotAllowed, ""},
		{http.MethodGet, "/debug/pprof/", http.StatusNotFound, ""},
	} {
		res := do(t, c, tc.method, admin.URL+tc.path, nil)
		if res.status != tc.wantStatus || (tc.wantBody != "" && res.body != tc.wantBody) {
			t.Errorf("%s %s = %d %q, want %d %q", tc.method, tc.path, res.status, res.body, tc.wantStatus, tc.wantBody)
		}
	}
}

// BenchmarkProxyNonStreamObserved is BenchmarkProxyNonStream with metrics and the access log on
// (a JSON encoder writing to io.Discard, sampled as in production), and off for comparison.
func BenchmarkProxyNonStreamObserved(b *testing.B) {
	for _, observed := range []bool{false, true} {
		b.Run("observed="+strconv.FormatBool(observed), func(b *testing.B) {
			cfg := ServiceConfig{Name: "bench", Logger: zap.NewNop()}
			if observed {
				cfg.Metrics, _ = newTestMetrics(b)
				cfg.AccessLog = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
					zapcore.AddSync(io.Discard), zap.InfoLevel))
			}
			svc, err := NewService(cfg)
			if err != nil {
				b.Fatal(err)
			}
			upstream := startMemUpstream(b)
			svc.dial = func(string) (net.Conn, error) { return upstream.Dial() }
			svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
			ln := fasthttputil.NewInmemoryListener()
			go func() { _ = svc.Serve(ln) }()
			b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
			benchRequests(b, memClient(ln))
		})
	}
}

// BenchmarkObserveRequest is the per-request cost of metrics and the access log alone, without
// the network: the hooks of one non-streaming request, from the request to the end of its
// response, on one goroutine. Unlike the whole-path benchmarks it is not drowned in scheduling
// noise on a shared machine.
func BenchmarkObserveRequest(b *testing.B) {
	for _, observed := range []bool{false, true} {
		b.Run("observed="+strconv.FormatBool(observed), func(b *testing.B) {
			cfg := ServiceConfig{Name: "bench", Logger: zap.NewNop()}
			if observed {
				cfg.Metrics, _ = newTestMetrics(b)
				cfg.AccessLog = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
					zapcore.AddSync(io.Discard), zap.InfoLevel))
			}
			svc, err := NewService(cfg)
			if err != nil {
				b.Fatal(err)
			}
			svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
			snap := svc.snap.Load()
			var req fasthttp.Request
			req.Header.SetMethod(fasthttp.MethodPost)
			req.SetRequestURI("/v1/chat/completions")
			var ctx fasthttp.RequestCtx
			ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
			ex := svc.acquireExchange()
			ex.resp.SetStatusCode(fasthttp.StatusOK)
			b.ReportAllocs()
			for b.Loop() {
				ex.observeRequest(&ctx)
				ex.obs.start = time.Now() // fasthttp's handler call time, which ctx.Init leaves unset
				ex.begin(snap.replicas[0], snap.clients[0])
				ex.observeRead(benchBody)
				ex.observeFinish(nil, parseUsage(ex.obs.tail.bytes()))
				ex.end()
				ex.obs.reset()
			}
		})
	}
}

// BenchmarkCountRequest compares the two ways of counting a request by status code: a
// CounterVec lookup per request against replicaMetrics' atomic per-code counters.
func BenchmarkCountRequest(b *testing.B) {
	m, _ := newTestMetrics(b)
	b.Run("CounterVec", func(b *testing.B) {
		vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"service", "replica", "code"})
		b.ReportAllocs()
		for b.Loop() {
			vec.WithLabelValues("llama", "12", strconv.Itoa(fasthttp.StatusOK)).Inc()
		}
	})
	b.Run("replicaMetrics", func(b *testing.B) {
		rm := m.acquireReplica("llama", 12)
		b.ReportAllocs()
		for b.Loop() {
			rm.countRequest(fasthttp.StatusOK)
		}
	})
}

func TestTimePerOutputToken(t *testing.T) {
	tests := map[string]struct {
		decode             time.Duration
		completion, events int64
		want               time.Duration
	}{
		"usage reported":           {decode: 90 * time.Millisecond, completion: 10, events: 3, want: 10 * time.Millisecond},
		"events without usage":     {decode: 90 * time.Millisecond, completion: -1, events: 11, want: 10 * time.Millisecond},
		"one token":                {decode: time.Second, completion: 1, events: 5, want: -1},
		"only the first and DONE":  {decode: time.Second, completion: -1, events: 2, want: -1},
		"no events, no usage":      {decode: time.Second, completion: -1, events: 0, want: -1},
		"clock went back (ignore)": {decode: -time.Millisecond, completion: 10, want: -1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := timePerOutputToken(tc.decode, tc.completion, tc.events); got != tc.want {
				t.Errorf("timePerOutputToken(%v, %d, %d) = %v, want %v", tc.decode, tc.completion, tc.events, got, tc.want)
			}
		})
	}
}

// TestMetricsTimePerOutputToken streams through the proxy from a real upstream: a whole event
// stream is observed once, as its decode time (first byte to end) over the tokens after the
// first; the usage it reports wins over counting events; a JSON answer is not observed.
func TestMetricsTimePerOutputToken(t *testing.T) {
	const decodeDelay = 60 * time.Millisecond
	tests := map[string]struct {
		usage     string // a final usage chunk, or none
		wantSteps float64
		stream    bool
	}{
		"events counted":  {stream: true, wantSteps: 2}, // first, second, third: 2 steps after the first
		"usage reported":  {stream: true, usage: `{"usage":{"prompt_tokens":3,"completion_tokens":5}}`, wantSteps: 4},
		"not a stream":    {},
		"usage, not SSE ": {usage: `{"usage":{"prompt_tokens":3,"completion_tokens":5}}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u := startUpstream(t, "sse", func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if !tc.stream {
					w.Header().Set("Content-Type", "application/json")
					time.Sleep(decodeDelay)
					_, _ = io.WriteString(w, tc.usage+"\n")
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				sseEvent(w, "first")
				time.Sleep(decodeDelay)
				sseEvent(w, "second")
				sseEvent(w, "third")
				if tc.usage != "" {
					sseEvent(w, tc.usage)
				}
				sseEvent(w, "[DONE]")
			})
			m, reg := newTestMetrics(t)
			_, base := startProxy(t, ServiceConfig{Metrics: m}, backendsOf(u)...)
			res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
			if res.status != http.StatusOK {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			waitForRequests(t, reg, 1)
			tpot, _ := gatherSeries(t, reg, "ferry_time_per_output_token_seconds", "service", "llama")
			if tc.wantSteps == 0 {
				if tpot.count != 0 {
					t.Fatalf("TPOT observed %v times for a non-stream answer, want none", tpot.count)
				}
				return
			}
			ttft, _ := gatherSeries(t, reg, "ferry_time_to_first_token_seconds", "service", "llama")
			duration, _ := gatherSeries(t, reg, "ferry_request_duration_seconds", "service", "llama")
			// The decode time spans the upstream's pause, less however late the proxy read the
			// first event on a busy host: a third of the pause tells it from a clock started at
			// the last event.
			if tpot.count != 1 || tpot.sum*tc.wantSteps < decodeDelay.Seconds()/3 {
				t.Fatalf("TPOT: %v observations summing to %vs, want 1 of at least %v/3/%v", tpot.count, tpot.sum, decodeDelay, tc.wantSteps)
			}
			// The same clock readings: decode time over the steps, to the nanosecond's rounding.
			if decode := duration.sum - ttft.sum; math.Abs(tpot.sum*tc.wantSteps-decode) > 1e-6 {
				t.Errorf("TPOT %vs × %v steps != duration - TTFT = %vs", tpot.sum, tc.wantSteps, decode)
			}
		})
	}
}

// TestMetricsQueued holds a request in the slot queue behind a replica at its cap: it counts in
// ferry_requests_queued and ferry_requests_waiting while it waits, in neither once served, and
// its wait in ferry_slot_wait_seconds.
func TestMetricsQueued(t *testing.T) {
	u, g := startGatedUpstream(t, "busy")
	t.Cleanup(g.open)
	m, reg := newTestMetrics(t)
	_, base := startProxy(t, ServiceConfig{Metrics: m, MaxInFlightPerReplica: 1}, backendsOf(u)...)
	client := newClient(t)
	done := make(chan result, 2)
	send := func() {
		go func() { done <- do(t, client, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)) }()
	}
	// One at a time: two requests arriving at the same instant may both take the last slot
	// (slots.go says why the cap is not exact), and then neither is queued.
	send()
	waitFor(t, "the first request at the replica", func() bool { return u.hits.Load() == 1 })
	send()
	waitFor(t, "one request queued", func() bool {
		return seriesValue(t, reg, "ferry_requests_queued", "service", "llama") == 1
	})
	if got := seriesValue(t, reg, "ferry_requests_waiting", "service", "llama"); got != 1 {
		t.Errorf("waiting while one is queued = %v, want 1", got)
	}
	g.open()
	for range 2 {
		if res := <-done; res.status != http.StatusOK {
			t.Fatalf("status %d: %s", res.status, res.body)
		}
	}
	for _, name := range []string{"ferry_requests_queued", "ferry_requests_waiting"} {
		if got := seriesValue(t, reg, name, "service", "llama"); got != 0 {
			t.Errorf("%s after both answered = %v, want 0", name, got)
		}
	}
	if wait, _ := gatherSeries(t, reg, "ferry_slot_wait_seconds", "service", "llama"); wait.count != 1 || wait.sum <= 0 {
		t.Errorf("ferry_slot_wait_seconds after one queued request: %d observed, %v s; want 1 and its wait", int(wait.count), wait.sum)
	}
}

// BenchmarkObserveStream is BenchmarkObserveRequest for an event stream, whose reads are counted
// for TPOT and whose end observes it: the hooks must stay allocation-free.
func BenchmarkObserveStream(b *testing.B) {
	m, _ := newTestMetrics(b)
	svc, err := NewService(ServiceConfig{Name: "bench", Logger: zap.NewNop(), Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
	snap := svc.snap.Load()
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	ex := svc.acquireExchange()
	ex.resp.SetStatusCode(fasthttp.StatusOK)
	ex.sse = true
	b.ReportAllocs()
	for b.Loop() {
		ex.observeRequest(&ctx)
		ex.obs.start = time.Now()
		ex.begin(snap.replicas[0], snap.clients[0])
		for _, ev := range benchEvents {
			ex.observeRead(ev)
		}
		ex.observeFinish(nil, parseUsage(ex.obs.tail.bytes()))
		ex.end()
		ex.obs.reset()
	}
}
