package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/policy"
)

// seen is what an upstream received.
type seen struct {
	Method, RequestURI, Body string
	Header                   http.Header
}

func recordingUpstream(t *testing.T) (*upstream, <-chan seen) {
	t.Helper()
	got := make(chan seen, 16)
	u := startUpstream(t, "rec", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{Method: r.Method, RequestURI: r.RequestURI, Body: string(b), Header: r.Header.Clone()}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Reply", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"cmpl-1"}`)
	})
	return u, got
}

func TestForwardsRequestAndResponse(t *testing.T) {
	u, got := recordingUpstream(t)
	_, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	c := newClient(t)

	body := `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`
	res := do(t, c, http.MethodPost, base+"/v1/chat/completions?stream=false&x=a%2Fb", strings.NewReader(body),
		"Authorization", "Bearer sk-secret", "Content-Type", "application/json", "X-Custom", "kept",
		"X-Forwarded-For", "203.0.113.7")

	r := <-got
	if diff := cmp.Diff(seen{Method: "POST", RequestURI: "/v1/chat/completions?stream=false&x=a%2Fb", Body: body},
		seen{Method: r.Method, RequestURI: r.RequestURI, Body: r.Body}); diff != "" {
		t.Errorf("upstream request (-want +got):\n%s", diff)
	}
	wantHeaders := map[string]string{
		"Authorization":     "Bearer sk-secret",
		"Content-Type":      "application/json",
		"X-Custom":          "kept",
		"X-Forwarded-For":   "203.0.113.7, 127.0.0.1",
		"X-Forwarded-Proto": "http",
	}
	for k, want := range wantHeaders {
		if got := r.Header.Get(k); got != want {
			t.Errorf("upstream header %s = %q, want %q", k, got, want)
		}
	}
	id := r.Header.Get("X-Request-Id")
	if !regexp.MustCompile(`^[0-9a-f]{16}-[0-9a-f]+$`).MatchString(id) {
		t.Errorf("upstream X-Request-Id = %q, want a generated id", id)
	}

	if res.status != http.StatusCreated || res.body != `{"id":"cmpl-1"}` {
		t.Errorf("response = %d %q, want 201 with the upstream body", res.status, res.body)
	}
	for k, want := range map[string]string{"Content-Type": "application/json", "X-Reply": "yes", "X-Request-Id": id} {
		if got := res.header.Get(k); got != want {
			t.Errorf("response header %s = %q, want %q", k, got, want)
		}
	}

	// A client's own request id is forwarded and echoed unchanged.
	res = do(t, c, http.MethodGet, base+"/v1/models", nil, "X-Request-Id", "client-chosen-1")
	if r := <-got; r.Header.Get("X-Request-Id") != "client-chosen-1" || r.Method != "GET" {
		t.Errorf("upstream got %s with X-Request-Id %q, want GET with client-chosen-1", r.Method, r.Header.Get("X-Request-Id"))
	}
	if got := res.header.Get("X-Request-Id"); got != "client-chosen-1" {
		t.Errorf("response X-Request-Id = %q, want client-chosen-1", got)
	}
}

func TestRequestIDsAreUnique(t *testing.T) {
	u, got := recordingUpstream(t)
	_, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	c := newClient(t)
	ids := map[string]bool{}
	for range 5 {
		do(t, c, http.MethodGet, base+"/", nil)
		ids[(<-got).Header.Get("X-Request-Id")] = true
	}
	if len(ids) != 5 {
		t.Errorf("5 requests got %d distinct request ids: %v", len(ids), ids)
	}
}

func TestStripsHopByHopHeaders(t *testing.T) {
	// A raw upstream, so the response can carry hop-by-hop headers net/http would not send.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	requests := make(chan *http.Request, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		requests <- req
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\n"+
			"Content-Type: text/plain\r\nContent-Length: 2\r\n"+
			"Connection: X-Hop-Resp\r\nX-Hop-Resp: 1\r\nKeep-Alive: timeout=5\r\n"+
			"Proxy-Authenticate: Basic\r\nUpgrade: h2c\r\nX-End-To-End: kept\r\n\r\nok")
	}()

	_, base := startProxy(t, ServiceConfig{}, Backend{ID: 1, Addr: ln.Addr().String()})
	resp, body := rawExchange(t, base, "POST /v1/completions HTTP/1.1\r\nHost: api.example\r\n"+
		"Connection: keep-alive, X-Hop-Req\r\nX-Hop-Req: 1\r\nKeep-Alive: 300\r\nTE: trailers\r\n"+
		"Proxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nUpgrade: websocket\r\n"+
		"Expect: 100-continue\r\nTransfer-Encoding: chunked\r\nX-End-To-End: kept\r\n\r\n"+
		"5\r\nhello\r\n0\r\n\r\n")

	var req *http.Request
	select {
	case req = <-requests:
	case <-time.After(waitTimeout):
		t.Fatal("upstream got no request")
	}
	b, _ := io.ReadAll(req.Body)
	if string(b) != "hello" || req.Host != "api.example" {
		t.Errorf("upstream got body %q host %q, want hello api.example", b, req.Host)
	}
	var gotHop []string
	for _, k := range []string{"Connection", "X-Hop-Req", "Keep-Alive", "Te", "Proxy-Authorization", "Proxy-Connection", "Upgrade", "Expect"} {
		if v, ok := req.Header[k]; ok {
			gotHop = append(gotHop, k+": "+strings.Join(v, ","))
		}
	}
	if len(gotHop) > 0 || len(req.TransferEncoding) > 0 {
		t.Errorf("upstream got hop-by-hop headers %v, transfer encoding %v", gotHop, req.TransferEncoding)
	}
	if req.Header.Get("X-End-To-End") != "kept" {
		t.Errorf("upstream lost an end-to-end header: %v", req.Header)
	}

	if body != "ok" || resp.Header.Get("X-End-To-End") != "kept" {
		t.Errorf("response %q with headers %v, want ok with X-End-To-End", body, resp.Header)
	}
	for _, k := range []string{"X-Hop-Resp", "Keep-Alive", "Proxy-Authenticate", "Upgrade"} {
		if v := resp.Header.Get(k); v != "" {
			t.Errorf("client got hop-by-hop response header %s: %s", k, v)
		}
	}
	if resp.Close {
		t.Error("the replica's Connection header closed the client connection")
	}
}

func TestRoundRobinSpreadsEvenly(t *testing.T) {
	us := []*upstream{
		startUpstream(t, "a", okHandler), startUpstream(t, "b", okHandler), startUpstream(t, "c", okHandler),
	}
	_, base := startProxy(t, ServiceConfig{Policy: policy.RoundRobin}, backendsOf(us...)...)
	c := newClient(t)
	for range 30 {
		if res := do(t, c, http.MethodGet, base+"/v1/models", nil); res.status != http.StatusOK {
			t.Fatalf("status %d", res.status)
		}
	}
	var got []int64
	for _, u := range us {
		got = append(got, u.hits.Load())
	}
	if diff := cmp.Diff([]int64{10, 10, 10}, got); diff != "" {
		t.Errorf("hits per replica (-want +got):\n%s", diff)
	}
}

func TestLeastLoadPrefersIdleReplica(t *testing.T) {
	hold := newGate()
	handler := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			hold.wait(r.Context())
		}
		okHandler(w, r)
	}
	a, b := startUpstream(t, "a", handler), startUpstream(t, "b", handler)
	svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastLoad}, backendsOf(a, b)...)
	t.Cleanup(hold.open) // registered last so it runs first: a failed test must not leave a held request
	c := newClient(t)

	held := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, base+"/hold", nil)
		resp, err := c.Do(req)
		if err != nil {
			held <- result{}
			return
		}
		defer resp.Body.Close()
		held <- result{status: resp.StatusCode, header: resp.Header}
	}()
	waitFor(t, "the held request to reach a replica", func() bool { return hold.arrivals.Load() == 1 })
	busy, idle := a, b
	if b.hits.Load() == 1 {
		busy, idle = b, a
	}

	for range 10 {
		res := do(t, c, http.MethodGet, base+"/fast", nil)
		if got := res.header.Get("X-Upstream"); got != idle.name {
			t.Fatalf("request went to %s while %s held a request and %s was idle", got, busy.name, idle.name)
		}
	}
	if got := svc.InFlight(); got != 1 {
		t.Errorf("InFlight = %d with one held request, want 1", got)
	}
	hold.open()
	if res := <-held; res.status != http.StatusOK || res.header.Get("X-Upstream") != busy.name {
		t.Errorf("held request: %d from %q, want 200 from %s", res.status, res.header.Get("X-Upstream"), busy.name)
	}
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
}

func TestNoReplicasIs503(t *testing.T) {
	_, base := startProxy(t, ServiceConfig{Name: "llama-70b", MaxQueuedRequests: -1})
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader("{}"))
	if res.status != http.StatusServiceUnavailable {
		t.Fatalf("status = %d, want 503", res.status)
	}
	want := `{"error":{"message":"no ready replicas for service \"llama-70b\"","type":"service_unavailable","code":"no_ready_replicas"}}`
	if res.body != want {
		t.Errorf("body:\n got %s\nwant %s", res.body, want)
	}
	if got := res.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	if got := res.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", got)
	}
}

func TestDialErrorRetriesOnAnotherReplica(t *testing.T) {
	live := startUpstream(t, "live", okHandler)
	dead := deadAddr(t)
	// Round robin sends every other first attempt to the dead replica; each must be retried on
	// the live one, never on the dead one again.
	svc, base := startProxy(t, ServiceConfig{Policy: policy.RoundRobin, MaxAttempts: 2},
		Backend{ID: 1, Addr: dead}, Backend{ID: 2, Addr: live.addr()})
	c := newClient(t)
	for i := range 10 {
		if res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"prompt":"x"}`)); res.status != http.StatusOK {
			t.Fatalf("request %d: status %d body %s, want 200 via retry", i, res.status, res.body)
		}
	}
	if got := live.hits.Load(); got != 10 {
		t.Errorf("live replica got %d requests, want 10", got)
	}
	if got := svc.InFlight(); got != 0 {
		t.Errorf("InFlight = %d after all requests, want 0", got)
	}
	for _, r := range svc.snap.Load().replicas {
		if n := r.InFlight.Load(); n != 0 {
			t.Errorf("replica %d InFlight = %d, want 0", r.ID, n)
		}
	}
}

func TestAllReplicasUnreachableIs502(t *testing.T) {
	svc, base := startProxy(t, ServiceConfig{Name: "m"},
		Backend{ID: 1, Addr: deadAddr(t)}, Backend{ID: 2, Addr: deadAddr(t)}, Backend{ID: 3, Addr: deadAddr(t)})
	res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader("{}"),
		"Authorization", "Bearer sk-do-not-leak")
	if res.status != http.StatusBadGateway {
		t.Fatalf("status = %d, want 502", res.status)
	}
	e := decodeError(t, res.body)
	if e.Error.Code != "replica_unreachable" || e.Error.Type != "upstream_error" {
		t.Errorf("error = %+v, want replica_unreachable", e.Error)
	}
	if strings.Contains(res.body, "sk-do-not-leak") || strings.Contains(res.body, "127.0.0.1") {
		t.Errorf("error body leaks request or replica details: %s", res.body)
	}
	if res.header.Get("X-Request-Id") == "" {
		t.Error("error response has no X-Request-Id")
	}
	if got := svc.InFlight(); got != 0 {
		t.Errorf("InFlight = %d, want 0", got)
	}
}

func TestOversizeBodyIs413(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{MaxRequestBodySize: 1024}, backendsOf(u)...)

	// The requests declare an oversize body and stop there: the server must answer from the
	// declaration alone. (Sending the whole body would make the test racy: a server that closes a
	// connection with unread bytes sends a TCP reset, which can destroy the 413 at the client.)
	tests := map[string]string{
		"content length": "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n",
		"chunked":        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n",
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			resp, body := rawExchange(t, base, raw)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("status = %d, want 413", resp.StatusCode)
			}
			if e := decodeError(t, body); e.Error.Code != "request_too_large" || e.Error.Type != "invalid_request_error" {
				t.Errorf("error = %+v", e.Error)
			}
			if got := resp.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type = %q", got)
			}
		})
	}
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(strings.Repeat("x", 1024))); res.status != http.StatusOK {
		t.Errorf("body at the limit: status = %d, want 200", res.status)
	}
	if got := u.hits.Load(); got != 1 {
		t.Errorf("replica got %d requests, want only the one within the limit", got)
	}
}

// TestHandlerEnforcesBodyLimit covers Handler mounted in someone else's server.
func TestHandlerEnforcesBodyLimit(t *testing.T) {
	svc, err := NewService(ServiceConfig{Name: "m", MaxRequestBodySize: 8})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends([]Backend{{ID: 1, Addr: deadAddr(t)}})
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(http.MethodPost)
	ctx.Request.SetRequestURI("/v1/completions")
	ctx.Request.SetBodyString("0123456789")
	svc.Handler(&ctx)
	if got := ctx.Response.StatusCode(); got != http.StatusRequestEntityTooLarge {
		t.Errorf("status = %d, want 413", got)
	}
}

func TestSilentReplicaIs504(t *testing.T) {
	silent := newGate()
	u := startUpstream(t, "silent", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		silent.wait(r.Context())
	})
	svc, base := startProxy(t, ServiceConfig{IdleTimeout: 50 * time.Millisecond}, backendsOf(u)...)
	t.Cleanup(silent.open)
	res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader("{}"))
	if res.status != http.StatusGatewayTimeout {
		t.Fatalf("status = %d body %s, want 504", res.status, res.body)
	}
	if e := decodeError(t, res.body); e.Error.Code != "replica_timeout" {
		t.Errorf("error = %+v, want replica_timeout", e.Error)
	}
	// A timed-out request is not retried: the replica may be working on it.
	if got := u.hits.Load(); got != 1 {
		t.Errorf("replica got %d attempts, want 1", got)
	}
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
}

func TestHeadAndNoContent(t *testing.T) {
	u := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/empty" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Length", "11")
		okHandler(w, r)
	})
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	c := newClient(t)
	if res := do(t, c, http.MethodHead, base+"/health", nil); res.status != http.StatusOK || res.body != "" || res.header.Get("Content-Length") != "11" {
		t.Errorf("HEAD = %d %q Content-Length %q, want 200, no body, 11", res.status, res.body, res.header.Get("Content-Length"))
	}
	if res := do(t, c, http.MethodDelete, base+"/empty", nil); res.status != http.StatusNoContent {
		t.Errorf("DELETE = %d, want 204", res.status)
	}
	if got := svc.InFlight(); got != 0 {
		t.Errorf("InFlight = %d, want 0", got)
	}
}

// TestConcurrentRequests runs many requests at once through several replicas; with -race it
// checks the request path's sharing.
func TestConcurrentRequests(t *testing.T) {
	us := []*upstream{startUpstream(t, "a", okHandler), startUpstream(t, "b", okHandler)}
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(us...)...)
	c := newClient(t)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 8 {
		wg.Go(func() {
			for range 25 {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
				resp, err := c.Do(req)
				if err != nil {
					errs <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != `{"ok":true}` {
					errs <- resp.Status + " " + string(b)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if got := us[0].hits.Load() + us[1].hits.Load(); got != 200 {
		t.Errorf("replicas got %d requests, want 200", got)
	}
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
}
