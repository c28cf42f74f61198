package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startEpoll runs the epoll pass-through in front of upstreams until the test ends; it
// returns its base URL.
func startEpoll(t *testing.T, upstreams ...string) string {
	t.Helper()
	p, err := newEpollProxy("127.0.0.1:0", upstreams)
	if err != nil {
		t.Fatal(err)
	}
	port, err := p.port()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.run() }()
	t.Cleanup(func() {
		p.stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("the loop did not stop")
		}
	})
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// echoUpstream answers POST with the body it got (Content-Length), HEAD and 204 without one,
// and /stream with chunked events, each written only once the test lets it (next).
func echoUpstream(t *testing.T, next chan struct{}, conns *atomic.Int32) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				if i > 0 {
					<-next
				}
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/head":
			// A HEAD answer names the length of a body it does not carry.
			w.Header().Set("Content-Length", "5")
		default:
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write(body)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// The epoll pass-through forwards requests and answers intact over kept-alive connections at
// both ends, streams a chunked answer as it comes, and answers what it cannot forward with
// 400 or 502 instead of hanging.
func TestEpollPassThrough(t *testing.T) {
	next := make(chan struct{})
	var upConns atomic.Int32
	base := startEpoll(t, echoUpstream(t, next, &upConns), echoUpstream(t, next, &upConns))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

	// Many requests at once, each with its own body, each answered with it.
	var wg sync.WaitGroup
	errs := make(chan error, 16*25)
	for g := range 16 {
		wg.Go(func() {
			for i := range 25 {
				want := fmt.Sprintf(`{"model":"m","n":"%d-%d-%s"}`, g, i, strings.Repeat("x", g*97))
				res, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(want))
				if err != nil {
					errs <- err
					return
				}
				got, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || res.StatusCode != 200 || string(got) != want {
					errs <- fmt.Errorf("status %d body %q (err %v), want %q", res.StatusCode, got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := upConns.Load(); n > 2*16 {
		t.Errorf("%d upstream connections for 16 clients: kept-alive connections are not reused", n)
	}

	// HEAD and 204 have no body, and a body of megabytes passes whole both ways (through
	// the 16 KiB buffers and full sockets); the client's connection serves on throughout.
	big := strings.Repeat("0123456789abcdef", 1<<19)
	var reused int
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if info.Reused {
			reused++
		}
	}}
	one := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
	for _, req := range []struct {
		method, path, body string
		status             int
	}{{"POST", "/x", "a", 200}, {"HEAD", "/head", "", 200}, {"GET", "/empty", "", 204}, {"POST", "/x", big, 200}, {"HEAD", "/head", "", 200}, {"POST", "/x", "b", 200}} {
		r, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), req.method, base+req.path, strings.NewReader(req.body))
		res, err := one.Do(r)
		if err != nil {
			t.Fatalf("%s %s: %v", req.method, req.path, err)
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != req.status || string(got) != req.body {
			t.Fatalf("%s %s: status %d, %d bytes (err %v); want %d and %d bytes", req.method, req.path, res.StatusCode, len(got), err, req.status, len(req.body))
		}
	}
	if reused != 5 {
		t.Errorf("%d of 5 requests after the first reused the client's connection", reused)
	}

	// A streamed answer arrives event by event: the upstream writes the next only after the
	// client has read the one before.
	res, err := client.Get(base + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewReader(res.Body)
	for i := range 3 {
		line, err := lines.ReadString('\n')
		if err != nil || line != fmt.Sprintf("data: %d\n", i) {
			t.Fatalf("event %d: %q, %v", i, line, err)
		}
		lines.ReadString('\n')
		if i < 2 {
			next <- struct{}{}
		}
	}
	if rest, _ := io.ReadAll(lines); len(rest) != 0 {
		t.Errorf("after the last event: %q", rest)
	}
	res.Body.Close()

	// A head it cannot read: 400 and the connection closed.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(conn, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
	if got, _ := io.ReadAll(conn); !strings.HasPrefix(string(got), "HTTP/1.1 400 ") {
		t.Errorf("malformed head: %q, want a 400", got)
	}
}

func TestEpollUpstreamDownIs502(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	base := startEpoll(t, down)
	res, err := (&http.Client{Timeout: 10 * time.Second}).Post(base+"/v1/chat/completions", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d with the upstream down, want 502", res.StatusCode)
	}
}

func TestEpollRejectsAListenOffLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", "[::1]:0", "nope"} {
		if _, err := newEpollProxy(listen, []string{"127.0.0.1:1"}); err == nil {
			t.Errorf("listen %q accepted", listen)
		}
	}
	if _, err := newEpollProxy("127.0.0.1:0", nil); err == nil {
		t.Error("no upstream accepted")
	}
}

// The chunked scanner finds the end of a chunked body however the reads split it: after the
// last chunk, its trailers and the blank line, and not before.
func TestChunkScannerAcrossReads(t *testing.T) {
	for _, body := range []string{
		"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n",
		"A\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n",
		"0\r\n\r\n",
	} {
		stream := body + "HTTP/1.1 200 OK\r\n" // the next answer's bytes must not count
		for cut := range len(stream) + 1 {
			var s chunkScanner
			end := s.scan([]byte(stream[:min(cut, len(stream))]))
			if end < 0 && cut < len(stream) {
				if e := s.scan([]byte(stream[cut:])); e >= 0 {
					end = cut + e
				}
			}
			if end != len(body) {
				t.Fatalf("%q cut at %d: end %d, want %d", body, cut, end, len(body))
			}
		}
	}
}
