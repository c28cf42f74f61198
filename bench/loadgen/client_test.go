package loadgen

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// serve runs h on a loopback port for the test's lifetime and returns its address.
func serve(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

func sseHandler(events int, done bool) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString(": comment lines are skipped\n\n")
			for range events {
				_, _ = w.WriteString("data: {\"x\":1}\n\n")
				_ = w.Flush()
			}
			_, _ = w.WriteString("data: {\"usage\":{\"prompt_tokens\":3}}\n\n")
			if done {
				_, _ = w.WriteString("data: [DONE]\n\n")
			}
		})
	}
}

func TestClientStream(t *testing.T) {
	addr := serve(t, sseHandler(5, true))
	c, err := NewClient(addr, 4, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	for range 3 { // the connection is reused
		res, err := c.Stream("/", []byte(`{"stream":true}`), []Header{{"X-Session-Id", "abc"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Events != 7 {
			t.Errorf("events %d, want 7 (5 chunks, usage, [DONE])", res.Events)
		}
		if string(res.Last) != `{"usage":{"prompt_tokens":3}}` {
			t.Errorf("last payload %q", res.Last)
		}
		if res.TTFB <= 0 || res.Total < res.TTFB {
			t.Errorf("ttfb %v total %v", res.TTFB, res.Total)
		}
	}
}

func TestClientStreamWithoutDone(t *testing.T) {
	addr := serve(t, sseHandler(2, false))
	c, err := NewClient(addr, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stream("/", nil, nil); !errors.Is(err, ErrIncompleteStream) {
		t.Errorf("Stream() error = %v, want ErrIncompleteStream", err)
	}
}

func TestClientErrors(t *testing.T) {
	addr := serve(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/json":
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"ok":true}`)
		default:
			ctx.Error("nope", fasthttp.StatusTooManyRequests)
		}
	})
	c, err := NewClient(addr, 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Do(fasthttp.MethodPost, "/json", []byte(`{}`), nil); err != nil || n != len(`{"ok":true}`) {
		t.Errorf("Do() = %d, %v", n, err)
	}
	var se *StatusError
	if _, err := c.Do(fasthttp.MethodGet, "/other", nil, nil); !errors.As(err, &se) || se.Status != 429 || se.Body != "nope" {
		t.Errorf("Do() error = %v, want a 429 StatusError with body nope", err)
	}
	if _, err := c.Stream("/other", nil, nil); !errors.As(err, &se) || se.Status != 429 {
		t.Errorf("Stream() error = %v, want a 429 StatusError", err)
	}
	if _, err := c.Stream("/json", nil, nil); !errors.Is(err, ErrNotEventStream) {
		t.Errorf("Stream() of JSON: error = %v, want ErrNotEventStream", err)
	}
}

func TestCheckLoopback(t *testing.T) {
	tests := map[string]bool{
		"127.0.0.1:80": true, "127.1.2.3:1": true, "[::1]:8080": true,
		"10.0.0.1:80": false, "example.com:80": false, "localhost:80": false, "127.0.0.1": false,
	}
	for addr, ok := range tests {
		err := CheckLoopback(addr)
		if (err == nil) != ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
	if _, err := NewClient("192.0.2.1:80", 1, time.Second); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("NewClient to a remote address: %v, want ErrNotLoopback", err)
	}
}

func TestReadEvents(t *testing.T) {
	tests := map[string]struct {
		body       string
		wantEvents int
		wantLast   string
		wantErr    error
	}{
		"openai stream": {
			body:       "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n",
			wantEvents: 3, wantLast: `{"a":2}`,
		},
		"no space after colon, CRLF": {
			body:       "data:{\"a\":1}\r\n\r\ndata:[DONE]\r\n\r\n",
			wantEvents: 2, wantLast: `{"a":1}`,
		},
		"event names and ids skipped": {
			body:       "event: message\nid: 7\ndata: x\n\n: ping\n\ndata: [DONE]\n",
			wantEvents: 2, wantLast: "x",
		},
		"last line without newline": {
			body:       "data: x\n\ndata: [DONE]",
			wantEvents: 2, wantLast: "x",
		},
		"truncated": {
			body:       "data: x\n\n",
			wantEvents: 1, wantLast: "x", wantErr: ErrIncompleteStream,
		},
		"empty": {wantErr: ErrIncompleteStream},
		"line longer than the buffer": {
			body:       "data: " + strings.Repeat("y", 100) + "\n\ndata: [DONE]\n\n",
			wantEvents: 2, wantLast: strings.Repeat("y", 10), // cut at the 16-byte buffer
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tc.body), 16) // bufio's minimum size
			res, err := ReadEvents(br, time.Now())
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if res.Events != tc.wantEvents || string(res.Last) != tc.wantLast {
				t.Errorf("events %d last %q, want %d %q", res.Events, res.Last, tc.wantEvents, tc.wantLast)
			}
		})
	}
}
