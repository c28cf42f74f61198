package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// modelServer is a replica that serves one model id on /v1/models and names itself on
// completions.
func modelServer(t *testing.T, name, modelID string) *upstream {
	return startUpstream(t, name, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, modelID)
			return
		}
		fmt.Fprintf(w, `{"served_by":%q}`, name)
	})
}

func startGateway(t *testing.T, services ...*Service) string {
	t.Helper()
	return startGatewayWith(t, GatewayConfig{Logger: zaptest.NewLogger(t)}, services...)
}

func startGatewayWith(t *testing.T, cfg GatewayConfig, services ...*Service) string {
	t.Helper()
	g := NewGateway(cfg)
	g.SetServices(services)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func listModels(t *testing.T, c *http.Client, base string, headers ...string) []string {
	t.Helper()
	res := do(t, c, http.MethodGet, base+"/v1/models", nil, headers...)
	if res.status != 200 {
		t.Fatalf("GET /v1/models: %d %s", res.status, res.body)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			OwnedBy string `json:"owned_by"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(res.body), &list); err != nil || list.Object != "list" {
		t.Fatalf("GET /v1/models body %s: %v", res.body, err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID+"@"+m.OwnedBy)
	}
	slices.Sort(ids)
	return ids
}

func TestGatewayRoutesByModel(t *testing.T) {
	const key = "sk-ferry-private-0123456789"
	llama := modelServer(t, "llama-replica", "meta-llama/Llama-3.1-8B-Instruct")
	qwen := modelServer(t, "qwen-replica", "Qwen/Qwen2.5-7B-Instruct")
	private := modelServer(t, "private-replica", "private/model")
	llamaSvc, _ := startProxy(t, ServiceConfig{Name: "llama"}, backendsOf(llama)...)
	qwenSvc, _ := startProxy(t, ServiceConfig{Name: "qwen"}, backendsOf(qwen)...)
	privateSvc, _ := startProxy(t, ServiceConfig{Name: "private", APIKeyHashes: []string{hashKey(key)}}, backendsOf(private)...)
	base := startGateway(t, llamaSvc, qwenSvc, privateSvc)
	c := newClient(t)

	wantPublic := []string{"Qwen/Qwen2.5-7B-Instruct@ferry:qwen", "llama@ferry:llama", "meta-llama/Llama-3.1-8B-Instruct@ferry:llama", "qwen@ferry:qwen"}
	waitFor(t, "model discovery", func() bool { return slices.Equal(listModels(t, c, base), wantPublic) })
	// Each service discovers its replicas' models on its own: the private one may still be at it.
	waitFor(t, "the private model with the key", func() bool {
		withKey := listModels(t, c, base, "Authorization", "Bearer "+key)
		return slices.Contains(withKey, "private/model@ferry:private") && slices.Contains(withKey, "llama@ferry:llama")
	})

	tests := map[string]struct {
		body       string
		headers    []string
		wantStatus int
		wantBody   string
		wantCode   string
	}{
		"model id":       {body: `{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[]}`, wantStatus: 200, wantBody: `{"served_by":"llama-replica"}`},
		"service name":   {body: `{"model":"qwen","prompt":"hi"}`, wantStatus: 200, wantBody: `{"served_by":"qwen-replica"}`},
		"other model id": {body: `{"messages":[],"model":"Qwen/Qwen2.5-7B-Instruct"}`, wantStatus: 200, wantBody: `{"served_by":"qwen-replica"}`},
		// A caller without any service's key cannot tell an unknown model from a protected one.
		"unknown model":            {body: `{"model":"gpt-5"}`, wantStatus: 401, wantCode: "invalid_api_key"},
		"unknown model with a key": {body: `{"model":"gpt-5"}`, headers: []string{"Authorization", "Bearer " + key}, wantStatus: 404, wantCode: "model_not_found"},
		"no model":                 {body: `{"prompt":"hi"}`, wantStatus: 400, wantCode: "missing_model"},
		"bad JSON":                 {body: `{"model":"llama",`, wantStatus: 400, wantCode: "invalid_json"},
		"private without key":      {body: `{"model":"private/model"}`, wantStatus: 401, wantCode: "invalid_api_key"},
		"private with key":         {body: `{"model":"private"}`, headers: []string{"Authorization", "Bearer " + key}, wantStatus: 200, wantBody: `{"served_by":"private-replica"}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(tc.body), tc.headers...)
			if res.status != tc.wantStatus {
				t.Fatalf("status = %d, want %d: %s", res.status, tc.wantStatus, res.body)
			}
			if tc.wantCode != "" {
				if got := decodeError(t, res.body).Error.Code; got != tc.wantCode {
					t.Errorf("code = %q, want %q", got, tc.wantCode)
				}
				return
			}
			if res.body != tc.wantBody {
				t.Errorf("body = %s, want %s", res.body, tc.wantBody)
			}
		})
	}

	res := do(t, c, http.MethodGet, base+"/v1/models/meta-llama/Llama-3.1-8B-Instruct", nil)
	if res.status != 200 || !strings.Contains(res.body, `"owned_by":"ferry:llama"`) {
		t.Errorf("GET /v1/models/{id}: %d %s", res.status, res.body)
	}
	if res := do(t, c, http.MethodGet, base+"/v1/models/private/model", nil); res.status != 404 {
		t.Errorf("a private model is visible without its key: %d %s", res.status, res.body)
	}
	if res := do(t, c, http.MethodGet, base+"/metrics", nil); res.status != 404 || decodeError(t, res.body).Error.Code != "unknown_url" {
		t.Errorf("GET /metrics on the gateway: %d %s", res.status, res.body)
	}
}

// TestGatewayFollowsReplicaChanges: a model appears when a replica serving it joins and goes
// when the replica leaves.
func TestGatewayFollowsReplicaChanges(t *testing.T) {
	a := modelServer(t, "a", "model-a")
	b := modelServer(t, "b", "model-b")
	svc, _ := startProxy(t, ServiceConfig{Name: "svc"}, backendsOf(a)...)
	base := startGateway(t, svc)
	c := newClient(t)
	waitFor(t, "model-a", func() bool { return slices.Contains(listModels(t, c, base), "model-a@ferry:svc") })
	svc.SetBackends([]Backend{{ID: 2, Addr: b.addr(), Version: 1}})
	want := []string{"model-b@ferry:svc", "svc@ferry:svc"}
	waitFor(t, "model-b replaces model-a", func() bool { return cmp.Equal(listModels(t, c, base), want) })
}

// TestGatewayObservesItsOwnAnswers checks that requests the gateway answers before any service
// is chosen are counted by reason and logged without the user's input.
func TestGatewayObservesItsOwnAnswers(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	svc, _ := startProxy(t, ServiceConfig{Name: "chat", Metrics: m}, backendsOf(modelServer(t, "a", "llama-3"))...)
	base := startGatewayWith(t, GatewayConfig{Logger: zaptest.NewLogger(t), Metrics: m, AccessLog: zap.New(core)}, svc)
	c := newClient(t)

	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPost, "/v1/chat/completions", `{"model":"secret-typo-model"}`, 404},
		{http.MethodPost, "/v1/chat/completions", `{"model":`, 400},
		{http.MethodPost, "/v1/chat/completions", `{"messages":[]}`, 400},
		{http.MethodGet, "/v1/nowhere?key=sk-hidden", "", 404},
		{http.MethodPost, "/v1/chat/completions", `{"model":"chat"}`, 200},
	} {
		if res := do(t, c, tc.method, base+tc.path, strings.NewReader(tc.body)); res.status != tc.status {
			t.Errorf("%s %s %s: %d %s, want %d", tc.method, tc.path, tc.body, res.status, res.body, tc.status)
		}
	}

	want := `
# HELP ferry_gateway_errors_total Requests the shared gateway answered itself, before any service: unknown model, no model, bad JSON, unknown path.
# TYPE ferry_gateway_errors_total counter
ferry_gateway_errors_total{code="400",reason="bad_json"} 1
ferry_gateway_errors_total{code="400",reason="no_model"} 1
ferry_gateway_errors_total{code="404",reason="unknown_model"} 1
ferry_gateway_errors_total{code="404",reason="unknown_path"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "ferry_gateway_errors_total"); err != nil {
		t.Error(err)
	}
	lines := waitForLines(t, logs, 4)
	for _, l := range lines {
		text := fmt.Sprint(l.ContextMap())
		if l.ContextMap()["listener"] != "gateway" || l.ContextMap()["error"] == "" {
			t.Errorf("gateway access line %v lacks listener or error", text)
		}
		if strings.Contains(text, "secret-typo-model") || strings.Contains(text, "sk-hidden") {
			t.Errorf("gateway access line carries user input: %v", text)
		}
	}
	if len(lines) != 4 {
		t.Errorf("%d gateway access lines, want 4 (the routed request is the service's to log)", len(lines))
	}
}

// TestGatewayHoldsServiceScaledToZero: a service whose replicas are all gone is still routed
// to by the model id they reported, and holds the request until a replica is back.
func TestGatewayHoldsServiceScaledToZero(t *testing.T) {
	a := modelServer(t, "a", "model-a")
	svc, _ := startProxy(t, ServiceConfig{Name: "svc"}, backendsOf(a)...)
	base := startGateway(t, svc)
	c := newClient(t)
	want := []string{"model-a@ferry:svc", "svc@ferry:svc"}
	waitFor(t, "model-a", func() bool { return cmp.Equal(listModels(t, c, base), want) })

	svc.SetBackends(nil)
	if diff := cmp.Diff(want, listModels(t, c, base)); diff != "" {
		t.Errorf("models after scaling to zero (-want +got):\n%s", diff)
	}
	pending := doAsync(c, base+"/v1/chat/completions", `{"model":"model-a","messages":[]}`)
	waitFor(t, "the request to be held", func() bool { return svc.Waiting() == 1 })

	svc.SetBackends([]Backend{{ID: 2, Addr: a.addr(), Version: 1}})
	if res := receive(t, pending); res.status != http.StatusOK || res.body != `{"served_by":"a"}` {
		t.Errorf("held request: %d %s, want 200 from a", res.status, res.body)
	}
	waitFor(t, "model-a from the new replica", func() bool { return cmp.Equal(listModels(t, c, base), want) })
}

// TestGatewayUnescapesModel: the gateway routes on the model's value, not its JSON spelling:
// "ferry\u002dsim" is ferry-sim. It used to look up the escaped bytes and answer 404.
func TestGatewayUnescapesModel(t *testing.T) {
	u := modelServer(t, "sim-replica", "org/model-1")
	svc, _ := startProxy(t, ServiceConfig{Name: "ferry-sim"}, backendsOf(u)...)
	base := startGateway(t, svc)
	c := newClient(t)
	waitFor(t, "model discovery", func() bool { return slices.Contains(svc.Models(), "org/model-1") })
	for _, body := range []string{`{"model":"ferry\u002dsim"}`, `{"model":"org\/model-1"}`, `{"model":"\u0066erry-sim"}`} {
		if res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body)); res.status != 200 {
			t.Errorf("%s: %d %s", body, res.status, res.body)
		}
	}
	res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"ferry\u002dnone"}`))
	if res.status != 404 || !strings.Contains(res.body, "ferry-none") {
		t.Errorf("unknown escaped model: %d %s, want 404 naming ferry-none", res.status, res.body)
	}
}

// TestGatewayHidesProtectedModels: asking for a model tells a caller nothing about models it may
// not use. Without a key of any service, an unknown model and a protected one both get 401; with
// one service's key, another service's protected model and an unknown one both get 404. The
// gateway used to answer 401 for protected models and 404 for unknown ones, so anyone could list
// the protected models by trying names.
func TestGatewayHidesProtectedModels(t *testing.T) {
	const keyA, keyB = "sk-ferry-aaaaaaaaaaaaaaaa", "sk-ferry-bbbbbbbbbbbbbbbb"
	pub := modelServer(t, "pub-replica", "pub-model")
	a := modelServer(t, "a-replica", "a-model")
	b := modelServer(t, "b-replica", "b-model")
	pubSvc, _ := startProxy(t, ServiceConfig{Name: "pub"}, backendsOf(pub)...)
	aSvc, _ := startProxy(t, ServiceConfig{Name: "a", APIKeyHashes: []string{hashKey(keyA)}}, backendsOf(a)...)
	bSvc, _ := startProxy(t, ServiceConfig{Name: "b", APIKeyHashes: []string{hashKey(keyB)}}, backendsOf(b)...)
	base := startGateway(t, pubSvc, aSvc, bSvc)
	c := newClient(t)
	answer := func(model, key string) (int, string) {
		var headers []string
		if key != "" {
			headers = []string{"Authorization", "Bearer " + key}
		}
		res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`"}`), headers...)
		if res.status == 200 {
			return 200, ""
		}
		e := decodeError(t, res.body)
		return res.status, e.Error.Type + "/" + e.Error.Code
	}
	tests := map[string]struct {
		key        string
		same       []string // models that must get the same answer
		wantStatus int
	}{
		"no key":                {key: "", same: []string{"a", "b", "nonexistent"}, wantStatus: 401},
		"a key of no service":   {key: "sk-ferry-cccccccccccccccc", same: []string{"a", "b", "nonexistent"}, wantStatus: 401},
		"another service's key": {key: keyA, same: []string{"b", "nonexistent"}, wantStatus: 404},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for _, model := range tc.same {
				if status, kind := answer(model, tc.key); status != tc.wantStatus {
					t.Errorf("model %q: %d %s, want %d like every model the caller may not use", model, status, kind, tc.wantStatus)
				}
			}
		})
	}
	for model, key := range map[string]string{"pub": "", "a": keyA, "b": keyB} {
		if status, kind := answer(model, key); status != 200 {
			t.Errorf("model %q with its key: %d %s", model, status, kind)
		}
	}
}

// TestGatewayCloseConnections: once the gateway is draining, each response closes its client
// connection, so keep-alive clients reconnect elsewhere; before, connections are kept.
func TestGatewayCloseConnections(t *testing.T) {
	g := NewGateway(GatewayConfig{Logger: zaptest.NewLogger(t)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := g.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		<-served
	})
	base := "http://" + ln.Addr().String()
	const get = "GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
	if resp, _ := rawExchange(t, base, get); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before the drain: %d, close %v", resp.StatusCode, resp.Close)
	}
	g.CloseConnections()
	if resp, _ := rawExchange(t, base, get); resp.StatusCode != 200 || !resp.Close {
		t.Errorf("draining: %d, close %v; want the connection closed", resp.StatusCode, resp.Close)
	}
}

// TestGatewayKeepsModelsAcrossAReplacement: a Service that replaces another of the same service
// in the gateway (a new configuration) answers to the old one's model ids before its replicas
// have reported theirs, so the gateway never answers them 404 in between.
func TestGatewayKeepsModelsAcrossAReplacement(t *testing.T) {
	a := modelServer(t, "a", "model-a")
	old, _ := startProxy(t, ServiceConfig{Name: "svc"}, backendsOf(a)...)
	g := NewGateway(GatewayConfig{Logger: zaptest.NewLogger(t)})
	g.SetServices([]*Service{old})
	waitFor(t, "model-a", func() bool { return slices.Contains(old.Models(), "model-a") })

	next, err := NewService(ServiceConfig{Name: "svc", Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Shutdown(context.Background()) })
	next.KeepModels(old)
	if got := next.Models(); !slices.Contains(got, "model-a") {
		t.Errorf("models of the replacement before any replica = %v, want model-a kept", got)
	}
	next.SetBackends(backendsOf(a))
	g.SetServices([]*Service{next})
	if got := next.Models(); !slices.Contains(got, "model-a") {
		t.Errorf("models of the replacement as it joins the gateway = %v, want model-a", got)
	}
}
