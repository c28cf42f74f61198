package replicasim

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// vLLM's own bucket boundaries, so dashboards and quantile queries written for vLLM read the
// simulator's histograms the same way.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
		50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	// tgiDurationBuckets are TGI's router buckets for every *_duration histogram: 35 steps of a
	// geometric sequence from 0.15 ms by 1.5.
	tgiDurationBuckets = prometheus.ExponentialBuckets(0.0001*1.5, 1.5, 35)
)

// metrics are the series that LLM-aware routers scrape, under the names of the engine the
// replica imitates: vLLM's, with its model_name label, or TGI's, which carry no labels. Each
// Server has its own registry so several replicas can live in one test. Every field is always
// valid; those the chosen engine does not export are simply not registered.
type metrics struct {
	registry      *prometheus.Registry
	prefixQueries prometheus.Counter
	prefixHits    prometheus.Counter
	// truthQueries and truthHits count the same as prefixQueries and prefixHits under names
	// no router reads (replicasim_*), whatever Signals hides: what benchmarks score hit rates by.
	truthQueries     prometheus.Counter
	truthHits        prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	requestSuccess   prometheus.Counter // finished_reason="length", the only way the simulator stops
	ttft             prometheus.Histogram
	e2e              prometheus.Histogram
	requestCount     prometheus.Counter   // TGI's tgi_request_count: every completion request
	queueDuration    prometheus.Histogram // TGI's tgi_request_queue_duration: wait for a batch slot
	handler          http.Handler         // serves the Prometheus text format
	// The simulator's own counters for what vLLM does not count: /tokenize calls and the
	// KV-event batches published or dropped on a full queue.
	tokenizeRequests prometheus.Counter
	kvEventBatches   prometheus.Counter
	kvEventsDropped  prometheus.Counter
}

// newMetrics registers engine's series; the gauges read the live values through the callbacks.
// kvBlocks is the KV cache's size in blocks, announced as vLLM does in vllm:cache_config_info
// unless signals is SignalsBasic, which leaves out that and the prefix-cache counters.
func newMetrics(engine, signals, model string, kvBlocks int, running, waiting, kvUsage func() float64) *metrics {
	labels := prometheus.Labels{"model_name": model}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		registry:         prometheus.NewRegistry(),
		prefixQueries:    counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		truthQueries:     prometheus.NewCounter(prometheus.CounterOpts{Name: "replicasim_prefix_cache_queries_total", Help: "Prompt tokens looked up in the prefix cache (the simulator's own count, whatever --signals hides)."}),
		truthHits:        prometheus.NewCounter(prometheus.CounterOpts{Name: "replicasim_prefix_cache_hits_total", Help: "Prompt tokens found in the prefix cache (the simulator's own count, whatever --signals hides)."}),
		promptTokens:     counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		requestSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.",
			ConstLabels: prometheus.Labels{"model_name": model, "finished_reason": "length"},
		}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Histogram of time to first token in seconds.",
			ConstLabels: labels, Buckets: ttftBuckets,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "Histogram of e2e request latency in seconds.",
			ConstLabels: labels, Buckets: e2eBuckets,
		}),
		requestCount: prometheus.NewCounter(prometheus.CounterOpts{Name: "tgi_request_count", Help: "Total number of requests received."}),
		queueDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "tgi_request_queue_duration", Help: "Time a request spent in the queue, in seconds.",
			Buckets: tgiDurationBuckets,
		}),
		tokenizeRequests: prometheus.NewCounter(prometheus.CounterOpts{Name: "replicasim_tokenize_requests_total", Help: "Requests to /tokenize."}),
		kvEventBatches:   prometheus.NewCounter(prometheus.CounterOpts{Name: "replicasim_kv_event_batches_total", Help: "KV-cache event batches handed to the ZMQ socket (--kv-events)."}),
		kvEventsDropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "replicasim_kv_events_dropped_total", Help: "KV-cache event batches dropped because the publisher's queue was full."}),
	}
	// Engine-independent: both engines serve /tokenize and can publish events.
	m.registry.MustRegister(m.tokenizeRequests, m.kvEventBatches, m.kvEventsDropped)
	if engine == EngineTGI {
		// TGI has no KV-cache usage gauge and no prefix-cache counters.
		m.registry.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tgi_queue_size", Help: "Number of requests waiting in the queue."}, waiting),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tgi_batch_current_size", Help: "Number of requests in the current batch."}, running),
			m.requestCount, m.queueDuration,
		)
		m.handler = promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
		return m
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	m.registry.MustRegister(
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kvUsage),
		// Deprecated in vLLM but still what older routers read.
		gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", kvUsage),
		m.promptTokens, m.generationTokens, m.requestSuccess, m.ttft, m.e2e,
		m.truthQueries, m.truthHits,
	)
	if signals != SignalsBasic {
		m.registry.MustRegister(m.prefixQueries, m.prefixHits, cacheConfigInfo(kvBlocks))
	}
	m.handler = promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
	return m
}

// cacheConfigInfo is vLLM's vllm:cache_config_info: a gauge of 1 whose labels are the engine's
// cache settings as strings, among them the two a prefix-aware router sizes its picture of the
// replica's cache by, num_gpu_blocks and block_size. (vLLM labels it with every CacheConfig
// field; these are the ones the simulator has.)
func cacheConfigInfo(kvBlocks int) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"block_size":               strconv.Itoa(blockTokens),
			"num_gpu_blocks":           strconv.Itoa(kvBlocks),
			"enable_prefix_caching":    "True",
			"prefix_caching_hash_algo": "xxhash",
			"cache_dtype":              "auto",
			"engine":                   "0",
		},
	})
	g.Set(1)
	return g
}
