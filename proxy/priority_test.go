package proxy

import (
	"context"
	"fmt"
	"io"
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/tenants"
)

// headerClassify is the tests' Service.classify: the class from x-ferry-priority, the tenant
// from x-test-tenant (in production both come from the request's API key).
func headerClassify(ctx *fasthttp.RequestCtx, ex *exchange) {
	ex.class, _ = tenants.ParsePriority(string(ctx.Request.Header.Peek("x-ferry-priority")))
	ex.tenant = string(ctx.Request.Header.Peek("x-test-tenant"))
}

// startClassifiedProxy is startProxy with headerClassify set before the service serves.
func startClassifiedProxy(t *testing.T, cfg ServiceConfig, backends ...Backend) (*Service, string) {
	t.Helper()
	cfg.HealthCheck.Interval = -1
	if cfg.Name == "" {
		cfg.Name = "llama"
	}
	cfg.Logger = testLogger(t)
	svc, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc.classify = headerClassify
	svc.SetBackends(backends)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := svc.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return svc, "http://" + ln.Addr().String()
}

// classed POSTs {"id":id} as tenant with priority class on its own goroutine.
func classed(c *http.Client, url, id, tenant, class string) <-chan asyncResult {
	out := make(chan asyncResult, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"id":"`+id+`"}`))
		req.Header.Set("x-ferry-priority", class)
		req.Header.Set("x-test-tenant", tenant)
		resp, err := c.Do(req)
		if err != nil {
			out <- asyncResult{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- asyncResult{result: result{status: resp.StatusCode, header: resp.Header, body: string(b)}, err: err}
	}()
	return out
}

// serveInTurn releases the held upstream's requests one at a time, each once it has arrived,
// until it has served n, and returns their ids in the order they reached it.
func serveInTurn(t *testing.T, u *heldUpstream, rel *releases, n int) []string {
	t.Helper()
	for i := range n {
		waitFor(t, "request "+strconv.Itoa(i+1)+" at the replica", func() bool { return len(u.ids()) > i })
		rel.release(u.ids()[i])
	}
	return u.ids()
}

// TestPriorityClassOrder: with every slot taken, waiting requests reach the replica interactive
// first, then standard, then batch, each class in arrival order.
func TestPriorityClassOrder(t *testing.T) {
	var rel releases
	u := startHeldUpstream(t, "a", func(id string) <-chan struct{} { return rel.of(id) })
	svc, base := startClassifiedProxy(t, ServiceConfig{Policy: "least_load", MaxInFlightPerReplica: 1}, backendsOf(u.upstream)...)
	c := newClient(t)
	url := base + "/v1/completions"

	pending := []<-chan asyncResult{classed(c, url, "busy", "", "standard")}
	waitFor(t, "the slot taken", func() bool { return len(u.ids()) == 1 })
	for i, r := range [][2]string{{"b1", "batch"}, {"s1", "standard"}, {"i1", "interactive"}, {"b2", "sheddable"}, {"s2", ""}, {"i2", "interactive"}} {
		pending = append(pending, classed(c, url, r[0], "", r[1]))
		waitFor(t, "the request to wait", func() bool { return svc.Waiting() == int64(i+1) })
	}
	got := serveInTurn(t, u, &rel, 7)
	want := []string{"busy", "i1", "i2", "s1", "s2", "b1", "b2"}
	if !slices.Equal(got, want) {
		t.Errorf("served %v, want %v", got, want)
	}
	for _, p := range pending {
		if res := receive(t, p); res.status != http.StatusOK {
			t.Errorf("got %d %s", res.status, res.body)
		}
	}
}

// TestPriorityFairShare: a heavy tenant with fifty requests waiting delays a light tenant's
// single request by at most one grant; the heavy tenant's own go in order.
func TestPriorityFairShare(t *testing.T) {
	var rel releases
	u := startHeldUpstream(t, "a", func(id string) <-chan struct{} { return rel.of(id) })
	svc, base := startClassifiedProxy(t, ServiceConfig{Policy: "least_load", MaxInFlightPerReplica: 1}, backendsOf(u.upstream)...)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(c.CloseIdleConnections)
	url := base + "/v1/completions"

	pending := []<-chan asyncResult{classed(c, url, "busy", "heavy", "standard")}
	waitFor(t, "the slot taken", func() bool { return len(u.ids()) == 1 })
	for i := range 50 {
		pending = append(pending, classed(c, url, fmt.Sprint("h", i), "heavy", "standard"))
		waitFor(t, "the heavy tenant's requests to wait", func() bool { return svc.Waiting() == int64(i+1) })
	}
	pending = append(pending, classed(c, url, "light", "light", "standard"))
	waitFor(t, "the light tenant's request to wait", func() bool { return svc.Waiting() == 51 })

	got := serveInTurn(t, u, &rel, 52)
	if at := slices.Index(got, "light"); at < 1 || at > 2 {
		t.Errorf("the light tenant's request was served %d grants after the slot freed (order %v), want 1 or 2", at, got[:min(len(got), 5)])
	}
	heavy := slices.DeleteFunc(slices.Clone(got[1:]), func(id string) bool { return id == "light" })
	for i, id := range heavy {
		if id != fmt.Sprint("h", i) {
			t.Fatalf("the heavy tenant's requests were served out of order: %v", heavy)
		}
	}
	for _, p := range pending {
		if res := receive(t, p); res.status != http.StatusOK {
			t.Errorf("got %d %s", res.status, res.body)
		}
	}
}

// TestPriorityShedding: at a full queue a batch request is refused, a higher class sheds the
// newest waiter of the lowest class below it, and a light tenant sheds the newest request of a
// tenant with two more waiting; each refused or shed request gets 503 with Retry-After and the
// OpenAI error shape, and ferry_requests_shed_total counts it by class and reason.
func TestPriorityShedding(t *testing.T) {
	u, g := startGatedUpstream(t, "a")
	defer g.open() // before the proxy's shutdown, which waits for held requests
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	svc, base := startClassifiedProxy(t, ServiceConfig{Policy: "least_load", MaxInFlightPerReplica: 1, MaxQueuedRequests: 3, Metrics: m}, backendsOf(u)...)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	t.Cleanup(c.CloseIdleConnections)
	url := base + "/v1/completions"

	served := []<-chan asyncResult{classed(c, url, "busy", "", "standard")}
	waitFor(t, "the slot taken", func() bool { return g.arrivals.Load() == 1 })
	wait := func(id, tenant, class string) <-chan asyncResult {
		before := svc.Waiting()
		r := classed(c, url, id, tenant, class)
		waitFor(t, id+" to wait", func() bool { return svc.Waiting() == before+1 })
		return r
	}
	b1 := wait("b1", "k", "batch")
	b2 := wait("b2", "k", "batch")
	served = append(served, wait("s1", "heavy", "standard"))

	wantRefused := func(what string, r <-chan asyncResult, code string) {
		t.Helper()
		res := receive(t, r)
		if res.status != http.StatusServiceUnavailable || res.header.Get("Retry-After") == "" {
			t.Fatalf("%s: got %d Retry-After %q, want 503 with Retry-After", what, res.status, res.header.Get("Retry-After"))
		}
		if e := decodeError(t, res.body); e.Error.Code != code || e.Error.Type != "service_unavailable" {
			t.Errorf("%s: error %+v, want code %s", what, e.Error, code)
		}
	}
	// Full (b1, b2, s1): a batch request is refused, and sheds nobody.
	wantRefused("a batch request at a full queue", classed(c, url, "b3", "k", "batch"), "queue_full")
	// An interactive request sheds the newest batch waiter, then the other.
	served = append(served, classed(c, url, "i1", "", "interactive"))
	wantRefused("the newest batch waiter", b2, "request_shed")
	served = append(served, classed(c, url, "s2", "heavy", "standard"))
	wantRefused("the other batch waiter", b1, "request_shed")
	// Full (s1, s2 of heavy, i1): heavy's third request finds nobody to shed.
	wantRefused("a heavy tenant's standard request", classed(c, url, "s3", "heavy", "standard"), "queue_full")
	// A light tenant's standard request sheds heavy's newest.
	served = append(served, classed(c, url, "l1", "light", "standard"))
	wantRefused("the heavy tenant's newest", served[3], "request_shed")
	served = slices.Delete(served, 3, 4)
	if got := svc.Waiting(); got != 3 {
		t.Errorf("Waiting = %d, want 3 (i1, s1, l1)", got)
	}

	g.open()
	for _, r := range served {
		if res := receive(t, r); res.status != http.StatusOK {
			t.Errorf("a request kept in the queue got %d %s", res.status, res.body)
		}
	}
	for _, tc := range []struct {
		class, reason string
		want          float64
	}{
		{"batch", "evicted", 2}, {"batch", "queue_full", 1}, {"standard", "evicted", 1}, {"standard", "queue_full", 1},
		{"interactive", "evicted", 0},
	} {
		if got := testutil.ToFloat64(m.shed.WithLabelValues("llama", tc.class, tc.reason)); got != tc.want {
			t.Errorf("ferry_requests_shed_total{class=%q,reason=%q} = %v, want %v", tc.class, tc.reason, got, tc.want)
		}
	}
	for _, class := range classNames {
		if got := testutil.ToFloat64(m.waitingByClass.WithLabelValues("llama", class)); got != 0 {
			t.Errorf("ferry_requests_waiting_by_class{class=%q} = %v at the end, want 0", class, got)
		}
	}
}

// TestPriorityShedWhileHeld: without late binding, requests held for a first replica are shed
// the same way, and the rest go on when the replica comes.
func TestPriorityShedWhileHeld(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	svc, base := startClassifiedProxy(t, ServiceConfig{Policy: "least_load", MaxInFlightPerReplica: -1, MaxQueuedRequests: 2})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	t.Cleanup(c.CloseIdleConnections)
	url := base + "/v1/completions"
	b1 := classed(c, url, "b1", "", "batch")
	waitFor(t, "b1 held", func() bool { return svc.Waiting() == 1 })
	s1 := classed(c, url, "s1", "", "standard")
	waitFor(t, "s1 held", func() bool { return svc.Waiting() == 2 })
	i1 := classed(c, url, "i1", "", "interactive")
	res := receive(t, b1)
	if res.status != http.StatusServiceUnavailable || decodeError(t, res.body).Error.Code != "request_shed" {
		t.Fatalf("the held batch request: %d %s, want 503 request_shed", res.status, res.body)
	}
	waitFor(t, "i1 held", func() bool { return svc.Waiting() == 2 })
	svc.SetBackends(backendsOf(u))
	for _, r := range []<-chan asyncResult{s1, i1} {
		if res := receive(t, r); res.status != http.StatusOK {
			t.Errorf("got %d %s", res.status, res.body)
		}
	}
}

// TestPriorityColdStartOrder: under late binding, requests held for a first replica wait in the
// slot queue, so the first replica's slots go by class.
func TestPriorityColdStartOrder(t *testing.T) {
	var rel releases
	u := startHeldUpstream(t, "a", func(id string) <-chan struct{} { return rel.of(id) })
	svc, base := startClassifiedProxy(t, ServiceConfig{Policy: "least_load", MaxInFlightPerReplica: 1})
	c := newClient(t)
	url := base + "/v1/completions"
	var pending []<-chan asyncResult
	for i, r := range [][2]string{{"b1", "batch"}, {"s1", "standard"}, {"i1", "interactive"}} {
		pending = append(pending, classed(c, url, r[0], "", r[1]))
		waitFor(t, "the request to be held", func() bool { return svc.Waiting() == int64(i+1) })
	}
	svc.SetBackends(backendsOf(u.upstream))
	if got, want := serveInTurn(t, u, &rel, 3), []string{"i1", "s1", "b1"}; !slices.Equal(got, want) {
		t.Errorf("served %v, want %v", got, want)
	}
	for _, p := range pending {
		if res := receive(t, p); res.status != http.StatusOK {
			t.Errorf("got %d %s", res.status, res.body)
		}
	}
}

// TestPriorityBatchNotSentOnUnderLearnedCaps: under learned caps a request that cannot wait is
// sent on to a full replica, but a batch request is refused, with Retry-After.
func TestPriorityBatchNotSentOnUnderLearnedCaps(t *testing.T) {
	s := &Service{slots: newSlotQueue(0, 1), errs: newErrorBodies("llama", 1).withHoldBodies("llama", 1, time.Second)}
	snap := &snapshot{replicas: make([]*policy.Replica, 1)}
	for _, tc := range []struct {
		class    tenants.Priority
		wantSent bool
	}{{tenants.PriorityInteractive, true}, {tenants.PriorityStandard, true}, {tenants.PriorityBatch, false}} {
		ex := &exchange{class: tc.class}
		got, refusal := s.noSlot(ex, snap, shedExpired, s.errs.noReplicaTimeout, s.errs.slotsTimeout)
		if sent := got != nil; sent != tc.wantSent || (refusal == nil) == (got == nil) {
			t.Errorf("%v: sent %v refusal %q, want sent %v", tc.class, sent, refusal, tc.wantSent)
		}
		if !tc.wantSent && ex.retryAfter < 1 {
			t.Errorf("%v: Retry-After %d", tc.class, ex.retryAfter)
		}
	}
}

// TestPriorityUnderLoad: many clients of random classes and tenants through three replicas with
// one slot each and a small queue: every request is served or shed with 503, none hangs (no
// lost wake-up), and nothing stays counted as waiting or queued.
func TestPriorityUnderLoad(t *testing.T) {
	const requests, clients = 400, 32
	var ups []*upstream
	for i := range 3 {
		ups = append(ups, startUpstream(t, fmt.Sprint(i), func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			okHandler(w, r)
		}))
	}
	svc, base := startClassifiedProxy(t, ServiceConfig{Policy: "least_load", MaxInFlightPerReplica: 1, MaxQueuedRequests: 12}, backendsOf(ups...)...)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	t.Cleanup(c.CloseIdleConnections)
	classes := []string{"interactive", "standard", "batch"}
	var next, ok, shed, other atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := next.Add(1); n <= requests; n = next.Add(1) {
				res := <-classed(c, base+"/v1/completions", fmt.Sprint(n), fmt.Sprint(rand.IntN(4)), classes[rand.IntN(3)])
				switch {
				case res.err == nil && res.status == http.StatusOK:
					ok.Add(1)
				case res.err == nil && res.status == http.StatusServiceUnavailable && res.header.Get("Retry-After") != "":
					shed.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if other.Load() != 0 || ok.Load()+shed.Load() != requests {
		t.Errorf("%d served, %d shed, %d otherwise; want %d served or shed", ok.Load(), shed.Load(), other.Load(), requests)
	}
	waitFor(t, "the queue and in-flight counts to drain", func() bool { return svc.Waiting() == 0 && svc.InFlight() == 0 })
	l := &svc.slots.line
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.queued.Load() != 0 || l.order.len() != 0 {
		t.Errorf("queued %d, in order %d after the load", l.queued.Load(), l.order.len())
	}
}
