package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// attackBodySize is what the attacks below announce: the default 32 MiB body limit.
const attackBodySize = 32 << 20

// headersOnly opens a connection to addr, sends raw (request headers, and perhaps the start of
// a body) and nothing more, and returns the connection with a reader on it.
func headersOnly(t *testing.T, addr, raw string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := conn.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// answerWithin reads one response from br within d.
func answerWithin(t *testing.T, conn net.Conn, br *bufio.Reader, d time.Duration) *http.Response {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within %v: %v", d, err)
	}
	_ = resp.Body.Close()
	return resp
}

// totalAlloc is the bytes the process has allocated since it started.
func totalAlloc() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// bodyAttacks are requests that announce a large body and send none of it: what held a proxy's
// memory in the issue. key is the Authorization value, "" for none.
func bodyAttacks(host, key string) map[string]string {
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	return map[string]string{
		"content-length": fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", host, auth, attackBodySize),
		// A chunk's size line announces the chunk, which fasthttp allocates before reading it.
		"chunked":             fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n", host, auth, attackBodySize-1<<10),
		"expect 100-continue": fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n%sExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", host, auth, attackBodySize),
	}
}

// TestUnauthenticatedBodiesAreNotRead is the memory-before-authentication attack: clients with
// a wrong or a missing key announce 32 MiB bodies and send none of it. Each must get 401 at
// once, with its connection closed, and the proxy must not have allocated what they announced
// (before, fasthttp allocated each announced body and waited up to the read timeout for it).
func TestUnauthenticatedBodiesAreNotRead(t *testing.T) {
	const good = "sk-ferry-0123456789abcdef"
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{hashKey(good)}}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	for _, key := range []string{"sk-ferry-0123456789abcdeX", ""} {
		for name, raw := range bodyAttacks(addr, key) {
			t.Run(fmt.Sprintf("%s, key %q", name, key), func(t *testing.T) {
				const clients = 3 // 18 wrong keys in all: within the burst of 401s (authFailureBurst)
				runtime.GC()
				before := totalAlloc()
				for range clients {
					conn, br := headersOnly(t, addr, raw)
					resp := answerWithin(t, conn, br, time.Second)
					if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
						t.Fatalf("got %d (close %v), want 401 and the connection closed", resp.StatusCode, resp.Close)
					}
				}
				if grew := totalAlloc() - before; grew > attackBodySize/2 {
					t.Errorf("the proxy allocated %d MiB for %d unauthenticated requests announcing %d MiB each", grew>>20, clients, attackBodySize>>20)
				}
			})
		}
	}
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "Authorization", "Bearer "+good); res.status != 200 {
		t.Errorf("a keyed request after the attack got %d %s", res.status, res.body)
	}
}

// TestGatewayUnauthenticatedBodiesAreNotRead is the same attack on a gateway whose services
// all require a key: a request with no key valid for any of them is refused at its headers.
func TestGatewayUnauthenticatedBodiesAreNotRead(t *testing.T) {
	const good = "sk-ferry-0123456789abcdef"
	u := modelServer(t, "a", "model-a")
	svc, _ := startProxy(t, ServiceConfig{Name: "a", APIKeyHashes: []string{hashKey(good)}}, backendsOf(u)...)
	base := startGateway(t, svc)
	addr := strings.TrimPrefix(base, "http://")
	for _, key := range []string{"sk-ferry-0123456789abcdeX", ""} {
		for name, raw := range bodyAttacks(addr, key) {
			t.Run(fmt.Sprintf("%s, key %q", name, key), func(t *testing.T) {
				runtime.GC()
				before := totalAlloc()
				conn, br := headersOnly(t, addr, raw)
				if resp := answerWithin(t, conn, br, time.Second); resp.StatusCode != http.StatusUnauthorized || !resp.Close {
					t.Fatalf("got %d (close %v), want 401 and the connection closed", resp.StatusCode, resp.Close)
				}
				if grew := totalAlloc() - before; grew > attackBodySize/2 {
					t.Errorf("the gateway allocated %d MiB for a request announcing %d MiB", grew>>20, attackBodySize>>20)
				}
			})
		}
	}
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"a"}`), "Authorization", "Bearer "+good)
	if res.status != 200 {
		t.Errorf("a keyed request after the attack got %d %s", res.status, res.body)
	}
}

// readingHandler reads the request's body before it answers, as a replica does.
func readingHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	okHandler(w, r)
}

// startBody sends headers announcing a body of size bytes to addr, and the first sent bytes of
// it, and returns the connection to finish or drop.
func startBody(t *testing.T, addr string, size, sent int, headers string) (net.Conn, *bufio.Reader) {
	t.Helper()
	raw := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, headers, size)
	return headersOnly(t, addr, raw+strings.Repeat(" ", sent))
}

// TestBodyBudget: bodies being read are counted at their announced length against the process's
// budget; a request that would exceed it gets an OpenAI-shaped 503 with Retry-After at its
// headers, while small bodies pass uncounted; reading a body to its end gives its share back.
func TestBodyBudget(t *testing.T) {
	u := startUpstream(t, "a", readingHandler)
	guard := newTestGuard(t, ClientLimits{MaxBufferedBodyBytes: 8 << 20})
	_, base := startProxy(t, ServiceConfig{Guard: guard}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")

	const big = 6 << 20
	slow, slowR := startBody(t, addr, big, 1<<10, "")
	waitFor(t, "the slow body counted", func() bool { return guard.BufferedBodyBytes() == big })

	conn, br := startBody(t, addr, big, 0, "")
	resp := answerWithin(t, conn, br, time.Second)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !resp.Close {
		t.Fatalf("over the budget: %d, Retry-After %q, close %v", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close)
	}
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"messages":[]}`)); res.status != 200 {
		t.Errorf("a small body while the budget is spent: %d %s", res.status, res.body)
	}

	if _, err := slow.Write([]byte(strings.Repeat(" ", big-1<<10))); err != nil {
		t.Fatal(err)
	}
	if resp := answerWithin(t, slow, slowR, 5*time.Second); resp.StatusCode != 200 {
		t.Fatalf("the slow body, once sent: %d", resp.StatusCode)
	}
	waitFor(t, "the budget back", func() bool { return guard.BufferedBodyBytes() == 0 })
	conn, br = startBody(t, addr, big, big, "")
	if resp := answerWithin(t, conn, br, 5*time.Second); resp.StatusCode != 200 {
		t.Fatalf("a large body with the budget free: %d", resp.StatusCode)
	}
	if n, pending := guard.bodies.reading(); n != 0 || pending != 0 {
		t.Errorf("after the requests: %d bytes and %d verdicts pending", n, pending)
	}
}

// TestBodyBudgetClientLeaves: a client that leaves while its body is read gives its share of
// the budget back.
func TestBodyBudgetClientLeaves(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	guard := newTestGuard(t, ClientLimits{MaxBufferedBodyBytes: 8 << 20})
	_, base := startProxy(t, ServiceConfig{Guard: guard}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	for _, chunked := range []bool{false, true} {
		var conn net.Conn
		if chunked {
			conn, _ = headersOnly(t, addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789")
		} else {
			conn, _ = startBody(t, addr, 1<<20, 100, "")
		}
		waitFor(t, "the body counted", func() bool { return guard.BufferedBodyBytes() > 0 })
		_ = conn.Close()
		waitFor(t, "the budget back", func() bool { n, pending := guard.bodies.reading(); return n == 0 && pending == 0 })
	}
}

// TestBodyBudgetExpires: a verdict whose request never reached a handler stops counting once
// its body can no longer be being read.
func TestBodyBudgetExpires(t *testing.T) {
	var b bodyBudget
	b.init(10)
	var h1, h2, h3 fasthttp.RequestHeader
	if !b.reserve(&h1, 8, 0, 100, 200) {
		t.Fatal("first body refused")
	}
	if b.reserve(&h2, 8, 0, 150, 250) {
		t.Fatal("a body over the budget admitted")
	}
	if !b.reserve(&h2, 8, 0, 201, 300) {
		t.Fatal("the first body's share was not dropped after it expired")
	}
	if !b.reserve(&h2, 9, 0, 202, 300) {
		t.Fatal("a header's new request did not replace its stale verdict")
	}
	if !b.reserve(&h3, 1, 0, 203, 300) || b.reserve(&h1, 1, 0, 204, 300) {
		t.Fatal("want the budget exactly full")
	}
	if v := b.take(&h2); v.reserved != 9 || b.take(&h2) != (verdict{}) {
		t.Fatalf("take = %+v, then a second take found a verdict", v)
	}
	if n, pending := b.reading(); n != 1 || pending != 1 {
		t.Errorf("%d bytes, %d verdicts left; want h3's 1 byte", n, pending)
	}
	var big fasthttp.RequestHeader
	b.take(&h3)
	if !b.reserve(&big, 100, 0, 205, 300) {
		t.Error("a body larger than the whole budget refused while no other is read")
	}
}

// TestLargeBodyKeyMatchedOnce: a large body's key, checked at its headers, is the key its rate
// limit counts against (the handler takes the index instead of hashing again).
func TestLargeBodyKeyMatchedOnce(t *testing.T) {
	const keyA, keyB = "sk-ferry-aaaaaaaaaaaaaaaa", "sk-ferry-bbbbbbbbbbbbbbbb"
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{hashKey(keyA), hashKey(keyB)}, RateLimit: RateLimit{RequestsPerSecond: 0.01, Burst: 1}}, backendsOf(u)...)
	c := newClient(t)
	large := `{"messages":[],"pad":"` + strings.Repeat("x", 2*smallBodySize) + `"}`
	send := func(key, body string) int {
		return do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Authorization", "Bearer "+key).status
	}
	if got := send(keyB, large); got != 200 {
		t.Fatalf("large body with key B: %d", got)
	}
	if got := send(keyA, `{}`); got != 200 {
		t.Errorf("key A after key B's large body: %d, want 200 (its own bucket)", got)
	}
	if got := send(keyB, `{}`); got != 429 {
		t.Errorf("key B again: %d, want 429 (its bucket spent by the large body)", got)
	}
}

// TestGatewayBodyBudget: the gateway counts the bodies it reads in the same budget.
func TestGatewayBodyBudget(t *testing.T) {
	u := modelServer(t, "a", "model-a")
	guard := newTestGuard(t, ClientLimits{MaxBufferedBodyBytes: 1 << 20})
	svc, _ := startProxy(t, ServiceConfig{Name: "a", Guard: guard}, backendsOf(u)...)
	base := startGatewayWith(t, GatewayConfig{Logger: zaptest.NewLogger(t), Guard: guard}, svc)
	addr := strings.TrimPrefix(base, "http://")
	_, _ = startBody(t, addr, 1<<20, 10, "")
	waitFor(t, "the slow body counted", func() bool { return guard.BufferedBodyBytes() > 0 })
	conn, br := startBody(t, addr, 1<<20, 0, "")
	if resp := answerWithin(t, conn, br, time.Second); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("over the budget: %d", resp.StatusCode)
	}
}

// TestAmbiguousFramingClosesConnection: a request with both Transfer-Encoding and Content-Length
// is read by its Transfer-Encoding and answered, and then its connection is closed (RFC 9112
// §6.1): whoever sent it may disagree with us about where it ended (request smuggling). It used
// to be kept alive.
func TestAmbiguousFramingClosesConnection(t *testing.T) {
	u := startUpstream(t, "a", readingHandler)
	_, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	tests := map[string]string{
		"chunked, then length": "Transfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"length, then chunked": "Content-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
		"identity and length":  "Transfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}",
	}
	for name, rest := range tests {
		t.Run(name, func(t *testing.T) {
			conn, br := headersOnly(t, addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+rest)
			resp := answerWithin(t, conn, br, 5*time.Second)
			if resp.StatusCode != 200 || !resp.Close {
				t.Errorf("got %d, close %v; want 200 and the connection closed", resp.StatusCode, resp.Close)
			}
		})
	}
	t.Run("plain chunked stays open", func(t *testing.T) {
		conn, br := headersOnly(t, addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
		if resp := answerWithin(t, conn, br, 5*time.Second); resp.StatusCode != 200 || resp.Close {
			t.Errorf("got %d, close %v; want 200 on a kept connection", resp.StatusCode, resp.Close)
		}
	})
}

// BenchmarkHeaderReceived is what judging a request at its headers costs one with a small body
// (BenchmarkProxyNonStream's), without and with an API key: the path every request takes.
func BenchmarkHeaderReceived(b *testing.B) {
	raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nUser-Agent: bench\r\nContent-Type: application/json\r\n" +
		"Authorization: Bearer sk-bench-0123456789abcdef\r\nContent-Length: 61\r\n\r\n"
	for name, cfg := range map[string]ServiceConfig{
		"open":  {Name: "bench", Logger: zap.NewNop()},
		"keyed": {Name: "bench", Logger: zap.NewNop(), APIKeyHashes: []string{hashKey("sk-bench-0123456789abcdef")}},
	} {
		b.Run(name, func(b *testing.B) {
			svc, err := NewService(cfg)
			if err != nil {
				b.Fatal(err)
			}
			var h fasthttp.RequestHeader
			if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				svc.headerReceived(&h)
				svc.front.guard.bodies.take(&h)
			}
		})
	}
}
