//go:build !race

package proxy

import (
	"context"
	"net"
	"slices"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/tenants"
)

// tenancyBudget is what a request with a managed key (looked up, scoped, admitted against
// per-minute and per-day limits of key and team, priced, settled from the answer's usage, its
// windows in six x-ratelimit-* headers) may cost in CPU over the same request with a key of the
// service's own (what the gateway did before managed keys). Measured in one run, alternating
// rounds, median judged, as TestHotPathWithinBudget does. Here the client and the replica share
// the process with the proxy, and the client's parsing of the six headers counts too: measured
// 1.11–1.21× on 2026-11-30. Issue 41's bar (at most 10 % more) is the proxy's own CPU, which
// bench/tenants' CPU phase measures out of process (1.057–1.064× there, two proxies at once);
// this guard stands at 1.35×, so that the ledger's cost doubling crosses it.
const tenancyBudget = 1.35

func TestTenancyWithinBudget(t *testing.T) {
	replica := fasthttputil.NewInmemoryListener()
	upstream := &fasthttp.Server{Handler: nonStreamHandler}
	go func() { _ = upstream.Serve(replica) }()
	t.Cleanup(func() { _ = upstream.Shutdown() })

	tn := NewTenancy(nil)
	secret, err := tenants.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	big := tenants.Limits{RequestsPerMinute: 1 << 36, RequestsPerDay: 1 << 38, TotalTokensPerMinute: 1 << 38, TotalTokensPerDay: 1 << 39, BudgetUSD: 1e8}
	tn.SetDirectory(tenants.Directory{Version: 1,
		Keys:   []tenants.Key{{ID: "key_hot", Name: "hot", Team: "t", Hash: tenants.HashSecret(secret), Limits: big}},
		Teams:  []tenants.Team{{Name: "t", Limits: big}},
		Prices: map[string]tenants.Price{"llama": {InputPerMillion: 1, OutputPerMillion: 2}}})

	serve := func(cfg ServiceConfig) *fasthttp.HostClient {
		cfg.Name, cfg.Logger = "tenancy", zap.NewNop()
		svc, err := NewService(cfg)
		if err != nil {
			t.Fatal(err)
		}
		svc.dial = func(string) (net.Conn, error) { return replica.Dial() }
		svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
		ln := fasthttputil.NewInmemoryListener()
		go func() { _ = svc.Serve(ln) }()
		t.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
		return memClient(ln)
	}
	// Off is the gateway before managed keys: the same request with a key of the service's own.
	const ownKey = "sk-own-key-0123456789abcdef0123456789ab"
	off := serve(ServiceConfig{APIKeyHashes: []string{hashKey(ownKey)}})
	on := serve(ServiceConfig{Tenancy: tn, APIKeyHashes: []string{}})
	keyed := func(req *fasthttp.Request) { req.Header.Set("Authorization", "Bearer "+secret) }
	owned := func(req *fasthttp.Request) { req.Header.Set("Authorization", "Bearer "+ownKey) }

	hotPathCostWith(t, off, 2000, owned)
	hotPathCostWith(t, on, 2000, keyed)
	var ratios []float64
	for range hotPathRounds {
		o := hotPathCostWith(t, off, hotPathRequests, owned)
		n := hotPathCostWith(t, on, hotPathRequests, keyed)
		ratios = append(ratios, float64(n.cpu)/float64(o.cpu))
		t.Logf("CPU per request: no tenancy %v, a managed key %v (%.3f×); allocations %.1f and %.1f", o.cpu, n.cpu, ratios[len(ratios)-1], o.allocs, n.allocs)
	}
	slices.Sort(ratios)
	median := ratios[len(ratios)/2]
	t.Logf("median ratio %.3f (budget %.2f)", median, tenancyBudget)
	if median > tenancyBudget {
		t.Errorf("a request with a managed key costs %.3f× one without tenancy (median of %d rounds), over the budget of %.2f×", median, hotPathRounds, tenancyBudget)
	}
	rows := tn.Ledger().Take("p").Rows
	if len(rows) != 1 || rows[0].Requests < int64(hotPathRounds*hotPathRequests) || rows[0].CostMicros == 0 {
		t.Errorf("the ledger's rows %+v: every request charged and priced", rows)
	}
}
