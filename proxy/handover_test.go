package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/policy"
)

// startHandover serves a Handover with first on loopback and shuts it down at the end of the
// test.
func startHandover(t *testing.T, first *Service) (*Handover, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandover(ln, first, zaptest.NewLogger(t))
	served := make(chan error, 1)
	go func() { served <- h.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := h.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h, "http://" + ln.Addr().String()
}

// newTestService builds a Service on least_load unless cfg names a policy (see startProxy).
func newTestService(t *testing.T, cfg ServiceConfig, backends []Backend) *Service {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "llama"
	}
	if cfg.Policy == "" {
		cfg.Policy = policy.LeastLoad
	}
	cfg.Logger = zaptest.NewLogger(t)
	svc, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends(backends)
	return svc
}

// TestHandoverSwapDropsNoRequest swaps the Service five times under concurrent keep-alive
// traffic: every request succeeds, and Arrivals counts each once across the swaps.
func TestHandoverSwapDropsNoRequest(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	backends := backendsOf(u)
	h, base := startHandover(t, newTestService(t, ServiceConfig{}, backends))

	const workers = 8
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		c := newClient(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"w%d r%d"}]}`, w, i)
				resp, err := c.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("HTTP %d", resp.StatusCode)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	waitFor(t, "traffic to flow", func() bool { return ok.Load() >= 200 })
	policies := []string{"round_robin", "least_load", "power_of_two", "round_robin", "least_load"}
	for _, p := range policies {
		before := ok.Load()
		h.Swap(newTestService(t, ServiceConfig{Policy: p}, backends), waitTimeout)
		waitFor(t, "traffic after swap to "+p, func() bool { return ok.Load() >= before+200 })
	}
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed across swaps; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	// Retired Services finish once their clients reconnected; then every arrival is in the
	// retired count or the current Service.
	waitFor(t, "retired services to drain", func() bool { return len(h.services()) == 1 })
	if got, want := h.Arrivals(), uint64(ok.Load()); got != want {
		t.Errorf("Arrivals = %d, want %d (every request once)", got, want)
	}
	if got := h.Current().cfg.Policy; got != policies[len(policies)-1] {
		t.Errorf("current policy = %q, want %q", got, policies[len(policies)-1])
	}
}

// TestHandoverNewConfigWhileStreamDrains: after a swap to a Service that requires an API key,
// new connections need one, while a stream on the retired Service runs to its end and Busy
// counts it until then.
func TestHandoverNewConfigWhileStreamDrains(t *testing.T) {
	const key = "sk-ferry-handover-0123456789"
	g := newGate()
	u := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/stream" {
			heldStreamHandler(g)(w, r)
			return
		}
		okHandler(w, r)
	})
	t.Cleanup(g.open)
	backends := backendsOf(u)
	h, base := startHandover(t, newTestService(t, ServiceConfig{}, backends))

	streamClient := newClient(t)
	resp, r := openStream(t, streamClient, base+"/v1/stream")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: HTTP %d", resp.StatusCode)
	}
	if got := readEvent(t, r); got != "data: first" {
		t.Fatalf("first event = %q", got)
	}

	h.Swap(newTestService(t, ServiceConfig{APIKeyHashes: []string{hashKey(key)}}, backends), waitTimeout)
	c := newClient(t)
	if got := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`)); got.status != http.StatusUnauthorized {
		t.Errorf("without a key after the swap: HTTP %d, want 401", got.status)
	}
	if got := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "Authorization", "Bearer "+key); got.status != http.StatusOK {
		t.Errorf("with the key after the swap: HTTP %d, want 200", got.status)
	}
	if got := h.Busy(u.addr()); got != 1 {
		t.Errorf("Busy during the retired Service's stream = %d, want 1", got)
	}
	if got := len(h.services()); got != 2 {
		t.Errorf("%d services, want the current one and the draining one", got)
	}

	// A new replica set reaches the retired Service too.
	other := startUpstream(t, "b", okHandler)
	h.SetBackends(backendsOf(other))
	for _, s := range h.services() {
		if bs := s.Backends(); len(bs) != 1 || bs[0].Addr != other.addr() {
			t.Errorf("service %p backends %v, want only %s", s, bs, other.addr())
		}
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
	// The client is done with its connection to the retired Service (not waiting out the
	// idle grace).
	streamClient.CloseIdleConnections()
	waitFor(t, "the stream's replica to be idle", func() bool { return h.Busy(u.addr()) == 0 })
	waitFor(t, "the retired Service to finish", func() bool { return len(h.services()) == 1 })
	// The stream and the request with a key; a refused key is not demand.
	if got := h.Arrivals(); got != 2 {
		t.Errorf("Arrivals = %d, want 2", got)
	}
}

// TestHandoverSwapKeepsModels: the Service swapped in for a new configuration (as the
// controller's reconfigureProxy does, its in-process gateway routing by model) answers to the
// model ids its predecessor knew before its own replicas have answered /v1/models; here they
// never do after the first answer, so without the carry-over the gateway would 404 the model.
func TestHandoverSwapKeepsModels(t *testing.T) {
	var answered atomic.Bool
	release := make(chan struct{})
	a := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			if answered.Swap(true) {
				select { // only the first Service learns the ids
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			fmt.Fprint(w, `{"object":"list","data":[{"id":"model-a","object":"model"}]}`)
			return
		}
		fmt.Fprint(w, `{"served_by":"a"}`)
	})
	// Nop loggers: a model fetch may end, and log, after the test.
	cfg := ServiceConfig{Name: "svc", Policy: policy.LeastLoad, HealthCheck: HealthCheck{Interval: -1}, Logger: zap.NewNop()}
	first, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first.SetBackends(backendsOf(a))
	h, _ := startHandover(t, first)
	t.Cleanup(func() { close(release) }) // runs before the handover's shutdown
	g := NewGateway(GatewayConfig{Logger: zap.NewNop()})
	g.SetServices([]*Service{h.Current()})
	waitFor(t, "model-a", func() bool { return slices.Contains(first.Models(), "model-a") })

	next, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	next.SetBackends(backendsOf(a))
	h.Swap(next, time.Second)
	g.SetServices([]*Service{h.Current()})
	if got := h.Current().Models(); !slices.Contains(got, "model-a") {
		t.Errorf("models of the swapped-in Service = %v, want model-a kept from its predecessor", got)
	}
}
