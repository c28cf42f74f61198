package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/policy"
)

// startLoRASims serves n simulated vLLM replicas with the same adapters registered, each
// running at most maxLoRAs at once.
func startLoRASims(t *testing.T, n, adapters, maxLoRAs int) ([]*replicasim.Server, []Backend) {
	t.Helper()
	cfg := replicasim.DefaultConfig()
	cfg.TTFT, cfg.ITL, cfg.ITLPerSeq, cfg.PrefillPerToken, cfg.MaxTokens = time.Millisecond, time.Millisecond, 0, 0, 3
	cfg.MaxLoRAs, cfg.LoRALoadTime, cfg.LoRAActivateTime = maxLoRAs, 5*time.Millisecond, 0
	for i := range adapters {
		cfg.LoRAModules = append(cfg.LoRAModules, fmt.Sprintf("a%d=/adapters/a%d", i, i))
	}
	var sims []*replicasim.Server
	var backends []Backend
	for i := range n {
		sim := replicasim.NewServer(cfg)
		sims = append(sims, sim)
		backends = append(backends, Backend{ID: i + 1, Addr: startUpstream(t, "sim", sim.Handler().ServeHTTP).addr(), Version: 1})
	}
	return sims, backends
}

// adapterLoads sends rounds of one streamed request per adapter, one at a time, and returns how
// many times the replicas loaded an adapter.
func adapterLoads(t *testing.T, ignore bool) int {
	sims, backends := startLoRASims(t, 4, 8, 2)
	svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT, IgnoreAdapters: ignore}, backends...)
	waitFor(t, "the adapters from the replicas' /v1/models", func() bool { return svc.adapters.Len() == 8 })
	c := newClient(t)
	for round := range 4 {
		for a := range 8 {
			body := fmt.Sprintf(`{"model":"a%d","messages":[{"role":"user","content":"round %d"}],"max_tokens":3,"stream":true}`, a, round)
			r := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Content-Type", "application/json")
			if r.status != http.StatusOK || !strings.Contains(r.body, fmt.Sprintf(`"model":"a%d"`, a)) {
				t.Fatalf("adapter a%d: %d %s", a, r.status, r.body)
			}
		}
	}
	loads := 0
	for _, s := range sims {
		loads += s.Loads()
	}
	return loads
}

// Eight adapters fit four replicas of two slots each: routing by adapter loads each about once,
// where routing blind to them keeps swapping. "About": the router learns which adapters a
// replica holds from its metrics, scraped every 100 ms, so on a busy host
// a request may come before the scrape that shows its adapter loaded (11 of 32 in a CI run at
// full load; blind routing: 29).
func TestRoutingByAdapterAvoidsLoads(t *testing.T) {
	aware, blind := adapterLoads(t, false), adapterLoads(t, true)
	t.Logf("adapter loads over 32 requests: %d by adapter, %d blind", aware, blind)
	if aware > 12 || blind < 2*aware {
		t.Fatalf("adapter loads: %d routing by adapter (want at most 12, 1.5 times the 8 adapters), %d blind (want at least twice as many)", aware, blind)
	}
}

func TestParseLoRAInfo(t *testing.T) {
	body := []byte(`# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",model_name="m",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e+09
vllm:lora_requests_info{max_lora="4",model_name="m",running_lora_adapters="c",waiting_lora_adapters="d"} 1.700000005e+09
vllm:lora_requests_info{max_lora="4",model_name="m",running_lora_adapters="",waiting_lora_adapters=""} 1.699e+09
vllm:num_requests_running{model_name="m"} 2
`)
	got, ok := parseLoRAInfo(body)
	if !ok || got.running != "c" || got.waiting != "d" || got.maxLoRAs != 4 {
		t.Fatalf("parseLoRAInfo = %+v, %v; want the newest set (running c, waiting d, max 4)", got, ok)
	}
	if _, ok := parseLoRAInfo([]byte("vllm:num_requests_running 1\n# vllm:lora_requests_info\n")); ok {
		t.Fatal("found lora info in a body without the series")
	}
	if got := splitAdapters(" x, ,y,"); len(got) != 2 || got[0] != "x" || got[1] != "y" {
		t.Fatalf("splitAdapters = %q", got)
	}
}

// On demand, the proxy registers an adapter on a replica at its first request there, once
// however many requests wait for it, and keeps at most MaxLoadedAdapters registered per
// replica, unloading the least recently used.
func TestAdaptersLoadOnDemand(t *testing.T) {
	cfg := replicasim.DefaultConfig()
	cfg.TTFT, cfg.ITL, cfg.ITLPerSeq, cfg.PrefillPerToken, cfg.MaxTokens = time.Millisecond, time.Millisecond, 0, 0, 3
	cfg.EnableLoRA, cfg.RuntimeLoRA, cfg.MaxLoRAs, cfg.LoRALoadTime = true, true, 2, 20*time.Millisecond
	var sims []*replicasim.Server
	var backends []Backend
	for i := range 2 {
		sim := replicasim.NewServer(cfg)
		sims = append(sims, sim)
		backends = append(backends, Backend{ID: i + 1, Addr: startUpstream(t, "sim", sim.Handler().ServeHTTP).addr(), Version: 1})
	}
	modules := map[string]string{}
	var names []string
	for i := range 6 {
		name := fmt.Sprintf("a%d", i)
		modules[name], names = "/adapters/"+name, append(names, name)
	}
	m, _ := newTestMetrics(t)
	svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT, Adapters: names, MaxLoRAs: 2,
		LoadAdapters: modules, MaxLoadedAdapters: 2, Metrics: m}, backends...)
	if got := svc.Models(); !slices.Contains(got, "a5") {
		t.Fatalf("Models() = %q: a gateway would not route the declared adapters here", got)
	}
	c := newClient(t)
	send := func(model string) result {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`
		return do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Content-Type", "application/json")
	}

	// Ten requests at once for a new adapter: one load.
	done := make(chan result, 10)
	for range 10 {
		go func() { done <- send("a0") }()
	}
	for range 10 {
		if r := <-done; r.status != http.StatusOK {
			t.Fatalf("a0: %d %s", r.status, r.body)
		}
	}
	if got := sims[0].Loads() + sims[1].Loads(); got > 2 {
		t.Fatalf("%d loads for one adapter's burst, want one per replica it went to at most", got)
	}

	for round := range 3 {
		for _, name := range names {
			if r := send(name); r.status != http.StatusOK || !strings.Contains(r.body, `"model":"`+name+`"`) {
				t.Fatalf("round %d %s: %d %s", round, name, r.status, r.body)
			}
		}
	}
	a0 := testutil.ToFloat64(m.adapterRequests.WithLabelValues("llama", "a0", "true")) +
		testutil.ToFloat64(m.adapterRequests.WithLabelValues("llama", "a0", "false"))
	loads := 0.0
	for _, name := range names {
		loads += testutil.ToFloat64(m.adapterLoads.WithLabelValues("llama", name, "ok"))
	}
	if a0 != 13 || loads < 6 || testutil.CollectAndCount(m.adapterTTFT) != 6 {
		t.Errorf("adapter series: %v requests for a0 (want 13), %v loads (want at least one per adapter), %d TTFT series (want 6)",
			a0, loads, testutil.CollectAndCount(m.adapterTTFT))
	}
	for _, b := range backends {
		waitFor(t, "unloads beyond max_loaded", func() bool {
			r := do(t, c, http.MethodGet, "http://"+b.Addr+"/v1/models", nil)
			return strings.Count(r.body, `"parent"`)-strings.Count(r.body, `"parent":null`) <= 2
		})
	}
	// The service lists every declared adapter, though each replica holds two: all are served.
	r := do(t, c, http.MethodGet, base+"/v1/models", nil)
	for _, want := range []string{`"id":"a5","object":"model"`, `"root":"/adapters/a5","parent":"ferry-sim"`, `"id":"ferry-sim","object":"model"`} {
		if !strings.Contains(r.body, want) {
			t.Errorf("the service's /v1/models lacks %s: %s", want, r.body)
		}
	}
	if n := strings.Count(r.body, `"parent":"ferry-sim"`); r.status != http.StatusOK || n != 6 {
		t.Errorf("the service's /v1/models: %d, %d adapters, want all 6: %s", r.status, n, r.body)
	}
}
