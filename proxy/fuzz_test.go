package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// FuzzUsageTail feeds an event stream through the tail the proxy keeps of every response, in
// reads of any size, the way SSE arrives from a replica. Whatever precedes it, the usage of the
// final chunk (before data: [DONE]) must be what the proxy reads, and the tail must hold
// exactly the stream's last bytes. Seeds: testdata/fuzz/FuzzUsageTail.
func FuzzUsageTail(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"), uint8(7), uint32(12), uint32(34))
	f.Add([]byte(`{"usage":{"prompt_tokens":`), uint8(1), uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, prefix []byte, read uint8, prompt, completion uint32) {
		final := fmt.Appendf(nil, "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", prompt, completion)
		stream := append(bytes.Clone(prefix), final...)
		var tail usageTail
		step := int(read)%97 + 1
		for b := stream; len(b) > 0; {
			n := min(step, len(b))
			tail.write(b[:n])
			b = b[n:]
		}
		want := stream[max(0, len(stream)-usageTailSize):]
		if !bytes.Equal(tail.bytes(), want) {
			t.Fatalf("tail holds %q, want the stream's last %d bytes %q", tail.bytes(), len(want), want)
		}
		if got := parseUsage(tail.bytes()); got != (tokenUsage{prompt: int64(prompt), completion: int64(completion), cached: -1}) {
			t.Fatalf("usage = %+v, want %d/%d after %q", got, prompt, completion, prefix)
		}
	})
}

// fuzzKey is the one API key of FuzzRequest's service.
const fuzzKey = "sk-ferry-fuzz-0123456789abcdef"

// FuzzRequest sends arbitrary bytes, parsed as fasthttp's server parses a request, through the
// front of a service: API key check, rate limit, body scan, stream limit, then a replica that
// cannot be reached. Whatever the request, the proxy answers with one of its own statuses in
// OpenAI's error shape, never panics (500), never lets a request without the key past the key
// check (401, or 429 once its address has sent too many wrong keys), never echoes credentials,
// and gives back every slot it took, its share of the body budget included. The request is
// judged at its headers first, as the server does (prescreen.go). Seeds: testdata/fuzz/FuzzRequest.
func FuzzRequest(f *testing.F) {
	f.Add([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + fuzzKey + "\r\nContent-Length: 15\r\n\r\n{\"stream\":true}"))
	f.Add([]byte("GET /v1/models HTTP/1.1\r\nHost: x\r\napi-key: " + fuzzKey + "\r\n\r\n"))
	guard, err := NewGuard(ClientLimits{MaxBufferedBodyBytes: 4 << 10})
	if err != nil {
		f.Fatal(err)
	}
	svc, err := NewService(ServiceConfig{
		Name:                 "fuzz",
		Guard:                guard,
		Logger:               zap.NewNop(),
		APIKeyHashes:         []string{hashKey(fuzzKey), hashKey("sk-ferry-other-key-0123456789")},
		RateLimit:            RateLimit{RequestsPerSecond: 1e6, Burst: 1e6},
		MaxConcurrentStreams: 1,
		MaxRequestBodySize:   1 << 10,
		MaxAttempts:          1,
	})
	if err != nil {
		f.Fatal(err)
	}
	svc.dial = func(string) (net.Conn, error) { return nil, errors.New("fuzz: no replica") }
	svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req fasthttp.Request
		if err := req.ReadLimitBody(bufio.NewReader(bytes.NewReader(raw)), 1<<10); err != nil {
			return // the server answers these itself (400, 413, 431): see TestOversize*
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, remote, nil)
		svc.headerReceived(&ctx.Request.Header)
		svc.Handler(&ctx)

		status := ctx.Response.StatusCode()
		switch status {
		case fasthttp.StatusBadRequest, fasthttp.StatusUnauthorized, fasthttp.StatusRequestEntityTooLarge,
			fasthttp.StatusTooManyRequests, fasthttp.StatusBadGateway, fasthttp.StatusServiceUnavailable:
		default:
			t.Fatalf("status %d for %q", status, raw)
		}
		body := ctx.Response.Body()
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code == "" {
			t.Fatalf("status %d with a body not in OpenAI's error shape: %q", status, body)
		}
		// Past the burst of wrong keys from one address, a key check answers 429 instead of 401.
		refusedKey := status == fasthttp.StatusUnauthorized || e.Error.Code == "too_many_auth_failures"
		if !refusedKey && !bytes.Contains(raw, []byte(fuzzKey)) && !bytes.Contains(raw, []byte("sk-ferry-other-key")) {
			t.Fatalf("admitted past the key check (%d) without a key: %q", status, raw)
		}
		if auth := ctx.Request.Header.Peek("Authorization"); len(auth) > 8 && bytes.Contains(body, auth) {
			t.Fatalf("the answer echoes the Authorization header: %q", body)
		}
		if n := svc.streams.Load(); n != 0 {
			t.Fatalf("%d stream slots still taken after the request ended", n)
		}
		if n := svc.InFlight(); n != 0 {
			t.Fatalf("%d requests still in flight after the request ended", n)
		}
		if n, pending := guard.bodies.reading(); n != 0 || pending != 0 {
			t.Fatalf("%d bytes of the body budget and %d verdicts still held after the request ended", n, pending)
		}
	})
}
