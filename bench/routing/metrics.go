package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// kvFigures are what the proxy's metrics say of a run with KV events: its /tokenize round trips
// (all of them, and those that failed, when the request went on with the byte index's guess)
// and the engines' event batches and stored blocks it applied.
type kvFigures struct {
	Tokenized      float64 `json:"tokenized"`
	TokenizeFailed float64 `json:"tokenize_failed"`
	TokenizeMeanMs float64 `json:"tokenize_mean_ms"`
	EventBatches   float64 `json:"event_batches_applied"`
	BlocksStored   float64 `json:"blocks_stored"`
}

// proxyKVFigures reads kvFigures from the proxy's admin listener.
func proxyKVFigures(addr string) (*kvFigures, error) {
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	// parseMetrics sums label sets; the labelled series are picked out by their lines.
	m, err := parseMetrics(bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	k := &kvFigures{Tokenized: m["ferry_tokenize_duration_seconds_count"]}
	if k.Tokenized > 0 {
		k.TokenizeMeanMs = 1000 * m["ferry_tokenize_duration_seconds_sum"] / k.Tokenized
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		value := func() float64 {
			f := strings.Fields(line[strings.LastIndexByte(line, '}')+1:])
			v, _ := strconv.ParseFloat(f[0], 64)
			return v
		}
		switch {
		case strings.HasPrefix(line, "ferry_tokenize_duration_seconds_count{") && strings.Contains(line, `result="failed"`):
			k.TokenizeFailed = value()
		case strings.HasPrefix(line, "ferry_kv_event_batches_total{") && strings.Contains(line, `result="applied"`):
			k.EventBatches = value()
		case strings.HasPrefix(line, "ferry_kv_event_blocks_total{") && strings.Contains(line, `event="stored"`):
			k.BlocksStored = value()
		}
	}
	return k, nil
}

// metricProxyQueued is the proxy's gauge of requests it holds for a free slot (late binding).
const metricProxyQueued = "ferry_requests_queued"

// The vLLM series the driver reads from each replica's /metrics.
const (
	metricRequestSuccess = "vllm:request_success_total"
	// The simulator's own prefix-cache counters, present whatever --sim-signals hides.
	metricPrefixQueries = "replicasim_prefix_cache_queries_total"
	metricPrefixHits    = "replicasim_prefix_cache_hits_total"
	metricLoRALoads     = "replicasim_lora_loads_total"
	metricPromptTokens  = "vllm:prompt_tokens_total"
	metricGenTokens     = "vllm:generation_tokens_total"
	metricRunning       = "vllm:num_requests_running"
	metricWaiting       = "vllm:num_requests_waiting"
)

// parseMetrics reads Prometheus text exposition and returns each metric's value summed over its
// label sets, keyed by name (a histogram's _bucket, _sum and _count are names of their own).
// Comment lines are skipped; a malformed sample line is an error.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		// name{labels} value [timestamp]; label values may contain spaces, so cut after '}'.
		var name, rest []byte
		if i := bytes.IndexByte(line, '{'); i >= 0 {
			j := bytes.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("metrics line %q: unbalanced braces", line)
			}
			name, rest = line[:i], line[j+1:]
		} else {
			f := bytes.Fields(line)
			if len(f) < 2 {
				return nil, fmt.Errorf("metrics line %q: no value", line)
			}
			name, rest = f[0], line[len(f[0]):]
		}
		f := bytes.Fields(rest)
		if len(f) < 1 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(string(f[0]), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[string(name)] += v
	}
	return out, sc.Err()
}

// scrapeClient reads /metrics; short timeouts, since replicas are local.
var scrapeClient = &http.Client{Timeout: 5 * time.Second}

// scrape fetches and parses a replica's /metrics, which must have the series the driver scores
// by.
func scrape(addr string) (map[string]float64, error) {
	m, err := fetchMetrics(addr)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{metricRequestSuccess, metricPrefixQueries, metricPrefixHits} {
		if _, ok := m[name]; !ok {
			return nil, fmt.Errorf("%s/metrics has no %s (is it a replica-sim?)", addr, name)
		}
	}
	return m, nil
}

// fetchMetrics fetches and parses addr's /metrics.
func fetchMetrics(addr string) (map[string]float64, error) {
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s/metrics: %w", addr, err)
	}
	return m, nil
}

// maxOverMean is the imbalance of per-replica loads: the largest divided by the mean. 1 is a
// perfect balance; NaN when nothing was served.
func maxOverMean(loads []float64) float64 {
	if len(loads) == 0 {
		return nan
	}
	var sum, top float64
	for _, v := range loads {
		sum += v
		top = max(top, v)
	}
	if sum == 0 {
		return nan
	}
	return top / (sum / float64(len(loads)))
}

// formatLoads renders per-replica values compactly, e.g. "120/98/101/95".
func formatLoads(loads []float64) string {
	parts := make([]string, len(loads))
	for i, v := range loads {
		parts[i] = strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strings.Join(parts, "/")
}
