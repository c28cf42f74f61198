package rpc

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// startServer serves NewHandler(token, testRoutes()) through NewServer with maxConns per listener on a
// loopback listener, and returns its address.
func startServer(t *testing.T, token string, maxConns int) (string, *guardListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := zaptest.NewLogger(t)
	srv := NewServer(NewHandler(Tokens{Full: token}, testRoutes()), maxConns, log)
	guarded := srv.guard(ln).(*guardListener)
	done := make(chan error, 1)
	go func() { done <- srv.srv.Serve(guarded) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), guarded
}

// held is how many connections the listener holds.
func (l *guardListener) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// TestIdleUnauthenticatedConnectionsDoNotStarveAuthorised: 240 connections without the token,
// half silent and half idle after a 401, and a listener capped at 32. Each authorised call,
// on a new connection, still answers within a second, and the listener never holds more than
// its cap.
func TestIdleUnauthenticatedConnectionsDoNotStarveAuthorised(t *testing.T) {
	const token, maxConns = "t0ken-for-the-cap-test", 32
	addr, guarded := startServer(t, token, maxConns)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for i := range 240 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if i%2 == 0 {
			_ = c.SetDeadline(deadline)
			_, _ = io.WriteString(c, "GET /v1/services HTTP/1.1\r\nHost: ferry\r\n\r\n")
			_, _ = c.Read(make([]byte, 4096))
		}
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3 {
		start := time.Now()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/services", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("authorised call: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || time.Since(start) > time.Second {
			t.Fatalf("authorised call: HTTP %d after %v", resp.StatusCode, time.Since(start))
		}
	}
	if n := guarded.held(); n > maxConns {
		t.Errorf("listener holds %d connections, cap %d", n, maxConns)
	}
}

// TestRefusedConnectionIsClosed: a 401 closes its connection, so a client without the token
// cannot keep one open by waiting after its answer.
func TestRefusedConnectionIsClosed(t *testing.T) {
	addr, _ := startServer(t, "t0ken-for-the-close-test", 8)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /v1/services HTTP/1.1\r\nHost: ferry\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("HTTP %d, close %v; want 401 and the connection closed", resp.StatusCode, resp.Close)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the 401 the connection reads %v, want EOF", err)
	}
}

// TestSilentConnectionTimesOut: a connection that never sends a request is closed after
// HeaderTimeout.
func TestSilentConnectionTimesOut(t *testing.T) {
	addr, _ := startServer(t, "t0ken-for-the-timeout-test", 8)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(HeaderTimeout + 5*time.Second))
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("silent connection read %v, want EOF (closed by the server)", err)
	}
	if took := time.Since(start); took < HeaderTimeout-time.Second {
		t.Fatalf("closed after %v, before HeaderTimeout %v", took, HeaderTimeout)
	}
}

// TestAuthorisedConnectionsAreNotEvicted: with every slot held by connections that sent the
// token, a new unauthenticated connection is the one closed, and a long request on a trusted
// connection keeps running.
func TestAuthorisedConnectionsAreNotEvicted(t *testing.T) {
	const token, maxConns = "t0ken-for-the-evict-test", 4
	addr, _ := startServer(t, token, maxConns)
	var trusted []*bufio.ReadWriter
	for range maxConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		getWithToken(t, rw, token)
		trusted = append(trusted, rw)
	}
	stranger, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	_ = stranger.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := stranger.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection beyond the cap read data; want it closed")
	}
	for _, rw := range trusted {
		getWithToken(t, rw, token) // every trusted connection still answers
	}
}

func getWithToken(t *testing.T, rw *bufio.ReadWriter, token string) {
	t.Helper()
	if _, err := rw.WriteString("GET /v1/controller HTTP/1.1\r\nHost: ferry\r\nAuthorization: Bearer " + token + "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := rw.Flush(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rw.Reader, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("HTTP %d, close %v: %s", resp.StatusCode, resp.Close, strings.TrimSpace(string(body)))
	}
}

// TestSlowBodyTimesOut: a request whose body trickles in (or stops) is cut off after the body
// timeout; the handler does not wait on it for ever.
func TestSlowBodyTimesOut(t *testing.T) {
	saved := bodyTimeout
	bodyTimeout = 300 * time.Millisecond
	t.Cleanup(func() { bodyTimeout = saved }) // registered first, so it runs after the server stopped
	const token = "t0ken-for-the-body-test"
	addr, _ := startServer(t, token, 8)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	_, err = io.WriteString(c, "POST /v1/services HTTP/1.1\r\nHost: ferry\r\nAuthorization: Bearer "+token+
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\":")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || time.Since(start) > 3*time.Second {
		t.Fatalf("stalled body: HTTP %d after %v, want 400 after the body timeout", resp.StatusCode, time.Since(start))
	}
}
