package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// healthMetrics exports what the health checks do (healthcheck.go), per service:
//
//	ferry_replica_ejections_total{service}   replicas taken out of rotation by the proxy's health checks
//	ferry_replicas_ejected{service}          replicas out of rotation now
//
// Series are reference-counted like the other per-service series: Services that share a name
// (one draining while its replacement serves) add up into one, and the last one's Shutdown
// deletes them.
type healthMetrics struct {
	ejectionsDesc *prometheus.Desc
	ejectedDesc   *prometheus.Desc

	mu     sync.Mutex
	series map[string]*healthSeries
}

var _ prometheus.Collector = (*healthMetrics)(nil)

func newHealthMetrics() *healthMetrics {
	return &healthMetrics{
		ejectionsDesc: prometheus.NewDesc("ferry_replica_ejections_total",
			"Replicas the proxy took out of rotation because they neither answered its health check nor sent a response byte for the check's timeout.",
			[]string{"service"}, nil),
		ejectedDesc: prometheus.NewDesc("ferry_replicas_ejected",
			"Replicas out of rotation now because of failed health checks (they return after their first answered check).",
			[]string{"service"}, nil),
		series: map[string]*healthSeries{},
	}
}

// healthSeries are one service's health counters.
type healthSeries struct {
	m         *healthMetrics
	name      string
	refs      int // guarded by m.mu
	ejections atomic.Uint64
	ejected   atomic.Int64
}

func (m *healthMetrics) acquire(service string) *healthSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.series[service]
	if s == nil {
		s = &healthSeries{m: m, name: service}
		m.series[service] = s
	}
	s.refs++
	return s
}

// release drops a reference; the last one deletes the service's series.
func (s *healthSeries) release() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(s.m.series, s.name)
	}
}

func (m *healthMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.ejectionsDesc
	ch <- m.ejectedDesc
}

func (m *healthMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	live := make([]*healthSeries, 0, len(m.series))
	for _, s := range m.series {
		live = append(live, s)
	}
	m.mu.Unlock()
	for _, s := range live {
		ch <- prometheus.MustNewConstMetric(m.ejectionsDesc, prometheus.CounterValue, float64(s.ejections.Load()), s.name)
		ch <- prometheus.MustNewConstMetric(m.ejectedDesc, prometheus.GaugeValue, float64(max(s.ejected.Load(), 0)), s.name)
	}
}
