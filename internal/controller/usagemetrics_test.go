package controller

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryserve/ferry/tenants"
)

// TestSyncTenantsCountsUsageInMetrics: what proxies sync reaches the controller's series, with
// models beyond maxUsageModels counted as "other".
func TestSyncTenantsCountsUsageInMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newUsageMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := New(Options{})
	c.usageMetrics = m
	rows := []tenants.Row{{KeyID: "key_a", Service: "s", Model: "llama", Totals: tenants.Totals{Requests: 3, Errors: 1, Input: 300, Output: 90, CostMicros: 1_500_000}}}
	for i := range maxUsageModels + 5 {
		rows = append(rows, tenants.Row{KeyID: "key_b", Service: "s", Model: fmt.Sprint("m", i), Totals: tenants.Totals{Requests: 1, Input: 1}})
	}
	if _, _, err := c.SyncTenants(tenants.SyncRequest{Proxy: "p", Rows: rows}, 0); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(m.tokens.WithLabelValues("key_a", "llama", "output")); v != 90 {
		t.Errorf("output tokens %v, want 90", v)
	}
	if v := testutil.ToFloat64(m.cost.WithLabelValues("key_a")); v != 1.5 {
		t.Errorf("cost %v, want 1.5", v)
	}
	if v := testutil.ToFloat64(m.errors.WithLabelValues("key_a", "llama")); v != 1 {
		t.Errorf("errors %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.requests.WithLabelValues("key_b", "other")); v != 6 {
		t.Errorf("requests of models beyond the bound %v, want 6 (the 64th model on)", v)
	}
	if n := testutil.CollectAndCount(m.requests); n != maxUsageModels+1 {
		t.Errorf("%d request series, want %d", n, maxUsageModels+1)
	}
}
