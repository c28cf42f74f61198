package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/tenants"
)

// usageUpstream answers like vLLM: a chat completion with usage, or, when asked to stream, one
// event per token and no usage unless stream_options.include_usage.
func usageUpstream(t *testing.T, prompt, completion int) *upstream {
	return startUpstream(t, "u", func(w http.ResponseWriter, r *http.Request) {
		body := make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for range completion {
				sseEvent(w, `{"choices":[{"delta":{"content":"x"}}],"usage":null}`)
			}
			if strings.Contains(string(body), `"include_usage":true`) {
				sseEvent(w, fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, prompt, completion))
			}
			sseEvent(w, "[DONE]")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, prompt, completion, prompt+completion)
	})
}

func newTestTenancy(t *testing.T, keys ...tenants.Key) (*Tenancy, map[string]string) {
	t.Helper()
	tn := NewTenancy(nil)
	secrets := map[string]string{}
	d := tenants.Directory{Version: 1, Prices: map[string]tenants.Price{"m": {InputPerMillion: 1, OutputPerMillion: 2}}}
	for _, k := range keys {
		s, err := tenants.NewSecret()
		if err != nil {
			t.Fatal(err)
		}
		k.Hash, k.Hint = tenants.HashSecret(s), tenants.HintOf(s)
		secrets[k.Name] = s
		d.Keys = append(d.Keys, k)
	}
	tn.SetDirectory(d)
	return tn, secrets
}

func chat(model string, stream bool) string {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("word ", 40) + `"}]` + s + `}`
}

// TestManagedKeysAreAdmittedAndCharged: a managed key is accepted by a service that requires
// keys, its limits answer in OpenAI's headers, the request over its token limit gets 429 with
// Retry-After, and the ledger holds the engine's counts, priced.
func TestManagedKeysAreAdmittedAndCharged(t *testing.T) {
	tn, secrets := newTestTenancy(t,
		tenants.Key{ID: "key_a", Name: "a", Limits: tenants.Limits{RequestsPerMinute: 100, TotalTokensPerMinute: 1000}},
		tenants.Key{ID: "key_b", Name: "b", Services: []string{"other"}},
		tenants.Key{ID: "key_old", Name: "old", ExpiresAt: time.Now().Add(-time.Hour)})
	u := usageUpstream(t, 300, 100)
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{}, Tenancy: tn}, backendsOf(u)...)
	c := newClient(t)
	post := func(key, body string) result {
		return do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Authorization", "Bearer "+key)
	}
	res := post(secrets["a"], chat("m", false))
	if res.status != 200 {
		t.Fatalf("a managed key: %d %s", res.status, res.body)
	}
	if h := res.header; h.Get("X-Ratelimit-Limit-Requests") != "100" || h.Get("X-Ratelimit-Remaining-Requests") != "99" ||
		h.Get("X-Ratelimit-Limit-Tokens") != "1000" || h.Get("X-Ratelimit-Remaining-Tokens") == "" || h.Get("X-Ratelimit-Reset-Tokens") == "" {
		t.Errorf("rate headers %v", h)
	}
	// 400 tokens a request: the third does not fit what is left of 1000 (the estimate is 53).
	post(secrets["a"], chat("m", false))
	post(secrets["a"], chat("m", false))
	res = post(secrets["a"], chat("m", false))
	if e := decodeError(t, res.body); res.status != 429 || res.header.Get("Retry-After") == "" || e.Error.Code != "rate_limit_exceeded" || !strings.Contains(e.Error.Message, "tokens per minute") {
		t.Errorf("over the token limit: %d %v %s", res.status, res.header, res.body)
	}
	if res := post(secrets["b"], chat("m", false)); res.status != 404 {
		t.Errorf("a key scoped to another service: %d %s", res.status, res.body)
	}
	if res := post(secrets["old"], chat("m", false)); res.status != 401 || !strings.Contains(res.body, "expired") {
		t.Errorf("an expired key: %d %s", res.status, res.body)
	}
	if res := post("fy-not-a-key-at-all-0000000000", chat("m", false)); res.status != 401 {
		t.Errorf("an unknown key: %d", res.status)
	}
	rows := tn.Ledger().Take("p").Rows
	if len(rows) != 1 {
		t.Fatalf("rows %+v, want one for key_a", rows)
	}
	r := rows[0]
	// Three admitted (the fourth refused before any charge), each 300 in and 100 out.
	if r.KeyID != "key_a" || r.Model != "m" || r.Service != "llama" || r.Requests != 3 || r.Input != 900 || r.Output != 300 || r.CostMicros != 3*(300+200) {
		t.Errorf("row %+v", r)
	}
}

// TestManagedKeyStreamsAreCountedAsTheyFlow: a stream without usage is charged an output token
// per event; one with usage is charged what the engine reported.
func TestManagedKeyStreamsAreCountedAsTheyFlow(t *testing.T) {
	tn, secrets := newTestTenancy(t, tenants.Key{ID: "key_s", Name: "s"})
	u := usageUpstream(t, 77, 25)
	_, base := startProxy(t, ServiceConfig{Tenancy: tn}, backendsOf(u)...)
	c := newClient(t)
	res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", true)), "Authorization", "Bearer "+secrets["s"])
	if res.status != 200 || strings.Count(res.body, "data:") != 26 {
		t.Fatalf("stream: %d %q", res.status, res.body)
	}
	body := strings.Replace(chat("m", true), `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body), "Authorization", "Bearer "+secrets["s"])
	// An open service leaves anonymous requests alone.
	if res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", false))); res.status != 200 {
		t.Fatalf("anonymous: %d", res.status)
	}
	rows := tn.Ledger().Take("p").Rows
	if len(rows) != 1 || rows[0].Requests != 2 || rows[0].Output != 50 || rows[0].Input != 77+estimateTokens(len(`[{"role":"user","content":"`+strings.Repeat("word ", 40)+`"}]`)) {
		t.Fatalf("rows %+v: want 25 counted + 25 reported output, the estimate + 77 input", rows)
	}
}

// TestManagedKeyRefusedByTheProxyGivesItsEstimateBack: a request no replica answered costs no
// tokens, and counts as an error.
func TestManagedKeyRefusedByTheProxyGivesItsEstimateBack(t *testing.T) {
	tn, secrets := newTestTenancy(t, tenants.Key{ID: "key_r", Name: "r"})
	_, base := startProxy(t, ServiceConfig{Tenancy: tn, APIKeyHashes: []string{}, MaxQueuedRequests: -1})
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", false)), "Authorization", "Bearer "+secrets["r"])
	if res.status != 503 {
		t.Fatalf("no replica: %d", res.status)
	}
	rows := tn.Ledger().Take("p").Rows
	if len(rows) != 1 || rows[0].Requests != 1 || rows[0].Errors != 1 || rows[0].Input != 0 || rows[0].Output != 0 {
		t.Fatalf("rows %+v", rows)
	}
}

// TestGatewayRoutesManagedKeys: through the gateway, a managed key reaches the services its
// scope names (protected by their own keys or not) and gets 404 from the others, like a model it
// may not use; a dollar budget, once spent, answers insufficient_quota.
func TestGatewayRoutesManagedKeys(t *testing.T) {
	tn, secrets := newTestTenancy(t,
		tenants.Key{ID: "key_a", Name: "a", Services: []string{"a"}, Limits: tenants.Limits{BudgetUSD: 0.001, BudgetPeriod: tenants.PeriodDay}})
	a := modelServer(t, "a-replica", "a-model")
	b := modelServer(t, "b-replica", "b-model")
	aSvc, _ := startProxy(t, ServiceConfig{Name: "a", APIKeyHashes: []string{hashKey("sk-ferry-aaaaaaaaaaaaaaaa")}, Tenancy: tn}, backendsOf(a)...)
	bSvc, _ := startProxy(t, ServiceConfig{Name: "b", APIKeyHashes: []string{}, Tenancy: tn}, backendsOf(b)...)
	tn.SetDirectory(tenants.Directory{Version: 2, Keys: []tenants.Key{{ID: "key_a", Name: "a", Services: []string{"a"}, Hash: tenants.HashSecret(secrets["a"]),
		Limits: tenants.Limits{BudgetUSD: 0.001, BudgetPeriod: tenants.PeriodDay}}}, Prices: map[string]tenants.Price{"a": {InputPerMillion: 1000}}})
	base := startGateway(t, aSvc, bSvc)
	c := newClient(t)
	post := func(model string) result {
		return do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","prompt":"`+strings.Repeat("x", 8000)+`"}`), "Authorization", "Bearer "+secrets["a"])
	}
	if res := post("a"); res.status != 200 {
		t.Fatalf("its service: %d %s", res.status, res.body)
	}
	if res := post("b"); res.status != 404 {
		t.Errorf("a service outside its scope: %d %s", res.status, res.body)
	}
	// The first request's 2,001 estimated prompt tokens at $1,000 a million spent the $0.001.
	res := post("a")
	if e := decodeError(t, res.body); res.status != 429 || e.Error.Code != "insufficient_quota" {
		t.Errorf("over budget: %d %s", res.status, res.body)
	}
}

// TestManagedKeysShareSaturatedReplicasFairly: with every slot held by a heavy tenant's
// streams and more of them waiting, a light tenant's request is granted the next slot that
// frees, not the one after the heavy tenant's line: its wait is about one stream's length
// divided by the slots, not the heavy line's.
func TestManagedKeysShareSaturatedReplicasFairly(t *testing.T) {
	const streamFor = 300 * time.Millisecond
	tn, secrets := newTestTenancy(t, tenants.Key{ID: "key_heavy", Name: "heavy"}, tenants.Key{ID: "key_light", Name: "light"})
	u := startUpstream(t, "u", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		sseEvent(w, `{"choices":[{"delta":{"content":"x"}}]}`)
		time.Sleep(streamFor)
		sseEvent(w, "[DONE]")
	})
	_, base := startProxy(t, ServiceConfig{Tenancy: tn, APIKeyHashes: []string{}, MaxInFlightPerReplica: 2}, backendsOf(u)...)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 10 { // 2 slots, 8 waiting: the heavy line is 4 slot turns long (1.2 s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(t)
			for {
				select {
				case <-stop:
					return
				default:
				}
				do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", true)), "Authorization", "Bearer "+secrets["heavy"])
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(time.Second) // the line fills
	c := newClient(t)
	var waits []time.Duration
	for range 5 {
		start := time.Now()
		res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", true)), "Authorization", "Bearer "+secrets["light"])
		if res.status != 200 {
			t.Fatalf("light: %d %s", res.status, res.body)
		}
		waits = append(waits, time.Since(start)-streamFor)
	}
	slices.Sort(waits)
	t.Logf("the light tenant's waits for a slot: %v", waits)
	// One slot frees every 150 ms; the heavy line would be 1.2 s.
	if waits[2] > 450*time.Millisecond {
		t.Errorf("the light tenant waited %v (median) for a slot, want about one slot's turn (≤ 450 ms), not the heavy line's 1.2 s", waits[2])
	}
}

// TestHeadroomLeavesSlotsToOtherTenants: a tenant alone takes every slot; once another tenant
// has asked for one, the first holds at most the slots less one per replica, and the other's
// requests start at once instead of waiting for a stream to end.
func TestHeadroomLeavesSlotsToOtherTenants(t *testing.T) {
	const streamFor = 400 * time.Millisecond
	tn, secrets := newTestTenancy(t, tenants.Key{ID: "key_heavy", Name: "heavy"}, tenants.Key{ID: "key_light", Name: "light"})
	var mu sync.Mutex
	running, peak := map[string]int{}, map[string]int{}
	h := func(w http.ResponseWriter, r *http.Request) {
		who := "heavy"
		if strings.Contains(r.Header.Get("X-Test-Who"), "light") {
			who = "light"
		}
		mu.Lock()
		running[who]++
		peak[who] = max(peak[who], running[who])
		mu.Unlock()
		defer func() { mu.Lock(); running[who]--; mu.Unlock() }()
		w.Header().Set("Content-Type", "text/event-stream")
		sseEvent(w, `{"choices":[{"delta":{"content":"x"}}]}`)
		time.Sleep(streamFor)
		sseEvent(w, "[DONE]")
	}
	u1, u2 := startUpstream(t, "u1", h), startUpstream(t, "u2", h)
	_, base := startProxy(t, ServiceConfig{Tenancy: tn, APIKeyHashes: []string{}, MaxInFlightPerReplica: 4}, backendsOf(u1, u2)...)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 12 { // 8 slots: 4 heavy requests always waiting
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newClient(t)
			for {
				select {
				case <-stop:
					return
				default:
				}
				do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", true)), "Authorization", "Bearer "+secrets["heavy"])
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(1500 * time.Millisecond)
	mu.Lock()
	alone := peak["heavy"]
	mu.Unlock()
	c := newClient(t)
	var waits []time.Duration
	for i := range 6 {
		if i == 1 {
			// From the light tenant's first answer on, it has surely asked: a heavy request
			// granted just before its ask may still have reached the upstream after it.
			mu.Lock()
			peak["heavy"] = 0
			mu.Unlock()
		}
		start := time.Now()
		res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat("m", true)),
			"Authorization", "Bearer "+secrets["light"], "X-Test-Who", "light")
		if res.status != 200 {
			t.Fatalf("light: %d %s", res.status, res.body)
		}
		waits = append(waits, time.Since(start)-streamFor)
	}
	mu.Lock()
	crowded := peak["heavy"]
	mu.Unlock()
	slices.Sort(waits)
	t.Logf("heavy alone held %d slots, %d beside the light tenant; the light tenant waited %v", alone, crowded, waits)
	if alone != 8 {
		t.Errorf("the heavy tenant alone held %d of 8 slots, want all", alone)
	}
	if crowded > 6 {
		t.Errorf("beside another tenant the heavy one held %d slots, want at most 6 (8 less one per replica)", crowded)
	}
	if waits[len(waits)-2] > 100*time.Millisecond {
		t.Errorf("the light tenant's requests waited %v for a slot; past the first, want them at once", waits)
	}
}
