package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/policy"
)

// waitTimeout bounds every poll for observed state. Generous: it only matters when a test fails.
const waitTimeout = 10 * time.Second

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// upstream is a real HTTP server on loopback standing in for a replica. It counts requests and
// tracks its open connections, so tests can observe what the proxy did to it.
type upstream struct {
	*httptest.Server
	name  string
	hits  atomic.Int64
	conns atomic.Int64 // open connections
}

func (u *upstream) addr() string { return u.Listener.Addr().String() }

func startUpstream(t *testing.T, name string, h http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{name: name}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		w.Header().Set("X-Upstream", name)
		h(w, r)
	}))
	u.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		switch state {
		case http.StateNew:
			u.conns.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.conns.Add(-1)
		}
	}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

// okHandler answers every request with a small JSON body.
func okHandler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

// deadAddr returns a loopback address nothing listens on: connecting to it is refused at once.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	_ = ln.Close()
	// Each call gets its own loopback address: the kernel may hand the same free port to two
	// calls in a row, and two backends with one address are one backend to SetBackends.
	n := deadAddrs.Add(1)
	return net.JoinHostPort(fmt.Sprintf("127.0.%d.%d", 100+n/250, 1+n%250), port)
}

var deadAddrs atomic.Int32

// testLogger logs to t until the end of the test, then drops what comes: fasthttp's workers may
// still log a closed connection after Shutdown returned, and writing to a finished test is a
// data race (and a panic). Call it before registering the cleanups that stop the logging
// goroutines, so that it closes after them.
func testLogger(t *testing.T) *zap.Logger {
	c := &closableCore{Core: zaptest.NewLogger(t).Core(), state: &closeState{}}
	t.Cleanup(func() {
		c.state.mu.Lock()
		c.state.closed = true
		c.state.mu.Unlock()
	})
	return zap.New(c)
}

type closeState struct {
	mu     sync.RWMutex
	closed bool
}

// closableCore is a zapcore.Core that stops writing once its state is closed; the cores With
// derives share the state.
type closableCore struct {
	zapcore.Core
	state *closeState
}

func (c *closableCore) With(fields []zapcore.Field) zapcore.Core {
	return &closableCore{Core: c.Core.With(fields), state: c.state}
}

func (c *closableCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *closableCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	c.state.mu.RLock()
	defer c.state.mu.RUnlock()
	if c.state.closed {
		return nil
	}
	return c.Core.Write(e, fields)
}

// startProxy serves a new Service on loopback and shuts it down at the end of the test.
// Health checks, learned late-binding caps and the default policy's scrapes are off unless the
// test asks: their requests (GET /health, GET /metrics) would count on the test's upstreams,
// and its held handlers would look hung (healthcheck_test.go and slots_test.go test them, the
// latter through serveProxy; learn_test.go names least_ttft, the default).
func startProxy(t *testing.T, cfg ServiceConfig, backends ...Backend) (*Service, string) {
	t.Helper()
	if cfg.Policy == "" {
		cfg.Policy = policy.LeastLoad
	}
	if cfg.HealthCheck == (HealthCheck{}) {
		cfg.HealthCheck.Interval = -1
	}
	if cfg.MaxInFlightPerReplica == 0 {
		cfg.MaxInFlightPerReplica = -1
	}
	return serveProxy(t, cfg, backends...)
}

// serveProxy is startProxy with cfg's own defaults, but for the policy: least_load unless the
// test names one, since the default scrapes every replica's /metrics every 100 ms.
func serveProxy(t *testing.T, cfg ServiceConfig, backends ...Backend) (*Service, string) {
	t.Helper()
	if cfg.Policy == "" {
		cfg.Policy = policy.LeastLoad
	}
	if cfg.Name == "" {
		cfg.Name = "llama"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	svc, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends(backends)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := svc.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return svc, "http://" + ln.Addr().String()
}

func backendsOf(us ...*upstream) []Backend {
	out := make([]Backend, len(us))
	for i, u := range us {
		out[i] = Backend{ID: i + 1, Addr: u.addr(), Version: 1}
	}
	return out
}

// newClient returns an HTTP client with its own connection pool, so tests do not share
// connections and closing them is observable.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

type result struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, c *http.Client, method, url string, body io.Reader, headers ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return result{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// rawExchange sends a hand-written request over a fresh TCP connection, for headers that
// net/http's client would rewrite (Connection, TE, Upgrade...).
func rawExchange(t *testing.T, proxyURL, raw string) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(proxyURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode == http.StatusContinue { // Expect: 100-continue
		resp, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// openAIError is the shape every proxy error must have.
type openAIErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decodeError(t *testing.T, body string) openAIErrorBody {
	t.Helper()
	var e openAIErrorBody
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body %q is not OpenAI-shaped JSON: %v", body, err)
	}
	return e
}

// gate blocks handlers until released; arrivals are counted so tests can wait for them.
type gate struct {
	once     sync.Once
	release  chan struct{}
	arrivals atomic.Int64
}

func newGate() *gate { return &gate{release: make(chan struct{})} }

func (g *gate) wait(ctx context.Context) {
	g.arrivals.Add(1)
	g.block(ctx)
}

// block waits without counting an arrival, for handlers that count earlier.
func (g *gate) block(ctx context.Context) {
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// startGatedUpstream starts an upstream whose requests all wait for the gate. The gate opens at
// the end of the test at the latest; a test that ends with requests held defers g.open, so
// that they end before the proxy's shutdown waits for them.
func startGatedUpstream(t *testing.T, name string) (*upstream, *gate) {
	t.Helper()
	g := newGate()
	t.Cleanup(g.open)
	u := startUpstream(t, name, func(w http.ResponseWriter, r *http.Request) {
		g.wait(r.Context())
		okHandler(w, r)
	})
	return u, g
}

func sseEvent(w io.Writer, data string) {
	_, _ = fmt.Fprintf(w, "data: %s\n\n", data)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}
