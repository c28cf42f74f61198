package controller

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"
)

// controlPlaneMetrics are the controller's own health, on the same registry as the fleet's,
// so that a slow scale-up can be told apart: waiting on the leader, on the store, on a
// reconcile pass, or on the client-side rate limit in front of the API server.
//
//	ferry_controller_leader                                 1 while this controller leads, 0 while it follows (leaderCollector)
//	ferry_controller_leader_term                            the fencing term it leads with: the Lease's transitions (0 without election; absent while following)
//	ferry_store_write_duration_seconds{store,op}            each store write; store sqlite or kubernetes, op the method (CreateService, SaveReplica, ...)
//	ferry_reconcile_duration_seconds{loop}                  each reconcile pass; loop replicas (a service's replica manager) or ferryservice
//	ferry_kube_client_rate_limiter_wait_seconds{verb}       how long client-go's rate limiter held each request to the API server
//	ferry_kube_client_request_duration_seconds{verb}        each request to the API server as the client saw it (the API server's own time plus the way there and back)
//	ferry_workqueue_depth{queue}                            items waiting in a work queue (ferryservices; 0 where FerryServices are not followed)
type controlPlaneMetrics struct {
	storeWrites *prometheus.HistogramVec
	reconciles  *prometheus.HistogramVec
	queueDepth  *prometheus.GaugeVec
}

// Reconcile loops, the values of ferry_reconcile_duration_seconds's loop label, and the work
// queue of ferry_workqueue_depth's queue label.
const (
	loopReplicas       = "replicas"
	loopFerryServices  = "ferryservice"
	queueFerryServices = "ferryservices"
)

// durationBuckets span a local SQLite write (under a millisecond) to a write or pass that waited
// seconds on a throttled or slow API server (16 s).
var durationBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// registerControlPlane creates the control-plane metrics on reg.
func registerControlPlane(reg prometheus.Registerer, c *Controller) (*controlPlaneMetrics, error) {
	m := &controlPlaneMetrics{
		storeWrites: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_store_write_duration_seconds",
			Help:    "How long each store write took, by store (sqlite, kubernetes) and operation.",
			Buckets: durationBuckets}, []string{"store", "op"}),
		reconciles: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_reconcile_duration_seconds",
			Help:    "How long each reconcile pass took: loop replicas (a service's replica manager) or ferryservice (a FerryService object).",
			Buckets: durationBuckets}, []string{"loop"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_workqueue_depth",
			Help: "Items waiting in a controller work queue."}, []string{"queue"}),
	}
	registerKubeClientMetrics()
	// Every series exists from the start, as ferry_infra_up's do, so that a panel or an
	// alert on a rate does not wait for the first throttled request or the first FerryService.
	m.queueDepth.WithLabelValues(queueFerryServices)
	m.reconciles.WithLabelValues(loopReplicas)
	m.reconciles.WithLabelValues(loopFerryServices)
	for _, verb := range []string{"GET", "POST", "PUT", "PATCH", "DELETE"} {
		kubeClientWait.WithLabelValues(verb)
		kubeClientRequests.WithLabelValues(verb)
	}
	for _, col := range []prometheus.Collector{m.storeWrites, m.reconciles, m.queueDepth, kubeClientWait, kubeClientRequests, leaderCollector{c}} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observeReconcile returns a recorder of loop's passes; nil without metrics (a controller
// whose metrics were never initialized, in tests).
func (m *controlPlaneMetrics) observeReconcile(loop string) func(time.Duration) {
	if m == nil {
		return nil
	}
	h := m.reconciles.WithLabelValues(loop)
	return func(d time.Duration) { h.Observe(d.Seconds()) }
}

// leaderCollector reads the election at each scrape, so that the gauges are never stale
// after a lost Lease.
type leaderCollector struct{ c *Controller }

var (
	leaderDesc = prometheus.NewDesc("ferry_controller_leader",
		"1 while this controller leads (always, without leader election), 0 while it follows.", nil, nil)
	leaderTermDesc = prometheus.NewDesc("ferry_controller_leader_term",
		"The fencing term this controller leads with: the Lease's leader transitions when it took over (0 without leader election). Absent while following.", nil, nil)
)

var _ prometheus.Collector = leaderCollector{}

func (leaderCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leaderDesc
	ch <- leaderTermDesc
}

func (lc leaderCollector) Collect(ch chan<- prometheus.Metric) {
	e := lc.c.opts.Elector
	if e == nil {
		ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, 1)
		ch <- prometheus.MustNewConstMetric(leaderTermDesc, prometheus.GaugeValue, 0)
		return
	}
	term, _, ok := e.Term()
	if !ok {
		ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(leaderTermDesc, prometheus.GaugeValue, float64(term))
}

// kubeClientWait is process-wide, as client-go's metrics hook is: every controller in the
// process (tests run several) registers the same histogram on its registry.
var kubeClientWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_kube_client_rate_limiter_wait_seconds",
	Help:    "How long client-go's client-side rate limiter (--kube-api-qps, --kube-api-burst) held each request to the API server, by verb.",
	Buckets: durationBuckets}, []string{"verb"})

// kubeClientRequests is process-wide too: a slow store write is the request itself when this is
// slow, and the store (or what runs beside it) when only the write is.
var kubeClientRequests = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ferry_kube_client_request_duration_seconds",
	Help:    "How long each request to the API server took as client-go saw it, by verb.",
	Buckets: durationBuckets}, []string{"verb"})

var kubeClientMetricsOnce sync.Once

// registerKubeClientMetrics installs kubeClientWait and kubeClientRequests as client-go's
// latency hooks, which client-go takes once per process (the first Register wins).
func registerKubeClientMetrics() {
	kubeClientMetricsOnce.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{RateLimiterLatency: latencyMetric{kubeClientWait},
			RequestLatency: latencyMetric{kubeClientRequests}})
	})
}

// latencyMetric is a client-go latency hook on h; it drops the URL: it names objects, unbounded
// as a label.
type latencyMetric struct{ h *prometheus.HistogramVec }

func (m latencyMetric) Observe(_ context.Context, verb string, _ url.URL, latency time.Duration) {
	m.h.WithLabelValues(verb).Observe(latency.Seconds())
}

// queueMetricsProvider is the provider of the controller's work queues; nil without metrics
// (client-go's no-op then).
func (m *controlPlaneMetrics) queueMetricsProvider() workqueue.MetricsProvider {
	if m == nil {
		return nil
	}
	return queueMetrics{m.queueDepth}
}

// queueMetrics gives a work queue its depth gauge; the rest of client-go's queue metrics are
// not exported.
type queueMetrics struct{ depth *prometheus.GaugeVec }

var _ workqueue.MetricsProvider = queueMetrics{}

func (q queueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return q.depth.WithLabelValues(name)
}
func (queueMetrics) NewAddsMetric(string) workqueue.CounterMetric           { return noMetric{} }
func (queueMetrics) NewLatencyMetric(string) workqueue.HistogramMetric      { return noMetric{} }
func (queueMetrics) NewWorkDurationMetric(string) workqueue.HistogramMetric { return noMetric{} }
func (queueMetrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (queueMetrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (queueMetrics) NewRetriesMetric(string) workqueue.CounterMetric { return noMetric{} }

// noMetric is a queue metric that is not exported.
type noMetric struct{}

func (noMetric) Inc()            {}
func (noMetric) Set(float64)     {}
func (noMetric) Observe(float64) {}
