package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryserve/ferry/bench/replicasim"
	"github.com/ferryserve/ferry/policy"
)

// pdSim is a simulated vLLM replica with a KV connector whose POSTed bodies the test can read.
type pdSim struct {
	*upstream
	mu     sync.Mutex
	bodies []string
}

func startPDSim(t *testing.T, prefillPerToken time.Duration) *pdSim {
	cfg := replicasim.DefaultConfig()
	cfg.TTFT, cfg.ITL, cfg.ITLPerSeq, cfg.MaxTokens = time.Millisecond, time.Millisecond, 0, 4
	cfg.KVTransfer, cfg.PrefillPerToken = true, prefillPerToken
	h := replicasim.NewServer(cfg).Handler()
	p := &pdSim{}
	p.upstream = startUpstream(t, "pd", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost { // not the scrapes and model listings
			p.mu.Lock()
			p.bodies = append(p.bodies, string(b))
			p.mu.Unlock()
		}
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		h.ServeHTTP(w, r)
	})
	return p
}

func (p *pdSim) count(substr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.bodies {
		if strings.Contains(b, substr) {
			n++
		}
	}
	return n
}

// Each completion is prefilled on a prefill replica (one token, do_remote_decode) and streamed
// from a decode replica that got the prefill's kv_transfer_params; with the prefill pool gone,
// requests go to the decode replicas as they are.
func TestDisaggregatedPrefillThenDecode(t *testing.T) {
	prefill := []*pdSim{startPDSim(t, 0), startPDSim(t, 0)}
	decode := []*pdSim{startPDSim(t, 0), startPDSim(t, 0)}
	m, _ := newTestMetrics(t)
	svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT, Metrics: m},
		Backend{ID: 1, Addr: decode[0].addr(), Version: 1}, Backend{ID: 2, Addr: decode[1].addr(), Version: 1})
	if err := svc.SetPrefillBackends([]Backend{{ID: 3, Addr: prefill[0].addr(), Version: 1}, {ID: 4, Addr: prefill[1].addr(), Version: 1}}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t)
	const requests = 8
	for i := range requests {
		r := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatTurns(i, 1, true)), "Content-Type", "application/json")
		if r.status != http.StatusOK || !strings.Contains(r.body, "data: [DONE]") || strings.Count(r.body, `"delta":{"content"`) != 3 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	prefills := prefill[0].count(`"do_remote_decode":true`) + prefill[1].count(`"do_remote_decode":true`)
	decodes := decode[0].count(`"do_remote_prefill":true`) + decode[1].count(`"do_remote_prefill":true`)
	if prefills != requests || decodes != requests {
		t.Fatalf("%d prefills and %d decodes with the prefill's params, want %d each", prefills, decodes, requests)
	}

	if n := testutil.CollectAndCount(m.prefill); n != 1 {
		t.Errorf("%d prefill series, want the ok one", n)
	}
	// A prefill replica that fails is skipped; with none left, the decode side prefills.
	prefill[0].Close()
	if r := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatTurns(100, 1, true)), "Content-Type", "application/json"); r.status != http.StatusOK {
		t.Fatalf("with one prefill replica down: %d %s", r.status, r.body)
	}
	prefill[1].Close()
	before := decode[0].count("") + decode[1].count("")
	if r := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chatTurns(101, 1, true)), "Content-Type", "application/json"); r.status != http.StatusOK {
		t.Fatalf("with the prefill pool down: %d %s", r.status, r.body)
	}
	if got := decode[0].count("") + decode[1].count("") - before; got != 1 {
		t.Fatalf("%d decode requests for one request without prefill", got)
	}
	if err := svc.SetPrefillBackends(nil); err != nil {
		t.Fatal(err)
	}
}

func TestAppendMember(t *testing.T) {
	for body, want := range map[string]string{
		`{"a":1}`:      `{"a":1,"x":2}`,
		"{\"a\":1}\n ": `{"a":1,"x":2}`,
		`{ }`:          `{ "x":2}`,
	} {
		b := []byte(body)
		end := jsonObjectEnd(b)
		got := string(append(appendMember(append([]byte(nil), b[:end]...), b[:end], `"x":2`), '}'))
		if got != want {
			t.Errorf("%q: got %q, want %q", body, got, want)
		}
	}
	for _, body := range []string{``, `[1]`, `{"a":1`, `}`} {
		if end := jsonObjectEnd([]byte(body)); end >= 0 {
			t.Errorf("jsonObjectEnd(%q) = %d, want -1", body, end)
		}
	}
}

// A prefill replica that failed sits out a growing backoff, unless every other one does too;
// an answer ends it.
func TestPrefillReplicaBackoff(t *testing.T) {
	a, b := &policy.Replica{ID: 1}, &policy.Replica{ID: 2}
	pool := &prefillPool{replicas: []*policy.Replica{a, b}, benched: []*prefillBench{{}, {}}}
	now := time.Unix(100, 0)
	if got := pool.available(nil, now); len(got) != 2 {
		t.Fatalf("available = %d replicas, want both", len(got))
	}
	pool.benched[0].failed(now)
	if got := pool.available(nil, now.Add(500*time.Millisecond)); len(got) != 1 || got[0] != b {
		t.Fatalf("after a failure: %v, want only the other replica", got)
	}
	if got := pool.available(nil, now.Add(1500*time.Millisecond)); len(got) != 2 {
		t.Fatalf("after the first backoff: %d replicas, want both", len(got))
	}
	pool.benched[0].failed(now)
	if got := pool.available(nil, now.Add(1500*time.Millisecond)); len(got) != 1 {
		t.Fatal("the second failure in a row did not double the backoff")
	}
	if got := pool.available([]*policy.Replica{b}, now); len(got) != 1 || got[0] != a {
		t.Fatalf("with the other one tried: %v, want the benched one rather than none", got)
	}
	pool.benched[0].answered()
	if got := pool.available(nil, now); len(got) != 2 {
		t.Fatal("an answer did not end the backoff")
	}
}

// The prefill pool's autoscaler reads PrefillTokens: the prompt tokens in a prefill step, and
// with the pool empty those the decode replicas prefill, until the answer starts. A prefill
// replica that hangs costs a request the prefill timeout, not the idle timeout, and the request
// is decoded all the same.
func TestPrefillTokensAndHungPrefill(t *testing.T) {
	defer func(d time.Duration) { prefillTimeoutMin = d }(prefillTimeoutMin)
	prefillTimeoutMin = 300 * time.Millisecond
	release := make(chan struct{})
	hung := startUpstream(t, "hung", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	})
	defer close(release)
	decode := startPDSim(t, time.Millisecond) // 300 prompt tokens: 300 ms of prefill
	svc, base := startProxy(t, ServiceConfig{Policy: policy.LeastTTFT}, Backend{ID: 1, Addr: decode.addr(), Version: 1})
	c := newClient(t)
	sent := 0
	send := func() (time.Duration, *observedTokens) {
		sent++ // a prompt of its own: no prefix cache hit makes its prefill short
		prompt := fmt.Sprintf(`{"model":"ferry-sim","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"%d %s"}]}`, sent, strings.Repeat("word ", 240))
		seen := &observedTokens{}
		stop := make(chan struct{})
		go seen.watch(svc, stop)
		start := time.Now()
		r := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(prompt), "Content-Type", "application/json")
		took := time.Since(start)
		close(stop)
		if r.status != http.StatusOK || !strings.Contains(r.body, "data: [DONE]") {
			t.Fatalf("%d %s", r.status, r.body)
		}
		return took, seen
	}

	if err := svc.SetPrefillBackends([]Backend{}); err != nil { // the pool, empty
		t.Fatal(err)
	}
	if _, seen := send(); seen.max() < 250 || svc.PrefillTokens() != 0 {
		t.Fatalf("empty pool: %d prompt tokens counted at most, %d left after the answer; want about 300, then 0", seen.max(), svc.PrefillTokens())
	}
	if err := svc.SetPrefillBackends([]Backend{{ID: 2, Addr: hung.addr(), Version: 1}}); err != nil {
		t.Fatal(err)
	}
	took, seen := send()
	if took < prefillTimeoutMin || took > 10*prefillTimeoutMin || seen.max() < 250 || svc.PrefillTokens() != 0 {
		t.Fatalf("hung prefill replica: answered in %v (want the prefill timeout, %v, and the decode), %d tokens counted at most, %d left",
			took, prefillTimeoutMin, seen.max(), svc.PrefillTokens())
	}
	if decode.count(`"do_remote_prefill"`) != 0 {
		t.Fatal("the decode replica got prefill params from a prefill that never answered")
	}

	// A prefill replica leaving the pool is busy while a step is in flight there: the replica
	// manager waits for it before it stops the replica.
	answered := make(chan time.Duration)
	go func() {
		took, _ := send()
		answered <- took
	}()
	waitFor(t, "a prefill step on the hung replica", func() bool { return svc.Busy(hung.addr()) == 1 })
	if err := svc.SetPrefillBackends([]Backend{}); err != nil {
		t.Fatal(err)
	}
	if n := svc.Busy(hung.addr()); n != 1 {
		t.Fatalf("Busy = %d on a prefill replica that left the pool with a step in flight, want 1", n)
	}
	<-answered
	if n := svc.Busy(hung.addr()); n != 0 || svc.PrefillBusy()[hung.addr()] != 0 {
		t.Fatalf("Busy = %d after the step ended", n)
	}
}

// observedTokens samples a Service's PrefillTokens until stopped.
type observedTokens struct{ peak atomic.Int64 }

func (o *observedTokens) watch(svc *Service, stop <-chan struct{}) {
	for {
		if n := svc.PrefillTokens(); n > o.peak.Load() {
			o.peak.Store(n)
		}
		select {
		case <-stop:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

func (o *observedTokens) max() int64 { return o.peak.Load() }
