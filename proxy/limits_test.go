package proxy

import (
	"io"
	"net"
	"net/http"
	"strings"
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
