package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// waitingReplica answers after hold unless its client (the proxy) closes the connection first;
// it counts how its requests ended. With stream it sends the SSE headers at once (as vLLM does
// for a request it queues) and nothing more until hold has passed.
type waitingReplica struct {
	*upstream
	started, cancelled, answered atomic.Int64
}

func startWaitingReplica(t *testing.T, name string, hold time.Duration) *waitingReplica {
	t.Helper()
	w := &waitingReplica{}
	w.upstream = startUpstream(t, name, func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.Path, "fast") {
			okHandler(rw, r)
			return
		}
		stream := strings.Contains(r.URL.Path, "stream")
		if stream {
			rw.Header().Set("Content-Type", "text/event-stream")
			rw.WriteHeader(http.StatusOK)
			rw.(http.Flusher).Flush()
		}
		w.started.Add(1)
		select {
		case <-r.Context().Done():
			w.cancelled.Add(1)
			return
		case <-time.After(hold):
		}
		w.answered.Add(1)
		if stream {
			_, _ = io.WriteString(rw, "data: [DONE]\n\n")
			return
		}
		okHandler(rw, r)
	})
	return w
}

// sendAndLeave sends a request on a raw connection, waits until the replica has it, optionally
// reads the response header, and closes the connection.
func sendAndLeave(t *testing.T, base, path string, rep *waitingReplica, readHeader bool) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	waitFor(t, "the replica to get the request", func() bool { return rep.started.Load() == 1 })
	if readHeader {
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || !strings.Contains(line, "200") {
			t.Fatalf("status line %q, %v", line, err)
		}
	}
	_ = conn.Close()
}

// TestClientLeavingClosesReplicaRequest: a client that leaves while its request waits for the
// replica's answer (non-streamed: for the whole response; streamed: for the first chunk) gets
// the replica's connection closed, so the replica stops working on it; the request is not
// retried on another replica, the in-flight counts drop, and the departure is counted.
func TestClientLeavingClosesReplicaRequest(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		readHeader bool
	}{
		{"non-streamed, waiting for the response", "/v1/chat/completions", false},
		{"streamed, waiting for the first chunk", "/v1/stream", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			busy := startWaitingReplica(t, "busy", time.Minute)
			other := startWaitingReplica(t, "other", time.Minute)
			reg := prometheus.NewRegistry()
			m, err := NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			svc, base := startProxy(t, ServiceConfig{Metrics: m}, Backend{ID: 1, Addr: busy.addr(), Version: 1})
			// A first request leaves a pooled connection, which the next one reuses: the
			// binding must follow a reused connection as well as a new one (phase two).
			if r := do(t, newClient(t), http.MethodGet, base+"/fast", nil); r.status != http.StatusOK {
				t.Fatalf("warm-up: %d", r.status)
			}
			left := time.Now()
			sendAndLeave(t, base, tc.path, busy, tc.readHeader)

			waitFor(t, "the replica to see its request closed", func() bool { return busy.cancelled.Load() == 1 })
			t.Logf("replica request closed %v after the client left", time.Since(left).Round(time.Millisecond))
			waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
			if n := svc.snap.Load().replicas[0].InFlight.Load(); n != 0 {
				t.Errorf("replica InFlight = %d, want 0", n)
			}
			if got := testutil.ToFloat64(m.clientAborts.WithLabelValues("llama")); got != 1 {
				t.Errorf("ferry_client_aborts_total = %v, want 1", got)
			}

			// Never retried: with a second replica in the set, a new request that leaves is not
			// sent on to it either.
			svc.SetBackends([]Backend{{ID: 1, Addr: busy.addr(), Version: 1}, {ID: 2, Addr: other.addr(), Version: 1}})
			busy.started.Store(0)
			other.started.Store(0)
			rep := busy
			sendAndLeaveAny(t, base, tc.path, busy, other, tc.readHeader, &rep)
			waitFor(t, "the second request closed at its replica", func() bool { return rep.cancelled.Load() >= 1 })
			waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
			time.Sleep(2 * clientWatchInterval) // a wrong retry would have reached the other replica by now
			if total := busy.started.Load() + other.started.Load(); total != 1 {
				t.Errorf("the abandoned request reached %d replicas, want 1 (no retry)", total)
			}
		})
	}
}

// sendAndLeaveAny is sendAndLeave when the request may land on either replica; *got is set to
// the one that got it.
func sendAndLeaveAny(t *testing.T, base, path string, a, b *waitingReplica, readHeader bool, got **waitingReplica) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	waitFor(t, "a replica to get the request", func() bool { return a.started.Load()+b.started.Load() == 1 })
	if b.started.Load() == 1 {
		*got = b
	}
	if readHeader {
		if _, err := bufio.NewReader(conn).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.Close()
}

// TestClientThatWaitsIsNotAbandoned: a client that keeps its connection open through several
// watch intervals gets its answer; so does the next request pipelined behind it, whose bytes the
// watcher's peek must leave in place.
func TestClientThatWaitsIsNotAbandoned(t *testing.T) {
	slow := startWaitingReplica(t, "slow", 3*clientWatchInterval)
	_, base := startProxy(t, ServiceConfig{}, Backend{ID: 1, Addr: slow.addr(), Version: 1})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	_, _ = io.WriteString(conn, req+req) // the second is pipelined: it waits in the socket
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	br := bufio.NewReader(conn)
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i+1, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"ok"`) {
			t.Fatalf("response %d: %d %q", i+1, resp.StatusCode, body)
		}
	}
	if c := slow.cancelled.Load(); c != 0 {
		t.Errorf("%d requests cancelled at the replica, want 0", c)
	}
}

// TestHeldClientLeaving: a request held while the service has no replica stops waiting (and
// counting as demand) once its client hangs up, instead of holding its place until
// MaxQueueWait; a request still waiting is served when a replica arrives.
func TestHeldClientLeaving(t *testing.T) {
	svc, base := startProxy(t, ServiceConfig{MaxQueueWait: time.Minute})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	waitFor(t, "the request to be held", func() bool { return svc.Waiting() == 1 })
	stays := doAsync(newClient(t), base+"/v1/chat/completions", "{}")
	waitFor(t, "the second request to be held", func() bool { return svc.Waiting() == 2 })
	_ = conn.Close()
	waitFor(t, "the departed request to stop waiting", func() bool { return svc.Waiting() == 1 })

	u := startUpstream(t, "late", okHandler)
	svc.SetBackends(backendsOf(u))
	if r := receive(t, stays); r.status != http.StatusOK {
		t.Errorf("the request that stayed: status %d %s", r.status, r.body)
	}
	if n := u.hits.Load(); n != 1 {
		t.Errorf("the replica got %d requests, want 1 (the departed one is not sent)", n)
	}
}

// TestStaleConnectionIsSkipped: a pooled connection that a departed client's watcher closed
// after fasthttp had pooled it (possible for a response without a body) costs the next request
// nothing: it goes out on a new connection to the same replica.
func TestStaleConnectionIsSkipped(t *testing.T) {
	u := startUpstream(t, "only", okHandler)
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	if r := do(t, newClient(t), http.MethodGet, base+"/warm", nil); r.status != http.StatusOK {
		t.Fatalf("warm-up: %d", r.status)
	}
	c := svc.snap.Load().clientFor(svc.snap.Load().replicas[0])
	c.health.mu.Lock()
	var pooled []*upstreamConn
	for hc := range c.health.conns {
		pooled = append(pooled, hc)
	}
	c.health.mu.Unlock()
	if len(pooled) != 1 {
		t.Fatalf("%d upstream connections after one request, want 1", len(pooled))
	}
	ex := &exchange{svc: svc}
	pooled[0].bind(ex)
	ex.abandon() // as the watcher does when fasthttp has pooled the connection already
	for i := range 3 {
		if r := do(t, newClient(t), http.MethodGet, base+"/after", nil); r.status != http.StatusOK {
			t.Fatalf("request %d after the stale connection: %d %s", i+1, r.status, r.body)
		}
	}
}

// TestTLSClientLeavingClosesReplicaRequest: a TLS client's Close sends close_notify before its
// FIN, so its socket has unread bytes when the watcher looks; the departure is still seen.
func TestTLSClientLeavingClosesReplicaRequest(t *testing.T) {
	busy := startWaitingReplica(t, "busy", time.Minute)
	certFile, keyFile := writeCert(t, t.TempDir(), "ferry-test")
	cfg, err := LoadTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	svc, base := startProxy(t, ServiceConfig{TLS: cfg}, Backend{ID: 1, Addr: busy.addr(), Version: 1})
	conn, err := tls.Dial("tcp", strings.TrimPrefix(base, "http://"), &tls.Config{InsecureSkipVerify: true}) // self-signed
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	waitFor(t, "the replica to get the request", func() bool { return busy.started.Load() == 1 })
	_ = conn.Close()
	waitFor(t, "the replica to see its request closed", func() bool { return busy.cancelled.Load() == 1 })
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
}

// TestHandoverClientLeavingClosesReplicaRequest: a client of a Handover (every service endpoint
// of the controller, every attached proxy) that leaves gets its replica request closed too: the
// watcher must see through the Handover's connection wrapper to the socket.
func TestHandoverClientLeavingClosesReplicaRequest(t *testing.T) {
	busy := startWaitingReplica(t, "busy", time.Minute)
	_, base := startHandover(t, newTestService(t, ServiceConfig{HealthCheck: HealthCheck{Interval: -1}, MaxInFlightPerReplica: -1}, []Backend{{ID: 1, Addr: busy.addr(), Version: 1}}))
	sendAndLeave(t, base, "/v1/chat/completions", busy, false)
	waitFor(t, "the replica to see its request closed", func() bool { return busy.cancelled.Load() == 1 })
}
