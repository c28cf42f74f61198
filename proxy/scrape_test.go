package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/policy"
)

// Expositions as the engines write them (trimmed to a few neighbours of the wanted series).
const (
	scrapeVLLM = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.9
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:prefix_cache_hits_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4096.0
`
	scrapeOldVLLM = `# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="mistral"} 3.0
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="mistral"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="mistral"} 4.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="mistral"} 0.875
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="mistral"} 0.5
`
	scrapeTGI = `# TYPE tgi_request_count counter
tgi_request_count 130
# TYPE tgi_queue_size gauge
tgi_queue_size 6
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 9
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096
# TYPE tgi_request_queue_duration histogram
tgi_request_queue_duration_bucket{le="0.00015"} 10
tgi_request_queue_duration_bucket{le="+Inf"} 130
tgi_request_queue_duration_sum 1.5
tgi_request_queue_duration_count 130
`
)

func TestParseScrape(t *testing.T) {
	tests := map[string]struct {
		body      string
		want      policy.Metrics
		wantFound bool
	}{
		// Counts sum over engines; KV usage is their mean, and the new name wins over the old.
		"vLLM":     {body: scrapeVLLM, want: policy.Metrics{Waiting: 3, Running: 12, KVCacheUsage: 0.375}, wantFound: true},
		"old vLLM": {body: scrapeOldVLLM, want: policy.Metrics{Waiting: 4, Running: 3, KVCacheUsage: 0.875}, wantFound: true},
		"TGI":      {body: scrapeTGI, want: policy.Metrics{Waiting: 6, Running: 9}, wantFound: true},
		"CRLF and blanks": {
			body: "\r\n# TYPE tgi_queue_size gauge\r\ntgi_queue_size 2\r\n\r\n  tgi_batch_current_size\t3  \r\n",
			want: policy.Metrics{Waiting: 2, Running: 3}, wantFound: true,
		},
		"no trailing newline": {body: "vllm:num_requests_waiting 5", want: policy.Metrics{Waiting: 5}, wantFound: true},
		"timestamps ignored": {
			body: "vllm:num_requests_waiting{model_name=\"m\"} 2 1700000000000\nvllm:num_requests_running 1 1700000000000\n",
			want: policy.Metrics{Waiting: 2, Running: 1}, wantFound: true,
		},
		"braces and quotes inside labels": {
			body: `vllm:num_requests_waiting{model_name="a}b",note="say \"}\" 9"} 4` + "\n" +
				`vllm:num_requests_waiting{model_name="x\\"} 1` + "\n",
			want: policy.Metrics{Waiting: 5}, wantFound: true,
		},
		"names are matched whole": {
			body: "vllm:num_requests_waiting_total 9\ntgi_queue_size_bucket{le=\"1\"} 9\nxvllm:num_requests_running 9\n# vllm:num_requests_running 9\n",
		},
		"bad samples are skipped": {
			body: "vllm:num_requests_waiting NaN\nvllm:num_requests_waiting -1\nvllm:num_requests_waiting +Inf\n" +
				"vllm:num_requests_waiting two\nvllm:num_requests_waiting\nvllm:num_requests_waiting{model_name=\"m\" 3\n" +
				"vllm:num_requests_running 1.6\nvllm:kv_cache_usage_perc 1.5\n",
			want: policy.Metrics{Running: 2, KVCacheUsage: 1}, wantFound: true,
		},
		"only the old KV name": {body: "vllm:gpu_cache_usage_perc 0.25\n", want: policy.Metrics{KVCacheUsage: 0.25}, wantFound: true},
		// The prefix cache's size and counters sum over engines; the new counter names win.
		"prefix cache": {
			body: `vllm:num_requests_running{engine="0"} 1` + "\n" +
				`vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="1000",note="num_gpu_blocks=\"9\""} 1.0` + "\n" +
				`vllm:cache_config_info{engine="1", num_gpu_blocks="500",block_size="32"} 1.0` + "\n" +
				`vllm:prefix_cache_queries_total{engine="0",model_name="m"} 800.0` + "\n" +
				`vllm:prefix_cache_queries_total{engine="1",model_name="m"} 200.0` + "\n" +
				`vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9` + "\n" +
				`vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0` + "\n" +
				`vllm:gpu_prefix_cache_queries_total{model_name="m"} 7` + "\n",
			want: policy.Metrics{Running: 1, CacheTokens: 1000*16 + 500*32, PrefixQueries: 1000, PrefixHits: 300}, wantFound: true,
		},
		"old prefix counters": {
			body: "vllm:num_requests_running 2\nvllm:gpu_prefix_cache_queries_total 70\nvllm:gpu_prefix_cache_hits_total 7\n",
			want: policy.Metrics{Running: 2, PrefixQueries: 70, PrefixHits: 7}, wantFound: true,
		},
		"cache size not known yet": {
			body: "vllm:num_requests_running 2\n" + `vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1` + "\n" +
				`vllm:cache_config_info{block_size="16"} 1` + "\n" + `vllm:cache_config_info{num_gpu_blocks="-4",block_size="16"} 1` + "\n",
			want: policy.Metrics{Running: 2}, wantFound: true,
		},
		"cache info alone is not load": {body: `vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1` + "\n"},
		"not an engine":                {body: "# HELP go_goroutines x\ngo_goroutines 12\nprocess_open_fds 9\n"},
		"empty":                        {body: ""},
		"HTML":                         {body: "<html><body>Not Found</body></html>"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, found := parseScrape([]byte(tc.body))
			if found != tc.wantFound {
				t.Fatalf("found = %v, want %v", found, tc.wantFound)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("metrics (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, seed := range []string{
		scrapeVLLM, scrapeOldVLLM, scrapeTGI, "", "#", "{", "vllm:num_requests_waiting{",
		`vllm:num_requests_waiting{a="\` + "\n1",
		"vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n",
		"vllm:kv_cache_usage_perc 0x1p-2\n", "tgi_queue_size 3 \t 17\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, found := parseScrape(body)
		if !found {
			if m != (policy.Metrics{}) {
				t.Fatalf("nothing found but %+v", m)
			}
			return
		}
		if m.Waiting < 0 || m.Running < 0 || !(m.KVCacheUsage >= 0 && m.KVCacheUsage <= 1) || m.UpdatedAt != 0 {
			t.Fatalf("out of range: %+v", m)
		}
		// Line endings and comments do not change what is read.
		crlf := strings.ReplaceAll(string(body), "\n", "\r\n")
		if again, _ := parseScrape([]byte("# a comment\n" + crlf)); again != m && !strings.Contains(string(body), "\r") {
			t.Fatalf("CRLF or a comment changed %+v into %+v", m, again)
		}
	})
}

// metricsEndpoint serves a /metrics body that a test can change, and counts scrapes.
type metricsEndpoint struct {
	*upstream
	body   atomic.Value // string
	status atomic.Int64
}

func startMetricsEndpoint(t *testing.T, body string) *metricsEndpoint {
	t.Helper()
	e := &metricsEndpoint{}
	e.body.Store(body)
	e.status.Store(http.StatusOK)
	e.upstream = startUpstream(t, "metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.WriteHeader(int(e.status.Load()))
		_, _ = io.WriteString(w, e.body.Load().(string))
	})
	return e
}

func newTestScraper(t *testing.T) *scraper {
	t.Helper()
	s := newScraper(5*time.Millisecond, zaptest.NewLogger(t), defaultDial)
	t.Cleanup(s.close)
	return s
}

func replicaAt(id int, addr string) *policy.Replica { return &policy.Replica{ID: id, Addr: addr} }

// updateFresh is scraper.update for replicas that have learned no cap yet.
func updateFresh(s *scraper, rs ...*policy.Replica) {
	caps := make([]*learnedCap, len(rs))
	for i := range caps {
		caps[i] = &learnedCap{}
	}
	s.update(rs, caps)
}

// withoutTime drops the timestamp, which tests check separately.
func withoutTime(m policy.Metrics) policy.Metrics {
	m.UpdatedAt = 0
	return m
}

func TestScrapeStoresEachEngineFormat(t *testing.T) {
	vllm, old, tgi := startMetricsEndpoint(t, scrapeVLLM), startMetricsEndpoint(t, scrapeOldVLLM), startMetricsEndpoint(t, scrapeTGI)
	rs := []*policy.Replica{replicaAt(1, vllm.addr()), replicaAt(2, old.addr()), replicaAt(3, tgi.addr())}
	before := time.Now().UnixNano()
	s := newTestScraper(t)
	updateFresh(s, rs...)
	want := []policy.Metrics{
		{Waiting: 3, Running: 12, KVCacheUsage: 0.375},
		{Waiting: 4, Running: 3, KVCacheUsage: 0.875},
		{Waiting: 6, Running: 9},
	}
	for i, r := range rs {
		waitFor(t, "replica scraped", func() bool { return r.LoadMetrics().UpdatedAt != 0 })
		got := r.LoadMetrics()
		if got.UpdatedAt < before {
			t.Errorf("replica %d: updated at %d, before the scraper started (%d)", r.ID, got.UpdatedAt, before)
		}
		if diff := cmp.Diff(want[i], withoutTime(got)); diff != "" {
			t.Errorf("replica %d metrics (-want +got):\n%s", r.ID, diff)
		}
	}

	// New values show up on the next scrapes.
	tgi.body.Store("tgi_queue_size 0\ntgi_batch_current_size 1\n")
	waitFor(t, "new TGI values", func() bool { return withoutTime(rs[2].LoadMetrics()) == policy.Metrics{Running: 1} })
}

// TestScrapeFailureLeavesValuesToGoStale: a scrape that fails, for any reason, leaves the
// values and their timestamp as they were.
func TestScrapeFailureLeavesValuesToGoStale(t *testing.T) {
	tests := map[string]func(e *metricsEndpoint){
		"server error":  func(e *metricsEndpoint) { e.status.Store(http.StatusInternalServerError) },
		"not an engine": func(e *metricsEndpoint) { e.body.Store("go_goroutines 10\n") },
		"too large":     func(e *metricsEndpoint) { e.body.Store(strings.Repeat("#\n", maxScrapeBody/2+1)) },
	}
	for name, fail := range tests {
		t.Run(name, func(t *testing.T) {
			e := startMetricsEndpoint(t, scrapeTGI)
			r := replicaAt(1, e.addr())
			s := newTestScraper(t)
			updateFresh(s, r)
			waitFor(t, "first scrape", func() bool { return r.LoadMetrics().UpdatedAt != 0 })
			fail(e)
			// Once a scrape has begun after the change, the next completed one failed.
			hits := e.hits.Load()
			waitFor(t, "two failed scrapes", func() bool { return e.hits.Load() >= hits+2 })
			last := r.LoadMetrics()
			waitFor(t, "two more failed scrapes", func() bool { return e.hits.Load() >= hits+4 })
			if got := r.LoadMetrics(); got != last {
				t.Errorf("metrics changed from %+v to %+v while scrapes failed", last, got)
			}
		})
	}
}

func TestScrapeUnreachableReplica(t *testing.T) {
	r := replicaAt(1, deadAddr(t))
	s := newTestScraper(t)
	updateFresh(s, r)
	e := startMetricsEndpoint(t, scrapeTGI)
	live := replicaAt(2, e.addr())
	updateFresh(s, r, live)
	waitFor(t, "the live replica scraped", func() bool { return live.LoadMetrics().UpdatedAt != 0 })
	waitFor(t, "the live replica scraped again", func() bool { return e.hits.Load() >= 5 })
	if got := r.LoadMetrics(); got != (policy.Metrics{}) {
		t.Errorf("unreachable replica has metrics %+v", got)
	}
}

// TestScrapeFollowsReplicaSet: update starts and stops goroutines by replica pointer; close
// stops them all and waits; nothing starts after close.
func TestScrapeFollowsReplicaSet(t *testing.T) {
	a, b := startMetricsEndpoint(t, scrapeTGI), startMetricsEndpoint(t, scrapeVLLM)
	ra, rb := replicaAt(1, a.addr()), replicaAt(2, b.addr())
	s := newTestScraper(t)

	updateFresh(s, ra, rb)
	updateFresh(s, ra, rb) // idempotent
	if got := s.active.Load(); got != 2 {
		t.Fatalf("%d scrape goroutines for 2 replicas", got)
	}
	waitFor(t, "both scraped", func() bool { return ra.LoadMetrics().UpdatedAt != 0 && rb.LoadMetrics().UpdatedAt != 0 })

	updateFresh(s, rb)
	waitFor(t, "a's goroutine to end", func() bool { return s.active.Load() == 1 })
	hitsA, hitsB := a.hits.Load(), b.hits.Load()
	waitFor(t, "b scraped on", func() bool { return b.hits.Load() >= hitsB+3 })
	if got := a.hits.Load(); got != hitsA {
		t.Errorf("removed replica scraped %d more times", got-hitsA)
	}
	waitFor(t, "a's connection closed", func() bool { return a.conns.Load() == 0 })

	// A rebuilt replica (same address, new pointer) is a new target.
	rb2 := replicaAt(3, b.addr())
	updateFresh(s, rb2)
	waitFor(t, "the rebuilt replica scraped", func() bool { return rb2.LoadMetrics().UpdatedAt != 0 })
	waitFor(t, "the old pointer's goroutine to end", func() bool { return s.active.Load() == 1 })

	s.close()
	if got := s.active.Load(); got != 0 {
		t.Errorf("%d scrape goroutines after close", got)
	}
	updateFresh(s, ra)
	if got := s.active.Load(); got != 0 {
		t.Errorf("update after close started %d goroutines", got)
	}
	s.close() // twice is fine
	hitsB = b.hits.Load()
	waitFor(t, "b's connections closed", func() bool { return b.conns.Load() == 0 })
	if got := b.hits.Load(); got != hitsB {
		t.Errorf("scraped %d times after close", got-hitsB)
	}
}

// TestScrapeUsesTheDialer: scrapes go through the proxy's dial function, so tests' in-memory
// listeners and any future dial policy apply to them too.
func TestScrapeUsesTheDialer(t *testing.T) {
	e := startMetricsEndpoint(t, scrapeTGI)
	var dials atomic.Int64
	s := newScraper(5*time.Millisecond, zaptest.NewLogger(t), func(addr string) (net.Conn, error) {
		dials.Add(1)
		return net.Dial("tcp", e.addr())
	})
	t.Cleanup(s.close)
	r := replicaAt(1, "replica.invalid:8000")
	updateFresh(s, r)
	waitFor(t, "scraped through the dialer", func() bool { return r.LoadMetrics().UpdatedAt != 0 })
	waitFor(t, "more scrapes", func() bool { return e.hits.Load() >= 5 })
	if got := dials.Load(); got != 1 {
		t.Errorf("%d dials for %d scrapes, want 1: the connection is reused", got, e.hits.Load())
	}
}

func TestNewScraperDefaults(t *testing.T) {
	s := newScraper(0, nil, defaultDial)
	defer s.close()
	if s.interval != defaultScrapeInterval || s.log == nil {
		t.Errorf("interval %v, logger %v; want %v and a no-op logger", s.interval, s.log, defaultScrapeInterval)
	}
}

// TestScrapeReplicaSim scrapes the simulator with each engine's metric names while it holds one
// running and two waiting requests.
func TestScrapeReplicaSim(t *testing.T) {
	tests := map[string]struct {
		engine string
		wantKV bool
	}{
		"vllm": {engine: "vllm", wantKV: true},
		"tgi":  {engine: "tgi"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := replicasim.DefaultConfig()
			cfg.Engine = tc.engine
			cfg.MaxNumSeqs = 1
			cfg.TTFT = time.Hour // requests stay until the test lets them go
			sim := httptest.NewServer(replicasim.NewServer(cfg).Handler())
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() {
				cancel()
				wg.Wait()
				sim.Close()
			})
			for range 3 {
				wg.Go(func() {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, sim.URL+"/v1/chat/completions",
						strings.NewReader(`{"messages":[{"role":"user","content":"hello"}],"max_tokens":1}`))
					if resp, err := http.DefaultClient.Do(req); err == nil {
						resp.Body.Close()
					}
				})
			}

			r := replicaAt(1, sim.Listener.Addr().String())
			s := newTestScraper(t)
			updateFresh(s, r)
			waitFor(t, "one running and two waiting", func() bool {
				m := r.LoadMetrics()
				// vLLM counts the running request's prompt as a prefix-cache query just after
				// admitting it.
				return m.Running == 1 && m.Waiting == 2 && (m.PrefixQueries > 0) == tc.wantKV
			})
			m := r.LoadMetrics()
			if kv := m.KVCacheUsage; (kv > 0) != tc.wantKV {
				t.Errorf("KV-cache usage %v, want it reported: %v", kv, tc.wantKV)
			}
			// vLLM's cache size, for least_ttft; TGI has none.
			wantCache := int64(0)
			if tc.wantKV {
				wantCache = int64(cfg.KVCacheBlocks) * 16
			}
			if m.CacheTokens != wantCache {
				t.Errorf("cache %d tokens, want %d", m.CacheTokens, wantCache)
			}
		})
	}
}

// TestServiceScrapeWiring checks the wiring: an llm_aware service polls its replicas every
// 100 ms from the first SetBackends, follows the replica set, and stops at Shutdown; a service
// whose picker reads no engine metrics polls once a second, to learn batch sizes for late
// binding, and never when late binding is off or has a configured cap.
func TestServiceScrapeWiring(t *testing.T) {
	sim := httptest.NewServer(replicasim.NewServer(replicasim.DefaultConfig()).Handler())
	t.Cleanup(sim.Close)
	backend := Backend{ID: 1, Addr: sim.Listener.Addr().String()}

	for _, limit := range []int{-1, 8} {
		plain, err := NewService(ServiceConfig{Name: "plain", Policy: "least_load", MaxInFlightPerReplica: limit})
		if err != nil {
			t.Fatal(err)
		}
		plain.SetBackends([]Backend{backend})
		if plain.scraper != nil {
			t.Errorf("a least_load service with max in flight per replica %d started a scraper", limit)
		}
	}
	learning, err := NewService(ServiceConfig{Name: "learning", Policy: "least_load"})
	if err != nil {
		t.Fatal(err)
	}
	learning.SetBackends([]Backend{backend})
	if learning.scraper == nil || learning.scraper.interval != learnScrapeInterval {
		t.Errorf("a least_load service with learned caps has scraper %+v, want one every %v", learning.scraper, learnScrapeInterval)
	}
	if err := learning.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	svc, err := NewService(ServiceConfig{Name: "smart", Policy: "llm_aware"})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends([]Backend{backend})
	if svc.scraper.interval != defaultScrapeInterval {
		t.Errorf("llm_aware scrapes every %v, want %v", svc.scraper.interval, defaultScrapeInterval)
	}
	r := svc.snap.Load().replicas[0]
	waitFor(t, "a scrape of the replica", func() bool { return r.LoadMetrics().UpdatedAt > 0 })

	svc.SetBackends(nil)
	waitFor(t, "the removed replica's scraper to stop", func() bool { return svc.scraper.active.Load() == 0 })

	svc.SetBackends([]Backend{backend})
	waitFor(t, "a scraper for the re-added replica", func() bool { return svc.scraper.active.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := svc.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := svc.scraper.active.Load(); n != 0 {
		t.Errorf("%d scrape goroutines outlive Shutdown", n)
	}
	svc.SetBackends([]Backend{backend}) // after Shutdown: must not start polling again
	if n := svc.scraper.active.Load(); n != 0 {
		t.Errorf("SetBackends after Shutdown started %d scrape goroutines", n)
	}
}

// TestScrapeLearnsBatchLimit: a replica's batch size is its running count once two scrapes in
// a row saw requests waiting, and it only grows.
func TestScrapeLearnsBatchLimit(t *testing.T) {
	type obs struct {
		waiting, running int64
		failed           bool
	}
	tests := map[string]struct {
		scrapes []obs
		want    int64
	}{
		"never full":                   {[]obs{{0, 3, false}, {0, 16, false}, {0, 16, false}}, 0},
		"one scrape with a waiter":     {[]obs{{0, 3, false}, {1, 3, false}, {0, 4, false}}, 0},
		"full twice in a row":          {[]obs{{2, 16, false}, {5, 16, false}}, 16},
		"a failure in between":         {[]obs{{2, 16, false}, {0, 0, true}, {5, 16, false}}, 0},
		"starting engine":              {[]obs{{4, 0, false}, {4, 0, false}}, 0},
		"grows, never shrinks":         {[]obs{{1, 8, false}, {1, 8, false}, {1, 12, false}, {3, 6, false}, {3, 6, false}}, 12},
		"the second scrape is counted": {[]obs{{1, 4, false}, {1, 9, false}}, 9},
		"then any larger batch":        {[]obs{{1, 4, false}, {1, 4, false}, {0, 6, false}, {0, 5, false}}, 6},
		"not before it is known":       {[]obs{{0, 6, false}, {1, 4, false}}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var raised []int64
			s := newScraper(time.Second, zaptest.NewLogger(t), defaultDial)
			s.batchLimitRaised = func(_ *policy.Replica, _, to int64) { raised = append(raised, to) }
			target := &scrapeTarget{replica: replicaAt(1, "127.0.0.1:1"), learned: &learnedCap{}}
			for _, o := range tc.scrapes {
				if o.failed {
					s.failed(target, errNoScrapeSeries)
					continue
				}
				s.learnBatchLimit(target, policy.Metrics{Waiting: o.waiting, Running: o.running})
			}
			if got := target.learned.size.Load(); got != tc.want {
				t.Errorf("BatchLimit = %d, want %d", got, tc.want)
			}
			if tc.want > 0 && (len(raised) == 0 || raised[len(raised)-1] != tc.want) {
				t.Errorf("raise hook saw %v, want it to end at %d", raised, tc.want)
			}
		})
	}
}

// TestScrapeBacksProbesOff: each scrape that finds the engine full at its known batch size
// doubles the wait before the next probe beyond it, up to maxProbeBackoff; a raise of the size
// allows the next probe at once.
func TestScrapeBacksProbesOff(t *testing.T) {
	s := newScraper(250*time.Millisecond, zaptest.NewLogger(t), defaultDial)
	target := &scrapeTarget{replica: replicaAt(1, "127.0.0.1:1"), learned: &learnedCap{}}
	full := policy.Metrics{Waiting: 1, Running: 8}
	s.learnBatchLimit(target, full)
	s.learnBatchLimit(target, full) // learned: 8, probe at once
	if target.learned.size.Load() != 8 || target.learned.probeAfter.Load() != 0 {
		t.Fatalf("after learning: size %d, probe after %d; want 8 and 0", target.learned.size.Load(), target.learned.probeAfter.Load())
	}
	var waits []time.Duration
	for range 9 {
		before := time.Now()
		s.learnBatchLimit(target, full)
		waits = append(waits, time.Duration(target.learned.probeAfter.Load()-before.UnixNano()).Round(250*time.Millisecond))
	}
	want := []time.Duration{250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if diff := cmp.Diff(want, waits); diff != "" {
		t.Errorf("probe waits (-want +got):\n%s", diff)
	}
	s.learnBatchLimit(target, policy.Metrics{Running: 9}) // a probe ran: the size grows
	if target.learned.size.Load() != 9 || target.learned.probeAfter.Load() != 0 {
		t.Errorf("after a raise: size %d, probe after %d; want 9 and 0", target.learned.size.Load(), target.learned.probeAfter.Load())
	}
}

// TestScrapeBackoff: after scrapeFailuresBeforeBackoff failures in a row the wait doubles up
// to maxScrapeBackoff, and one success restores the interval.
func TestScrapeBackoff(t *testing.T) {
	s := newScraper(100*time.Millisecond, zaptest.NewLogger(t), defaultDial)
	target := &scrapeTarget{replica: replicaAt(1, "127.0.0.1:1"), learned: &learnedCap{}}
	var got []time.Duration
	for range 12 {
		s.failed(target, errNoScrapeSeries)
		got = append(got, s.next(target))
	}
	want := []time.Duration{100, 100, 100, 200, 400, 800, 1600, 3200, 6400, 10000, 10000, 10000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waits after each failure (-want +got):\n%s", diff)
	}
	target.failures = 0 // what a successful scrape does
	if w := s.next(target); w != s.interval {
		t.Errorf("wait after a success = %v, want %v", w, s.interval)
	}
}
