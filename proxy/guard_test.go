package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func newTestGuard(t *testing.T, limits ClientLimits) *Guard {
	t.Helper()
	g, err := NewGuard(limits)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// dialFrom opens a connection to addr from the loopback address local ("" for any).
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exchangeOn sends one request on c and reads the answer, or the error that ended the
// connection instead.
func exchangeOn(c net.Conn, host string) (*http.Response, string, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: "+host+"\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"model\":\"a\"}"); err != nil {
		return nil, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// TestConnectionCaps: beyond MaxConnections the next connection gets an OpenAI-shaped 503 with
// Retry-After and is closed, whichever listener of the process it came to; closing a
// connection makes room again.
func TestConnectionCaps(t *testing.T) {
	u := modelServer(t, "a", "model-a")
	guard := newTestGuard(t, ClientLimits{MaxConnections: 3})
	svc, base := startProxy(t, ServiceConfig{Name: "a", Guard: guard}, backendsOf(u)...)
	gw := startGatewayWith(t, GatewayConfig{Logger: zaptest.NewLogger(t), Guard: guard}, svc)
	svcAddr, gwAddr := strings.TrimPrefix(base, "http://"), strings.TrimPrefix(gw, "http://")

	held := []net.Conn{dialFrom(t, "", svcAddr), dialFrom(t, "", svcAddr), dialFrom(t, "", gwAddr)}
	for _, c := range held {
		if resp, body, err := exchangeOn(c, "x"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("a connection within the cap: %v %v %s", resp, err, body)
		}
	}
	for _, addr := range []string{svcAddr, gwAddr} {
		resp, body, err := exchangeOn(dialFrom(t, "", addr), "x")
		if err != nil {
			t.Fatalf("connection over the cap to %s: %v, want a 503", addr, err)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !resp.Close {
			t.Errorf("over the cap: %d, Retry-After %q, close %v", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close)
		}
		if e := decodeError(t, body); e.Error.Code != "too_many_connections" {
			t.Errorf("over the cap: %+v", e)
		}
	}
	_ = held[0].Close()
	waitFor(t, "the closed connection's place", func() bool { return guard.OpenConnections() == 2 })
	again := dialFrom(t, "", gwAddr)
	if resp, body, err := exchangeOn(again, "x"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a connection after one closed: %v %v %s", resp, err, body)
	}
	for _, c := range append(held[1:], again) {
		_ = c.Close()
	}
	waitFor(t, "every connection's place back", func() bool { return guard.OpenConnections() == 0 })
}

// TestConnectionCapPerAddress: one address's connections beyond MaxConnectionsPerAddr get 429;
// another address still gets in.
func TestConnectionCapPerAddress(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	guard := newTestGuard(t, ClientLimits{MaxConnectionsPerAddr: 2})
	_, base := startProxy(t, ServiceConfig{Guard: guard}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	for range 2 {
		if resp, body, err := exchangeOn(dialFrom(t, "127.0.0.1", addr), "x"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("a connection within the cap: %v %v %s", resp, err, body)
		}
	}
	resp, body, err := exchangeOn(dialFrom(t, "127.0.0.1", addr), "x")
	if err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third connection from one address: %v %v, want 429 with Retry-After", resp, err)
	}
	if e := decodeError(t, body); e.Error.Type != "rate_limit_error" {
		t.Errorf("429 body %+v", e)
	}
	if resp, body, err := exchangeOn(dialFrom(t, "127.0.0.2", addr), "x"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("another address: %v %v %s", resp, err, body)
	}
}

// TestConnectionCapOverTLS: a refused TLS connection is closed without a word (a plain-text
// answer would be garbage to a TLS client).
func TestConnectionCapOverTLS(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	certFile, keyFile := writeCert(t, t.TempDir(), "ferry-test")
	tlsCfg, err := LoadTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	guard := newTestGuard(t, ClientLimits{MaxConnections: 1})
	_, base := startProxy(t, ServiceConfig{TLS: tlsCfg, Guard: guard}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	httpsClient := func() *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // self-signed
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 5 * time.Second}
	}
	if res := do(t, httpsClient(), http.MethodPost, "https://"+addr+"/v1/chat/completions", strings.NewReader(`{}`)); res.status != 200 {
		t.Fatalf("first connection: %d %s", res.status, res.body)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/v1/chat/completions", strings.NewReader(`{}`))
	if resp, err := httpsClient().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a second TLS connection over the cap got %d", resp.StatusCode)
	}
}

func TestClientLimitsValidate(t *testing.T) {
	_, err := NewGuard(ClientLimits{MaxConnections: -1, MaxConnectionsPerAddr: -2, MaxBufferedBodyBytes: -3})
	for _, want := range []string{"max connections: -1", "max connections per address: -2", "max buffered body bytes: -3"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NewGuard error = %v, want it to name %q", err, want)
		}
	}
	g := newTestGuard(t, ClientLimits{})
	if lim := g.Limits(); lim.MaxConnections < minDefaultMaxConnections || lim.MaxConnectionsPerAddr != lim.MaxConnections/4 || lim.MaxBufferedBodyBytes != DefaultMaxBufferedBodyBytes {
		t.Errorf("defaults %+v", lim)
	}
}

// TestDefaultConnectionCapPerAddress: the per-address cap is on unless turned off, a quarter
// of the connection cap, at least 16, and never above the connection cap itself; so one
// address never holds every slot when MaxConnections is 64 or more.
func TestDefaultConnectionCapPerAddress(t *testing.T) {
	tests := map[string]struct {
		limits      ClientLimits
		wantPerAddr int
	}{
		"a 256-descriptor limit's cap":  {ClientLimits{MaxConnections: 128}, 32},
		"a large cap":                   {ClientLimits{MaxConnections: 500_000}, 125_000},
		"the smallest default cap":      {ClientLimits{MaxConnections: minDefaultMaxConnections}, 16},
		"a cap below sixteen":           {ClientLimits{MaxConnections: 3}, 3},
		"a cap where 16 is above a 1/4": {ClientLimits{MaxConnections: 40}, 16},
		"set":                           {ClientLimits{MaxConnections: 128, MaxConnectionsPerAddr: 100}, 100},
		"off":                           {ClientLimits{MaxConnections: 128, MaxConnectionsPerAddr: NoConnectionCapPerAddr}, NoConnectionCapPerAddr},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := newTestGuard(t, tc.limits).Limits().MaxConnectionsPerAddr; got != tc.wantPerAddr {
				t.Errorf("MaxConnectionsPerAddr = %d, want %d", got, tc.wantPerAddr)
			}
		})
	}
}

// TestConnectionCapPerAddressOff: with the cap off one address may hold every slot.
func TestConnectionCapPerAddressOff(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	guard := newTestGuard(t, ClientLimits{MaxConnections: 64, MaxConnectionsPerAddr: NoConnectionCapPerAddr})
	_, base := startProxy(t, ServiceConfig{Guard: guard}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	for i := range 20 {
		if resp, body, err := exchangeOn(dialFrom(t, "127.0.0.1", addr), "x"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection %d from one address with no per-address cap: %v %v %s", i, resp, err, body)
		}
	}
}

// BenchmarkAdmitConn is the cost of admitting and closing a client connection, with and
// without the per-address count (a map under a lock), once per connection, not per request.
func BenchmarkAdmitConn(b *testing.B) {
	for name, perAddr := range map[string]int{"per-address cap on": 0, "per-address cap off": NoConnectionCapPerAddr} {
		b.Run(name, func(b *testing.B) {
			g, err := NewGuard(ClientLimits{MaxConnections: 1 << 20, MaxConnectionsPerAddr: perAddr})
			if err != nil {
				b.Fatal(err)
			}
			c := fakeTCPConn{remote: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 40000}}
			b.ReportAllocs()
			for b.Loop() {
				admitted, refusal := g.admitConn(c)
				if refusal != connAdmitted {
					b.Fatal("refused")
				}
				_ = admitted.Close()
			}
		})
	}
}

// fakeTCPConn is a connection with a remote address and nothing else, for BenchmarkAdmitConn.
type fakeTCPConn struct {
	net.Conn
	remote net.Addr
}

func (c fakeTCPConn) RemoteAddr() net.Addr { return c.remote }
func (c fakeTCPConn) Close() error         { return nil }

// TestRetryingListenerStopsOnClose: a listener closed while it waits out an accept error
// returns at once, so Shutdown is not held up by the backoff.
func TestRetryingListenerStopsOnClose(t *testing.T) {
	errs := make([]syscall.Errno, 1000)
	for i := range errs {
		errs[i] = syscall.EMFILE
	}
	inner := newFailingListener(t, errs...)
	ln := newRetryingListener(inner, zaptest.NewLogger(t))
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		done <- err
	}()
	waitFor(t, "a few retries", func() bool { return inner.calls.Load() >= 5 })
	_ = ln.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept on a closed listener returned a connection")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Accept still waiting after Close")
	}
}
