package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestOversizeHeadersAre431(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	huge := strings.Repeat("x", readBufferSize+1)
	resp, body := rawExchange(t, base, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "+huge+"\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status = %d, want 431", resp.StatusCode)
	}
	if e := decodeError(t, body); e.Error.Code != "request_header_too_large" {
		t.Errorf("body = %+v", e)
	}
	if u.hits.Load() != 0 {
		t.Errorf("the request reached the replica")
	}
}

// TestSlowClientIsCut: a client that trickles its request (slow loris) is answered 408 and
// disconnected once the read timeout passes, instead of holding a connection forever.
func TestSlowClientIsCut(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{RequestReadTimeout: 200 * time.Millisecond}, backendsOf(u)...)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	got, _ := io.ReadAll(conn) // returns when the proxy closes the connection
	if !strings.HasPrefix(string(got), "HTTP/1.1 408") {
		t.Errorf("slow client got %q, want a 408 then close", got)
	}
	if elapsed := time.Since(start); elapsed > waitTimeout/2 {
		t.Errorf("connection held for %v", elapsed)
	}
	if u.hits.Load() != 0 {
		t.Errorf("a partial request reached the replica")
	}
}

// TestSlowLorisHeadersAreCut: clients that trickle their request headers a byte at a time, each
// byte well within any per-read timeout, are still cut off once the request read timeout has
// passed since their first byte, while the proxy keeps serving everyone else meanwhile.
func TestSlowLorisHeadersAreCut(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	var served atomic.Int64
	u := startUpstream(t, "a", countingPath("/v1/models", &served))
	_, base := startProxy(t, ServiceConfig{RequestReadTimeout: readTimeout}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")

	const loris = 20
	cut := make(chan time.Duration, loris)
	for range loris {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		go func() {
			start := time.Now()
			header := "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 10000)
			for i := range len(header) {
				if _, err := conn.Write([]byte{header[i]}); err != nil {
					cut <- time.Since(start) // the proxy hung up
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			cut <- -1 // sent everything without being cut: 200 s of headers
		}()
	}
	// While the slow clients hold their connections, others are served at once.
	c := newClient(t)
	for i := range 5 {
		start := time.Now()
		if res := do(t, c, http.MethodGet, base+"/v1/models", nil); res.status != 200 {
			t.Fatalf("request %d beside the slow clients: %d", i, res.status)
		}
		if d := time.Since(start); d > readTimeout {
			t.Errorf("request %d beside the slow clients took %v", i, d)
		}
		time.Sleep(30 * time.Millisecond)
	}
	for range loris {
		select {
		case d := <-cut:
			if d < 0 || d > readTimeout+2*time.Second {
				t.Errorf("slow client cut after %v, want about %v", d, readTimeout)
			}
		case <-time.After(waitTimeout):
			t.Fatal("a slow client is still connected")
		}
	}
	if served.Load() != 5 {
		t.Errorf("replica saw %d requests, want the 5 complete ones", served.Load())
	}
}

// TestGatewayLimitsHeaders: the gateway's listener has the same header limit as a service's.
func TestGatewayLimitsHeaders(t *testing.T) {
	g := NewGateway(GatewayConfig{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() { _ = g.Shutdown(context.Background()) })
	huge := strings.Repeat("x", readBufferSize+1)
	resp, body := rawExchange(t, "http://"+ln.Addr().String(), "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "+huge+"\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status = %d, want 431", resp.StatusCode)
	}
	if e := decodeError(t, body); e.Error.Code != "request_header_too_large" {
		t.Errorf("body = %+v", e)
	}
}
