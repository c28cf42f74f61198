package proxy

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"
)

// TestRateLimiterGCRA drives the token bucket on a scripted clock: a full bucket admits a burst,
// then one request per interval; a refusal says how long until the next admission; keys and
// addresses have buckets of their own.
func TestRateLimiterGCRA(t *testing.T) {
	const sec = int64(time.Second)
	l := newRateLimiter(RateLimit{RequestsPerSecond: 2, Burst: 3}, 2)
	now := int64(0)
	for i := range 3 {
		if _, _, ok := l.admitKey(0, now); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	_, wait, ok := l.admitKey(0, now)
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("4th request at once: admitted %v, wait %v; want refused, wait 500ms", ok, wait)
	}
	if _, _, ok := l.admitKey(1, now); !ok {
		t.Error("key 1 was refused because key 0 spent its bucket")
	}
	now += sec / 2
	if _, _, ok := l.admitKey(0, now); !ok {
		t.Error("refused after the wait it was told")
	}
	if _, _, ok := l.admitKey(0, now); ok {
		t.Error("admitted twice within one interval after the burst")
	}
	// Idle long enough and the whole burst is back, no more.
	now += 10 * sec
	for i := range 3 {
		if _, _, ok := l.admitKey(0, now); !ok {
			t.Fatalf("after idling, request %d of the burst refused", i+1)
		}
	}
	if _, _, ok := l.admitKey(0, now); ok {
		t.Error("idling banked more than a burst")
	}

	// Addresses: IPv4 each, IPv6 by /64.
	a := newRateLimiter(RateLimit{RequestsPerSecond: 1, Burst: 1}, 0)
	admit := func(ip string) bool {
		_, _, ok := a.admitAddr(net.ParseIP(ip), 0)
		return ok
	}
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"10.0.0.1", true}, {"10.0.0.1", false}, {"::ffff:10.0.0.1", false}, {"10.0.0.2", true},
		{"2001:db8:1:2::1", true}, {"2001:db8:1:2::ffff", false}, {"2001:db8:1:3::1", true},
	} {
		if got := admit(tc.ip); got != tc.want {
			t.Errorf("admit %s: %v, want %v", tc.ip, got, tc.want)
		}
	}
}

// TestRateLimiterMemoryIsBounded: a flood from more addresses than the tables hold keeps each
// table at its cap, and idle buckets are the first to go.
func TestRateLimiterMemoryIsBounded(t *testing.T) {
	l := newRateLimiter(RateLimit{RequestsPerSecond: 1, Burst: 1}, 0)
	ip := func(i int) net.IP { return net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)) }
	const clients = 2 * rateShards * rateShardCap
	for i := range clients {
		l.admitAddr(ip(i), 0) // all active: each bucket is empty until 1 s
	}
	for i := range l.shards {
		if n := len(l.shards[i].tats); n > rateShardCap {
			t.Fatalf("shard %d holds %d buckets, cap %d", i, n, rateShardCap)
		}
	}
	// Two seconds later every bucket is full again: a new address's arrival sweeps them all.
	for i := range rateShards * 64 {
		l.admitAddr(ip(clients+i), int64(2*time.Second))
	}
	total := 0
	for i := range l.shards {
		total += len(l.shards[i].tats)
	}
	if total > rateShards*64+rateShards*rateShardCap/2 {
		t.Errorf("%d buckets left after every old one went idle", total)
	}
}

// TestRateLimitPerKeyIs429: each API key has its own bucket; a key over its rate gets 429 with
// the seconds to wait, in OpenAI's error shape, and never reaches a replica; another key, and
// the key once refilled, are served.
func TestRateLimitPerKeyIs429(t *testing.T) {
	const keyA, keyB = "sk-ferry-key-a-0123456789", "sk-ferry-key-b-0123456789"
	var completions atomic.Int64
	u := startUpstream(t, "a", countingPath("/v1/completions", &completions))
	_, base := startProxy(t, ServiceConfig{
		APIKeyHashes: []string{hashKey(keyA), hashKey(keyB)},
		RateLimit:    RateLimit{RequestsPerSecond: 0.01, Burst: 2}, // then one per 100 s
	}, backendsOf(u)...)
	c := newClient(t)
	post := func(key string) result {
		return do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`), "Authorization", "Bearer "+key)
	}
	for i := range 2 {
		res := post(keyA)
		if res.status != 200 {
			t.Fatalf("key A request %d: %d %s", i+1, res.status, res.body)
		}
		// OpenAI's headers on the replica's answer: the bucket after this request.
		checkRateHeaders(t, res, "2", strconv.Itoa(1-i), 100*time.Second*time.Duration(i+1))
	}
	hits := completions.Load()
	res := post(keyA)
	checkRateHeaders(t, res, "2", "0", 200*time.Second)
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("key A beyond its burst: %d %s, want 429", res.status, res.body)
	}
	e := decodeError(t, res.body)
	if e.Error.Code != "rate_limit_exceeded" || e.Error.Type != "rate_limit_error" || !strings.Contains(e.Error.Message, "per API key") {
		t.Errorf("429 body = %+v", e)
	}
	if secs, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || secs < 99 || secs > 100 {
		t.Errorf("Retry-After = %q, want about 100 seconds", res.header.Get("Retry-After"))
	}
	if completions.Load() != hits {
		t.Error("a rate-limited request reached the replica")
	}
	if res := post(keyB); res.status != 200 {
		t.Errorf("key B after key A was limited: %d %s", res.status, res.body)
	}
	// A request without a valid key is refused as unauthorized, and spends nobody's bucket.
	for range 3 {
		if res := post("sk-ferry-wrong-key-0123456"); res.status != http.StatusUnauthorized {
			t.Fatalf("wrong key: %d, want 401", res.status)
		}
	}
	if res := post(keyB); res.status != 200 {
		t.Errorf("key B's second request: %d, want 200 (burst 2)", res.status)
	}
}

// TestRateLimitPerAddress: without auth the bucket is the client's address, so one client
// spending its rate leaves another served.
func TestRateLimitPerAddress(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{RateLimit: RateLimit{RequestsPerSecond: 0.01, Burst: 1}}, backendsOf(u)...)
	clientFrom := func(local string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	one, two := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	res := do(t, one, http.MethodGet, base+"/v1/models", nil)
	if res.status != 200 {
		t.Fatalf("first request: %d", res.status)
	}
	checkRateHeaders(t, res, "1", "0", 100*time.Second)
	res = do(t, one, http.MethodGet, base+"/v1/models", nil)
	if res.status != http.StatusTooManyRequests || !strings.Contains(decodeError(t, res.body).Error.Message, "per client address") {
		t.Fatalf("second request from the same address: %d %s, want 429 per client address", res.status, res.body)
	}
	checkRateHeaders(t, res, "1", "0", 100*time.Second)
	if res := do(t, two, http.MethodGet, base+"/v1/models", nil); res.status != 200 {
		t.Errorf("another address: %d %s, want 200", res.status, res.body)
	}
}

// TestMaxConcurrentStreamsIs429: beyond the cap a streaming request gets 429 however it spells
// "stream", while requests that do not stream pass; the slot comes back when the stream ends.
func TestMaxConcurrentStreamsIs429(t *testing.T) {
	g := newGate()
	u := startUpstream(t, "sse", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			heldStreamHandler(g)(w, r)
			return
		}
		okHandler(w, r)
	})
	svc, base := startProxy(t, ServiceConfig{MaxConcurrentStreams: 1}, backendsOf(u)...)
	t.Cleanup(g.open)
	c := newClient(t)

	resp, r := openStream(t, c, base+"/v1/chat/completions")
	if resp.StatusCode != 200 || readEvent(t, r) != "data: first" {
		t.Fatalf("first stream: %d", resp.StatusCode)
	}
	for _, body := range []string{
		`{"model":"m","stream":true}`,
		`{"model":"m","stream":1}`,
		`{"model":"m","stream":"True"}`,
		`{"model":"m","str\u0065am":true}`,
		`{"model":"m","stream":false,"stream":true}`,
	} {
		res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		if res.status != http.StatusTooManyRequests {
			t.Errorf("%s while a stream runs: %d %s, want 429", body, res.status, res.body)
			continue
		}
		if e := decodeError(t, res.body); e.Error.Code != "too_many_streams" || !strings.Contains(e.Error.Message, "limit of 1 concurrent streams") {
			t.Errorf("429 body = %+v", e)
		}
		if res.header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
	}
	for _, body := range []string{`{"model":"m"}`, `{"model":"m","stream":false}`, `{"stream":0}`, `{"stream":"no"}`, `not json`} {
		if res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(body)); res.status != 200 {
			t.Errorf("%s while a stream runs: %d %s, want 200", body, res.status, res.body)
		}
	}
	g.open()
	for readEvent(t, r) != "data: [DONE]" {
	}
	waitFor(t, "the stream's slot to come back", func() bool { return svc.streams.Load() == 0 && svc.InFlight() == 0 })
	if res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"stream":true}`)); res.status != 200 {
		t.Errorf("a stream after the first ended: %d %s", res.status, res.body)
	}
}

// countingPath answers like okHandler and counts the requests for path, so a test can tell
// what reached the replica apart from the proxy's own health checks.
func countingPath(path string, n *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == path {
			n.Add(1)
		}
		okHandler(w, r)
	}
}

// BenchmarkProxyNonStreamLimited is BenchmarkProxyNonStream (1 replica) with every per-request
// check of this file on: an API key, a rate limit per key that never refuses, and a cap on
// streams (which scans the body for "stream"). Compare its allocations with
// BenchmarkProxyNonStream's: the checks must add none.
func BenchmarkProxyNonStreamLimited(b *testing.B) {
	svc, err := NewService(ServiceConfig{
		Name: "bench", Logger: zap.NewNop(),
		APIKeyHashes:         []string{hashKey("sk-other-key"), hashKey("sk-bench")},
		RateLimit:            RateLimit{RequestsPerSecond: 1e9, Burst: 1e6},
		MaxConcurrentStreams: 1 << 20,
	})
	if err != nil {
		b.Fatal(err)
	}
	up := startMemUpstream(b)
	svc.dial = func(string) (net.Conn, error) { return up.Dial() }
	svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = svc.Serve(ln) }()
	b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
	benchRequests(b, memClient(ln))
}

// BenchmarkRateLimiter is the limiter alone: an API key's bucket (lock-free) and a client
// address's (sharded map).
func BenchmarkRateLimiter(b *testing.B) {
	l := newRateLimiter(RateLimit{RequestsPerSecond: 1e9, Burst: 1e6}, 1)
	ip := net.IPv4(192, 0, 2, 7)
	b.Run("key", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.admitKey(0, l.now())
		}
	})
	b.Run("address", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.admitAddr(ip, l.now())
		}
	})
}

// fewestAllocs is testing.AllocsPerRun over 100 runs of f, the fewest of five tries. The count is
// the process's: a goroutine of another part (a test's service probing its replicas, the
// runtime) that allocates meanwhile adds to it now and then, while an allocation of f's own
// shows in every try.
func fewestAllocs(f func()) float64 {
	fewest := testing.AllocsPerRun(100, f)
	for range 4 {
		fewest = min(fewest, testing.AllocsPerRun(100, f))
	}
	return fewest
}

// TestRefusalsDoNotAllocate: answering a client over its rate, a wrong key, or a stream over the
// cap costs no allocation, so a flood of refused requests cannot turn into garbage-collector
// work.
func TestRefusalsDoNotAllocate(t *testing.T) {
	svc, err := NewService(ServiceConfig{
		Name: "alloc", Logger: zap.NewNop(),
		APIKeyHashes:         []string{hashKey("sk-alloc-key-0123456789")},
		RateLimit:            RateLimit{RequestsPerSecond: 0.001, Burst: 1},
		MaxConcurrentStreams: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
	svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/completions")
	req.Header.Set("Authorization", "Bearer sk-alloc-key-0123456789")
	req.SetBodyString(`{"stream":true}`)
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1)}, nil)
	svc.limiter.admitKey(0, svc.limiter.now()) // spend the burst
	if allocs := fewestAllocs(func() { svc.Handler(&ctx) }); allocs != 0 || ctx.Response.StatusCode() != fasthttp.StatusTooManyRequests {
		t.Errorf("rate refusal: %v allocations, status %d; want 0 and 429", allocs, ctx.Response.StatusCode())
	}

	req.Header.Set("Authorization", "Bearer sk-wrong-key-0123456789")
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1)}, nil)
	if svc.Handler(&ctx); ctx.Response.StatusCode() != fasthttp.StatusUnauthorized {
		t.Errorf("wrong key: status %d, want 401", ctx.Response.StatusCode())
	}
	// Past the burst of failed keys (authFailureBurst) the address gets 429: allocation-free too.
	if allocs := fewestAllocs(func() { svc.Handler(&ctx) }); allocs != 0 || ctx.Response.StatusCode() != fasthttp.StatusTooManyRequests {
		t.Errorf("wrong key: %v allocations, status %d; want 0 and 429", allocs, ctx.Response.StatusCode())
	}

	svc2, err := NewService(ServiceConfig{Name: "alloc", Logger: zap.NewNop(), MaxConcurrentStreams: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc2.Shutdown(context.Background()) })
	svc2.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
	svc2.streams.Store(1) // the one stream allowed is running
	if allocs := fewestAllocs(func() { svc2.Handler(&ctx) }); allocs != 0 || ctx.Response.StatusCode() != fasthttp.StatusTooManyRequests {
		t.Errorf("stream refusal: %v allocations, status %d; want 0 and 429", allocs, ctx.Response.StatusCode())
	}
}

// checkRateHeaders checks an answer's x-ratelimit-*-requests headers: the limit and remaining
// exactly, the reset within a second below wantReset (time passes between the decision and
// the check).
func checkRateHeaders(t *testing.T, res result, limit, remaining string, wantReset time.Duration) {
	t.Helper()
	h := res.header
	if got := h.Get("X-Ratelimit-Limit-Requests"); got != limit {
		t.Errorf("x-ratelimit-limit-requests = %q, want %q", got, limit)
	}
	if got := h.Get("X-Ratelimit-Remaining-Requests"); got != remaining {
		t.Errorf("x-ratelimit-remaining-requests = %q, want %q", got, remaining)
	}
	reset, err := time.ParseDuration(h.Get("X-Ratelimit-Reset-Requests"))
	if err != nil || reset > wantReset || reset < wantReset-time.Second {
		t.Errorf("x-ratelimit-reset-requests = %q, want about %v", h.Get("X-Ratelimit-Reset-Requests"), wantReset)
	}
}
