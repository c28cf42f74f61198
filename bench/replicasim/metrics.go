package replicasim

import (
	"net/http"

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
)

// metrics are the vLLM series that LLM-aware routers scrape, under vLLM's names and with its
// model_name label. Each Server has its own registry so several replicas can live in one test.
type metrics struct {
	registry         *prometheus.Registry
	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	requestSuccess   prometheus.Counter // finished_reason="length", the only way the simulator stops
	ttft             prometheus.Histogram
	e2e              prometheus.Histogram
	handler          http.Handler // serves the Prometheus text format
}

// newMetrics registers the series; the gauges read the live values through the callbacks.
func newMetrics(model string, running, waiting, kvUsage func() float64) *metrics {
	labels := prometheus.Labels{"model_name": model}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	m := &metrics{
		registry:         prometheus.NewRegistry(),
		prefixQueries:    counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
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
		m.prefixQueries, m.prefixHits, m.promptTokens, m.generationTokens, m.requestSuccess,
		m.ttft, m.e2e,
	)
	m.handler = promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
	return m
}
