package proxy

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/policy"
)

// collector is an OTLP/HTTP collector on loopback: it decodes what the exporter posts to
// /v1/traces and keeps the spans.
type collector struct {
	url      string
	posts    atomic.Int64
	mu       sync.Mutex
	spans    []*tracepb.Span
	services []string // the resources' service.name
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector got %s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusNotFound)
			return
		}
		c.posts.Add(1)
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			t.Errorf("collector: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			c.services = append(c.services, stringAttr(rs.Resource.GetAttributes(), "service.name"))
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

// startTracing exports to c; flush (Shutdown) before reading c's spans.
func startTracing(t *testing.T, c *collector) *Tracing {
	t.Helper()
	t.Setenv(EnvOTLPEndpoint, "")
	t.Setenv(EnvOTLPTracesEndpoint, "")
	tr, err := StartOTLP(context.Background(), OTLPConfig{Endpoint: c.url, ServiceName: "ferry-test"})
	if err != nil || tr == nil {
		t.Fatalf("StartOTLP: %v, %v", tr, err)
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

// flush waits for svc's streams to end and sends every span to the collector.
func flush(t *testing.T, tr *Tracing, svcs ...*Service) {
	t.Helper()
	for _, s := range svcs {
		waitFor(t, "the streams to end", func() bool { return s.InFlight() == 0 })
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("flushing spans: %v", err)
	}
}

// traces groups the collected spans by trace id.
func (c *collector) traces() map[string][]*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]*tracepb.Span{}
	for _, s := range c.spans {
		id := hex.EncodeToString(s.TraceId)
		out[id] = append(out[id], s)
	}
	return out
}

// tree renders a trace as "parent > child" lines, sorted, with each span's kind, so a test can
// compare shapes.
func tree(spans []*tracepb.Span) []string {
	byID := map[string]*tracepb.Span{}
	for _, s := range spans {
		byID[string(s.SpanId)] = s
	}
	var lines []string
	for _, s := range spans {
		parent := "-"
		if p := byID[string(s.ParentSpanId)]; p != nil {
			parent = p.Name
		}
		lines = append(lines, fmt.Sprintf("%s > %s (%s)", parent, s.Name, strings.TrimPrefix(s.Kind.String(), "SPAN_KIND_")))
	}
	slices.Sort(lines)
	return lines
}

func spanNamed(t *testing.T, spans []*tracepb.Span, name string) *tracepb.Span {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q in %v", name, tree(spans))
	return nil
}

func attr(kvs []*commonpb.KeyValue, key string) *commonpb.AnyValue {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

func stringAttr(kvs []*commonpb.KeyValue, key string) string { return attr(kvs, key).GetStringValue() }

func intAttr(kvs []*commonpb.KeyValue, key string) int64 {
	v := attr(kvs, key)
	if v == nil {
		return -1
	}
	return v.GetIntValue()
}

// streamingReplica streams a chat completion of model m1 that reports its usage last, and
// records the traceparent each request brought.
func streamingReplica(t *testing.T, traceparents chan<- string) *upstream {
	return startUpstream(t, "stream", func(w http.ResponseWriter, r *http.Request) {
		traceparents <- r.Header.Get("Traceparent")
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a", "b", "c"} {
			sseEvent(w, `{"id":"c1","object":"chat.completion.chunk","model":"m1","choices":[{"index":0,"delta":{"content":"`+tok+`"}}],"usage":null}`)
		}
		sseEvent(w, `{"id":"c1","object":"chat.completion.chunk","model":"m1","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`)
		sseEvent(w, "[DONE]")
	})
}

const (
	clientTraceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParentSpan = "00f067aa0ba902b7"
)

// TestTracingSpanTree: a streamed chat completion through a service yields one trace that
// continues the client's, with the request's span, the pick and the attempt, the first token
// marked on the attempt, the GenAI attributes with the usage the replica reported, and the
// replica got a traceparent naming the attempt's span.
func TestTracingSpanTree(t *testing.T) {
	col := startCollector(t)
	tr := startTracing(t, col)
	traceparents := make(chan string, 4)
	replica := streamingReplica(t, traceparents)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr, Policy: policy.LeastLoad}, backendsOf(replica)...)

	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions?api_key=secret",
		strings.NewReader(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`),
		"Traceparent", "00-"+clientTraceID+"-"+clientParentSpan+"-01", "Authorization", "Bearer sk-secret")
	if res.status != http.StatusOK || !strings.Contains(res.body, "[DONE]") {
		t.Fatalf("request: %d %s", res.status, res.body)
	}
	flush(t, tr, svc)

	traces := col.traces()
	spans := traces[clientTraceID]
	if len(traces) != 1 || spans == nil {
		t.Fatalf("traces %v, want one with the client's id %s", traces, clientTraceID)
	}
	want := []string{"- > llama (SERVER)", "llama > chat m1 (CLIENT)", "llama > pick (INTERNAL)"}
	if diff := cmp.Diff(want, tree(spans)); diff != "" {
		t.Errorf("span tree (-want +got):\n%s", diff)
	}
	root := spanNamed(t, spans, "llama")
	if got := hex.EncodeToString(root.ParentSpanId); got != clientParentSpan {
		t.Errorf("request span's parent %s, want the client's %s", got, clientParentSpan)
	}
	attempt := spanNamed(t, spans, "chat m1")
	wantParent := "00-" + clientTraceID + "-" + hex.EncodeToString(attempt.SpanId) + "-01"
	if got := <-traceparents; got != wantParent {
		t.Errorf("replica got traceparent %q, want %q", got, wantParent)
	}
	for _, s := range []*tracepb.Span{root, attempt} {
		checkAttrs(t, s, map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "gen_ai.response.model": "m1",
			"gen_ai.usage.input_tokens": int64(7), "gen_ai.usage.output_tokens": int64(3),
			"http.response.status_code": int64(200),
		})
	}
	checkAttrs(t, root, map[string]any{"ferry.service": "llama", "url.path": "/v1/chat/completions", "http.request.method": "POST"})
	checkAttrs(t, attempt, map[string]any{"server.address": "127.0.0.1", "ferry.replica.id": int64(1), "ferry.attempt": int64(1)})
	if len(attempt.Events) != 1 || attempt.Events[0].Name != "first_token" ||
		attempt.Events[0].TimeUnixNano < attempt.StartTimeUnixNano || attempt.Events[0].TimeUnixNano > attempt.EndTimeUnixNano {
		t.Errorf("attempt's events %v, want one first_token within it", attempt.Events)
	}
	if attempt.EndTimeUnixNano > root.EndTimeUnixNano || attempt.StartTimeUnixNano < root.StartTimeUnixNano {
		t.Error("the attempt's span is not within the request's")
	}
	noSecrets(t, spans)
	if got := col.services; len(got) == 0 || got[0] != "ferry-test" {
		t.Errorf("resources' service.name %v, want ferry-test", got)
	}
}

// noSecrets fails if any span carries the test's key or query string.
func noSecrets(t *testing.T, spans []*tracepb.Span) {
	t.Helper()
	for _, s := range spans {
		if b, _ := proto.Marshal(s); strings.Contains(string(b), "secret") || strings.Contains(string(b), "hi\"") {
			t.Errorf("span %s carries a secret, the query or the body: %v", s.Name, s)
		}
	}
}

func checkAttrs(t *testing.T, s *tracepb.Span, want map[string]any) {
	t.Helper()
	for key, v := range want {
		var got any
		switch v.(type) {
		case string:
			got = stringAttr(s.Attributes, key)
		case int64:
			got = intAttr(s.Attributes, key)
		}
		if got != v {
			t.Errorf("span %s: %s = %v, want %v", s.Name, key, got, v)
		}
	}
}

// TestTracingStartsTrace: without a client traceparent the request's span is a root, and the
// replica's traceparent carries its trace.
func TestTracingStartsTrace(t *testing.T) {
	col := startCollector(t)
	tr := startTracing(t, col)
	traceparents := make(chan string, 4)
	replica := streamingReplica(t, traceparents)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr}, backendsOf(replica)...)
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`)); res.status != http.StatusOK {
		t.Fatalf("request: %d %s", res.status, res.body)
	}
	flush(t, tr, svc)
	traces := col.traces()
	if len(traces) != 1 {
		t.Fatalf("%d traces, want 1", len(traces))
	}
	for id, spans := range traces {
		if root := spanNamed(t, spans, "llama"); len(root.ParentSpanId) != 0 {
			t.Errorf("request span has parent %x, want none", root.ParentSpanId)
		}
		if got := <-traceparents; !strings.HasPrefix(got, "00-"+id+"-") {
			t.Errorf("replica got traceparent %q, want trace %s", got, id)
		}
	}
}

// TestTracingRetry: an attempt on a dead replica is a failed attempt span, and the retry a
// second one beside it.
func TestTracingRetry(t *testing.T) {
	col := startCollector(t)
	tr := startTracing(t, col)
	live := startUpstream(t, "live", okHandler)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr, Policy: policy.RoundRobin, MaxAttempts: 2},
		Backend{ID: 1, Addr: deadAddr(t)}, Backend{ID: 2, Addr: live.addr()})
	c := newClient(t)
	for range 2 { // round robin: one or both go to the dead replica first
		if res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"m2","prompt":"x"}`)); res.status != http.StatusOK {
			t.Fatalf("request: %d %s", res.status, res.body)
		}
	}
	flush(t, tr, svc)
	retried := 0
	for _, spans := range col.traces() {
		var attempts []*tracepb.Span
		for _, s := range spans {
			if s.Name == "text_completion m2" {
				attempts = append(attempts, s)
			}
		}
		if len(attempts) < 2 {
			continue
		}
		retried++
		want := []string{"- > llama (SERVER)", "llama > pick (INTERNAL)", "llama > pick (INTERNAL)",
			"llama > text_completion m2 (CLIENT)", "llama > text_completion m2 (CLIENT)"}
		if diff := cmp.Diff(want, tree(spans)); diff != "" {
			t.Errorf("span tree (-want +got):\n%s", diff)
		}
		slices.SortFunc(attempts, func(a, b *tracepb.Span) int {
			return int(intAttr(a.Attributes, "ferry.attempt") - intAttr(b.Attributes, "ferry.attempt"))
		})
		failed, ok := attempts[0], attempts[1]
		if failed.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || stringAttr(failed.Attributes, "error.type") != "dial" ||
			intAttr(failed.Attributes, "ferry.replica.id") != 1 {
			t.Errorf("first attempt: status %v, attributes %v; want a dial error on replica 1", failed.Status, failed.Attributes)
		}
		if ok.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR || intAttr(ok.Attributes, "http.response.status_code") != 200 ||
			intAttr(ok.Attributes, "ferry.replica.id") != 2 {
			t.Errorf("second attempt: status %v, attributes %v; want 200 from replica 2", ok.Status, ok.Attributes)
		}
	}
	if retried == 0 {
		t.Error("no trace with two attempts")
	}
}

// TestTracingHold: a request held while the service has no replica has a hold span before its
// pick.
func TestTracingHold(t *testing.T) {
	col := startCollector(t)
	tr := startTracing(t, col)
	replica := startUpstream(t, "late", okHandler)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr})
	pending := doAsync(newClient(t), base+"/v1/embeddings", `{"model":"e5","input":"x"}`)
	waitFor(t, "the request to be held", func() bool { return svc.Waiting() == 1 })
	svc.SetBackends(backendsOf(replica))
	if res := receive(t, pending); res.status != http.StatusOK {
		t.Fatalf("held request: %d %s", res.status, res.body)
	}
	flush(t, tr, svc)
	traces := col.traces()
	if len(traces) != 1 {
		t.Fatalf("%d traces, want 1", len(traces))
	}
	for _, spans := range traces {
		want := []string{"- > llama (SERVER)", "llama > embeddings e5 (CLIENT)", "llama > hold (INTERNAL)", "llama > pick (INTERNAL)"}
		if diff := cmp.Diff(want, tree(spans)); diff != "" {
			t.Errorf("span tree (-want +got):\n%s", diff)
		}
		hold, pick := spanNamed(t, spans, "hold"), spanNamed(t, spans, "pick")
		checkAttrs(t, hold, map[string]any{"ferry.hold.for": "replica"})
		if hold.EndTimeUnixNano > pick.StartTimeUnixNano {
			t.Error("the hold ends after the pick starts")
		}
	}
}

// TestTracingGateway: through the gateway the request's span is the gateway's, which the
// service continues; a request the gateway answers itself has its span too.
func TestTracingGateway(t *testing.T) {
	col := startCollector(t)
	tr := startTracing(t, col)
	replica := modelServer(t, "a", "model-a")
	svc, _ := startProxy(t, ServiceConfig{Name: "svc", Tracing: tr}, backendsOf(replica)...)
	base := startGatewayWith(t, GatewayConfig{Tracing: tr, Logger: testLogger(t)}, svc)
	c := newClient(t)
	if res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"svc","messages":[]}`)); res.status != http.StatusOK {
		t.Fatalf("request: %d %s", res.status, res.body)
	}
	if res := do(t, c, http.MethodGet, base+"/health", nil); res.status != http.StatusOK { // not traced
		t.Fatalf("health: %d %s", res.status, res.body)
	}
	if res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"nope","messages":[]}`)); res.status != http.StatusNotFound {
		t.Fatalf("unknown model: %d %s", res.status, res.body)
	}
	flush(t, tr, svc)
	var shapes [][]string
	for _, spans := range col.traces() {
		shapes = append(shapes, tree(spans))
		root := spanNamed(t, spans, "gateway")
		if len(spans) == 1 {
			checkAttrs(t, root, map[string]any{"http.response.status_code": int64(404), "ferry.service": ""})
			continue
		}
		checkAttrs(t, root, map[string]any{"http.response.status_code": int64(200), "ferry.service": "svc", "gen_ai.request.model": "svc"})
	}
	slices.SortFunc(shapes, func(a, b []string) int { return len(a) - len(b) })
	want := [][]string{{"- > gateway (SERVER)"}, {"- > gateway (SERVER)", "gateway > chat svc (CLIENT)", "gateway > pick (INTERNAL)"}}
	if diff := cmp.Diff(want, shapes); diff != "" {
		t.Errorf("span trees (-want +got):\n%s", diff)
	}
}

// TestTracingOff: without an endpoint no Tracing is made, nothing reaches a collector, and the
// replica gets the client's traceparent as it was, or none.
func TestTracingOff(t *testing.T) {
	col := startCollector(t)
	t.Setenv(EnvOTLPEndpoint, "")
	t.Setenv(EnvOTLPTracesEndpoint, "")
	tr, err := StartOTLP(context.Background(), OTLPConfig{})
	if tr != nil || err != nil {
		t.Fatalf("StartOTLP without an endpoint: %v, %v; want nil, nil", tr, err)
	}
	traceparents := make(chan string, 4)
	replica := streamingReplica(t, traceparents)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr}, backendsOf(replica)...)
	c := newClient(t)
	clientParent := "00-" + clientTraceID + "-" + clientParentSpan + "-01"
	for _, sent := range []string{"", clientParent} {
		headers := []string{}
		if sent != "" {
			headers = []string{"Traceparent", sent}
		}
		if res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`), headers...); res.status != http.StatusOK {
			t.Fatalf("request: %d %s", res.status, res.body)
		}
		if got := <-traceparents; got != sent {
			t.Errorf("replica got traceparent %q, want %q", got, sent)
		}
	}
	waitFor(t, "the streams to end", func() bool { return svc.InFlight() == 0 })
	if n := col.posts.Load(); n != 0 {
		t.Errorf("collector got %d exports with tracing off", n)
	}
}

// TestOTLPEnvironment: the standard variables turn tracing on without a flag.
func TestOTLPEnvironment(t *testing.T) {
	col := startCollector(t)
	t.Setenv(EnvOTLPEndpoint, "")
	t.Setenv(EnvOTLPTracesEndpoint, col.url+"/v1/traces")
	tr, err := StartOTLP(context.Background(), OTLPConfig{ServiceName: "env"})
	if tr == nil || err != nil {
		t.Fatalf("StartOTLP with %s: %v, %v", EnvOTLPTracesEndpoint, tr, err)
	}
	replica := startUpstream(t, "r", okHandler)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr}, backendsOf(replica)...)
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"x"}`)); res.status != http.StatusOK {
		t.Fatalf("request: %d %s", res.status, res.body)
	}
	flush(t, tr, svc)
	if got := len(col.traces()); got != 1 {
		t.Errorf("%d traces at the environment's endpoint, want 1", got)
	}
}

func TestOTLPConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg     OTLPConfig
		wantErr bool
	}{
		"base URL":        {cfg: OTLPConfig{Endpoint: "http://collector:4318", SampleRatio: 0.5}},
		"URL with a path": {cfg: OTLPConfig{Endpoint: "https://collector/otlp/v1/traces"}},
		"no scheme":       {cfg: OTLPConfig{Endpoint: "collector:4318"}, wantErr: true},
		"ratio above 1":   {cfg: OTLPConfig{Endpoint: "http://c:4318", SampleRatio: 1.5}, wantErr: true},
		"negative ratio":  {cfg: OTLPConfig{SampleRatio: -0.1}, wantErr: true},
	} {
		if err := tc.cfg.Validate(); (err != nil) != tc.wantErr {
			t.Errorf("%s: Validate() = %v, want error %v", name, err, tc.wantErr)
		}
	}
}

func TestResponseModel(t *testing.T) {
	for tail, want := range map[string]string{
		`data: {"model":"a"}` + "\n\ndata: {\"model\": \"b\",\"usage\":{}}\n\ndata: [DONE]": "b",
		`{"id":"x","model":"llama-3"}`: "llama-3",
		`odel":"cut"}`:                 "",
		`{"model":"esc\"aped"}`:        "",
		`{"model":null}`:               "",
	} {
		if got := string(responseModel([]byte(tail))); got != want {
			t.Errorf("responseModel(%q) = %q, want %q", tail, got, want)
		}
	}
}

// TestTracingUnsampled: a request whose trace is not sampled goes through like any other, and
// its replica still gets a traceparent, flagged unsampled.
func TestTracingUnsampled(t *testing.T) {
	col := startCollector(t)
	t.Setenv(EnvOTLPEndpoint, "")
	t.Setenv(EnvOTLPTracesEndpoint, "")
	tr, err := StartOTLP(context.Background(), OTLPConfig{Endpoint: col.url, SampleRatio: 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	traceparents := make(chan string, 4)
	replica := streamingReplica(t, traceparents)
	svc, base := startProxy(t, ServiceConfig{Tracing: tr}, backendsOf(replica)...)
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"m1","stream":true}`)); res.status != http.StatusOK {
		t.Fatalf("request: %d %s", res.status, res.body)
	}
	if got := <-traceparents; !strings.HasPrefix(got, "00-") || !strings.HasSuffix(got, "-00") {
		t.Errorf("replica got traceparent %q, want an unsampled one", got)
	}
	flush(t, tr, svc)
	if n := len(col.traces()); n != 0 {
		t.Errorf("%d traces exported, want none", n)
	}
}
