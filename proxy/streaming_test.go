package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// openStream starts a streaming request and returns the response with a line reader over it.
func openStream(t *testing.T, c *http.Client, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

// readEvent reads one SSE event's data line.
func readEvent(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading event: %v", err)
	}
	if blank, err := r.ReadString('\n'); err != nil || blank != "\n" {
		t.Fatalf("event not terminated by a blank line: %q, %v", blank, err)
	}
	return strings.TrimSuffix(line, "\n")
}

// heldStreamHandler sends one event, waits at g, then sends the rest.
func heldStreamHandler(g *gate) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		g.arrivals.Add(1) // before the first event, which a test may read right away
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		sseEvent(w, "first")
		g.block(r.Context())
		sseEvent(w, "second")
		sseEvent(w, "[DONE]")
	}
}

func TestSSEIsStreamedIncrementally(t *testing.T) {
	g := newGate()
	u := startUpstream(t, "sse", heldStreamHandler(g))
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	t.Cleanup(g.open) // registered last so it runs first: a failed test must not leave a held stream

	resp, r := openStream(t, newClient(t), base+"/v1/chat/completions")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The replica is still holding the rest of its stream: this event came through on its own.
	if got := readEvent(t, r); got != "data: first" {
		t.Fatalf("first event = %q", got)
	}
	if got := g.arrivals.Load(); got != 1 {
		t.Fatalf("replica arrivals = %d, want 1", got)
	}
	if got := svc.InFlight(); got != 1 {
		t.Errorf("InFlight during the stream = %d, want 1", got)
	}
	g.open()
	for _, want := range []string{"data: second", "data: [DONE]"} {
		if got := readEvent(t, r); got != want {
			t.Errorf("event = %q, want %q", got, want)
		}
	}
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Errorf("after [DONE]: %q, %v; want a clean end of stream", rest, err)
	}
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
}

// TestClientDisconnectReleasesReplica: a client that hangs up mid-stream frees its replica slot
// and the upstream connection is closed, not returned to the pool with an unread body.
func TestClientDisconnectReleasesReplica(t *testing.T) {
	var upstreamDone atomic.Int64
	u := startUpstream(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			okHandler(w, r)
			return
		}
		defer upstreamDone.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		ticker := time.NewTicker(5 * time.Millisecond) // a replica generating tokens forever
		defer ticker.Stop()
		for {
			if _, err := io.WriteString(w, "data: token\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-ticker.C:
			}
		}
	})
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)

	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "data: token") {
			break
		}
	}
	waitFor(t, "the upstream connection to open", func() bool { return u.conns.Load() == 1 })
	if got := svc.InFlight(); got != 1 {
		t.Fatalf("InFlight during the stream = %d, want 1", got)
	}
	_ = conn.Close()

	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
	waitFor(t, "the replica's handler to see the disconnect", func() bool { return upstreamDone.Load() == 1 })
	waitFor(t, "the upstream connection to be closed", func() bool { return u.conns.Load() == 0 })
	for _, r := range svc.snap.Load().replicas {
		if n := r.InFlight.Load(); n != 0 {
			t.Errorf("replica %d InFlight = %d, want 0", r.ID, n)
		}
	}

	// The replica still serves new requests through fresh connections.
	res := do(t, newClient(t), http.MethodGet, base+"/x", nil)
	if res.status != http.StatusOK {
		t.Errorf("after the disconnect: status %d", res.status)
	}
}

// TestSetBackendsDuringTraffic swaps the replica set while a stream runs on a replica being
// removed and other requests keep arriving: nothing fails, the stream completes, and the removed
// replica's connections are closed once it has.
func TestSetBackendsDuringTraffic(t *testing.T) {
	g := newGate()
	handler := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			heldStreamHandler(g)(w, r)
			return
		}
		okHandler(w, r)
	}
	a, b := startUpstream(t, "a", handler), startUpstream(t, "b", handler)
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(a)...)
	t.Cleanup(g.open)
	c := newClient(t)

	resp, stream := openStream(t, c, base+"/stream")
	if got := readEvent(t, stream); got != "data: first" || resp.Header.Get("X-Upstream") != "a" {
		t.Fatalf("stream: %q from %q, want first from a", got, resp.Header.Get("X-Upstream"))
	}
	oldA := svc.snap.Load().replicas[0]

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
				r, err := c.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, r.Body)
				r.Body.Close()
				if r.StatusCode == http.StatusOK {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	waitFor(t, "traffic before the swap", func() bool { return ok.Load() >= 20 })
	svc.SetBackends([]Backend{{ID: 1, Addr: a.addr(), Version: 1}, {ID: 2, Addr: b.addr(), Version: 1}})
	if svc.snap.Load().replicas[0] != oldA {
		t.Error("an unchanged replica got a new Replica: its in-flight count was lost")
	}
	if got := oldA.InFlight.Load(); got < 1 {
		t.Errorf("replica a InFlight after adding b = %d, want at least the stream", got)
	}
	waitFor(t, "traffic to reach b", func() bool { return b.hits.Load() >= 20 })
	svc.SetBackends([]Backend{{ID: 2, Addr: b.addr(), Version: 1}})
	hitsA := a.hits.Load()
	before := ok.Load()
	waitFor(t, "traffic after the swap", func() bool { return ok.Load() >= before+50 })
	stop()
	wg.Wait()
	if failed.Load() != 0 {
		t.Errorf("%d requests failed during the swaps", failed.Load())
	}
	if got := a.hits.Load(); got > hitsA+4 { // at most the requests that had already picked a
		t.Errorf("removed replica a kept getting traffic: %d hits after removal", got-hitsA)
	}

	// The removed replica's stream is still alive and completes.
	if a.conns.Load() == 0 {
		t.Fatal("replica a's connections were closed while its stream was running")
	}
	g.open()
	for _, want := range []string{"data: second", "data: [DONE]"} {
		if got := readEvent(t, stream); got != want {
			t.Errorf("stream event = %q, want %q", got, want)
		}
	}
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
	waitFor(t, "removed replica a's connections to close", func() bool { return a.conns.Load() == 0 })
	if diff := len(svc.Backends()); diff != 1 || svc.Backends()[0].Addr != b.addr() {
		t.Errorf("Backends() = %v, want only b", svc.Backends())
	}
}

func TestShutdownWaitsForStream(t *testing.T) {
	g := newGate()
	u := startUpstream(t, "sse", heldStreamHandler(g))
	t.Cleanup(g.open)
	svc, err := NewService(ServiceConfig{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends(backendsOf(u))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	base := "http://" + ln.Addr().String()

	resp, stream := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, stream); got != "data: first" {
		t.Fatalf("first event = %q", got)
	}

	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		shutdown <- svc.Shutdown(ctx)
	}()
	waitFor(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if err := <-served; err != nil {
		t.Errorf("Serve returned %v, want nil after Shutdown", err)
	}
	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned %v while a stream was still running", err)
	default:
	}

	g.open()
	for _, want := range []string{"data: second", "data: [DONE]"} {
		if got := readEvent(t, stream); got != want {
			t.Errorf("event = %q, want %q", got, want)
		}
	}
	_ = resp.Body.Close()
	if err := <-shutdown; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if got := svc.InFlight(); got != 0 {
		t.Errorf("InFlight after Shutdown = %d", got)
	}
	if err := svc.Serve(ln); err != ErrClosed {
		t.Errorf("Serve after Shutdown = %v, want ErrClosed", err)
	}
}

func TestShutdownTimesOut(t *testing.T) {
	g := newGate()
	u := startUpstream(t, "sse", heldStreamHandler(g))
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	t.Cleanup(g.open) // registered last so it runs first: a failed test must not leave a held stream
	_, stream := openStream(t, newClient(t), base+"/v1/chat/completions")
	readEvent(t, stream)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := svc.Shutdown(ctx); err == nil {
		t.Error("Shutdown with an expired context and a running stream returned nil")
	}
	g.open() // let the stream finish so the cleanup's Shutdown succeeds
}

// TestStalledStreamIsCut: a replica that stops sending mid-stream is cut after the idle timeout;
// the client gets an OpenAI-shaped error event as the stream's last event (not a silent clean
// end) and the slot is released. Streams that keep sending are never cut, however long (the
// deadline is per read).
func TestStalledStreamIsCut(t *testing.T) {
	g := newGate()
	u := startUpstream(t, "stall", heldStreamHandler(g))
	svc, base := startProxy(t, ServiceConfig{IdleTimeout: 50 * time.Millisecond}, backendsOf(u)...)
	t.Cleanup(g.open)

	_, r := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, r); got != "data: first" {
		t.Fatalf("first event = %q", got)
	}
	expectStreamErrorEvent(t, r)
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
	waitFor(t, "the stalled upstream connection to close", func() bool { return u.conns.Load() == 0 })
}

// expectStreamErrorEvent reads the rest of a stream and checks it is one OpenAI-shaped error
// event, the way a stream cut by its replica must end.
func expectStreamErrorEvent(t *testing.T, r *bufio.Reader) {
	t.Helper()
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("reading the end of a cut stream: %v (after %q)", err, rest)
	}
	data, ok := strings.CutPrefix(strings.TrimSpace(string(rest)), "data: ")
	if !ok {
		t.Fatalf("cut stream ended with %q, want an error event", rest)
	}
	if e := decodeError(t, data); e.Error.Code != "stream_interrupted" || e.Error.Type != "upstream_error" {
		t.Errorf("error event = %+v", e)
	}
}
