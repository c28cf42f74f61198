package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// TestArrivals: requests count as arrivals once they pass the checks that no replica could
// change (API key, body size, JSON for a picker that reads it), whatever happens next.
func TestArrivals(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	tests := map[string]struct {
		cfg          ServiceConfig
		backends     []Backend
		body         string
		wantStatus   int
		wantArrivals uint64
	}{
		"served":              {backends: backendsOf(u), body: `{}`, wantStatus: http.StatusOK, wantArrivals: 1},
		"no replica":          {cfg: ServiceConfig{MaxQueuedRequests: -1}, body: `{}`, wantStatus: http.StatusServiceUnavailable, wantArrivals: 1},
		"unauthorized":        {cfg: ServiceConfig{APIKeyHashes: []string{hashKey("sk-x")}}, backends: backendsOf(u), body: `{}`, wantStatus: http.StatusUnauthorized},
		"too large":           {cfg: ServiceConfig{MaxRequestBodySize: 8}, backends: backendsOf(u), body: `{"prompt":"0123456789"}`, wantStatus: http.StatusRequestEntityTooLarge},
		"not JSON for prefix": {cfg: ServiceConfig{Policy: policy.PrefixAffinity}, body: `{"prompt":`, wantStatus: http.StatusBadRequest},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc, base := startProxy(t, tc.cfg, tc.backends...)
			res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(tc.body))
			if res.status != tc.wantStatus {
				t.Fatalf("status = %d %s, want %d", res.status, res.body, tc.wantStatus)
			}
			if got := svc.Arrivals(); got != tc.wantArrivals {
				t.Errorf("Arrivals = %d, want %d", got, tc.wantArrivals)
			}
			if got := svc.Waiting(); got != 0 {
				t.Errorf("Waiting = %d, want 0", got)
			}
		})
	}
}

const engineMetrics = `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3
vllm:num_requests_running{model_name="m"} 5
vllm:kv_cache_usage_perc{model_name="m"} 0.25
`

// TestReplicaLoad: per-replica load combines the proxy's in-flight counts with the engine
// metrics the service scrapes, which ScrapeEngineMetrics turns on for a least_load service.
func TestReplicaLoad(t *testing.T) {
	// replica answers /metrics with metrics (404 when empty) and holds completions at g.
	replica := func(name, metrics string, g *gate) *upstream {
		return startUpstream(t, name, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				if metrics == "" {
					http.NotFound(w, r)
					return
				}
				_, _ = io.WriteString(w, metrics)
				return
			}
			g.wait(r.Context())
			okHandler(w, r)
		})
	}
	tests := map[string]struct {
		scrape      bool
		wantScraped bool
	}{
		"scraping": {scrape: true, wantScraped: true},
		"off":      {scrape: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			engineGate, plainGate := newGate(), newGate()
			engine := replica("engine", engineMetrics, engineGate)
			plain := replica("plain", "", plainGate)
			svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastLoad, ScrapeEngineMetrics: tc.scrape},
				backendsOf(engine, plain)...)
			t.Cleanup(engineGate.open) // registered last so they run first
			t.Cleanup(plainGate.open)
			if (svc.scraper != nil) != tc.scrape {
				t.Fatalf("scraper running = %v, want %v", svc.scraper != nil, tc.scrape)
			}
			if tc.wantScraped {
				waitFor(t, "a scrape of the engine", func() bool { return svc.ReplicaLoad()[0].Scraped })
			}
			pending := doAsync(newClient(t), base+"/v1/completions", `{}`)
			waitFor(t, "the request to reach a replica", func() bool {
				return engineGate.arrivals.Load()+plainGate.arrivals.Load() == 1
			})

			want := []ReplicaLoad{
				{ID: 1, Addr: engine.addr(), InFlight: engineGate.arrivals.Load()},
				{ID: 2, Addr: plain.addr(), InFlight: plainGate.arrivals.Load()},
			}
			if tc.wantScraped {
				want[0].Waiting, want[0].Running, want[0].KVCacheUsage, want[0].Scraped = 3, 5, 0.25, true
			}
			if diff := cmp.Diff(want, svc.ReplicaLoad()); diff != "" {
				t.Errorf("ReplicaLoad (-want +got):\n%s", diff)
			}
			engineGate.open()
			plainGate.open()
			if res := receive(t, pending); res.status != http.StatusOK {
				t.Errorf("status = %d, want 200", res.status)
			}
		})
	}
}

// TestReplicaLoadIgnoresStaleScrapes: a scrape older than the pickers trust is not reported as
// current load.
func TestReplicaLoadIgnoresStaleScrapes(t *testing.T) {
	svc, err := NewService(ServiceConfig{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends([]Backend{{ID: 7, Addr: "127.0.0.1:9001"}})
	r := svc.snap.Load().replicas[0]
	tests := map[string]struct {
		age  time.Duration
		want ReplicaLoad
	}{
		"fresh": {age: 0, want: ReplicaLoad{ID: 7, Addr: "127.0.0.1:9001", Waiting: 2, Running: 4, KVCacheUsage: 0.5, Scraped: true}},
		"stale": {age: 2 * policy.DefaultMetricsStaleAfter, want: ReplicaLoad{ID: 7, Addr: "127.0.0.1:9001"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r.SetMetrics(policy.Metrics{Waiting: 2, Running: 4, KVCacheUsage: 0.5, UpdatedAt: time.Now().Add(-tc.age).UnixNano()})
			if diff := cmp.Diff([]ReplicaLoad{tc.want}, svc.ReplicaLoad()); diff != "" {
				t.Errorf("ReplicaLoad (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBusyCountsRetiredStreams: a replica removed by SetBackends stays busy until its last
// stream ends, also when its address is added back with a new client meanwhile.
func TestBusyCountsRetiredStreams(t *testing.T) {
	g := newGate()
	u := startUpstream(t, "sse", heldStreamHandler(g))
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(u)...)
	t.Cleanup(g.open) // registered last so it runs first: a failed test must not leave a held stream

	if got := svc.Busy(u.addr()); got != 0 {
		t.Errorf("Busy before any request = %d, want 0", got)
	}
	_, stream := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, stream); got != "data: first" {
		t.Fatalf("first event = %q", got)
	}
	steps := []struct {
		name     string
		backends []Backend
		wantBusy int64
	}{
		{name: "in the snapshot", backends: backendsOf(u), wantBusy: 1},
		{name: "removed", backends: nil, wantBusy: 1},
		{name: "added back with a new client", backends: []Backend{{ID: 2, Addr: u.addr()}}, wantBusy: 1},
	}
	for _, step := range steps {
		svc.SetBackends(step.backends)
		if got := svc.Busy(u.addr()); got != step.wantBusy {
			t.Errorf("%s: Busy = %d, want %d", step.name, got, step.wantBusy)
		}
	}
	if got := svc.Busy("127.0.0.1:1"); got != 0 {
		t.Errorf("Busy of an unknown address = %d, want 0", got)
	}

	g.open()
	for _, want := range []string{"data: second", "data: [DONE]"} {
		if got := readEvent(t, stream); got != want {
			t.Errorf("event = %q, want %q", got, want)
		}
	}
	waitFor(t, "Busy to drop to 0", func() bool { return svc.Busy(u.addr()) == 0 })
	svc.mu.Lock()
	draining := len(svc.draining)
	svc.mu.Unlock()
	if draining != 0 {
		t.Errorf("%d retired clients still tracked after their streams ended", draining)
	}
}

// BenchmarkReplicaLoad is what an autoscaler pays each second per service.
func BenchmarkReplicaLoad(b *testing.B) {
	svc, err := NewService(ServiceConfig{Name: "bench", Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	backends := make([]Backend, 8)
	for i := range backends {
		backends[i] = Backend{ID: i + 1, Addr: "10.0.0.1:" + strconv.Itoa(8000+i)}
	}
	svc.SetBackends(backends)
	b.ReportAllocs()
	for b.Loop() {
		if n := len(svc.ReplicaLoad()); n != len(backends) {
			b.Fatal(fmt.Sprint(n, " replicas"))
		}
	}
}
