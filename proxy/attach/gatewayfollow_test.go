package attach

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/internal/testhttp"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/tenants"
)

// gatewayService is one service of gatewayController: a real Feed and a configuration.
type gatewayService struct {
	feed    Feed
	config  atomic.Pointer[ProxyConfig]
	reports atomic.Int64
}

func (s *gatewayService) Poll(ctx context.Context, after uint64, wait time.Duration) ReplicaSet {
	rs := s.feed.Wait(ctx, after, wait)
	rs.Config = *s.config.Load()
	return rs
}

func (s *gatewayService) Report(LoadReport) error {
	s.reports.Add(1)
	return nil
}

// gatewayController serves the attach routes and the list route of its services, as the
// controller's API does, for the home it publishes its address in.
type gatewayController struct {
	list ServiceFeed

	mu       sync.Mutex
	services map[string]*gatewayService
}

func (c *gatewayController) ListServices(ctx context.Context, after uint64, wait time.Duration) ServiceList {
	return c.list.Wait(ctx, after, wait)
}

func (c *gatewayController) find(name string) (Service, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.services[name]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("service %q: %w", name, rpc.ErrNotFound)
}

// add makes a service of one replica, r, and lists it with the others.
func (c *gatewayController) add(name string, r *httptest.Server) *gatewayService {
	s := &gatewayService{}
	s.config.Store(&ProxyConfig{})
	s.feed.Publish([]proxy.Backend{{ID: 1, Addr: r.Listener.Addr().String(), Version: 1}})
	c.mu.Lock()
	c.services[name] = s
	c.mu.Unlock()
	c.publish()
	return s
}

func (c *gatewayController) remove(name string) {
	c.mu.Lock()
	delete(c.services, name)
	c.mu.Unlock()
	c.publish()
}

func (c *gatewayController) publish() {
	c.mu.Lock()
	var names []string
	for name := range c.services {
		names = append(names, name)
	}
	c.mu.Unlock()
	c.list.Publish(names)
}

// startGatewayController serves the routes; keys, when not nil, answers the managed keys'
// sync.
func startGatewayController(t *testing.T, h home.Home, keys Tenants) *gatewayController {
	t.Helper()
	token, err := h.ProxyToken()
	if err != nil {
		t.Fatal(err)
	}
	c := &gatewayController{services: map[string]*gatewayService{}}
	log := zaptest.NewLogger(t)
	routes := append(Routes(c.find, log), ServiceListRoutes(c, log)...)
	if keys != nil {
		routes = append(routes, TenantRoutes(keys, log)...)
	}
	srv := httptest.NewServer(rpc.NewHandler(rpc.Tokens{Full: "controller-test-token", Attach: token}, routes))
	t.Cleanup(srv.Close)
	if err := h.WriteInfo(home.Info{PID: 1, Addr: srv.Listener.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	return c
}

// simReplica is a simulated vLLM replica serving model.
func simReplica(t *testing.T, model string) *httptest.Server {
	t.Helper()
	cfg := replicasim.DefaultConfig()
	cfg.Model, cfg.TTFT, cfg.ITL = model, 5*time.Millisecond, 5*time.Millisecond
	srv := httptest.NewServer(replicasim.NewServer(cfg).Handler())
	t.Cleanup(srv.Close)
	return srv
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s; last: %s", what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// complete posts a completion for model and returns the status and the answer's model or
// error code.

// TestGatewayFollowerFrontsEveryService runs an attached gateway against a controller API with
// two services of different models: it turns ready once both are in, routes by model, lists
// both models, follows a service added later and one removed (model_not_found from then on),
// applies a new configuration without failing requests in flight, and drains when stopped.
func TestGatewayFollowerFrontsEveryService(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	ctl := startGatewayController(t, h, nil)
	a := ctl.add("svc-a", simReplica(t, "model-a"))
	ctl.add("svc-b", simReplica(t, "model-b"))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := new(proxy.Readiness)
	gf := NewGatewayFollower(GatewayFollowerConfig{Listener: ln, Home: h, DrainTimeout: 10 * time.Second, Readiness: ready,
		Base: proxy.ServiceConfig{Tenancy: proxy.NewTenancy(nil)}, Logger: zaptest.NewLogger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gf.Start(ctx) }()
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}

	// No managed keys are served by this controller: the wait for them is bounded.
	eventually(t, "ready", func() (bool, string) { return ready.IsReady(), "not ready" })
	for _, model := range []string{"model-a", "model-b"} {
		if code, got, err := testhttp.Completion(c, base, model, 2); err != nil || code != http.StatusOK || got != model {
			t.Fatalf("%s: HTTP %d %q, %v", model, code, got, err)
		}
	}
	eventually(t, "both models listed", func() (bool, string) {
		models := gatewayModels(t, c, base)
		return slices.Contains(models, "model-a") && slices.Contains(models, "model-b"), fmt.Sprint(models)
	})
	eventually(t, "load reports", func() (bool, string) { return a.reports.Load() > 0, "none" })

	ctl.add("svc-c", simReplica(t, "model-c"))
	eventually(t, "a service added later routable", func() (bool, string) {
		code, got, err := testhttp.Completion(c, base, "model-c", 2)
		return code == http.StatusOK && got == "model-c", fmt.Sprintf("HTTP %d %q %v", code, got, err)
	})

	// A new configuration of svc-a while requests are in flight there: none fails.
	var inflight sync.WaitGroup
	var failed atomic.Int64
	for range 4 {
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			if code, got, err := testhttp.Completion(c, base, "model-a", 40); err != nil || code != http.StatusOK || got != "model-a" {
				t.Errorf("in flight across the new configuration: HTTP %d %q, %v", code, got, err)
				failed.Add(1)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	a.config.Store(&ProxyConfig{Policy: "round_robin"})
	a.feed.Publish(nil)
	inflight.Wait()
	if code, got, err := testhttp.Completion(c, base, "model-a", 2); err != nil || code != http.StatusOK || got != "model-a" {
		t.Errorf("after the new configuration: HTTP %d %q, %v", code, got, err)
	}

	ctl.remove("svc-b")
	eventually(t, "a removed service's model unknown", func() (bool, string) {
		code, got, err := testhttp.Completion(c, base, "model-b", 2)
		return code == http.StatusNotFound && got == "model_not_found", fmt.Sprintf("HTTP %d %q %v", code, got, err)
	})

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the gateway did not stop within 20s")
	}
	if ready.IsReady() {
		t.Error("still ready after the drain")
	}
}

// gatewayModels is GET /v1/models's ids.
func gatewayModels(t *testing.T, c *http.Client, base string) []string {
	t.Helper()
	ids, err := testhttp.ModelIDs(c, base, "")
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestGatewayFollowerReadyWithListSetsAndKeys: an attached gateway turns ready, and serves,
// only once the controller has sent the list of services, each one's first replica set and the
// managed keys, though the keys come well after the rest: a managed key sent as soon as the
// gateway is ready is not refused.
func TestGatewayFollowerReadyWithListSetsAndKeys(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	secret := "fy-0123456789abcdefghijklmnopqrstuvwxyzABCD"
	dir := tenants.Directory{Version: 1, Keys: []tenants.Key{{ID: "key_1", Name: "one", Hash: tenants.HashSecret(secret)}}}
	ctl := startGatewayController(t, h, slowTenants{delay: 1500 * time.Millisecond, dir: dir})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := new(proxy.Readiness)
	gf := NewGatewayFollower(GatewayFollowerConfig{Listener: ln, Home: h, DrainTimeout: 5 * time.Second, Readiness: ready,
		Base: proxy.ServiceConfig{Tenancy: proxy.NewTenancy(nil)}, Logger: zaptest.NewLogger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gf.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})

	time.Sleep(300 * time.Millisecond)
	if ready.IsReady() {
		t.Fatal("ready before the controller sent a list of services")
	}
	ctl.add("svc-a", simReplica(t, "model-a"))
	start := time.Now()
	for !ready.IsReady() {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the gateway never turned ready")
		}
		time.Sleep(time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/completions", strings.NewReader(`{"model":"model-a","prompt":"hi","max_tokens":2}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a managed key's first request once ready: HTTP %d %s", resp.StatusCode, body)
	}
}

// TestGatewayFollowerDrainDelay: when Start's ctx ends (SIGTERM), the gateway turns unready at
// once but keeps serving for the drain delay, each answer closing its connection, then stops.
func TestGatewayFollowerDrainDelay(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	ctl := startGatewayController(t, h, nil)
	ctl.add("svc-a", simReplica(t, "model-a"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := new(proxy.Readiness)
	const delay = time.Second
	gf := NewGatewayFollower(GatewayFollowerConfig{Listener: ln, Home: h, DrainTimeout: 5 * time.Second, DrainDelay: delay,
		Readiness: ready, Logger: zaptest.NewLogger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gf.Start(ctx) }()
	eventually(t, "ready", func() (bool, string) { return ready.IsReady(), "not ready" })

	stopped := time.Now()
	cancel()
	eventually(t, "unready", func() (bool, string) { return !ready.IsReady(), "still ready" })
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Post("http://"+ln.Addr().String()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"model-a","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatalf("a request during the drain delay: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !resp.Close {
		t.Errorf("during the drain delay: HTTP %d, connection closed %v; want 200 and closed", resp.StatusCode, resp.Close)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
		if took := time.Since(stopped); took < delay {
			t.Errorf("stopped %v after the signal, before the drain delay of %v", took, delay)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the gateway did not stop")
	}
}
