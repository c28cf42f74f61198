package proxy

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"
)

var benchBody = []byte(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}`)

// startMemUpstream serves a fixed chat completion on an in-memory listener.
func startMemUpstream(b *testing.B) *fasthttputil.InmemoryListener {
	b.Helper()
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(benchBody)
	}}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return ln
}

func memClient(ln *fasthttputil.InmemoryListener) *fasthttp.HostClient {
	return &fasthttp.HostClient{
		Addr:     "proxy",
		Dial:     func(string) (net.Conn, error) { return ln.Dial() },
		MaxConns: 1024,
	}
}

// benchRequests drives c with chat completions from every parallel goroutine; each answer must
// be benchBody.
func benchRequests(b *testing.B, c *fasthttp.HostClient) { benchRequestsWant(b, c, len(benchBody)) }

// benchRequestsWant is benchRequests for answers of wantBytes.
func benchRequestsWant(b *testing.B, c *fasthttp.HostClient, wantBytes int) {
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		smallChat(req)
		req.Header.Set("Authorization", "Bearer sk-bench")
		for pb.Next() {
			if err := c.Do(req, resp); err != nil {
				b.Fatal(err)
			}
			if resp.StatusCode() != fasthttp.StatusOK || len(resp.Body()) != wantBytes {
				b.Fatalf("got %d with %d bytes, want 200 with %d", resp.StatusCode(), len(resp.Body()), wantBytes)
			}
		}
	})
}

// BenchmarkProxyNonStream is the whole request path, client → proxy → replica and back, over
// in-memory connections: parsing, picking, forwarding, streaming the response through the
// exchange. Allocations include the client's and the replica's; BenchmarkDirectNonStream is the
// same traffic without the proxy, so the difference is the proxy's cost.
func BenchmarkProxyNonStream(b *testing.B) {
	for _, replicas := range []int{1, 4} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			svc, err := NewService(ServiceConfig{Name: "bench", Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			upstreams := map[string]*fasthttputil.InmemoryListener{}
			backends := make([]Backend, replicas)
			for i := range backends {
				addr := net.JoinHostPort("10.0.0.1", strconv.Itoa(8000+i))
				upstreams[addr] = startMemUpstream(b)
				backends[i] = Backend{ID: i + 1, Addr: addr, Version: 1}
			}
			svc.dial = func(addr string) (net.Conn, error) { return upstreams[addr].Dial() }
			svc.SetBackends(backends)

			ln := fasthttputil.NewInmemoryListener()
			go func() { _ = svc.Serve(ln) }()
			b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })

			benchRequests(b, memClient(ln))
		})
	}
}

func BenchmarkDirectNonStream(b *testing.B) {
	benchRequests(b, memClient(startMemUpstream(b)))
}

// smallChat makes req the small chat completion the hot-path benchmarks send.
func smallChat(req *fasthttp.Request) {
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("http://proxy/v1/chat/completions")
	req.Header.SetContentType("application/json")
	req.SetBodyString(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`)
}

// passThrough is the least a fasthttp reverse proxy can do: hand the client's request to the
// replica's client as it is and its response back, no header rewrites, no routing, no metrics.
// It is the yardstick the hot-path guard (TestHotPathWithinBudget) holds Ferry's proxy to.
func passThrough(c *fasthttp.HostClient) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}
}

// startPassThrough serves passThrough in front of upstream on an in-memory listener.
func startPassThrough(b *testing.B, upstream *fasthttputil.InmemoryListener) *fasthttputil.InmemoryListener {
	b.Helper()
	ln := fasthttputil.NewInmemoryListener()
	c := &fasthttp.HostClient{Addr: "replica", Dial: func(string) (net.Conn, error) { return upstream.Dial() }, MaxConns: 1024}
	srv := &fasthttp.Server{Handler: passThrough(c)}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return ln
}

// BenchmarkPassThroughNonStream is BenchmarkProxyNonStream's traffic through passThrough.
func BenchmarkPassThroughNonStream(b *testing.B) {
	benchRequests(b, memClient(startPassThrough(b, startMemUpstream(b))))
}
