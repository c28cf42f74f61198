package proxy

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// observedAccessLog returns an access logger that records entries in memory.
func observedAccessLog() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.InfoLevel)
	return zap.New(core), logs
}

// waitForLines waits until logs holds n entries and returns them.
func waitForLines(t *testing.T, logs *observer.ObservedLogs, n int) []observer.LoggedEntry {
	t.Helper()
	waitFor(t, "access log lines", func() bool { return logs.Len() >= n })
	return logs.All()
}

// withoutTimings checks that an entry's timings are positive and ordered, then drops them, so the
// rest can be compared exactly.
func withoutTimings(t *testing.T, fields map[string]any) map[string]any {
	t.Helper()
	duration, _ := fields["duration"].(time.Duration)
	if duration <= 0 {
		t.Errorf("duration = %v, want > 0", fields["duration"])
	}
	if ttft, ok := fields["ttft"].(time.Duration); ok && (ttft <= 0 || ttft > duration) {
		t.Errorf("ttft = %v, want in (0, duration %v]", ttft, duration)
	}
	delete(fields, "duration")
	delete(fields, "ttft")
	return fields
}

func TestAccessLogLine(t *testing.T) {
	sim := startReplicaSim(t)
	accessLog, logs := observedAccessLog()
	_, base := startProxy(t, ServiceConfig{AccessLog: accessLog}, backendsOf(sim)...)

	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions?api-version=1",
		strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`), "X-Request-Id", "req-42")
	usage, _ := usageOf(t, res.body)
	lines := waitForLines(t, logs, 1)
	if len(lines) != 1 || lines[0].Message != "request" || lines[0].Level != zapcore.InfoLevel {
		t.Fatalf("got %d lines, first %q at %v; want one Info \"request\"", len(lines), lines[0].Message, lines[0].Level)
	}
	want := map[string]any{
		"service":           "llama",
		"request_id":        "req-42",
		"method":            "POST",
		"path":              "/v1/chat/completions",
		"status":            int64(200),
		"replica_id":        int64(1),
		"attempts":          int64(1),
		"bytes_out":         int64(len(res.body)),
		"prompt_tokens":     int64(usage.PromptTokens),
		"completion_tokens": int64(usage.CompletionTokens),
		"client_ip":         "127.0.0.1",
	}
	fields := lines[0].ContextMap()
	if _, ok := fields["ttft"]; !ok {
		t.Error("no ttft on a 2xx answer")
	}
	if diff := cmp.Diff(want, withoutTimings(t, fields)); diff != "" {
		t.Errorf("access log fields (-want +got):\n%s", diff)
	}
}

// TestAccessLogProxyAnswers: responses the proxy writes itself are logged with the request id
// the client got, no replica, and what went wrong.
func TestAccessLogProxyAnswers(t *testing.T) {
	accessLog, logs := observedAccessLog()
	svc, base := startProxy(t, ServiceConfig{AccessLog: accessLog, MaxQueuedRequests: -1})
	c := newClient(t)

	noReplicas := do(t, c, http.MethodGet, base+"/v1/models", nil)
	svc.SetBackends([]Backend{{ID: 1, Addr: deadAddr(t)}, {ID: 2, Addr: deadAddr(t)}})
	unreachable := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))

	lines := waitForLines(t, logs, 2)
	want := []map[string]any{{
		"service": "llama", "request_id": noReplicas.header.Get("X-Request-Id"), "method": "GET", "path": "/v1/models",
		"status": int64(503), "attempts": int64(0), "bytes_out": int64(len(noReplicas.body)), "client_ip": "127.0.0.1",
	}, {
		"service": "llama", "request_id": unreachable.header.Get("X-Request-Id"), "method": "POST", "path": "/v1/completions",
		"status": int64(502), "attempts": int64(2), "bytes_out": int64(len(unreachable.body)), "client_ip": "127.0.0.1",
		"error": "dial",
	}}
	var got []map[string]any
	for _, l := range lines {
		got = append(got, withoutTimings(t, l.ContextMap()))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access log (-want +got):\n%s", diff)
	}
	if want[0]["request_id"] == "" || want[1]["request_id"] == "" {
		t.Error("a proxy answer has no X-Request-Id")
	}
}

// syncBuffer is a bytes.Buffer safe for a logger writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Sync() error { return nil }

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLogsNeverHoldSecrets sends credentials in every place a client can put them, through every
// outcome, and checks that nothing of them reaches the encoded output of either the access log or
// the service's debug log.
func TestLogsNeverHoldSecrets(t *testing.T) {
	var out syncBuffer
	logger := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), &out, zapcore.DebugLevel))
	ok := startUpstream(t, "ok", okHandler)
	failing := startUpstream(t, "failing", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", Logger: logger, AccessLog: logger, MaxQueuedRequests: -1},
		backendsOf(ok, failing)...)

	secrets := []string{"sk-keysecret", "apikeysecret", "cookiesecret", "querysecret", "bodysecret", "usersecret"}
	send := func() {
		c := newClient(t)
		do(t, c, http.MethodPost, base+"/v1/chat/completions?key=querysecret&x=1",
			strings.NewReader(`{"messages":[{"role":"user","content":"bodysecret"}]}`),
			"Authorization", "Bearer sk-keysecret", "Api-Key", "apikeysecret", "Cookie", "session=cookiesecret")
		rawExchange(t, base, "GET http://user:usersecret@api.example/v1/models?key=querysecret HTTP/1.1\r\n"+
			"Host: api.example\r\nAuthorization: Bearer sk-keysecret\r\nConnection: close\r\n\r\n")
	}
	send() // to the healthy replica and the failing one
	svc.SetBackends([]Backend{{ID: 3, Addr: deadAddr(t)}})
	send() // every attempt fails
	svc.SetBackends(nil)
	send() // no replicas

	waitFor(t, "six access log lines", func() bool { return strings.Count(out.String(), `"msg":"request"`) >= 6 })
	logged := out.String()
	for _, s := range secrets {
		if strings.Contains(logged, strings.TrimPrefix(s, "sk-")) {
			t.Errorf("the logs contain %q:\n%s", s, logged)
		}
	}
	if !strings.Contains(logged, `"path":"/v1/chat/completions"`) || !strings.Contains(logged, `"path":"/v1/models"`) {
		t.Errorf("the logs lack the request paths, so this test checks nothing:\n%s", logged)
	}
}

func TestAccessLogIsSampled(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	o := observability{accessLog: newAccessLogger(zap.New(core), "s")}
	const lines = 250
	for range lines { // well within one sampling tick
		o.logAccess(&accessRecord{status: 200, ttft: -1, replicaID: 1, usage: unknownUsage})
	}
	// The first 100, then every 100th: the 200th.
	if got := logs.Len(); got != accessLogFirst+1 {
		t.Errorf("%d of %d lines written, want %d", got, lines, accessLogFirst+1)
	}
	if got := logs.All()[0].ContextMap()["service"]; got != "s" {
		t.Errorf("service = %v, want s", got)
	}
}

func TestAccessLogRespectsLevel(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	u := startUpstream(t, "ok", okHandler)
	_, base := startProxy(t, ServiceConfig{AccessLog: zap.New(core)}, backendsOf(u)...)
	do(t, newClient(t), http.MethodGet, base+"/v1/models", nil)
	do(t, newClient(t), http.MethodGet, base+"/v1/models", nil)
	if n := logs.Len(); n != 0 {
		t.Errorf("%d access lines through a Warn-level logger, want 0", n)
	}
}

func TestRequestPath(t *testing.T) {
	for uri, want := range map[string]string{
		"/v1/chat/completions":       "/v1/chat/completions",
		"/v1/completions?key=secret": "/v1/completions",
		"/v1/x#frag":                 "/v1/x",
		"/a?next=http://b/c":         "/a",
		"*":                          "*",
		"http://api.example/v1/models?key=secret":     "/v1/models",
		"https://user:secret@api.example:443/v1/x?y":  "/v1/x",
		"http://api.example?key=secret":               "/",
		"http://api.example":                          "/",
		"":                                            "",
		"api.example:443":                             "api.example:443",
		"/%2F%2e%2e/../v1?x":                          "/%2F%2e%2e/../v1",
		"http://user:secret@api.example#x?key=secret": "/",
	} {
		if got := string(requestPath([]byte(uri))); got != want {
			t.Errorf("requestPath(%q) = %q, want %q", uri, got, want)
		}
	}
}
