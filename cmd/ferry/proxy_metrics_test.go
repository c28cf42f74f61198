package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// TestProxyServesMetrics runs `ferry proxy --metrics-listen ... --access-log` in front of a
// simulated replica: a request shows up in the admin listener's /metrics, next to the Go runtime
// metrics, and in one access log line.
func TestProxyServesMetrics(t *testing.T) {
	replica := httptest.NewServer(replicasim.NewServer(replicasim.DefaultConfig()).Handler())
	defer replica.Close()

	opts, err := proxyFlags{
		listen: "127.0.0.1:0", name: "svc", policy: "least_load", replicas: []string{replica.URL},
		maxBodyMB: 32, idleTimeout: time.Minute, shutdownTimeout: 10 * time.Second,
		metricsListen: "127.0.0.1:0", accessLog: true,
	}.parse()
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	adminLn := listen(t)
	core, logs := observer.New(zap.InfoLevel)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveProxy(ctx, opts, ln, adminLn, zap.New(core)) }()
	defer func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("proxy: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("proxy did not stop within 15s")
		}
	}()

	client := &http.Client{Timeout: 10 * time.Second}
	body := `{"model":"ferry-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	resp, err := client.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion: %d %s", resp.StatusCode, raw)
	}

	admin := "http://" + adminLn.Addr().String()
	// The request is counted when its response has ended, which the client may see first.
	const wantCount = `ferry_requests_total{code="200",replica="1",service="svc"} 1`
	var metrics string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if metrics = testhttp.GetOK(t, client, admin+"/metrics"); strings.Contains(metrics, wantCount) {
			break
		}
	}
	for _, want := range []string{wantCount, "\ngo_goroutines ", "\nprocess_open_fds ", "\nferry_request_duration_seconds_count{service=\"svc\"} 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	if got := testhttp.GetOK(t, client, admin+"/healthz"); got != "ok\n" {
		t.Errorf("/healthz = %q", got)
	}

	access := logs.FilterLoggerName("access").FilterMessage("request").All()
	if len(access) != 1 {
		t.Fatalf("%d access log lines, want 1: %+v", len(access), access)
	}
	fields := access[0].ContextMap()
	if fields["request_id"] == "" || fields["path"] != "/v1/chat/completions" || fields["status"] != int64(200) ||
		fields["service"] != "svc" {
		t.Errorf("access log line %v", fields)
	}

	// The proxy's own metrics are not on the traffic listener: its /metrics goes to the replica.
	if got := testhttp.GetOK(t, client, "http://"+ln.Addr().String()+"/metrics"); strings.Contains(got, "ferry_requests_total") {
		t.Errorf("the traffic listener serves the proxy's metrics:\n%s", got)
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
