package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// The contended benchmarks drive many concurrent requests through one Service over real
// loopback TCP, on both sides of the proxy, so that whatever the request path serialises on
// (per service or per replica) shows as a throughput that stops growing with -cpu. Run them
// with -cpu 1,2,4: each core gets contendedClientsPerCPU client goroutines.
const contendedClientsPerCPU = 8

// benchEvents is the SSE stream the streaming benchmark's replicas send, one chunk per event,
// as vLLM flushes one event per token.
var benchEvents = func() [][]byte {
	events := make([][]byte, 8)
	for i := range events {
		events[i] = []byte(`data: {"id":"cmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok` + strconv.Itoa(i) + `"}}]}` + "\n\n")
	}
	return append(events, []byte("data: [DONE]\n\n"))
}()

// startTCPUpstream serves handler on a loopback TCP listener and returns its address.
func startTCPUpstream(b *testing.B, handler fasthttp.RequestHandler) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: handler}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

func nonStreamHandler(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	ctx.SetBody(benchBody)
}

// streamHandler answers with benchEvents, chunked, flushing after each.
func streamHandler(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		for _, ev := range benchEvents {
			_, _ = w.Write(ev)
			if w.Flush() != nil {
				return
			}
		}
	})
}

// benchContended serves a Service over loopback with replicas real upstreams running handler
// and drives it from contendedClientsPerCPU goroutines per core; every response must be
// wantBytes long.
func benchContended(b *testing.B, replicas int, handler fasthttp.RequestHandler, wantBytes int) {
	svc, err := NewService(ServiceConfig{Name: "bench", Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	backends := make([]Backend, replicas)
	for i := range backends {
		backends[i] = Backend{ID: i + 1, Addr: startTCPUpstream(b, handler), Version: 1}
	}
	svc.SetBackends(backends)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = svc.Serve(ln) }()
	b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })

	b.SetParallelism(contendedClientsPerCPU)
	benchRequestsWant(b, &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 4096}, wantBytes)
}

// BenchmarkProxyNonStreamParallel is BenchmarkProxyNonStream under contention, over TCP: many
// requests at once on one replica (where per-replica serialisation shows) and on four.
func BenchmarkProxyNonStreamParallel(b *testing.B) {
	for _, replicas := range []int{1, 4} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			benchContended(b, replicas, nonStreamHandler, len(benchBody))
		})
	}
}

// BenchmarkProxyStreamParallel is the same with chunked SSE responses, whose end the proxy
// checks for a cut (bodyCut) and whose reads count as replica progress.
func BenchmarkProxyStreamParallel(b *testing.B) {
	n := 0
	for _, ev := range benchEvents {
		n += len(ev)
	}
	for _, replicas := range []int{1, 4} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			benchContended(b, replicas, streamHandler, n)
		})
	}
}
