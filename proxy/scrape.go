package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// Scraper settings.
const (
	// defaultScrapeInterval is how often each replica's /metrics is read when the caller gives
	// no interval. A queue that builds up within one interval is invisible to routing, so it must
	// stay short: llm-d scrapes every 50 ms; 100 ms costs a vLLM replica ten small requests per
	// second, and the proxy's own in-flight counts cover what happens in between.
	defaultScrapeInterval = 100 * time.Millisecond
	// learnScrapeInterval is the interval of a service that scrapes only for late binding's
	// learned caps (slots.go): often enough to catch a replica full during a short burst, and
	// to notice within a fraction of a second that a cap learned too low has room; a quarter
	// of llm_aware's rate, to keep the default cheap for the engine.
	learnScrapeInterval = 250 * time.Millisecond
	// scrapeFailuresBeforeBackoff consecutive failures (an error, a non-200, or no engine series
	// in the answer) make a replica's scrapes back off, doubling the wait up to
	// maxScrapeBackoff: a replica that is not vLLM or TGI then costs one request per
	// maxScrapeBackoff, and an engine whose endpoint recovers is read again within that time.
	scrapeFailuresBeforeBackoff = 3
	maxScrapeBackoff            = 10 * time.Second
	// maxProbeBackoff bounds how long a replica found full at its learned batch size goes
	// without a probe beyond it (slotQueue.free). A probe that finds the engine full costs one
	// request that waits in the engine instead of the proxy, so while probes keep finding it
	// full they back off, doubling from the scrape interval up to this.
	maxProbeBackoff = 30 * time.Second
	// scrapeTimeout bounds one scrape, connection reuse and body included. Half of
	// policy.DefaultMetricsStaleAfter: a replica too slow to answer goes stale within about a
	// second, and its goroutine does not fall further behind than that.
	scrapeTimeout = 500 * time.Millisecond
	// maxScrapeBody caps a /metrics body. vLLM's is some tens of KiB per model (histograms per
	// label set); anything far larger is not an inference engine's endpoint.
	maxScrapeBody = 4 << 20
	// scrapeLogEvery rate-limits the debug log of a replica whose scrapes keep failing: one line
	// when it starts failing, then at most one per this period, and one when it recovers.
	scrapeLogEvery = 30 * time.Second
)

// errNoScrapeSeries marks a /metrics answer without any series the pickers read: not a vLLM or
// TGI replica, or not ready. Its values are left to go stale, as for a failed scrape.
var errNoScrapeSeries = errors.New("no vLLM or TGI load series in /metrics")

// scraper polls every replica's Prometheus endpoint and stores the load signals that LLM-aware
// pickers read (policy.NeedsMetrics) into the replica's atomics, and learns each replica's batch
// size from them (see learnBatchLimit). Each replica has one goroutine and one connection, so a
// slow or dead replica delays only its own scrapes; a failed scrape leaves the replica's
// timestamp as it was, and the picker stops trusting the old values once they are stale.
type scraper struct {
	interval time.Duration
	timeout  time.Duration
	log      *zap.Logger
	dial     func(addr string) (net.Conn, error)
	// batchLimitRaised, when set, is called from a scrape goroutine after a replica's learned
	// batch size grew from (0: unknown) to.
	batchLimitRaised func(r *policy.Replica, from, to int64)
	// adapters, when set, numbers the LoRA adapters the engines report
	// (vllm:lora_requests_info), and learns the names it did not know.
	adapters *policy.Adapters

	// active counts running scrape goroutines, so tests can see them end.
	active atomic.Int64
	wg     sync.WaitGroup

	mu      sync.Mutex
	targets map[*policy.Replica]*scrapeTarget
	closed  bool
}

// newScraper returns a scraper with no replicas; update starts polling. interval ≤ 0 selects
// defaultScrapeInterval. dial opens connections as the proxy's upstream clients do.
func newScraper(interval time.Duration, log *zap.Logger, dial func(addr string) (net.Conn, error)) *scraper {
	if interval <= 0 {
		interval = defaultScrapeInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &scraper{
		interval: interval,
		timeout:  scrapeTimeout,
		log:      log,
		dial:     dial,
		targets:  make(map[*policy.Replica]*scrapeTarget),
	}
}

// newScraper returns the scraper s needs, or nil when nothing reads engine metrics: every
// 100 ms for a picker or autoscaler that scores on them, every learnScrapeInterval when only
// learned late-binding caps do.
func (s *Service) newScraper() *scraper {
	learning := s.slots != nil && s.slots.learned()
	var interval time.Duration
	switch {
	case s.needs&policy.NeedsMetrics != 0 || s.cfg.ScrapeEngineMetrics:
		interval = defaultScrapeInterval
	case learning:
		interval = learnScrapeInterval
	default:
		return nil
	}
	sc := newScraper(interval, s.log, s.dial)
	sc.adapters = s.adapters
	if learning {
		sc.batchLimitRaised = func(r *policy.Replica, from, to int64) {
			level, msg := zap.DebugLevel, "replica batch size raised"
			if from == 0 {
				level, msg = zap.InfoLevel, "replica batch size learned from its metrics; requests beyond it wait in the proxy for the first free slot"
			}
			if ce := s.log.Check(level, msg); ce != nil {
				ce.Write(zap.Int("replica_id", r.ID), zap.String("addr", r.Addr), zap.Int64("batch_size", to))
			}
			s.slots.grant(s) // a raised cap frees slots for waiting requests
		}
	}
	return sc
}

// scrapeTarget is one replica's polling state. Everything but stop is owned by its goroutine.
type scrapeTarget struct {
	replica *policy.Replica
	learned *learnedCap
	hc      *fasthttp.HostClient
	stop    chan struct{}
	req     fasthttp.Request
	resp    fasthttp.Response

	failures     int           // consecutive failed scrapes
	logged       time.Time     // when a failure was last logged
	saturated    bool          // the last scrape saw requests waiting beside a running batch
	probeBackoff time.Duration // the wait before the next probe (learnedCap.probeAfter); 0 after a raise
}

// update makes the scraped set equal to replicas, whose learned caps are the parallel caps: it
// starts a goroutine for every replica pointer it does not poll yet and stops those of replicas
// no longer listed. A replica the proxy
// rebuilt (same address, new identity) is a new pointer, so it starts with no stale values. It
// does not wait for stopped goroutines; close does. After close it does nothing.
func (s *scraper) update(replicas []*policy.Replica, caps []*learnedCap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	listed := make(map[*policy.Replica]bool, len(replicas))
	for i, r := range replicas {
		listed[r] = true
		if _, ok := s.targets[r]; ok {
			continue
		}
		t := s.newTarget(r, caps[i])
		s.targets[r] = t
		s.wg.Add(1)
		s.active.Add(1)
		go s.run(t)
	}
	for r, t := range s.targets {
		if !listed[r] {
			close(t.stop)
			delete(s.targets, r)
		}
	}
}

// close stops every goroutine and waits for them, so none outlives the proxy. A scrape in
// progress finishes first; it is bounded by the scrape timeout once connected and by the dial
// function's own timeout before.
func (s *scraper) close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for r, t := range s.targets {
			close(t.stop)
			delete(s.targets, r)
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *scraper) newTarget(r *policy.Replica, learned *learnedCap) *scrapeTarget {
	t := &scrapeTarget{
		replica: r,
		learned: learned,
		stop:    make(chan struct{}),
		hc: &fasthttp.HostClient{
			Addr: r.Addr,
			Dial: s.dial,
			// One scrape at a time; its connection stays open between scrapes.
			MaxConns:                  1,
			MaxIdleConnDuration:       upstreamMaxIdleConnDuration,
			MaxResponseBodySize:       maxScrapeBody,
			MaxIdemponentCallAttempts: 1,
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			Name:                      "ferry-scraper",
			SecureErrorLogMessage:     true,
		},
	}
	t.req.Header.SetMethod(fasthttp.MethodGet)
	t.req.SetRequestURI("http://" + r.Addr + "/metrics")
	// The classic text format: vLLM's Python client would otherwise be free to answer in
	// OpenMetrics, and nothing here needs anything else.
	t.req.Header.Set(fasthttp.HeaderAccept, "text/plain;version=0.0.4")
	return t
}

func (s *scraper) run(t *scrapeTarget) {
	// Deferred calls run last first: the count drops before Done, so close, which waits on
	// the group, never returns while this goroutine still counts as active.
	defer s.wg.Done()
	defer s.active.Add(-1)
	defer t.hc.CloseIdleConnections()
	var timer *time.Timer
	for {
		// Scrape at once, so a replica that just joined is scored on fresh values.
		s.scrape(t)
		wait := s.next(t)
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait) // the timer fired and was received: Reset starts afresh
		}
		select {
		case <-t.stop:
			return
		case <-timer.C:
		}
	}
}

// next returns how long t waits after a scrape: the interval, counted from the end of the
// scrape so that a slow replica is not polled back to back, or a backoff after repeated failures.
func (s *scraper) next(t *scrapeTarget) time.Duration {
	over := t.failures - scrapeFailuresBeforeBackoff
	if over <= 0 {
		return s.interval
	}
	return min(s.interval<<min(over, 20), max(maxScrapeBackoff, s.interval))
}

// scrape reads the replica's /metrics once and publishes what it found.
func (s *scraper) scrape(t *scrapeTarget) {
	defer func() {
		// A parser bug must not take the proxy down with it: count it as a failed scrape.
		if v := recover(); v != nil {
			s.failed(t, fmt.Errorf("panic while scraping: %v", v))
		}
	}()
	t.resp.Reset()
	err := t.hc.DoTimeout(&t.req, &t.resp, s.timeout)
	if err == nil && t.resp.StatusCode() != fasthttp.StatusOK {
		err = fmt.Errorf("status %d", t.resp.StatusCode())
	}
	var m policy.Metrics
	if err == nil {
		var ok bool
		if m, ok = parseScrape(t.resp.Body()); !ok {
			err = errNoScrapeSeries
		}
	}
	if err != nil {
		s.failed(t, err)
		return
	}
	m.UpdatedAt = time.Now().UnixNano()
	t.replica.SetMetrics(m)
	if s.adapters != nil {
		if lora, ok := parseLoRAInfo(t.resp.Body()); ok {
			s.publishLoRA(t.replica, lora, m.UpdatedAt)
		}
	}
	s.learnBatchLimit(t, m)
	if t.failures > 0 {
		if ce := s.log.Check(zap.DebugLevel, "replica metrics scrape recovered"); ce != nil {
			ce.Write(zap.Int("replica_id", t.replica.ID), zap.String("addr", t.replica.Addr), zap.Int("failed_scrapes", t.failures))
		}
		t.failures = 0
	}
}

// learnBatchLimit learns the replica's batch size (learnedCap.size) from a scrape.
// It first sets it to the running count when two scrapes in a row found requests waiting: an
// engine admits waiting requests at its next step, within tens of milliseconds, while it has
// room, so one scrape can catch a request that has just arrived beside a batch with room to
// spare, but requests still waiting a scrape interval later mean the batch is full (or the KV
// cache is). A replica that reports no running requests is starting or stalled, not full. Once
// set, any larger running count raises it: an engine never runs more than its batch. That is
// how a cap learned too low recovers, through the probes beyond it (slotQueue.free): a raise
// allows the next probe at once, and a scrape that finds the engine full at a known size backs
// them off.
func (s *scraper) learnBatchLimit(t *scrapeTarget, m policy.Metrics) {
	full := m.Waiting > 0 && m.Running > 0
	limit := t.learned.size.Load()
	switch {
	case (full && t.saturated || limit > 0 && m.Running > limit) && t.learned.raise(m.Running):
		t.probeBackoff = 0
		t.learned.probeAfter.Store(0)
		if s.batchLimitRaised != nil {
			s.batchLimitRaised(t.replica, limit, m.Running)
		}
	case full && limit > 0:
		t.probeBackoff = min(max(2*t.probeBackoff, s.interval), maxProbeBackoff)
		t.learned.probeAfter.Store(time.Now().Add(t.probeBackoff).UnixNano())
	}
	t.saturated = full
}

func (s *scraper) failed(t *scrapeTarget, err error) {
	t.failures++
	t.saturated = false
	now := time.Now()
	if t.failures > 1 && now.Sub(t.logged) < scrapeLogEvery {
		return
	}
	t.logged = now
	if ce := s.log.Check(zap.DebugLevel, "replica metrics scrape failed"); ce != nil {
		ce.Write(zap.Int("replica_id", t.replica.ID), zap.String("addr", t.replica.Addr),
			zap.Int("consecutive_failures", t.failures), zap.Error(err))
	}
}

// parseScrape reads the load series out of a Prometheus text exposition, without a full parse:
// it looks at the metric name of every sample line and parses the value of only the few it
// wants, summing each over its label sets (vLLM labels by model and, in recent versions, by
// engine). It reports whether any load series was present.
//
//   - waiting: vllm:num_requests_waiting, TGI's tgi_queue_size
//   - running: vllm:num_requests_running, TGI's tgi_batch_current_size
//   - KV-cache usage: vllm:kv_cache_usage_perc, or the deprecated vllm:gpu_cache_usage_perc when
//     the new name is absent (older vLLM). TGI exports none.
//   - the prefix cache's counters: vllm:prefix_cache_queries_total and _hits_total, or the
//     deprecated vllm:gpu_prefix_cache_* when the new names are absent
//   - the KV cache's size in tokens: num_gpu_blocks × block_size, labels of
//     vllm:cache_config_info
//
// KV-cache usage is a fraction per engine, so it is averaged over label sets rather than summed.
// Non-finite or negative samples are skipped; counts are rounded to whole requests.
func parseScrape(body []byte) (policy.Metrics, bool) {
	var waiting, running, kv, gpuKV float64
	var queries, hits, gpuQueries, gpuHits float64
	var kvSets, gpuKVSets, counterSets int
	var cacheTokens int64
	found := false
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		name, value, ok := scrapeSample(line)
		if !ok {
			continue
		}
		switch string(name) {
		case "vllm:num_requests_waiting", "tgi_queue_size":
		case "vllm:num_requests_running", "tgi_batch_current_size":
		case "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc":
		case "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total":
		case "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total":
		case "vllm:cache_config_info":
			cacheTokens += cacheConfigTokens(line)
			continue
		default:
			continue
		}
		v, err := strconv.ParseFloat(string(value), 64)
		if err != nil || !(v >= 0) || math.IsInf(v, 0) {
			continue
		}
		switch string(name) {
		case "vllm:num_requests_waiting", "tgi_queue_size":
			waiting += v
			found = true
		case "vllm:num_requests_running", "tgi_batch_current_size":
			running += v
			found = true
		case "vllm:kv_cache_usage_perc":
			kv += v
			kvSets++
			found = true
		case "vllm:gpu_cache_usage_perc":
			gpuKV += v
			gpuKVSets++
			found = true
		case "vllm:prefix_cache_queries_total":
			queries += v
			counterSets++
		case "vllm:prefix_cache_hits_total":
			hits += v
		case "vllm:gpu_prefix_cache_queries_total":
			gpuQueries += v
		case "vllm:gpu_prefix_cache_hits_total":
			gpuHits += v
		}
	}
	if !found {
		return policy.Metrics{}, false
	}
	m := policy.Metrics{Waiting: scrapeCount(waiting), Running: scrapeCount(running), CacheTokens: cacheTokens}
	switch {
	case kvSets > 0:
		m.KVCacheUsage = min(kv/float64(kvSets), 1)
	case gpuKVSets > 0:
		m.KVCacheUsage = min(gpuKV/float64(gpuKVSets), 1)
	}
	if counterSets > 0 {
		m.PrefixQueries, m.PrefixHits = queries, hits
	} else {
		m.PrefixQueries, m.PrefixHits = gpuQueries, gpuHits
	}
	return m, true
}

// cacheConfigTokens reads num_gpu_blocks × block_size from the labels of a
// vllm:cache_config_info sample line; 0 when either is missing or not a positive number (vLLM
// writes "None" before its memory profiling has sized the cache).
func cacheConfigTokens(line []byte) int64 {
	blocks := labelInt(line, "num_gpu_blocks")
	size := labelInt(line, "block_size")
	if blocks <= 0 || size <= 0 || blocks > 1<<40/size {
		return 0
	}
	return blocks * size
}

// labelInt returns the value of label name in a sample line's label set as an integer, or 0.
func labelInt(line []byte, name string) int64 {
	raw, ok := labelRaw(line, name)
	if !ok {
		return 0
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// labelString returns the value of label name in a sample line's label set, unescaped, or "".
func labelString(line []byte, name string) string {
	raw, ok := labelRaw(line, name)
	if !ok || bytes.IndexByte(raw, '\\') < 0 {
		return string(raw)
	}
	out := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c == '\\' && i+1 < len(raw) {
			i++
			if c = raw[i]; c == 'n' {
				c = '\n'
			}
		}
		out = append(out, c)
	}
	return string(out)
}

// labelRaw returns the still escaped value of label name in a sample line's label set. Label
// values are matched quote-aware, so a value containing `name="` cannot spoof another.
func labelRaw(line []byte, name string) ([]byte, bool) {
	open := bytes.IndexByte(line, '{')
	if open < 0 {
		return nil, false
	}
	labels := line[open:]
	if end := labelSetEnd(labels); end > 0 {
		labels = labels[1:end]
	} else {
		return nil, false
	}
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return nil, false
		}
		key := bytes.TrimLeft(labels[:eq], " \t,")
		rest := labels[eq+2:]
		end := 0
		for end < len(rest) && rest[end] != '"' {
			if rest[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(rest) {
			return nil, false
		}
		if string(key) == name {
			return rest[:end], true
		}
		labels = rest[end+1:]
	}
	return nil, false
}

// scrapeCount rounds a summed gauge to whole requests, saturating far above any real count.
func scrapeCount(v float64) int64 { return int64(math.Round(min(v, 1<<53))) }

// scrapeSample splits one line of the text format into its metric name and value. Comments,
// blank lines and malformed lines report false. Label values may hold any character, '}' and
// escaped quotes included, so the label set is skipped quote-aware. A trailing timestamp is
// ignored.
func scrapeSample(line []byte) (name, value []byte, ok bool) {
	line = bytes.TrimLeft(line, " \t")
	line = bytes.TrimRight(line, " \t\r")
	if len(line) == 0 || line[0] == '#' {
		return nil, nil, false
	}
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return nil, nil, false
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		closing := labelSetEnd(rest)
		if closing < 0 {
			return nil, nil, false
		}
		rest = rest[closing+1:]
	}
	rest = bytes.TrimLeft(rest, " \t")
	if i := bytes.IndexAny(rest, " \t"); i >= 0 {
		rest = rest[:i]
	}
	if len(rest) == 0 {
		return nil, nil, false
	}
	return name, rest, true
}

// labelSetEnd returns the index of the '}' closing the label set that s starts with, or -1.
func labelSetEnd(s []byte) int {
	inQuotes := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case inQuotes && c == '\\':
			i++ // skip the escaped character
		case c == '"':
			inQuotes = !inQuotes
		case !inQuotes && c == '}':
			return i
		}
	}
	return -1
}
