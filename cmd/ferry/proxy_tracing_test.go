package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/bench/replicasim"
)

// TestProxyExportsTraces runs `ferry proxy --otlp-endpoint URL` in front of a simulated
// replica: the request's spans reach the collector by the time the proxy has stopped, and the
// replica got a traceparent.
func TestProxyExportsTraces(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	var exports atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			exports.Add(1)
		}
	}))
	defer collector.Close()
	var traceparent atomic.Value
	sim := replicasim.NewServer(replicasim.DefaultConfig()).Handler()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost { // not the proxy's own GETs (models, metrics)
			traceparent.Store(r.Header.Get("Traceparent"))
		}
		sim.ServeHTTP(w, r)
	}))
	defer replica.Close()

	opts, err := proxyFlags{
		listen: "127.0.0.1:0", name: "svc", policy: "least_load", replicas: []string{replica.URL},
		maxBodyMB: 32, idleTimeout: time.Minute, shutdownTimeout: 10 * time.Second,
		otlpEndpoint: collector.URL, traceSample: 1,
	}.parse()
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveProxy(ctx, opts, ln, nil, zap.NewNop()) }()

	body := `{"model":"ferry-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %d", resp.StatusCode)
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("proxy: %v", err)
	}
	if exports.Load() == 0 {
		t.Error("no spans reached the collector by the proxy's exit")
	}
	if tp, _ := traceparent.Load().(string); !strings.HasPrefix(tp, "00-") {
		t.Errorf("replica got traceparent %q", tp)
	}
}
