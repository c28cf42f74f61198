package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// asyncResult is the outcome of a request sent by doAsync.
type asyncResult struct {
	result
	err error
}

// doAsync POSTs body to url on its own goroutine, for requests that block in the proxy. It
// reports errors in the result instead of failing the test from another goroutine.
func doAsync(c *http.Client, url, body string) <-chan asyncResult {
	out := make(chan asyncResult, 1)
	go func() {
		resp, err := c.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			out <- asyncResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- asyncResult{result: result{status: resp.StatusCode, header: resp.Header, body: string(b)}, err: err}
	}()
	return out
}

// receive waits for a doAsync result.
func receive(t *testing.T, ch <-chan asyncResult) result {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("request: %v", r.err)
		}
		return r.result
	case <-time.After(waitTimeout):
		t.Fatal("timed out waiting for a response")
		return result{}
	}
}

// isClosed reports whether ch is closed, without blocking.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func sseHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	sseEvent(w, "one")
	sseEvent(w, "[DONE]")
}

// TestHeldRequestIsServed: a request to a service with no replica waits for one, calls
// OnColdRequest, and is served, body or stream, once SetBackends provides a replica.
func TestHeldRequestIsServed(t *testing.T) {
	tests := map[string]struct {
		handler  http.HandlerFunc
		wantType string
		wantBody string
	}{
		"plain":  {handler: okHandler, wantType: "application/json", wantBody: `{"ok":true}`},
		"stream": {handler: sseHandler, wantType: "text/event-stream", wantBody: "data: one\n\ndata: [DONE]\n\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var cold atomic.Int64
			u := startUpstream(t, "a", tc.handler)
			svc, base := startProxy(t, ServiceConfig{OnColdRequest: func() { cold.Add(1) }})

			pending := doAsync(newClient(t), base+"/v1/chat/completions", `{"stream":true}`)
			waitFor(t, "the request to be held", func() bool { return svc.Waiting() == 1 })
			waitFor(t, "OnColdRequest", func() bool { return cold.Load() == 1 })

			svc.SetBackends(backendsOf(u))
			res := receive(t, pending)
			if res.status != http.StatusOK || res.header.Get("Content-Type") != tc.wantType || res.body != tc.wantBody {
				t.Errorf("got %d %q %q, want 200 %q %q", res.status, res.header.Get("Content-Type"), res.body, tc.wantType, tc.wantBody)
			}
			if got := svc.Waiting(); got != 0 {
				t.Errorf("Waiting after the release = %d, want 0", got)
			}
			if got := svc.Arrivals(); got != 1 {
				t.Errorf("Arrivals = %d, want 1", got)
			}
			waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
		})
	}
}

// TestHoldRefusals: the answers of a request that is not held, or held in vain, are 503s in the
// OpenAI shape with Retry-After, counted under replica "none"; the waiting gauge follows the
// requests held meanwhile.
func TestHoldRefusals(t *testing.T) {
	tests := map[string]struct {
		cfg         ServiceConfig
		held        int // requests held before the one that is refused
		wantCode    string
		wantMessage string
		minWait     time.Duration
	}{
		"queue full": {
			cfg: ServiceConfig{MaxQueuedRequests: 1}, held: 1, wantCode: "queue_full",
			wantMessage: `service "llama" has no ready replica and 1 requests are already waiting for one; retry shortly`,
		},
		"wait expired": {
			cfg: ServiceConfig{MaxQueueWait: 200 * time.Millisecond}, wantCode: "no_replica_timeout",
			wantMessage: `service "llama" had no ready replica within 200ms`, minWait: 200 * time.Millisecond,
		},
		"holding disabled": {
			cfg: ServiceConfig{MaxQueuedRequests: -1}, wantCode: "no_ready_replicas",
			wantMessage: `no ready replicas for service "llama"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, reg := newTestMetrics(t)
			tc.cfg.Metrics = m
			svc, base := startProxy(t, tc.cfg)
			c := newClient(t)
			for range tc.held {
				doAsync(c, base+"/v1/completions", `{}`) // answered by the cleanup's Shutdown
			}
			waitFor(t, "the requests to be held", func() bool { return svc.Waiting() == int64(tc.held) })
			if got := seriesValue(t, reg, "ferry_requests_waiting", "service", "llama"); got != float64(tc.held) {
				t.Errorf("ferry_requests_waiting = %v, want %d", got, tc.held)
			}

			start := time.Now()
			res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
			if elapsed := time.Since(start); elapsed < tc.minWait {
				t.Errorf("answered after %v, want at least %v", elapsed, tc.minWait)
			}
			if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") != "1" ||
				res.header.Get("Content-Type") != "application/json" {
				t.Errorf("got %d Retry-After %q Content-Type %q, want 503 with Retry-After 1 and JSON",
					res.status, res.header.Get("Retry-After"), res.header.Get("Content-Type"))
			}
			e := decodeError(t, res.body)
			if e.Error.Code != tc.wantCode || e.Error.Type != "service_unavailable" || e.Error.Message != tc.wantMessage {
				t.Errorf("error = %+v, want code %q type service_unavailable message %q", e.Error, tc.wantCode, tc.wantMessage)
			}
			waitForRequests(t, reg, 1)
			if got := seriesValue(t, reg, "ferry_requests_total", "service", "llama", "replica", replicaNone, "code", "503"); got != 1 {
				t.Errorf("ferry_requests_total 503 none = %v, want 1", got)
			}
			if got := svc.Waiting(); got != int64(tc.held) {
				t.Errorf("Waiting after the refusal = %d, want %d", got, tc.held)
			}
		})
	}
}

// TestShutdownReleasesHeldRequests: requests held for a replica get 503 as soon as the service,
// or the gateway they came through, shuts down, and neither Shutdown waits out MaxQueueWait.
func TestShutdownReleasesHeldRequests(t *testing.T) {
	tests := map[string]struct{ viaGateway bool }{
		"service": {},
		"gateway": {viaGateway: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc, base := startProxy(t, ServiceConfig{})
			shutdown := svc.Shutdown
			if tc.viaGateway {
				g := NewGateway(GatewayConfig{Logger: zaptest.NewLogger(t)})
				g.SetServices([]*Service{svc})
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				go func() { _ = g.Serve(ln) }()
				base, shutdown = "http://"+ln.Addr().String(), g.Shutdown
			}

			const held = 3
			c := newClient(t)
			var pending []<-chan asyncResult
			for range held {
				pending = append(pending, doAsync(c, base+"/v1/completions", `{"model":"llama"}`))
			}
			waitFor(t, "the requests to be held", func() bool { return svc.Waiting() == held })

			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			for _, p := range pending {
				res := receive(t, p)
				if res.status != http.StatusServiceUnavailable || decodeError(t, res.body).Error.Code != "shutting_down" {
					t.Errorf("held request got %d %s, want 503 shutting_down", res.status, res.body)
				}
			}
			if got := svc.Waiting(); got != 0 {
				t.Errorf("Waiting after Shutdown = %d, want 0", got)
			}
		})
	}
}

// TestSetBackendsSignalsReady: an empty snapshot carries the channel held requests wait on; it
// survives further empty sets and is closed by the first set with a replica.
func TestSetBackendsSignalsReady(t *testing.T) {
	svc, err := NewService(ServiceConfig{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	initial := svc.snap.Load().ready
	if initial == nil || isClosed(initial) {
		t.Fatal("a new service has no open ready channel")
	}
	svc.SetBackends(nil)
	if got := svc.snap.Load().ready; got != initial || isClosed(initial) {
		t.Error("an empty set replaced or closed the ready channel")
	}
	svc.SetBackends([]Backend{{ID: 1, Addr: "127.0.0.1:9001"}})
	if !isClosed(initial) {
		t.Error("the first replica did not close the ready channel")
	}
	if svc.snap.Load().ready != nil {
		t.Error("a snapshot with replicas has a ready channel")
	}
	svc.SetBackends(nil)
	if next := svc.snap.Load().ready; next == nil || isClosed(next) {
		t.Error("scaling to zero did not make a new open ready channel")
	}
}

// TestColdRequestHook: OnColdRequest runs off the request's goroutine, at most once per
// coldRequestEvery, and a panic in it is contained.
func TestColdRequestHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		svc, err := NewService(ServiceConfig{Name: "m", Logger: zap.NewNop(), OnColdRequest: func() {
			if calls.Add(1) == 3 {
				panic("controller bug")
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			after     time.Duration
			wantCalls int64
		}{
			{after: 0, wantCalls: 1},
			{after: coldRequestEvery / 2, wantCalls: 1}, // within the period: dropped
			{after: coldRequestEvery / 2, wantCalls: 2},
			{after: coldRequestEvery, wantCalls: 3}, // panics
			{after: coldRequestEvery, wantCalls: 4},
		}
		for i, step := range steps {
			time.Sleep(step.after) // the bubble's clock
			svc.coldRequest()
			synctest.Wait()
			if got := calls.Load(); got != step.wantCalls {
				t.Errorf("step %d: %d calls, want %d", i, got, step.wantCalls)
			}
		}
	})
}
