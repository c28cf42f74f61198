package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/loadgen"
)

const (
	readyTimeout = 30 * time.Second
	// loadSampleEvery is how often the replicas' running and waiting gauges are read.
	loadSampleEvery = time.Second
)

// policyResult is one policy's run: either unavailable, with the reason, or measured.
type policyResult struct {
	Policy string `json:"policy"`
	// Resolved is the policy the proxy reported using, for "default".
	Resolved    string `json:"resolved,omitempty"`
	Unavailable string `json:"unavailable,omitempty"`

	OK         int    `json:"ok"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`

	TTFT loadgen.Summary `json:"ttft"`
	E2E  loadgen.Summary `json:"e2e"`
	// TPOT is the time per output token after the first: (e2e - ttft) / (tokens - 1).
	TPOT loadgen.Summary `json:"tpot"`
	Lag  loadgen.Summary `json:"dispatch_lag"`

	MakespanS       float64 `json:"makespan_s"`
	RequestsPerSec  float64 `json:"requests_per_s"`
	OutputTokPerSec float64 `json:"output_tokens_per_s"`

	// Per replica, from its /metrics: finished requests, prompt+generated tokens, and the mean
	// of running+waiting sequences sampled every second.
	ReplicaRequests []float64 `json:"replica_requests"`
	ReplicaTokens   []float64 `json:"replica_tokens"`
	ReplicaBusy     []float64 `json:"replica_mean_sequences"`
	RequestsImbal   ratio     `json:"requests_max_over_mean"`
	TokensImbal     ratio     `json:"tokens_max_over_mean"`
	BusyImbal       ratio     `json:"sequences_max_over_mean"`

	// PrefixHitRate is hits/queries summed over replicas (vLLM's definition, in tokens);
	// ClientCachedShare the same from the responses' usage.prompt_tokens_details.cached_tokens.
	PrefixHitRate     ratio   `json:"prefix_hit_rate"`
	ClientCachedShare float64 `json:"client_cached_share"`

	// AdapterLoads is how many times the replicas loaded a LoRA adapter from disk.
	AdapterLoads float64 `json:"adapter_loads"`

	// Queueing is where requests waited: in the engines' queues or held by the proxy.
	Queueing queueing `json:"queueing"`

	// KVEvents is what the proxy said of the engines' events and of tokenizing, in a NAME@events
	// run; nil otherwise.
	KVEvents *kvFigures `json:"kv_events,omitempty"`
}

func (r *policyResult) oneLine() string {
	if r.Unavailable != "" {
		return fmt.Sprintf("%-17s unavailable: %s", r.Policy, r.Unavailable)
	}
	line := fmt.Sprintf("%-17s ok %d err %d  TTFT p50 %.0f p99 %.0f ms  e2e p50 %.0f p99 %.0f ms  %.1f req/s  load max/mean %.2f  prefix hits %.0f%%",
		r.Policy, r.OK, r.Errors, r.TTFT.P50Ms, r.TTFT.P99Ms, r.E2E.P50Ms, r.E2E.P99Ms, r.RequestsPerSec, float64(r.RequestsImbal), 100*float64(r.PrefixHitRate))
	if r.AdapterLoads > 0 {
		line += fmt.Sprintf("  adapter loads %.0f", r.AdapterLoads)
	}
	if k := r.KVEvents; k != nil {
		line += fmt.Sprintf("  tokenized %.0f (failed %.0f, mean %.2f ms)  event batches %.0f, blocks stored %.0f",
			k.Tokenized, k.TokenizeFailed, k.TokenizeMeanMs, k.EventBatches, k.BlocksStored)
	}
	return line
}

// runPolicy starts fresh replicas and a proxy with policy, replays the workload, and stops them.
func runPolicy(ctx context.Context, group *childproc.Group, opts options, policy string, wl *workload) (*policyResult, error) {
	res := &policyResult{Policy: policy}
	fmt.Fprintf(os.Stderr, "policy %s: starting %d replicas\n", policy, opts.replicas)
	name, limit := splitPolicy(policy)
	// With KV events the proxy binds the endpoint every replica's publisher connects to; the
	// publishers keep retrying until it does, as vLLM's do.
	var eventsAddr string
	var simArgs []string
	if limit == kvEventsMode {
		var err error
		if eventsAddr, err = benchkit.FreeLoopbackAddr(); err != nil {
			return nil, err
		}
		simArgs = []string{"--kv-events", "tcp://" + eventsAddr}
	}
	pd := limit == pdMode
	if pd {
		simArgs = []string{"--kv-transfer"}
	}
	replicas, err := startReplicas(ctx, group, opts, simArgs)
	defer func() {
		for _, p := range replicas {
			group.Stop(p.proc)
		}
	}()
	if err != nil {
		return nil, err
	}

	proxyAddr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	metricsAddr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	argv := []string{opts.ferryBin, "proxy", "--listen", proxyAddr, "--metrics-listen", metricsAddr}
	switch limit {
	case batchLimit:
		limit = strconv.Itoa(opts.sim.maxNumSeqs)
	case lateBindingOff:
		limit = "-1"
	case kvEventsMode:
		argv = append(argv, "--kv-events-listen", "tcp://"+eventsAddr)
		limit = ""
	case adapterBlind:
		argv = append(argv, "--ignore-adapters")
		limit = ""
	case pdMode:
		limit = ""
	}
	if name != defaultPolicy {
		argv = append(argv, "--policy", name)
	}
	if limit != "" {
		argv = append(argv, "--max-in-flight-per-replica", limit)
	}
	for i, r := range replicas {
		flag := "--replica"
		if pd && i < opts.pdPrefill {
			flag = "--prefill-replica"
		}
		argv = append(argv, flag, r.addr)
	}
	proxy, err := group.Start(childproc.Spec{Name: "proxy-" + policy, Argv: argv, CPU: -1})
	if err != nil {
		return nil, err
	}
	defer group.Stop(proxy)
	if err := childproc.WaitHTTP(ctx, proxy, "http://"+proxyAddr+"/health", readyTimeout); err != nil {
		if errors.Is(err, childproc.ErrExited) {
			res.Unavailable = whyUnavailable(proxy.LogTail(2000))
			return res, nil
		}
		return nil, err
	}
	if name == defaultPolicy {
		res.Resolved = policyFromLog(proxy.LogTail(4000))
	}

	client, err := loadgen.NewClient(proxyAddr, opts.maxInFlight, opts.timeout)
	if err != nil {
		return nil, err
	}
	defer client.CloseIdleConnections()

	before, err := scrapeAll(replicas)
	if err != nil {
		return nil, err
	}
	sampler := startLoadSampler(replicas, metricsAddr)
	fmt.Fprintf(os.Stderr, "policy %s: replaying %d requests over %.0f s\n", policy, len(wl.Requests), wl.stats.DurationS)
	start := time.Now()
	outcomes := replay(ctx, client, wl.Requests, opts.maxInFlight)
	makespan := time.Since(start)
	queues := sampler.stop()
	after, err := scrapeAll(replicas)
	if err != nil {
		return nil, err
	}
	select {
	case <-proxy.Exited():
		return nil, fmt.Errorf("proxy exited during the replay: %s", proxy.LogTail(1000))
	default:
	}
	summarize(res, wl.Requests, outcomes, makespan, before, after, queues)
	for i := range after {
		res.AdapterLoads += after[i][metricLoRALoads] - before[i][metricLoRALoads]
	}
	if eventsAddr != "" {
		if res.KVEvents, err = proxyKVFigures(metricsAddr); err != nil {
			return nil, err
		}
	}
	if err := writeOutcomes(filepath.Join(opts.out, "requests-"+fileSafe(policy)+".csv"), wl.Requests, outcomes); err != nil {
		return nil, err
	}
	return res, nil
}

// The limits a --policies entry NAME@LIMIT may name besides a number: batch caps in-flight
// requests per replica at the replicas' batch size, --sim-max-num-seqs, as if configured; off
// turns late binding off. Without "@" the proxy learns each replica's batch size from its
// metrics, its default.
const (
	batchLimit     = "batch"
	lateBindingOff = "off"
	// kvEventsMode runs the replicas with vLLM's KV-cache events published to the proxy
	// (--kv-events-listen), late binding as by default: NAME@events.
	kvEventsMode = "events"
	// adapterBlind routes as if no request named an adapter (--ignore-adapters): NAME@blind,
	// what Ferry's routing did before it knew adapters.
	adapterBlind = "blind"
	// pdMode disaggregates prefill and decode: the first --pd-prefill replicas prefill
	// (--prefill-replica), the others decode, all with a KV connector: NAME@pd.
	pdMode = "pd"
)

// roundRobinBaseline is what the default policy is measured against: round robin without late
// binding, SkyServe's load balancer.
const roundRobinBaseline = "round_robin@" + lateBindingOff

// leastOutstanding is least-outstanding-requests without late binding: the cache-blind policy
// issue 33 says the default must never be worse than.
const leastOutstanding = "least_load@" + lateBindingOff

// splitPolicy splits a --policies entry NAME@N into the policy and the proxy's
// --max-in-flight-per-replica (late binding); limit is empty without "@".
func splitPolicy(entry string) (name, limit string) {
	name, limit, _ = strings.Cut(entry, "@")
	return name, limit
}

// fileSafe keeps a policy name usable as part of a file name.
func fileSafe(name string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, name)
}

// writeOutcomes saves one line per request, so a tail can be taken apart: TTFT minus the
// replica's prefill of the uncached tokens is time spent waiting for a batch slot.
func writeOutcomes(path string, reqs []request, outcomes []outcome) error {
	var b strings.Builder
	b.WriteString("at_ms,conversation,turn,system,prompt_tokens,reusable_tokens,cached_tokens,out_tokens,ttft_ms,e2e_ms,lag_ms,error,adapter\n")
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }
	for i, o := range outcomes {
		r := &reqs[i]
		errText := ""
		if o.Err != nil {
			errText = strconv.Quote(o.Err.Error())
		}
		fmt.Fprintf(&b, "%s,%d,%d,%d,%d,%d,%d,%d,%s,%s,%s,%s,%s\n", ms(r.At), r.Conversation, r.Turn, r.System,
			r.PromptTokens, r.ReusableTokens, o.CachedTokens, r.OutTokens, ms(o.TTFT), ms(o.E2E), ms(o.Lag), errText, r.Adapter)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// ratio is a float that may be NaN (not measurable), which JSON writes as null.
type ratio float64

// MarshalJSON writes NaN and infinities as null, which encoding/json refuses to encode.
func (r ratio) MarshalJSON() ([]byte, error) {
	v := float64(r)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return json.Marshal(v)
}

// whyUnavailable turns the log of a proxy that exited at start into a short reason.
func whyUnavailable(logTail string) string {
	lines := strings.Split(strings.TrimSpace(logTail), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if strings.Contains(logTail, "unknown load balancing policy") || strings.Contains(logTail, "unknown policy") {
		return "unknown policy (" + last + ")"
	}
	return "proxy failed to start (" + last + ")"
}

var policyLogRE = regexp.MustCompile(`"policy":\s*"([^"]+)"`)

// policyFromLog finds the policy the proxy announced at start ("policy": "least_load").
func policyFromLog(log string) string {
	if m := policyLogRE.FindStringSubmatch(log); m != nil {
		return m[1]
	}
	return ""
}

// replica is one running replica-sim.
type replica struct {
	addr string
	proc *childproc.Proc
}

// startReplicas starts opts.replicas replica-sims and waits until all are ready. On error the
// ones already started are returned too, for the caller to stop.
func startReplicas(ctx context.Context, group *childproc.Group, opts options, extra []string) ([]replica, error) {
	var out []replica
	for i := range opts.replicas {
		addr, err := benchkit.FreeLoopbackAddr()
		if err != nil {
			return out, err
		}
		_, port, _ := net.SplitHostPort(addr)
		argv := append([]string{opts.ferryBin, "replica-sim", "--host", "127.0.0.1", "--port", port,
			"--model", opts.workload.Model, "--seed", fmt.Sprint(i + 1)}, opts.sim.args()...)
		argv = append(argv, extra...)
		p, err := group.Start(childproc.Spec{Name: fmt.Sprintf("replica%d", i+1), Argv: argv, CPU: -1})
		if err != nil {
			return out, err
		}
		out = append(out, replica{addr: addr, proc: p})
	}
	for _, r := range out {
		if err := childproc.WaitHTTP(ctx, r.proc, "http://"+r.addr+"/health", readyTimeout); err != nil {
			return out, err
		}
	}
	return out, nil
}

func scrapeAll(replicas []replica) ([]map[string]float64, error) {
	out := make([]map[string]float64, len(replicas))
	for i, r := range replicas {
		m, err := scrape(r.addr)
		if err != nil {
			return nil, err
		}
		out[i] = m
	}
	return out, nil
}

// loadSampler samples, every loadSampleEvery, each replica's running and waiting sequences
// and the requests the proxy holds for a slot: where requests queue, at the engines or at the
// proxy.
type loadSampler struct {
	done chan struct{}
	wg   sync.WaitGroup
	// Per replica: the sums of running+waiting and of waiting, and the samples taken.
	busy, waiting []float64
	n             []int
	peakWaiting   []float64
	// The proxy's held requests: sum, samples and peak.
	queued, peakQueued float64
	queuedN            int
	// proxyErr is the first failure to read the proxy's metrics, reported on stderr.
	proxyErr error
}

// queueing is where requests waited during a replay, from loadSampler.
type queueing struct {
	// Busy is each replica's mean running+waiting sequences.
	Busy []float64 `json:"replica_mean_sequences"`
	// EngineWaiting and PeakEngineWaiting are each replica's mean and largest waiting queue.
	EngineWaiting     []float64 `json:"replica_mean_waiting"`
	PeakEngineWaiting []float64 `json:"replica_peak_waiting"`
	// ProxyQueued and PeakProxyQueued are the mean and largest number of requests the proxy
	// held for a free slot; NaN when its metrics could not be read.
	ProxyQueued     ratio `json:"proxy_mean_queued"`
	PeakProxyQueued ratio `json:"proxy_peak_queued"`
}

func startLoadSampler(replicas []replica, proxyMetrics string) *loadSampler {
	k := len(replicas)
	s := &loadSampler{done: make(chan struct{}), busy: make([]float64, k), waiting: make([]float64, k),
		n: make([]int, k), peakWaiting: make([]float64, k)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(loadSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			for i, r := range replicas {
				if m, err := scrape(r.addr); err == nil {
					s.busy[i] += m[metricRunning] + m[metricWaiting]
					s.waiting[i] += m[metricWaiting]
					s.peakWaiting[i] = max(s.peakWaiting[i], m[metricWaiting])
					s.n[i]++
				}
			}
			if m, err := fetchMetrics(proxyMetrics); err == nil {
				s.queued += m[metricProxyQueued]
				s.peakQueued = max(s.peakQueued, m[metricProxyQueued])
				s.queuedN++
			} else if s.proxyErr == nil {
				s.proxyErr = err
				fmt.Fprintf(os.Stderr, "reading the proxy's metrics: %v\n", err)
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the means and peaks.
func (s *loadSampler) stop() queueing {
	close(s.done)
	s.wg.Wait()
	k := len(s.busy)
	q := queueing{Busy: make([]float64, k), EngineWaiting: make([]float64, k), PeakEngineWaiting: s.peakWaiting,
		ProxyQueued: ratio(nan), PeakProxyQueued: ratio(nan)}
	for i := range k {
		if s.n[i] > 0 {
			q.Busy[i], q.EngineWaiting[i] = s.busy[i]/float64(s.n[i]), s.waiting[i]/float64(s.n[i])
		}
	}
	if s.queuedN > 0 {
		q.ProxyQueued, q.PeakProxyQueued = ratio(s.queued/float64(s.queuedN)), ratio(s.peakQueued)
	}
	return q
}
