package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryserve/ferry/policy"
)

// kvIndexes is ServiceConfig.KVEvents without a socket: the test plays the engines' events.
type kvIndexes struct {
	mu sync.Mutex
	m  map[string]*policy.KVBlocks
}

func (k *kvIndexes) For(addr string) *policy.KVBlocks {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m[addr] == nil {
		k.m[addr] = policy.NewKVBlocks()
	}
	return k.m[addr]
}

// tokenIDs is the stand-in tokenizer of tokenizingEngine: one id per byte of the rendered
// prompt, so prompts sharing a prefix share ids.
func tokenIDs(text string) []uint32 {
	ids := make([]uint32, len(text))
	for i := range text {
		ids[i] = uint32(text[i])
	}
	return ids
}

// tokenizingEngine answers /tokenize as vLLM does (the ids of the rendered messages or prompt)
// and chat completions; it records the /tokenize bodies it got. status, when not 200, is what
// /tokenize answers; delay stalls it.
type tokenizingEngine struct {
	mu     sync.Mutex
	bodies []map[string]any
	status int
	delay  time.Duration
}

func (e *tokenizingEngine) handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/tokenize" {
		okHandler(w, r)
		return
	}
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":"bad json"}`, http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, req)
	status, delay := e.status, e.delay
	e.mu.Unlock()
	time.Sleep(delay)
	if status != 0 && status != http.StatusOK {
		http.Error(w, `{"error":"nope"}`, status)
		return
	}
	text := fmt.Sprint(req["prompt"])
	if msgs, ok := req["messages"].([]any); ok {
		text = ""
		for _, m := range msgs {
			mm := m.(map[string]any)
			text += fmt.Sprintf("%v: %v\n", mm["role"], mm["content"])
		}
	}
	ids, _ := json.Marshal(tokenIDs(text))
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"count": %d, "max_model_len": 8192, "tokens": %s}`, len(text), ids)
}

// TestTokenizedRequestsFollowTheEnginesCaches runs the proxy with KV events: a chat whose
// prefix one engine reports holding goes to it, with the ids that engine's /tokenize gave.
func TestTokenizedRequestsFollowTheEnginesCaches(t *testing.T) {
	engines := make([]*tokenizingEngine, 3)
	ups := make([]*upstream, 3)
	for i := range ups {
		engines[i] = &tokenizingEngine{}
		ups[i] = startUpstream(t, fmt.Sprint("r", i), engines[i].handler)
	}
	indexes := &kvIndexes{m: map[string]*policy.KVBlocks{}}
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	_, url := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT, KVEvents: indexes, Metrics: metrics}, backendsOf(ups...)...)

	system := strings.Repeat("You are a terse assistant. ", 40)
	history := "system: " + system + "\n" + "user: first question\n"
	// Engine 2 holds the conversation so far (as its BlockStored said); 0 and 1 hold other
	// things, so all three report.
	for i, u := range ups {
		text := history
		if i != 2 {
			text = "system: something else entirely, long enough for a block or two\n"
		}
		ids := tokenIDs(text)
		hashes := make([]uint64, len(ids)/16)
		for j := range hashes {
			hashes[j] = uint64(i<<20 | j)
		}
		indexes.For(u.addr()).Stored(0, false, hashes, ids[:len(hashes)*16], 16)
	}

	client := newClient(t)
	body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"system","content":%q},{"role":"user","content":"first question"},{"role":"assistant","content":"ok"},{"role":"user","content":"second"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, system)
	for range 3 {
		res := do(t, client, "POST", url+"/v1/chat/completions", strings.NewReader(body), "Content-Type", "application/json")
		if res.status != 200 || res.header.Get("X-Upstream") != "r2" {
			t.Fatalf("status %d from %q, want 200 from r2, the engine holding the prefix", res.status, res.header.Get("X-Upstream"))
		}
	}
	var asked []map[string]any
	for _, e := range engines {
		e.mu.Lock()
		asked = append(asked, e.bodies...)
		e.mu.Unlock()
	}
	if len(asked) != 3 {
		t.Fatalf("/tokenize was asked %d times for 3 requests", len(asked))
	}
	if q := asked[0]; q["model"] != "llama" || q["add_generation_prompt"] != true || q["messages"] == nil || q["tools"] == nil {
		t.Errorf("/tokenize body %v: want the model, messages, tools and add_generation_prompt", q)
	}
	if n := (dtoCount{}).samples(t, reg, "ok"); n != 3 {
		t.Errorf("tokenize round trips: %d, want 3", n)
	}

	// A failing or slow /tokenize costs the request nothing but the byte index's guess.
	for _, e := range engines {
		e.mu.Lock()
		e.status = http.StatusInternalServerError
		e.mu.Unlock()
	}
	res := do(t, client, "POST", url+"/v1/completions", strings.NewReader(`{"model":"llama","prompt":"hello"}`), "Content-Type", "application/json")
	if res.status != 200 {
		t.Fatalf("with /tokenize failing: status %d", res.status)
	}
	for _, e := range engines {
		e.mu.Lock()
		e.status, e.delay = 0, 10*tokenizeTimeout
		e.mu.Unlock()
	}
	start := time.Now()
	res = do(t, client, "POST", url+"/v1/completions", strings.NewReader(`{"model":"llama","prompt":"hello"}`), "Content-Type", "application/json")
	if res.status != 200 {
		t.Fatalf("with /tokenize stalled: status %d", res.status)
	}
	if took := time.Since(start); took >= 10*tokenizeTimeout {
		t.Errorf("a stalled /tokenize held the request %v", took)
	}
	if n := (dtoCount{}).samples(t, reg, "failed"); n != 2 {
		t.Errorf("failed tokenize round trips: %d, want 2", n)
	}
}

// dtoCount reads a histogram's sample count from a registry.
type dtoCount struct{}

func (dtoCount) samples(t *testing.T, reg *prometheus.Registry, result string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ferry_tokenize_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}

func TestParseTokenIDs(t *testing.T) {
	tests := map[string]struct {
		body string
		want []uint32
		ok   bool
	}{
		"vllm":            {`{"count":3,"max_model_len":8192,"tokens":[128000, 9906,0],"token_strs":null}`, []uint32{128000, 9906, 0}, true},
		"spaces":          {`{"tokens" : [ 1 ,2 ]}`, []uint32{1, 2}, true},
		"empty":           {`{"tokens":[]}`, nil, false},
		"none":            {`{"count":0}`, nil, false},
		"negative":        {`{"tokens":[-1]}`, nil, false},
		"too big":         {`{"tokens":[4294967296]}`, nil, false},
		"not a list":      {`{"tokens":"1,2"}`, nil, false},
		"hole":            {`{"tokens":[1,,2]}`, nil, false},
		"unterminated":    {`{"tokens":[1,2`, nil, false},
		"float":           {`{"tokens":[1.5]}`, nil, false},
		"adjacent digits": {`{"tokens":[1 2]}`, nil, false},
		"strings first":   {`{"token_strs":["\"tokens\":[7]", "x"],"tokens":[5,6]}`, []uint32{5, 6}, true},
		"nested first":    {`{"meta":{"tokens":[9]},"count":1,"tokens":[4]}`, []uint32{4}, true},
		"only nested":     {`{"meta":{"tokens":[9]}}`, nil, false},
		"not an object":   {`["tokens",[1]]`, nil, false},
	}
	for name, tt := range tests {
		got, ok := parseTokenIDs(nil, []byte(tt.body))
		if ok != tt.ok || (ok && fmt.Sprint(got) != fmt.Sprint(tt.want)) {
			t.Errorf("%s: got %v %v, want %v %v", name, got, ok, tt.want, tt.ok)
		}
	}
}

// countingIndexes is a KVIndexes that holds something per address, as kvevents.Subscriber does.
type countingIndexes struct {
	kvIndexes
	refs map[string]int
}

func (c *countingIndexes) For(addr string) *policy.KVBlocks {
	c.mu.Lock()
	c.refs[addr]++
	c.mu.Unlock()
	return c.kvIndexes.For(addr)
}

func (c *countingIndexes) Forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs[addr]--
}

// TestKVIndexesHeldPerAddress checks that a service asks for an engine's index once per
// address it routes to, whatever relabels the replica there, and lets go of it when the
// address leaves or the service shuts down.
func TestKVIndexesHeldPerAddress(t *testing.T) {
	idx := &countingIndexes{kvIndexes: kvIndexes{m: map[string]*policy.KVBlocks{}}, refs: map[string]int{}}
	svc, err := NewService(ServiceConfig{Name: "kv", Policy: policy.LeastTTFT, KVEvents: idx, Logger: testLogger(t),
		HealthCheck: HealthCheck{Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := "10.0.0.1:8000", "10.0.0.2:8000"
	svc.SetBackends([]Backend{{ID: 1, Addr: a, Version: 1}, {ID: 2, Addr: b, Version: 1}})
	svc.SetBackends([]Backend{{ID: 3, Addr: a, Version: 2}}) // a relabelled, b gone
	snap := svc.snap.Load()
	if snap.replicas[0].KV() != idx.m[a] {
		t.Error("the relabelled replica lost its engine's index")
	}
	if idx.refs[a] != 1 || idx.refs[b] != 0 {
		t.Fatalf("held %v after a relabel and a removal, want a:1 b:0", idx.refs)
	}
	if err := svc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := svc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if idx.refs[a] != 0 {
		t.Fatalf("held %v after Shutdown, want none", idx.refs)
	}
}
