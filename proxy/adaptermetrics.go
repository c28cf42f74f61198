package proxy

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxAdapterLabels bounds the adapters with series of their own per service; requests for the
// others count under adapter="other", so a service with thousands of adapters cannot blow up
// the proxy's series.
const maxAdapterLabels = 256

// adapterLabel is the adapter label of a request for adapter a (Adapters' number plus one).
func adapterLabel(a int32, model []byte) string {
	if a > maxAdapterLabels {
		return "other"
	}
	return string(model)
}

func (m *Metrics) newAdapterMetrics() {
	m.adapterRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_adapter_requests_total",
		Help: "Requests that named a LoRA adapter, by adapter and whether routing sent them where the adapter had to be loaded (swap=\"true\").",
	}, []string{"service", "adapter", "swap"})
	m.adapterTTFT = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ferry_adapter_time_to_first_token_seconds",
		Help:    "Time to first token of successful requests that named a LoRA adapter, by adapter.",
		Buckets: ttftBuckets,
	}, []string{"service", "adapter"})
	m.adapterLoads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ferry_adapter_loads_total",
		Help: "LoRA adapters the proxy registered on a replica (service.adapters.load: on_demand), by adapter and result (ok, failed).",
	}, []string{"service", "adapter", "result"})
}

// newPrefillMetrics creates the series of disaggregated prefill (pd.go).
func (m *Metrics) newPrefillMetrics() {
	m.prefill = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ferry_prefill_duration_seconds",
		Help:    "Prefill steps of disaggregated requests on a prefill replica, by result (ok; failed: another prefill replica or the decode replica prefilled instead).",
		Buckets: ttftBuckets,
	}, []string{"service", "result"})
}

// observePrefill records one prefill step.
func (s *Service) observePrefill(took time.Duration, err error) {
	sm := s.obs.metrics
	if sm == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "failed"
	}
	sm.m.prefill.WithLabelValues(sm.name, result).Observe(took.Seconds())
}

// observeAdapter counts one finished request for adapter; ttft < 0 means none.
func (sm *serviceMetrics) observeAdapter(adapter string, ttft time.Duration, swap bool) {
	m := sm.m
	m.adapterRequests.WithLabelValues(sm.name, adapter, strconv.FormatBool(swap)).Inc()
	if ttft >= 0 {
		m.adapterTTFT.WithLabelValues(sm.name, adapter).Observe(ttft.Seconds())
	}
}

// countAdapterLoad counts one on-demand load of adapter.
func (s *Service) countAdapterLoad(a int32, name string, err error) {
	sm := s.obs.metrics
	if sm == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "failed"
	}
	sm.m.adapterLoads.WithLabelValues(sm.name, adapterLabel(a, []byte(name)), result).Inc()
}
