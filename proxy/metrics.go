package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/tenants"
)

// Histogram buckets, in seconds. LLM requests span four orders of magnitude: a cached refusal
// or a proxy error takes milliseconds, a long reasoning stream minutes.
var (
	// durationBuckets cover a whole exchange, stream included: from a proxy error to a
	// ten-minute reasoning stream (longer ones count in +Inf only).
	durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}
	// ttftBuckets are finest between 25 ms and 1 s, where prefill on a healthy replica lands, and
	// reach two minutes for prompts queued behind a saturated batch.
	ttftBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 20, 30, 60, 120}
	// tpotBuckets span a decode step: a few ms for a small model alone on its GPU, tens of ms in
	// a full batch, up to a second for a swapped or preempted one.
	tpotBuckets = []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1}
)

// replicaNone is the replica label of requests the proxy answered itself (no ready replica, body
// too large, every attempt failed...).
const replicaNone = "none"

// Metrics holds Ferry's Prometheus metrics for proxied traffic:
//
//	ferry_requests_total{service,replica,code}           requests by final status; replica="none" when the proxy answered itself
//	ferry_request_duration_seconds{service}              request received to last response byte, streams included
//	ferry_time_to_first_token_seconds{service}           request received to first body byte from the replica (2xx only)
//	ferry_requests_in_flight{service}                    requests sent to a replica whose response has not ended
//	ferry_time_per_output_token_seconds{service}         a whole 2xx event stream's time after its first token, per later token
//	ferry_requests_waiting{service}                      requests waiting in the proxy: held for a first replica or queued for a slot
//	ferry_requests_queued{service}                       of those, the ones queued for a slot on a full replica (late binding, slots.go)
//	ferry_slot_wait_seconds{service}                     how long each queued request waited for its slot (or gave up)
//	ferry_requests_waiting_by_class{service,class}       ferry_requests_waiting by priority class (interactive, standard, batch: queue.go)
//	ferry_requests_shed_total{service,class,reason}      waiting requests answered 503 by the line: evicted for a higher class or a lighter tenant, queue_full, wait_expired
//	ferry_retries_total{service}                         attempts on another replica after a failed one
//	ferry_upstream_errors_total{service,replica,kind}    kind: dial, pool_full, reset, timeout, status_5xx, stream_cut
//	ferry_prompt_tokens_total{service}                   from the "usage" a 2xx response reports
//	ferry_completion_tokens_total{service}
//	ferry_cached_prompt_tokens_total{service}            of the prompt tokens, those the engine's prefix cache held (usage.prompt_tokens_details.cached_tokens)
//	ferry_gateway_errors_total{code,reason}              requests the gateway answered before choosing a service
//	ferry_replica_ejections_total{service}               replicas the health checks took out of rotation (healthmetrics.go)
//	ferry_replicas_ejected{service}                      replicas out of rotation now
//
// One Metrics serves every Service of a process (a controller runs many services, a gateway
// fronts them all): create it once with NewMetrics and pass it in ServiceConfig.Metrics.
//
// The request path does no label lookups. A Service resolves its series once in NewService, and
// a replica's when it first appears in SetBackends, caching them next to the replica's upstream
// client. Counts by status code are plain atomics exported by a collector, so counting a
// request is one atomic add (BenchmarkCountRequest: 6 ns, against 78 ns and an allocation for a
// CounterVec lookup with the code's label). Series are reference-counted per service and per replica: Services
// that share a name (an old one draining while its replacement serves) share series, a removed
// replica's series go once its last request has finished, and a service's once its last Service
// is shut down, so a long-lived process's /metrics does not grow with replica churn.
type Metrics struct {
	duration         *prometheus.HistogramVec
	ttft             *prometheus.HistogramVec
	tpot             *prometheus.HistogramVec
	inFlight         *prometheus.GaugeVec
	waiting          *prometheus.GaugeVec
	queued           *prometheus.GaugeVec
	slotWait         *prometheus.HistogramVec
	waitingByClass   *prometheus.GaugeVec
	shed             *prometheus.CounterVec
	retries          *prometheus.CounterVec
	clientAborts     *prometheus.CounterVec
	promptTokens     *prometheus.CounterVec
	completionTokens *prometheus.CounterVec
	cachedTokens     *prometheus.CounterVec
	tokenize         *prometheus.HistogramVec
	gatewayErrors    *prometheus.CounterVec
	// Per LoRA adapter (adapterLabel bounds their number).
	adapterRequests *prometheus.CounterVec
	adapterTTFT     *prometheus.HistogramVec
	adapterLoads    *prometheus.CounterVec
	// prefill times the prefill steps of disaggregated requests (pd.go).
	prefill      *prometheus.HistogramVec
	requestsDesc *prometheus.Desc
	errorsDesc   *prometheus.Desc
	health       *healthMetrics // healthmetrics.go

	mu       sync.Mutex
	services map[string]*serviceMetrics
	replicas map[replicaKey]*replicaMetrics
}

// NewMetrics creates Ferry's proxy metrics and registers them with reg. It fails if any is
// already registered there (a second Metrics on the same registry would report every series
// twice); nothing stays registered then.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ferry_request_duration_seconds",
			Help:    "Time from receiving a request to the end of its response, streams included.",
			Buckets: durationBuckets,
		}, []string{"service"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ferry_time_to_first_token_seconds",
			Help: "Time from receiving a request to the first response body byte from the replica, " +
				"for 2xx responses; for non-streaming requests it is the time to first byte.",
			Buckets: ttftBuckets,
		}, []string{"service"}),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ferry_time_per_output_token_seconds",
			Help: "For a whole 2xx event stream: the time from its first body byte to its end, over its output " +
				"tokens after the first (the usage it reports, else one per data event).",
			Buckets: tpotBuckets,
		}, []string{"service"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_requests_in_flight",
			Help: "Requests sent to a replica whose response has not finished streaming.",
		}, []string{"service"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_requests_waiting",
			Help: "Requests waiting in the proxy: held while the service has no ready replica (scale from zero), " +
				"or queued for a slot (ferry_requests_queued); " +
				"those refused for a full queue or an expired wait count in ferry_requests_total as 503 with replica=\"none\".",
		}, []string{"service"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ferry_requests_queued",
			Help: "Requests queued for a free slot while every replica is at its in-flight cap (late binding); " +
				"they also count in ferry_requests_waiting.",
		}, []string{"service"}),
		slotWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "ferry_slot_wait_seconds",
			Help: "Time each request queued for a free slot (late binding) spent in the queue, until granted a slot or given up; " +
				"its count over ferry_requests_total is how often the proxy held requests.",
			Buckets: ttftBuckets,
		}, []string{"service"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_retries_total",
			Help: "Attempts on another replica after a failed one (see ServiceConfig.MaxAttempts).",
		}, []string{"service"}),
		clientAborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_client_aborts_total",
			Help: "Requests whose client closed its connection while waiting for the response; the proxy closed the replica's connection so that it stops generating.",
		}, []string{"service"}),
		gatewayErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ferry_gateway_errors_total",
			Help: "Requests the shared gateway answered itself, before any service: unknown model, no model, bad JSON, unknown path.",
		}, []string{"code", "reason"}),
		requestsDesc: prometheus.NewDesc("ferry_requests_total",
			`Finished requests by final status code and the replica that answered ("none": the proxy answered itself).`,
			[]string{"service", "replica", "code"}, nil),
		errorsDesc: prometheus.NewDesc("ferry_upstream_errors_total",
			"Failed attempts and broken responses by replica and kind (dial, pool_full, reset, timeout, status_5xx, stream_cut).",
			[]string{"service", "replica", "kind"}, nil),
		services: map[string]*serviceMetrics{},
		replicas: map[replicaKey]*replicaMetrics{},
		health:   newHealthMetrics(),
	}
	m.newTokenMetrics()
	m.newQueueMetrics()
	m.newAdapterMetrics()
	m.newPrefillMetrics()
	collectors := []prometheus.Collector{m.duration, m.ttft, m.tpot, m.inFlight, m.waiting, m.queued, m.slotWait, m.retries, m.clientAborts, m.promptTokens,
		m.waitingByClass, m.shed, m.completionTokens, m.cachedTokens, m.tokenize, m.gatewayErrors, replicaCollector{m}, m.health,
		m.adapterRequests, m.adapterTTFT, m.adapterLoads, m.prefill}
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("registering ferry proxy metrics: %w", err)
		}
	}
	return m, nil
}

// newQueueMetrics creates the series of waiting requests by priority class (queue.go).
func (m *Metrics) newQueueMetrics() {
	m.waitingByClass = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ferry_requests_waiting_by_class",
		Help: "ferry_requests_waiting by the requests' priority class: interactive, standard or batch (a key's class, or x-ferry-priority).",
	}, []string{"service", "class"})
	m.shed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_requests_shed_total",
		Help: "Requests that waited or asked to wait in the proxy and were answered 503 with Retry-After, by priority class and reason: " +
			"evicted (taken out of a full queue for a request of a higher class or of a tenant with fewer waiting), " +
			"queue_full (max_queued_requests waited and none could be evicted), wait_expired (max_queue_wait passed).",
	}, []string{"service", "class", "reason"})
}

// newTokenMetrics creates the series about tokens: those the answers' usage reports, and the
// round trips that tokenize prompts (tokenize.go).
func (m *Metrics) newTokenMetrics() {
	m.promptTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_prompt_tokens_total",
		Help: "Prompt tokens reported in the usage of successful responses.",
	}, []string{"service"})
	m.completionTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_completion_tokens_total",
		Help: "Completion tokens reported in the usage of successful responses.",
	}, []string{"service"})
	m.cachedTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_cached_prompt_tokens_total",
		Help: "Prompt tokens the engine found in its prefix cache, as successful responses report them (usage.prompt_tokens_details.cached_tokens); divided by ferry_prompt_tokens_total of the same responses, the prefix-cache hit rate routing achieved.",
	}, []string{"service"})
	m.tokenize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ferry_tokenize_duration_seconds",
		Help:    "Round trips to a replica's /tokenize for a request's token ids, made before the pick when the engines report their KV caches, by result (ok, or failed: the request was matched by bytes instead).",
		Buckets: ttftBuckets,
	}, []string{"service", "result"})
}

// serviceMetrics are one service's resolved series. The fields other than refs are immutable.
type serviceMetrics struct {
	m                *Metrics
	name             string
	refs             int // guarded by m.mu
	duration         prometheus.Observer
	ttft             prometheus.Observer
	tpot             prometheus.Observer
	inFlight         prometheus.Gauge
	waiting          prometheus.Gauge
	queued           prometheus.Gauge
	slotWait         prometheus.Observer
	waitingByClass   [numClasses]prometheus.Gauge
	shed             [numClasses][numShedReasons]prometheus.Counter
	retries          prometheus.Counter
	clientAborts     prometheus.Counter
	promptTokens     prometheus.Counter
	completionTokens prometheus.Counter
	cachedTokens     prometheus.Counter
	tokenizeOK       prometheus.Observer
	tokenizeFailed   prometheus.Observer
	// none counts the requests the proxy answered itself.
	none *replicaMetrics
}

func (m *Metrics) acquireService(name string) *serviceMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sm := m.services[name]; sm != nil {
		sm.refs++
		return sm
	}
	sm := &serviceMetrics{
		m:                m,
		name:             name,
		refs:             1,
		duration:         m.duration.WithLabelValues(name),
		ttft:             m.ttft.WithLabelValues(name),
		tpot:             m.tpot.WithLabelValues(name),
		inFlight:         m.inFlight.WithLabelValues(name),
		waiting:          m.waiting.WithLabelValues(name),
		queued:           m.queued.WithLabelValues(name),
		slotWait:         m.slotWait.WithLabelValues(name),
		retries:          m.retries.WithLabelValues(name),
		clientAborts:     m.clientAborts.WithLabelValues(name),
		promptTokens:     m.promptTokens.WithLabelValues(name),
		completionTokens: m.completionTokens.WithLabelValues(name),
		cachedTokens:     m.cachedTokens.WithLabelValues(name),
		tokenizeOK:       m.tokenize.WithLabelValues(name, "ok"),
		tokenizeFailed:   m.tokenize.WithLabelValues(name, "failed"),
		none:             m.acquireReplicaLocked(name, replicaNone),
	}
	for c, class := range classNames {
		sm.waitingByClass[c] = m.waitingByClass.WithLabelValues(name, class)
		for r, reason := range shedReasonNames {
			sm.shed[c][r] = m.shed.WithLabelValues(name, class, reason)
		}
	}
	m.services[name] = sm
	return sm
}

// release drops a reference; the last one deletes the service's series. Handles still held by
// requests that outlive it keep working but are no longer exported.
func (sm *serviceMetrics) release() {
	m := sm.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if sm.refs--; sm.refs > 0 {
		return
	}
	delete(m.services, sm.name)
	for _, vec := range []interface{ DeleteLabelValues(...string) bool }{
		m.duration, m.ttft, m.tpot, m.inFlight, m.waiting, m.queued, m.retries, m.clientAborts, m.promptTokens, m.completionTokens,
		m.cachedTokens, m.slotWait,
	} {
		vec.DeleteLabelValues(sm.name)
	}
	for _, vec := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.tokenize, m.adapterRequests, m.adapterTTFT, m.adapterLoads, m.prefill, m.waitingByClass, m.shed} {
		vec.DeletePartialMatch(prometheus.Labels{"service": sm.name})
	}
	sm.none.releaseLocked()
}

// observe records one finished request's service-level figures; ttft and tpot < 0 mean none, and
// a negative token count means the response did not report it.
func (sm *serviceMetrics) observe(duration, ttft, tpot time.Duration, usage tokenUsage) {
	sm.duration.Observe(duration.Seconds())
	if ttft >= 0 {
		sm.ttft.Observe(ttft.Seconds())
	}
	if tpot >= 0 {
		sm.tpot.Observe(tpot.Seconds())
	}
	if usage.prompt >= 0 {
		sm.promptTokens.Add(float64(usage.prompt))
	}
	if usage.completion >= 0 {
		sm.completionTokens.Add(float64(usage.completion))
	}
	if usage.cached >= 0 {
		sm.cachedTokens.Add(float64(usage.cached))
	}
}

// upstreamErrorKind classifies what went wrong with a replica, for ferry_upstream_errors_total
// and the access log.
type upstreamErrorKind uint8

const (
	noUpstreamError   upstreamErrorKind = iota
	upstreamDial                        // could not connect: the request never left the proxy
	upstreamPoolFull                    // the replica's connection pool was at its limit
	upstreamReset                       // the connection broke before a whole response header arrived
	upstreamTimeout                     // the idle deadline fired, before the header or mid-body
	upstreamStatus5xx                   // the replica answered 5xx (passed on, or retried elsewhere)
	upstreamStreamCut                   // the body broke off after the header (not a timeout)
	numUpstreamErrorKinds
)

var upstreamErrorKindNames = [numUpstreamErrorKinds]string{
	"", "dial", "pool_full", "reset", "timeout", "status_5xx", "stream_cut",
}

func (k upstreamErrorKind) String() string { return upstreamErrorKindNames[k] }

// attemptErrorKind classifies a failed attempt: an error from sending the request and reading the
// response header, or a statusError for a 5xx answer retried on another replica.
func attemptErrorKind(err error) upstreamErrorKind {
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return upstreamPoolFull
	case errors.As(err, new(*dialError)):
		return upstreamDial
	case errors.As(err, new(*statusError)):
		return upstreamStatus5xx
	case isTimeout(err):
		return upstreamTimeout
	default:
		return upstreamReset
	}
}

// maxStatusCode bounds the per-code counters; codes outside [100, maxStatusCode) are counted
// under "other" (a replica sending nonsense).
const maxStatusCode = 600

// statusLabels are the code label values, rendered once instead of at every scrape.
var statusLabels = func() (labels [maxStatusCode]string) {
	labels[0] = "other"
	for code := 100; code < maxStatusCode; code++ {
		labels[code] = strconv.Itoa(code)
	}
	return labels
}()

type replicaKey struct{ service, replica string }

// replicaMetrics are one replica's counters (or a service's "none" pseudo-replica). They are
// atomics indexed by status code and error kind, so counting needs no label lookup and no
// lazily created series; replicaCollector exports the non-zero ones.
type replicaMetrics struct {
	m    *Metrics
	key  replicaKey
	refs int // guarded by m.mu

	codes  [maxStatusCode]atomic.Uint64
	errors [numUpstreamErrorKinds]atomic.Uint64
}

func (m *Metrics) acquireReplica(service string, id int) *replicaMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.acquireReplicaLocked(service, strconv.Itoa(id))
}

func (m *Metrics) acquireReplicaLocked(service, replica string) *replicaMetrics {
	key := replicaKey{service, replica}
	rm := m.replicas[key]
	if rm == nil {
		rm = &replicaMetrics{m: m, key: key}
		m.replicas[key] = rm
	}
	rm.refs++
	return rm
}

// release drops a reference; the last one deletes the replica's series.
func (rm *replicaMetrics) release() {
	rm.m.mu.Lock()
	defer rm.m.mu.Unlock()
	rm.releaseLocked()
}

func (rm *replicaMetrics) releaseLocked() {
	if rm.refs--; rm.refs == 0 {
		delete(rm.m.replicas, rm.key)
	}
}

func (rm *replicaMetrics) countRequest(status int) {
	if status < 100 || status >= maxStatusCode {
		status = 0
	}
	rm.codes[status].Add(1)
}

func (rm *replicaMetrics) countError(kind upstreamErrorKind) {
	if kind != noUpstreamError {
		rm.errors[kind].Add(1)
	}
}

// replicaCollector exports the per-replica counters of every live replicaMetrics: each replica's
// non-zero status codes, and every error kind (zeros included, so that rate() sees the first
// error of a replica).
type replicaCollector struct{ m *Metrics }

var _ prometheus.Collector = replicaCollector{}

func (c replicaCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.requestsDesc
	ch <- c.m.errorsDesc
}

func (c replicaCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	live := make([]*replicaMetrics, 0, len(m.replicas))
	for _, rm := range m.replicas {
		live = append(live, rm)
	}
	m.mu.Unlock()

	for _, rm := range live {
		for code := range rm.codes {
			if n := rm.codes[code].Load(); n > 0 {
				ch <- prometheus.MustNewConstMetric(m.requestsDesc, prometheus.CounterValue, float64(n),
					rm.key.service, rm.key.replica, statusLabels[code])
			}
		}
		if rm.key.replica == replicaNone {
			continue
		}
		for kind := noUpstreamError + 1; kind < numUpstreamErrorKinds; kind++ {
			ch <- prometheus.MustNewConstMetric(m.errorsDesc, prometheus.CounterValue,
				float64(rm.errors[kind].Load()), rm.key.service, rm.key.replica, kind.String())
		}
	}
}

// AdminHandler serves a Ferry process's admin endpoints from g: GET /metrics in the Prometheus
// text or OpenMetrics format, GET /healthz, which answers 200 "ok" while the process serves
// HTTP at all (liveness), and GET /readyz, what ready reports (readiness.go; nil: always
// ready). Mount it on its own listener, loopback or a private network: metrics name services
// and traffic volumes that the proxy's clients should not see, and a scrape must keep working
// while the traffic listener is saturated.
//
// It is a net/http handler, not fasthttp: promhttp is net/http (content negotiation,
// compression), and an admin listener's few requests a minute gain nothing from fasthttp.
// Gathering errors fail the scrape with a 500 rather than serve partial data, so a broken
// collector shows up as a down target instead of as silently missing series.
//
// A non-empty token protects /metrics with "Authorization: Bearer TOKEN" (admin.go);
// /healthz and /readyz stay open.
func AdminHandler(g prometheus.Gatherer, token string, ready *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", requireBearer(token, promhttp.HandlerFor(g, promhttp.HandlerOpts{})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", ready.serveHTTP)
	return mux
}

// NewRegistry returns a registry for one Ferry process with the Go runtime and process
// collectors and a Metrics for its services. It is not prometheus.DefaultRegisterer, so nothing a
// dependency registers globally reaches /metrics, and tests can run processes side by side.
func NewRegistry() (*prometheus.Registry, *Metrics, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, fmt.Errorf("registering Go metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, fmt.Errorf("registering process metrics: %w", err)
	}
	m, err := NewMetrics(reg)
	if err != nil {
		return nil, nil, err
	}
	return reg, m, nil
}

// ServeAdmin serves AdminHandler(g, token, ready) on ln until the returned stop is called.
// Timeouts are short: a scrape is one small request a few times a minute, so no client may hold
// a connection long, while Prometheus's keep-alive connection between scrapes (15–60 s apart)
// survives the idle timeout. Accept errors that pass (out of file descriptors, say) are waited
// out, as on the traffic listeners (accept.go), so metrics come back with the descriptors. stop
// lets a scrape in progress finish until ctx ends, then closes the listener and waits for the
// server to be gone, so the address is free on return.
func ServeAdmin(ln net.Listener, g prometheus.Gatherer, token string, ready *Readiness, log *zap.Logger) (stop func(context.Context)) {
	srv := &http.Server{
		Handler:           AdminHandler(g, token, ready),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          zap.NewStdLog(log),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(newRetryingListener(ln, log)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", zap.Error(err))
		}
	}()
	return func(ctx context.Context) {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		<-done
	}
}

// observability is what a Service records about its requests: metrics handles and the access
// log, resolved once in NewService. The zero value records nothing, and the request path then
// pays one nil check per hook.
type observability struct {
	metrics   *serviceMetrics // nil without ServiceConfig.Metrics
	accessLog *zap.Logger     // nil without ServiceConfig.AccessLog; sampled, service attached
	// refusedLog is accessLog with a sampler of its own, for refused API keys (accesslog.go).
	refusedLog *zap.Logger
	released   bool // guarded by Service.mu: Shutdown has dropped the metrics references
}

func newObservability(cfg ServiceConfig) observability {
	var o observability
	if cfg.Metrics != nil {
		o.metrics = cfg.Metrics.acquireService(cfg.Name)
	}
	if cfg.AccessLog != nil {
		o.accessLog = newAccessLogger(cfg.AccessLog, cfg.Name)
		o.refusedLog = newAccessLogger(cfg.AccessLog, cfg.Name)
	}
	return o
}

func (o *observability) on() bool { return o.metrics != nil || o.accessLog != nil }

// waitBegin and waitEnd bracket a request of class held for a replica or a slot (queue.go).
func (o *observability) waitBegin(class tenants.Priority) {
	if o.metrics != nil {
		o.metrics.waiting.Inc()
		o.metrics.waitingByClass[classIndex(class)].Inc()
	}
}

func (o *observability) waitEnd(class tenants.Priority) {
	if o.metrics != nil {
		o.metrics.waiting.Dec()
		o.metrics.waitingByClass[classIndex(class)].Dec()
	}
}

// shed counts a request of class answered 503 by the line for reason (shedEvicted...).
func (o *observability) shed(class tenants.Priority, reason int) {
	if o.metrics != nil {
		o.metrics.shed[classIndex(class)][reason].Inc()
	}
}

// queueBegin and queueEnd bracket a request queued for a slot (slots.go), within waitBegin/End;
// queueEnd takes what queueBegin returned.
func (o *observability) queueBegin() time.Time {
	if o.metrics == nil {
		return time.Time{}
	}
	o.metrics.queued.Inc()
	return time.Now()
}

func (o *observability) queueEnd(since time.Time) {
	if o.metrics != nil {
		o.metrics.queued.Dec()
		o.metrics.slotWait.Observe(time.Since(since).Seconds())
	}
}

// observeTokenize records a /tokenize round trip (tokenize.go).
func (o *observability) observeTokenize(took time.Duration, err error) {
	switch {
	case o.metrics == nil:
	case err == nil:
		o.metrics.tokenizeOK.Observe(took.Seconds())
	default:
		o.metrics.tokenizeFailed.Observe(took.Seconds())
	}
}

// trackReplica points c's metrics at replica id, taking a reference on its series when c is new
// or its address has been taken over by another replica id. SetBackends calls it under s.mu.
func (s *Service) trackReplica(c *hostClient, id int) {
	sm := s.obs.metrics
	if sm == nil {
		return
	}
	if cur := c.metrics.Load(); cur != nil && cur.key.replica == strconv.Itoa(id) {
		return
	}
	if old := c.metrics.Swap(sm.m.acquireReplica(sm.name, id)); old != nil {
		old.release() // requests still holding it count into series no longer exported
	}
}

// dropMetrics releases the client's replica series. It runs when a retired client's last
// request has finished (so the final counts of a removed replica's streams are recorded first),
// and at Shutdown.
func (c *hostClient) dropMetrics() {
	if rm := c.metrics.Swap(nil); rm != nil {
		rm.release()
	}
}

// releaseMetrics drops the Service's references to its series, once; Shutdown defers it, so
// requests finishing during the drain are still counted.
func (s *Service) releaseMetrics() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obs.metrics == nil || s.obs.released {
		return
	}
	s.obs.released = true
	for _, c := range s.snap.Load().clients {
		c.dropMetrics()
	}
	s.obs.metrics.release()
}

// exchangeObs is what one exchange records for metrics and the access log. It lives in the pooled
// exchange, so recording allocates nothing.
type exchangeObs struct {
	// start is when the request was received (fasthttp's handler call time); the first body
	// byte's time is exchange.firstAt.
	start    time.Time
	attempts int
	bytesOut int64
	// events counts "data:" fields of an event stream: one per decode step as vLLM and TGI
	// stream by default, the token count when the stream reports no usage.
	events    int64
	replica   *replicaMetrics   // series of the replica being tried; nil without Metrics
	lastError upstreamErrorKind // of the last failed attempt
	// method, uri and clientIP are copied for the access log: fasthttp may reset the client
	// request before a stream ends.
	method, uri []byte
	clientIP    netip.Addr
	tail        usageTail
}

// reset readies o for the next request, keeping its buffers.
func (o *exchangeObs) reset() {
	o.start = time.Time{}
	o.attempts, o.bytesOut, o.events = 0, 0, 0
	o.replica, o.lastError = nil, noUpstreamError
	o.method, o.uri, o.clientIP = o.method[:0], o.uri[:0], netip.Addr{}
	o.tail.n = 0
}

// observeRequest starts the clock and notes what the access log needs of the client request.
func (ex *exchange) observeRequest(ctx *fasthttp.RequestCtx) {
	o := &ex.obs
	o.start = ctx.Time()
	if ex.svc.obs.accessLog != nil {
		o.method = append(o.method[:0], ctx.Method()...)
		o.uri = appendLoggedURI(o.uri[:0], ctx.Request.Header.RequestURI())
		o.clientIP = clientAddr(ctx)
	}
}

// observeBegin counts an attempt on the replica behind c; attempts after the first are retries.
func (ex *exchange) observeBegin(c *hostClient) {
	o := &ex.obs
	o.attempts++
	sm := ex.svc.obs.metrics
	if sm == nil {
		return
	}
	o.replica = c.metrics.Load()
	sm.inFlight.Inc()
	if o.attempts > 1 {
		sm.retries.Inc()
	}
}

// observeEnd undoes observeBegin's in-flight count.
func (ex *exchange) observeEnd() {
	if sm := ex.svc.obs.metrics; sm != nil {
		sm.inFlight.Dec()
	}
}

// observeAttemptFailed counts a failed attempt (no response header) against its replica.
func (ex *exchange) observeAttemptFailed(err error) {
	if ex.trace != nil {
		ex.trace.attemptFailed(err)
	}
	if !ex.svc.obs.on() {
		return
	}
	kind := attemptErrorKind(err)
	ex.obs.lastError = kind
	if rm := ex.obs.replica; rm != nil {
		rm.countError(kind)
	}
}

// observeRead notes body bytes passing from the replica to the client: the count, and the tail
// that may hold the response's token usage (Read notes the first one's time, exchange.firstAt).
func (ex *exchange) observeRead(p []byte) {
	if len(p) == 0 {
		return
	}
	if !ex.svc.obs.on() {
		if ex.svc.learner != nil || ex.countsEvents() || ex.trace != nil { // they read the engine's reported usage
			ex.obs.tail.write(p)
		}
		if ex.sse && ex.countsEvents() {
			ex.obs.events += int64(bytes.Count(p, sseData))
		}
		return
	}
	o := &ex.obs
	o.bytesOut += int64(len(p))
	if ex.sse {
		// A field split across two reads is missed; replicas write an event per write.
		o.events += int64(bytes.Count(p, sseData))
	}
	o.tail.write(p)
}

// observeFinish records a request a replica answered, once its response has ended; err is
// fasthttp's, non-nil when the client did not get the whole body; usage is what a 2xx answer
// reported (finish parses it once for this and the learner).
func (ex *exchange) observeFinish(err error, usage tokenUsage) {
	so := &ex.svc.obs
	if !so.on() {
		return
	}
	o := &ex.obs
	status := ex.resp.StatusCode()
	duration := sinceStart(o.start)
	ttft := time.Duration(-1)
	if status >= 200 && status < 300 {
		if !ex.firstAt.IsZero() && !o.start.IsZero() {
			ttft = ex.firstAt.Sub(o.start)
		}
	}
	streamErr := noUpstreamError
	if ex.readErr != nil {
		streamErr = upstreamStreamCut
		if isTimeout(ex.readErr) {
			streamErr = upstreamTimeout
		}
	}

	if sm := so.metrics; sm != nil {
		tpot := time.Duration(-1)
		if ttft >= 0 && ex.sse && err == nil && streamErr == noUpstreamError {
			tpot = timePerOutputToken(duration-ttft, usage.completion, o.events)
		}
		sm.observe(duration, ttft, tpot, usage)
		if a := ex.info.Adapter; a != 0 {
			sm.observeAdapter(adapterLabel(a, ex.info.Model), ttft, ex.info.Estimate.AdapterLoad)
		}
		if rm := o.replica; rm != nil {
			rm.countRequest(status)
			if status >= 500 {
				rm.countError(upstreamStatus5xx)
			}
			rm.countError(streamErr)
		}
	}
	if so.accessLog != nil {
		problem := streamErr.String()
		if streamErr == noUpstreamError && err != nil {
			problem = "client_closed"
		}
		so.logAccess(&accessRecord{
			requestID: ex.requestID, method: o.method, uri: o.uri, clientIP: o.clientIP,
			status: status, replicaID: ex.replica.ID, attempts: o.attempts,
			duration: duration, ttft: ttft, bytesOut: o.bytesOut, usage: usage, problem: problem,
		})
	}
}

// answeredSelf finishes a response the proxy wrote itself (writeError) from Handler: it makes
// sure the response carries a request id, then counts the request under replica "none" and logs
// it. ex is the request's exchange if it still holds one (every attempt failed), else nil.
func (s *Service) answeredSelf(ctx *fasthttp.RequestCtx, ex *exchange) {
	s.recordSelfAnswer(ctx, ex, ctx.Time(), false)
}

// rejectedRequest is answeredSelf for a request fasthttp could not read (ErrorHandler). The
// handler never ran, so there is no start time and the duration is not observed.
func (s *Service) rejectedRequest(ctx *fasthttp.RequestCtx) {
	s.recordSelfAnswer(ctx, nil, time.Time{}, false)
}

// recordSelfAnswer counts and logs a request the proxy answered itself; unauthorized marks a
// refused API key, whose log line is sampled apart.
func (s *Service) recordSelfAnswer(ctx *fasthttp.RequestCtx, ex *exchange, start time.Time, unauthorized bool) {
	id := ctx.Response.Header.PeekBytes(headerXRequestID)
	if len(id) == 0 {
		if id = ctx.Request.Header.PeekBytes(headerXRequestID); !saneRequestID(id) {
			var buf [40]byte
			ctx.Response.Header.SetBytesKV(headerXRequestID, appendRequestID(buf[:0]))
		} else {
			ctx.Response.Header.SetBytesKV(headerXRequestID, id)
		}
		// The header's own copy: buf stays on the stack, so a refusal allocates nothing.
		id = ctx.Response.Header.PeekBytes(headerXRequestID)
	}
	if !s.obs.on() {
		return
	}
	status := ctx.Response.StatusCode()
	duration := sinceStart(start)
	if sm := s.obs.metrics; sm != nil {
		sm.none.countRequest(status)
		if !start.IsZero() {
			sm.duration.Observe(duration.Seconds())
		}
	}
	if s.obs.accessLog != nil {
		rec := accessRecord{
			requestID: id, method: ctx.Method(), uri: ctx.Request.Header.RequestURI(),
			clientIP: clientAddr(ctx), status: status, replicaID: -1, duration: duration, ttft: -1,
			bytesOut: int64(len(ctx.Response.Body())), usage: unknownUsage, unauthorized: unauthorized,
		}
		if ex != nil {
			rec.attempts, rec.problem = ex.obs.attempts, ex.obs.lastError.String()
		}
		s.obs.logAccess(&rec)
	}
}

// sseData starts an event stream's data field ("data: [DONE]" included).
var sseData = []byte("data:")

// timePerOutputToken is vLLM's TPOT: the decode time after the first token over the tokens
// after it. completion is the usage the stream reported (< 0: none); without it, every data
// event but the closing [DONE] counts as a token. -1 when fewer than two tokens came.
func timePerOutputToken(decode time.Duration, completion, events int64) time.Duration {
	tokens := completion
	if tokens < 0 {
		tokens = events - 1
	}
	if tokens < 2 || decode < 0 {
		return -1
	}
	return decode / time.Duration(tokens-1)
}

func sinceStart(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return time.Since(start)
}
