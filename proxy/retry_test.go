package proxy

import (
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

func TestRetries(t *testing.T) {
	failing := map[string]http.HandlerFunc{
		"503": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":"loading"}`))
		},
		"502": func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) },
		// A replica that dies after reading the request: the connection is reset, no status.
		"reset before answering": func(w http.ResponseWriter, _ *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				panic(err)
			}
			_ = conn.(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
		},
	}
	for name, bad := range failing {
		t.Run(name, func(t *testing.T) {
			broken := startUpstream(t, "broken", bad)
			healthy := startUpstream(t, "healthy", okHandler)
			// round_robin starts at the first backend, so the first attempt meets the broken one.
			svc, base := startProxy(t, ServiceConfig{Policy: "round_robin"}, backendsOf(broken, healthy)...)
			res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`))
			if res.status != 200 || res.header.Get("X-Upstream") != "healthy" {
				t.Fatalf("status %d from %q, want 200 from the healthy replica", res.status, res.header.Get("X-Upstream"))
			}
			if broken.hits.Load() != 1 || healthy.hits.Load() != 1 {
				t.Errorf("hits: broken %d, healthy %d; want 1 each", broken.hits.Load(), healthy.hits.Load())
			}
			waitFor(t, "in-flight back to 0", func() bool { return svc.InFlight() == 0 })
		})
	}
}

// TestLastAttemptPassesThrough: when every replica answers 503, the client gets the last
// replica's own answer, not a proxy invention, after trying each replica once.
func TestLastAttemptPassesThrough(t *testing.T) {
	var hits atomic.Int64
	busy := func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"queue full","type":"server_error","code":"busy"}}`))
	}
	a, b := startUpstream(t, "a", busy), startUpstream(t, "b", busy)
	_, base := startProxy(t, ServiceConfig{MaxAttempts: 5}, backendsOf(a, b)...)
	res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
	if res.status != 503 || !strings.Contains(res.body, "queue full") || res.header.Get("Retry-After") != "7" {
		t.Errorf("got %d %q Retry-After %q; want the replica's own 503", res.status, res.body, res.header.Get("Retry-After"))
	}
	if got := hits.Load(); got != 2 {
		t.Errorf("replica hits = %d, want 2 (each replica once)", got)
	}
}

// TestNoRetryAfterFirstByte: a stream that breaks after its first event is never replayed on
// another replica (the client already has tokens); it ends with an error event instead.
func TestNoRetryAfterFirstByte(t *testing.T) {
	crash := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		sseEvent(w, `{"choices":[{"delta":{"content":"Hel"}}]}`)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		_ = buf.Flush()
		_ = conn.(*net.TCPConn).SetLinger(0)
		_ = conn.Close()
	}
	a, b := startUpstream(t, "a", crash), startUpstream(t, "b", crash)
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(a, b)...)
	_, r := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, r); !strings.Contains(got, "Hel") {
		t.Fatalf("first event = %q", got)
	}
	expectStreamErrorEvent(t, r)
	if total := a.hits.Load() + b.hits.Load(); total != 1 {
		t.Errorf("replica hits = %d, want 1: a started stream must not be retried", total)
	}
	waitFor(t, "in-flight back to 0", func() bool { return svc.InFlight() == 0 })
}
