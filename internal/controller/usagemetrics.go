package controller

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryserve/ferry/tenants"
)

// usageMetrics count the use of managed keys as the hub hears it from every proxy: global
// series, whichever proxy admitted the request. Labels are bounded: keys are the operator's
// (`ferry keys create`), and the models a key names are counted under their own name up to
// maxUsageModels, then as "other", since a key without a model scope may name any.
type usageMetrics struct {
	requests, errors, tokens, cost *prometheus.CounterVec

	mu     sync.Mutex
	models map[string]bool
}

const maxUsageModels = 64

func newUsageMetrics(reg prometheus.Registerer) (*usageMetrics, error) {
	m := &usageMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_tenant_requests_total",
			Help: "Requests of managed API keys, every proxy's, by key id and model."}, []string{"key_id", "model"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_tenant_errors_total",
			Help: "Requests of managed API keys answered with no success (no replica, or not 2xx), by key id and model."}, []string{"key_id", "model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_tenant_tokens_total",
			Help: "Tokens of managed API keys' requests, by key id, model and kind (input: the prompt; output: generated)."}, []string{"key_id", "model", "kind"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_tenant_cost_dollars_total",
			Help: "What managed API keys' requests cost at the models' prices (ferry keys prices), by key id."}, []string{"key_id"}),
		models: map[string]bool{},
	}
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.tokens, m.cost} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// add counts rows of use a proxy synced.
func (m *usageMetrics) add(rows []tenants.Row) {
	if m == nil {
		return
	}
	for i := range rows {
		r := &rows[i]
		model := m.modelLabel(r.Model)
		m.requests.WithLabelValues(r.KeyID, model).Add(float64(max(r.Requests, 0)))
		m.errors.WithLabelValues(r.KeyID, model).Add(float64(max(r.Errors, 0)))
		m.tokens.WithLabelValues(r.KeyID, model, "input").Add(float64(max(r.Input, 0)))
		m.tokens.WithLabelValues(r.KeyID, model, "output").Add(float64(max(r.Output, 0)))
		m.cost.WithLabelValues(r.KeyID).Add(float64(max(r.CostMicros, 0)) / 1e6)
	}
}

func (m *usageMetrics) modelLabel(model string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.models[model] {
		return model
	}
	if len(m.models) >= maxUsageModels {
		return "other"
	}
	m.models[model] = true
	return model
}
