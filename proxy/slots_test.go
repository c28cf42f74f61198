package proxy

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// concurrency tracks how many requests a test upstream serves at once, and the most it ever did.
type concurrency struct {
	now, max atomic.Int64
}

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *concurrency) exit() { c.now.Add(-1) }

// heldUpstream answers each request only when the test releases it through the channel the
// request's "id" names, so a test decides which replica frees a slot first.
type heldUpstream struct {
	*upstream
	conc concurrency
	mu   sync.Mutex
	got  []string // ids, in arrival order
}

func startHeldUpstream(t *testing.T, name string, release func(id string) <-chan struct{}) *heldUpstream {
	return startEngineUpstream(t, name, 0, release)
}

// startEngineUpstream is a held upstream that also answers GET /metrics as a vLLM engine with
// a batch of batch would: up to batch of its requests running, the rest waiting. With batch 0
// it has no metrics (404).
func startEngineUpstream(t *testing.T, name string, batch int64, release func(id string) <-chan struct{}) *heldUpstream {
	h := &heldUpstream{}
	h.upstream = startUpstream(t, name, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			if batch == 0 {
				http.NotFound(w, r)
				return
			}
			n := h.conc.now.Load()
			fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", min(n, batch), max(n-batch, 0))
			return
		}
		h.conc.enter()
		defer h.conc.exit()
		raw, _ := io.ReadAll(r.Body)
		id := strings.TrimSuffix(strings.TrimPrefix(string(raw), `{"id":"`), `"}`)
		h.mu.Lock()
		h.got = append(h.got, id)
		h.mu.Unlock()
		select {
		case <-release(id):
		case <-r.Context().Done():
		}
		okHandler(w, r)
	})
	return h
}

func (h *heldUpstream) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

// releases hands out one channel per request id.
type releases struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func (r *releases) of(id string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(map[string]chan struct{})
	}
	c, ok := r.ch[id]
	if !ok {
		c = make(chan struct{})
		r.ch[id] = c
	}
	return c
}

// release lets request id finish; releasing it again does nothing.
func (r *releases) release(id string) {
	c := r.of(id)
	select {
	case <-c:
	default:
		close(c)
	}
}

// TestSlotsLateBinding: with one slot per replica, a third request waits in the proxy rather
// than at a busy replica, and goes to whichever replica finishes first; the next waiters follow
// in arrival order; no replica ever has more than one request.
func TestSlotsLateBinding(t *testing.T) {
	var rel releases
	a := startHeldUpstream(t, "a", func(id string) <-chan struct{} { return rel.of(id) })
	b := startHeldUpstream(t, "b", func(id string) <-chan struct{} { return rel.of(id) })
	svc, base := startProxy(t, ServiceConfig{MaxInFlightPerReplica: 1}, backendsOf(a.upstream, b.upstream)...)
	c := newClient(t)
	url := base + "/v1/completions"

	r1 := doAsync(c, url, `{"id":"1"}`)
	// One at a time: requests arriving at the same instant may overshoot the cap (slots.go).
	waitFor(t, "request 1 on a replica", func() bool { return a.hits.Load()+b.hits.Load() == 1 })
	r2 := doAsync(c, url, `{"id":"2"}`)
	waitFor(t, "one request on each replica", func() bool { return a.hits.Load() == 1 && b.hits.Load() == 1 })
	r3 := doAsync(c, url, `{"id":"3"}`)
	waitFor(t, "request 3 to wait", func() bool { return svc.Waiting() == 1 })
	r4 := doAsync(c, url, `{"id":"4"}`)
	waitFor(t, "request 4 to wait", func() bool { return svc.Waiting() == 2 })

	// Whichever replica got request 2 frees its slot first: request 3 must go there.
	second := a
	if b.ids()[0] == "2" {
		second = b
	}
	rel.release("2")
	if res := receive(t, r2); res.status != http.StatusOK {
		t.Fatalf("request 2: %d %s", res.status, res.body)
	}
	waitFor(t, "request 3 on the replica that finished", func() bool { return len(second.ids()) == 2 })
	if got := second.ids()[1]; got != "3" {
		t.Errorf("the freed slot went to request %s, want 3 (the oldest waiter)", got)
	}
	if got := svc.Waiting(); got != 1 {
		t.Errorf("Waiting = %d, want 1 (request 4)", got)
	}
	for _, id := range []string{"1", "3", "4"} {
		rel.release(id)
	}
	for i, r := range []<-chan asyncResult{r1, r3, r4} {
		if res := receive(t, r); res.status != http.StatusOK {
			t.Errorf("request %d: %d %s", []int{1, 3, 4}[i], res.status, res.body)
		}
	}
	if a.conc.max.Load() > 1 || b.conc.max.Load() > 1 {
		t.Errorf("most requests at once: a %d, b %d; want 1", a.conc.max.Load(), b.conc.max.Load())
	}
	if got := svc.Waiting(); got != 0 {
		t.Errorf("Waiting at the end = %d, want 0", got)
	}
	waitFor(t, "InFlight to drop to 0", func() bool { return svc.InFlight() == 0 })
}

// TestSlotsNewReplicaTakesWaiters: requests waiting for a slot go to a replica that joins.
func TestSlotsNewReplicaTakesWaiters(t *testing.T) {
	var rel releases
	a := startHeldUpstream(t, "a", func(id string) <-chan struct{} { return rel.of(id) })
	b := startHeldUpstream(t, "b", func(id string) <-chan struct{} { return rel.of(id) })
	svc, base := startProxy(t, ServiceConfig{MaxInFlightPerReplica: 2}, backendsOf(a.upstream)...)
	c := newClient(t)
	url := base + "/v1/completions"
	var pending []<-chan asyncResult
	// One at a time: requests arriving at the same instant may overshoot the cap (slots.go).
	for i := range 4 {
		pending = append(pending, doAsync(c, url, fmt.Sprintf(`{"id":"%d"}`, i)))
		waitFor(t, "the request to reach a or wait", func() bool { return a.hits.Load()+svc.Waiting() == int64(i+1) })
	}
	if a.hits.Load() != 2 || svc.Waiting() != 2 {
		t.Fatalf("a has %d requests and %d wait, want 2 and 2", a.hits.Load(), svc.Waiting())
	}

	svc.SetBackends(backendsOf(a.upstream, b.upstream))
	waitFor(t, "the waiters on b", func() bool { return b.hits.Load() == 2 })
	if got := svc.Waiting(); got != 0 {
		t.Errorf("Waiting = %d, want 0", got)
	}
	for i := range 4 {
		rel.release(fmt.Sprint(i))
	}
	for _, p := range pending {
		if res := receive(t, p); res.status != http.StatusOK {
			t.Errorf("got %d %s", res.status, res.body)
		}
	}
}

// TestSlotsRefusals: a request that finds every replica at the cap gets a 503 in the OpenAI
// shape with Retry-After when the queue is full, when its wait expires, or at once when holding
// is off; a waiter whose client hangs up leaves the queue and never reaches a replica.
func TestSlotsRefusals(t *testing.T) {
	tests := map[string]struct {
		cfg         ServiceConfig
		held        int // requests waiting before the one refused
		wantCode    string
		wantMessage string
	}{
		"queue full": {
			cfg: ServiceConfig{MaxQueuedRequests: 1}, held: 1, wantCode: "queue_full",
			wantMessage: `every replica of service "llama" is at its limit of requests in flight and 1 requests are already waiting; retry shortly`,
		},
		"wait expired": {
			cfg: ServiceConfig{MaxQueueWait: 100 * time.Millisecond}, wantCode: "queue_timeout",
			wantMessage: `no replica of service "llama" had a free slot within 100ms`,
		},
		"holding off": {
			cfg: ServiceConfig{MaxQueuedRequests: -1}, wantCode: "replicas_busy",
			wantMessage: `every replica of service "llama" is at its limit of requests in flight; retry shortly`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u, g := startGatedUpstream(t, "a")
			defer g.open() // before the proxy's shutdown, which waits for held requests
			tc.cfg.MaxInFlightPerReplica = 1
			svc, base := startProxy(t, tc.cfg, backendsOf(u)...)
			c := newClient(t)
			busy := doAsync(c, base+"/v1/completions", `{}`)
			waitFor(t, "the slot taken", func() bool { return g.arrivals.Load() == 1 })
			var held []<-chan asyncResult
			for range tc.held {
				held = append(held, doAsync(c, base+"/v1/completions", `{}`))
			}
			waitFor(t, "the waiters", func() bool { return svc.Waiting() == int64(tc.held) })

			res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
			if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") != "1" {
				t.Errorf("got %d Retry-After %q, want 503 with Retry-After 1", res.status, res.header.Get("Retry-After"))
			}
			e := decodeError(t, res.body)
			if e.Error.Code != tc.wantCode || e.Error.Type != "service_unavailable" || e.Error.Message != tc.wantMessage {
				t.Errorf("error = %+v, want code %q message %q", e.Error, tc.wantCode, tc.wantMessage)
			}
			g.open()
			for _, r := range append(held, busy) {
				if res := receive(t, r); res.status != http.StatusOK {
					t.Errorf("a request admitted before the refusal got %d %s", res.status, res.body)
				}
			}
			if got := u.hits.Load(); got != int64(1+tc.held) {
				t.Errorf("replica hits = %d, want %d (the refused request must not reach it)", got, 1+tc.held)
			}
		})
	}

	t.Run("client gone", func(t *testing.T) {
		u, g := startGatedUpstream(t, "a")
		defer g.open() // before the proxy's shutdown, which waits for held requests
		svc, base := startProxy(t, ServiceConfig{MaxInFlightPerReplica: 1}, backendsOf(u)...)
		c := newClient(t)
		busy := doAsync(c, base+"/v1/completions", `{}`)
		waitFor(t, "the slot taken", func() bool { return g.arrivals.Load() == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
		gone := make(chan error, 1)
		go func() {
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			gone <- err
		}()
		waitFor(t, "the waiter", func() bool { return svc.Waiting() == 1 })
		cancel()
		<-gone
		waitFor(t, "the departed waiter to leave the queue", func() bool { return svc.Waiting() == 0 })
		g.open()
		if res := receive(t, busy); res.status != http.StatusOK {
			t.Errorf("busy request: %d", res.status)
		}
		// The next request takes the freed slot at once: the departed waiter kept no grant.
		if res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)); res.status != http.StatusOK {
			t.Errorf("next request: %d %s", res.status, res.body)
		}
		if got := u.hits.Load(); got != 2 {
			t.Errorf("replica hits = %d, want 2 (the departed waiter must not reach it)", got)
		}
	})
}

// TestSlotsUnderLoad: many concurrent requests of random lengths through three replicas with two
// slots each all succeed, nothing stays queued or in flight, and the replicas stay near the cap
// (concurrent arrivals may overshoot it by a request or two for an instant: the check and the
// count are not one atomic step).
func TestSlotsUnderLoad(t *testing.T) {
	const limit, requests, clients = 2, 300, 24
	var ups []*upstream
	var concs [3]concurrency
	for i := range 3 {
		conc := &concs[i]
		ups = append(ups, startUpstream(t, fmt.Sprint(i), func(w http.ResponseWriter, r *http.Request) {
			conc.enter()
			defer conc.exit()
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
			okHandler(w, r)
		}))
	}
	svc, base := startProxy(t, ServiceConfig{MaxInFlightPerReplica: limit}, backendsOf(ups...)...)
	c := newClient(t)
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= requests {
				resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(`{}`))
				if err != nil {
					failed.Add(1)
					continue
				}
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if got := failed.Load(); got != 0 {
		t.Errorf("%d of %d requests failed", got, requests)
	}
	var hits int64
	for i, u := range ups {
		hits += u.hits.Load()
		if m := concs[i].max.Load(); m > limit+2 {
			t.Errorf("replica %d had %d requests at once, cap %d", i, m, limit)
		}
	}
	if hits != requests {
		t.Errorf("replicas served %d requests, want %d", hits, requests)
	}
	waitFor(t, "the queue and in-flight counts to drain", func() bool { return svc.Waiting() == 0 && svc.InFlight() == 0 })
}

// TestSlotsLearnedFromMetrics: by default each replica's cap is its batch size, learned from
// its engine metrics once it has been seen full; beyond it requests wait in the proxy and go to
// the first replica with a free slot; a learned cap never refuses a request: past
// MaxQueuedRequests it goes to a replica anyway.
func TestSlotsLearnedFromMetrics(t *testing.T) {
	var rel releases
	const batch = 2
	a := startEngineUpstream(t, "a", batch, func(id string) <-chan struct{} { return rel.of(id) })
	b := startEngineUpstream(t, "b", batch, func(id string) <-chan struct{} { return rel.of(id) })
	svc, base := serveProxy(t, ServiceConfig{MaxQueuedRequests: 1, HealthCheck: HealthCheck{Interval: -1}}, backendsOf(a.upstream, b.upstream)...)
	c := newClient(t)
	url := base + "/v1/completions"

	// Before anything is learned there is no cap: six requests reach the replicas, three
	// each, and each engine queues one.
	var pending []<-chan asyncResult
	for i := 1; i <= 6; i++ {
		pending = append(pending, doAsync(c, url, fmt.Sprintf(`{"id":"%d"}`, i)))
		waitFor(t, "the request to reach a replica", func() bool { return len(a.ids())+len(b.ids()) == i })
	}
	if len(a.ids()) != 3 || len(b.ids()) != 3 {
		t.Fatalf("replicas got %v and %v, want three each", a.ids(), b.ids())
	}
	caps := svc.snap.Load().caps
	waitFor(t, "both batch sizes to be learned", func() bool {
		return caps[0].size.Load() == batch && caps[1].size.Load() == batch
	})

	pending = append(pending, doAsync(c, url, `{"id":"7"}`))
	waitFor(t, "request 7 to wait in the proxy", func() bool { return svc.Waiting() == 1 })
	// The queue (MaxQueuedRequests 1) is full: request 8 goes to a replica anyway.
	pending = append(pending, doAsync(c, url, `{"id":"8"}`))
	waitFor(t, "request 8 to reach a replica", func() bool { return len(a.ids())+len(b.ids()) == 7 })
	if svc.Waiting() != 1 {
		t.Fatalf("Waiting = %d after request 8, want request 7 alone", svc.Waiting())
	}

	// Replica a drops to one request in flight, below its batch: request 7 goes there.
	first := a
	if len(b.ids()) < len(a.ids()) {
		first = b // the one with three requests; the other has four since request 8
	}
	rel.release(first.ids()[0])
	rel.release(first.ids()[1])
	waitFor(t, "request 7 to reach the replica that freed slots", func() bool { return slices.Contains(first.ids(), "7") })
	for i := 1; i <= 8; i++ {
		rel.release(strconv.Itoa(i))
	}
	for i, p := range pending {
		if res := receive(t, p); res.status != http.StatusOK {
			t.Errorf("request %d: %d %s", i+1, res.status, res.body)
		}
	}
}

// TestSlotsLearnedCapProbes: a replica at its learned cap takes one more request while its last
// fresh scrape showed no queue in the engine, so that a cap learned too low can grow; never
// under a configured cap, nor on stale or queued metrics.
func TestSlotsLearnedCapProbes(t *testing.T) {
	now := time.Now().UnixNano()
	tests := map[string]struct {
		limit    int
		shares   int
		learned  int64
		inFlight int64
		metrics  policy.Metrics
		want     int64
	}{
		"unknown size":             {0, 1, 0, 50, policy.Metrics{}, noCap},
		"below the cap":            {0, 1, 4, 1, policy.Metrics{Waiting: 3, UpdatedAt: now}, 3},
		"at the cap, queue":        {0, 1, 4, 4, policy.Metrics{Waiting: 1, Running: 4, UpdatedAt: now}, 0},
		"at the cap, no queue":     {0, 1, 4, 4, policy.Metrics{Running: 4, UpdatedAt: now}, 1},
		"probe in flight":          {0, 1, 4, 5, policy.Metrics{Running: 4, UpdatedAt: now}, 0},
		"stale metrics":            {0, 1, 4, 4, policy.Metrics{Running: 4, UpdatedAt: now - int64(2*policy.DefaultMetricsStaleAfter)}, 0},
		"configured cap, no queue": {4, 1, 0, 4, policy.Metrics{Running: 4, UpdatedAt: now}, 0},
		"probes backed off":        {0, 1, 4, 4, policy.Metrics{Running: 4, UpdatedAt: now}, 0},
		// Shared by three proxies: a configured 8 is 2 each (never 9 together), a learned 8
		// is 3 each (rounded up: it only delays).
		"configured cap, 3 shares":    {8, 3, 0, 1, policy.Metrics{Waiting: 3, UpdatedAt: now}, 1},
		"learned cap, 3 shares":       {0, 3, 8, 1, policy.Metrics{Waiting: 3, UpdatedAt: now}, 2},
		"configured cap, many shares": {2, 5, 0, 0, policy.Metrics{}, 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &policy.Replica{ID: 1}
			learned := &learnedCap{}
			learned.raise(tc.learned)
			r.InFlight.Store(tc.inFlight)
			r.SetMetrics(tc.metrics)
			if name == "probes backed off" {
				learned.probeAfter.Store(now + int64(time.Minute))
			}
			if got := newSlotQueue(tc.limit, tc.shares).free(r, learned); got != tc.want {
				t.Errorf("free = %d, want %d", got, tc.want)
			}
		})
	}
}

// BenchmarkProxyNonStreamSlots is BenchmarkProxyNonStream's replicas=4 with a per-replica cap:
// "none" has late binding off, "learned" is the default with no size learned (the replicas
// have no engine metrics), "free" leaves room (the common path: one load per replica, no lock), "saturated" has one slot
// per replica for 8 concurrent clients per core, so most requests wait in the queue and are
// handed a slot by the request before them.
func BenchmarkProxyNonStreamSlots(b *testing.B) {
	for _, tc := range []struct {
		name       string
		limit, par int
	}{{"none", -1, 1}, {"learned", 0, 1}, {"free", 1 << 20, 1}, {"saturated", 1, 8}} {
		b.Run(tc.name, func(b *testing.B) {
			svc, err := NewService(ServiceConfig{Name: "bench", Logger: zap.NewNop(), MaxInFlightPerReplica: tc.limit})
			if err != nil {
				b.Fatal(err)
			}
			up := startMemUpstream(b)
			svc.dial = func(string) (net.Conn, error) { return up.Dial() }
			backends := make([]Backend, 4)
			for i := range backends {
				backends[i] = Backend{ID: i + 1, Addr: net.JoinHostPort("10.0.0.1", strconv.Itoa(8000+i)), Version: 1}
			}
			svc.SetBackends(backends)
			ln := fasthttputil.NewInmemoryListener()
			go func() { _ = svc.Serve(ln) }()
			b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
			b.SetParallelism(tc.par)
			benchRequests(b, memClient(ln))
		})
	}
}

// offeredPicker records the replicas it is offered and picks the first; needs is what it
// declares.
type offeredPicker struct {
	needs   policy.Needs
	offered []int
}

func (p *offeredPicker) Needs() policy.Needs { return p.needs }

func (p *offeredPicker) Pick(_ *policy.Request, rs []*policy.Replica) *policy.Replica {
	p.offered = p.offered[:0]
	for _, r := range rs {
		p.offered = append(p.offered, r.ID)
	}
	if len(rs) == 0 {
		return nil
	}
	return rs[0]
}

// Under learned caps, a picker that weighs queues itself is offered full replicas too (a
// cached prefix may be worth a short wait there), also after waiting in the proxy for a slot;
// other pickers, and every picker under a configured cap, only replicas below their cap.
func TestPickOffersFullReplicasToQueueWeighingPickers(t *testing.T) {
	full, free := &policy.Replica{ID: 1}, &policy.Replica{ID: 2}
	full.InFlight.Add(2)
	caps := []*learnedCap{{}, {}}
	caps[0].size.Store(2)
	caps[1].size.Store(2)
	caps[0].probeAfter.Store(math.MaxInt64) // no probe beyond the cap
	snap := &snapshot{pick: []*policy.Replica{full, free}, pickCaps: caps}
	for name, tc := range map[string]struct {
		needs  policy.Needs
		limit  int
		waited bool
		want   []int
	}{
		"weighs queues, learned caps":                 {needs: policy.WeighsQueues, limit: 0, want: []int{1, 2}},
		"weighs queues, learned caps, waited for one": {needs: policy.WeighsQueues, limit: 0, waited: true, want: []int{1, 2}},
		"cache-blind, learned caps":                   {needs: 0, limit: 0, want: []int{2}},
		"weighs queues, configured caps":              {needs: policy.WeighsQueues, limit: 2, want: []int{2}},
	} {
		t.Run(name, func(t *testing.T) {
			p := &offeredPicker{needs: tc.needs}
			ex := &exchange{svc: &Service{needs: tc.needs}, slotWaited: tc.waited}
			ex.pick(p, snap, newSlotQueue(tc.limit, 1))
			if !slices.Equal(p.offered, tc.want) {
				t.Errorf("offered %v, want %v", p.offered, tc.want)
			}
		})
	}
}
