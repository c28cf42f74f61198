package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
)

// attachController is the controller's API with only the attach routes, serving the service
// "llama" from a real attach.Feed; an attached proxy calls nothing else. The real controller is
// in the end-to-end test (e2e/attach_test.go).
type attachController struct {
	feed   attach.Feed
	config atomic.Pointer[attach.ProxyConfig]
	srv    *httptest.Server

	mu      sync.Mutex
	reports []attach.LoadReport
}

var _ attach.Service = (*attachController)(nil)

func (c *attachController) find(name string) (attach.Service, error) {
	if name != "llama" {
		return nil, fmt.Errorf("service %q: %w", name, api.ErrNotFound)
	}
	return c, nil
}

func (c *attachController) Poll(ctx context.Context, after uint64, wait time.Duration) attach.ReplicaSet {
	rs := c.feed.Wait(ctx, after, wait)
	rs.Config = *c.config.Load()
	return rs
}

func (c *attachController) Report(r attach.LoadReport) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reports = append(c.reports, r)
	return nil
}

// lastReport returns the latest report, if any.
func (c *attachController) lastReport() (attach.LoadReport, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reports) == 0 {
		return attach.LoadReport{}, false
	}
	return c.reports[len(c.reports)-1], true
}

// startAttachController serves a controller API for h and publishes its address there, as a
// starting controller does.
func startAttachController(t *testing.T, h home.Home, cfg attach.ProxyConfig) *attachController {
	t.Helper()
	token, err := h.Token()
	if err != nil {
		t.Fatal(err)
	}
	c := &attachController{}
	c.config.Store(&cfg)
	log := zaptest.NewLogger(t)
	c.srv = httptest.NewServer(api.NewHandler(nil, api.Tokens{Full: token}, log, attach.Routes(c.find, log)...))
	t.Cleanup(c.kill)
	if err := h.WriteInfo(home.Info{PID: 1, Addr: c.srv.Listener.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	return c
}

// kill stops the controller the way SIGKILL does: its listener and every connection go at once.
func (c *attachController) kill() {
	c.srv.Listener.Close()
	c.srv.CloseClientConnections()
	c.srv.Close()
}

// countingReplica is a simulated replica that counts the requests it served (the proxy's
// health checks, GET /health, and scrapes, GET /metrics, do not count).
type countingReplica struct {
	*httptest.Server
	hits atomic.Int64
}

func startCountingReplica(t *testing.T) *countingReplica {
	t.Helper()
	r := &countingReplica{}
	sim := replicasim.NewServer(replicasim.DefaultConfig()).Handler()
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/health" && req.URL.Path != "/metrics" {
			r.hits.Add(1)
		}
		sim.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *countingReplica) backend(id int) proxy.Backend {
	return proxy.Backend{ID: id, Addr: r.Listener.Addr().String(), Version: 1}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestAttachedProxyFollowsController runs the attached proxy in process against a controller
// API: it serves the published set, follows changes, reports its load, keeps serving while the
// controller is gone, finds the restarted one at its new address, and applies a new
// configuration (an API key now required) to new connections.
func TestAttachedProxyFollowsController(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	r1, r2 := startCountingReplica(t), startCountingReplica(t)
	ctl := startAttachController(t, h, attach.ProxyConfig{Policy: "round_robin"})
	ctl.feed.Publish([]proxy.Backend{r1.backend(1)})

	opts, err := proxyFlags{listen: "127.0.0.1:0", attach: "llama", shutdownTimeout: 10 * time.Second}.parse()
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveAttached(ctx, opts, h, ln, nil, zaptest.NewLogger(t)) }()
	defer func() {
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("attached proxy: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("attached proxy did not stop within 15s")
		}
	}()

	endpoint := "http://" + ln.Addr().String() + "/v1/completions"
	client := &http.Client{Timeout: 10 * time.Second}
	request := func(headers ...string) (int, error) {
		req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"model":"ferry-sim","prompt":"hi","max_tokens":2}`))
		if err != nil {
			return 0, err
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return resp.StatusCode, err
	}
	mustServe := func(what string, n int, headers ...string) {
		t.Helper()
		for i := range n {
			code, err := request(headers...)
			if err != nil || code != http.StatusOK {
				t.Fatalf("%s: request %d: HTTP %d, %v", what, i, code, err)
			}
		}
	}
	reportedSeq := func(c *attachController, seq uint64) func() bool {
		return func() bool {
			r, ok := c.lastReport()
			return ok && r.Seq == seq
		}
	}

	mustServe("first set", 3)
	if r1.hits.Load() != 3 {
		t.Errorf("replica 1 served %d of 3", r1.hits.Load())
	}
	waitUntil(t, "a report of the first set", reportedSeq(ctl, ctl.feed.Seq()))

	ctl.feed.Publish([]proxy.Backend{r2.backend(2)})
	waitUntil(t, "a report of the second set", reportedSeq(ctl, ctl.feed.Seq()))
	mustServe("second set", 3)
	if r2.hits.Load() != 3 {
		t.Errorf("replica 2 served %d of 3", r2.hits.Load())
	}
	r, _ := ctl.lastReport()
	if _, ok := r.InFlight[r2.Listener.Addr().String()]; !ok || r.ProxyID == "" {
		t.Errorf("report %+v lacks the replica's in-flight count or the proxy id", r)
	}
	waitUntil(t, "arrivals reported", func() bool {
		r, _ := ctl.lastReport()
		return r.Arrivals == 6
	})

	// The controller dies: the proxy keeps serving the last set.
	ctl.kill()
	mustServe("controller down", 20)

	// A new controller on another address, with another Seq and set: the proxy finds it.
	ctl2 := startAttachController(t, h, attach.ProxyConfig{Policy: "round_robin"})
	ctl2.feed.Publish([]proxy.Backend{r1.backend(1), r2.backend(2)})
	waitUntil(t, "a report of the restarted controller's set", reportedSeq(ctl2, ctl2.feed.Seq()))
	before1, before2 := r1.hits.Load(), r2.hits.Load()
	mustServe("after the restart", 4)
	if r1.hits.Load()-before1 != 2 || r2.hits.Load()-before2 != 2 {
		t.Errorf("round robin over both replicas: %d and %d of 4", r1.hits.Load()-before1, r2.hits.Load()-before2)
	}

	// The service now requires an API key: new connections are served under it.
	const key = "sk-ferry-attach-0123456789"
	ctl2.config.Store(&attach.ProxyConfig{Policy: "round_robin", AuthRequired: true, APIKeyHashes: []string{configs.HashAPIKey(key)}})
	ctl2.feed.Publish(nil)
	waitUntil(t, "a report of the new configuration's Seq", reportedSeq(ctl2, ctl2.feed.Seq()))
	client.CloseIdleConnections()
	if code, err := request(); err != nil || code != http.StatusUnauthorized {
		t.Errorf("without a key: HTTP %d, %v; want 401", code, err)
	}
	mustServe("with the key", 2, "Authorization", "Bearer "+key)
}
