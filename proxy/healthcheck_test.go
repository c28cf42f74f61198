package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fastChecks finds a hung replica within about a quarter second, so tests wait little; the
// timeout still leaves a loaded CI machine room to answer a health check.
var fastChecks = HealthCheck{Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond}

// freezable is an upstream that can be made to hang like a SIGSTOPped process: while frozen,
// every request, /health included, gets no byte until it is thawed or its client goes away,
// and streams stop mid-way.
type freezable struct {
	*upstream
	health   atomic.Int64 // health checks seen
	requests atomic.Int64 // other requests seen

	mu     sync.Mutex
	thawed chan struct{} // nil while thawed; closed by thaw
}

func startFreezable(t *testing.T, name string, h http.HandlerFunc) *freezable {
	t.Helper()
	f := &freezable{}
	f.upstream = startUpstream(t, name, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			f.health.Add(1)
			f.await(r.Context())
			w.WriteHeader(http.StatusOK)
			return
		}
		f.requests.Add(1)
		f.await(r.Context())
		h(w, r)
	})
	t.Cleanup(f.thaw) // runs before the server's Close, which waits for handlers
	return f
}

// await blocks while the upstream is frozen.
func (f *freezable) await(ctx context.Context) {
	f.mu.Lock()
	ch := f.thawed
	f.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

func (f *freezable) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed == nil {
		f.thawed = make(chan struct{})
	}
}

func (f *freezable) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thawed != nil {
		close(f.thawed)
		f.thawed = nil
	}
}

// streamingHandler sends an event every gap until n are sent (freezing stops it mid-way).
func (f *freezable) streamingHandler(n int, gap time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			f.await(r.Context())
			if r.Context().Err() != nil {
				return
			}
			sseEvent(w, fmt.Sprintf(`{"i":%d}`, i))
			time.Sleep(gap)
		}
		sseEvent(w, "[DONE]")
	}
}

func ejected(svc *Service) string { return fmt.Sprint(svc.Ejected()) }

func TestHealthCheckEjectsHungReplicaAndReadmitsIt(t *testing.T) {
	m, reg := newTestMetrics(t)
	a := startFreezable(t, "a", okHandler)
	b := startUpstream(t, "b", okHandler)
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", HealthCheck: fastChecks, Metrics: m}, backendsOf(a.upstream, b)...)
	c := newClient(t)

	a.freeze()
	waitFor(t, "replica 1 ejected", func() bool { return ejected(svc) == "[1]" })
	if got := seriesValue(t, reg, "ferry_replicas_ejected", "service", "llama"); got != 1 {
		t.Errorf("ferry_replicas_ejected = %v, want 1", got)
	}
	if got := seriesValue(t, reg, "ferry_replica_ejections_total", "service", "llama"); got != 1 {
		t.Errorf("ferry_replica_ejections_total = %v, want 1", got)
	}
	requestsA := a.requests.Load()
	for range 6 {
		if res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`)); res.status != 200 || res.header.Get("X-Upstream") != "b" {
			t.Fatalf("with replica 1 ejected: %d from %q, want 200 from b", res.status, res.header.Get("X-Upstream"))
		}
	}
	if got := a.requests.Load(); got != requestsA {
		t.Errorf("the ejected replica got %d requests besides health checks", got-requestsA)
	}

	a.thaw()
	waitFor(t, "replica 1 back in rotation", func() bool { return ejected(svc) == "[]" })
	if got := seriesValue(t, reg, "ferry_replicas_ejected", "service", "llama"); got != 0 {
		t.Errorf("ferry_replicas_ejected after the return = %v, want 0", got)
	}
	served := map[string]int{}
	for range 4 {
		served[do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`)).header.Get("X-Upstream")]++
	}
	if served["a"] == 0 {
		t.Errorf("replica 1 serves nothing after its return: %v", served)
	}
}

// TestEjectionRetriesWaitingRequest: a request waiting on a replica that hung gets no answer;
// the ejection closes its connection and it is retried on a healthy replica, long before the
// idle timeout.
func TestEjectionRetriesWaitingRequest(t *testing.T) {
	a := startFreezable(t, "a", okHandler)
	b := startUpstream(t, "b", okHandler)
	// round_robin sends the first request to a; a timeout is never retried, so a 200 from b
	// can only come from the ejection.
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", HealthCheck: fastChecks, IdleTimeout: time.Minute},
		backendsOf(a.upstream, b)...)
	a.freeze()
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`))
	if res.status != 200 || res.header.Get("X-Upstream") != "b" {
		t.Fatalf("request caught by the hang: %d from %q %s, want 200 from b", res.status, res.header.Get("X-Upstream"), res.body)
	}
	if got := ejected(svc); got != "[1]" {
		t.Errorf("ejected = %s, want [1]", got)
	}
	waitFor(t, "in-flight back to 0", func() bool { return svc.InFlight() == 0 })
}

// TestEjectionEndsStream: a stream under way on a replica that hangs ends with the
// OpenAI-shaped error event once the replica is ejected.
func TestEjectionEndsStream(t *testing.T) {
	var f *freezable
	f = startFreezable(t, "a", func(w http.ResponseWriter, r *http.Request) { f.streamingHandler(1000, 5*time.Millisecond)(w, r) })
	b := startUpstream(t, "b", okHandler)
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", HealthCheck: fastChecks}, backendsOf(f.upstream, b)...)
	_, r := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, r); !strings.Contains(got, `"i":0`) {
		t.Fatalf("first event %q", got)
	}
	f.freeze()
	// The events sent before the freeze, then the error event.
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended without an error event: %v", err)
		}
		if strings.Contains(line, "stream_interrupted") {
			if e := decodeError(t, strings.TrimPrefix(strings.TrimSpace(line), "data: ")); e.Error.Type != "upstream_error" {
				t.Errorf("error event = %+v", e)
			}
			break
		}
	}
	if got := ejected(svc); got != "[1]" {
		t.Errorf("ejected = %s, want [1]", got)
	}
	waitFor(t, "in-flight back to 0", func() bool { return svc.InFlight() == 0 })
}

// TestSlowButProgressingReplicaStays: a replica whose health endpoint is slower than the
// check's timeout is not ejected while it sends response bytes (a loaded engine streaming
// tokens); once it is silent on every connection too, it is.
func TestSlowButProgressingReplicaStays(t *testing.T) {
	slowHealth := make(chan struct{})
	t.Cleanup(func() { close(slowHealth) })
	var streaming atomic.Bool
	a := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			select { // slower than any check's timeout
			case <-slowHealth:
			case <-r.Context().Done():
			}
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		streaming.Store(true)
		defer streaming.Store(false)
		for i := range 150 {
			sseEvent(w, fmt.Sprintf(`{"i":%d}`, i))
			time.Sleep(10 * time.Millisecond)
		}
		sseEvent(w, "[DONE]")
	})
	b := startUpstream(t, "b", okHandler)
	checks := HealthCheck{Interval: 20 * time.Millisecond, Timeout: 500 * time.Millisecond}
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", HealthCheck: checks}, backendsOf(a, b)...)
	_, r := openStream(t, newClient(t), base+"/v1/chat/completions") // round_robin: to a
	readEvent(t, r)
	for streaming.Load() {
		if got := ejected(svc); got != "[]" {
			t.Fatalf("replica ejected while streaming tokens: %s", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rest, err := readAll(r); err != nil || !strings.Contains(rest, "[DONE]") {
		t.Fatalf("stream from the slow-health replica: %v, ends %q", err, tail(rest))
	}
	waitFor(t, "silent replica ejected", func() bool { return ejected(svc) == "[1]" })
}

// TestAnyAnswerIsHealthy: a health endpoint answering 503 or 404 is an answer; readiness is
// the controller's business.
func TestAnyAnswerIsHealthy(t *testing.T) {
	var checks atomic.Int64
	a := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		checks.Add(1)
		http.Error(w, "loading", http.StatusServiceUnavailable)
	})
	b := startUpstream(t, "b", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	// A generous timeout: the test asserts that nothing is ejected, and a loaded machine must
	// not make a check time out.
	svc, _ := startProxy(t, ServiceConfig{HealthCheck: HealthCheck{Interval: 20 * time.Millisecond, Timeout: 5 * time.Second}}, backendsOf(a, b)...)
	waitFor(t, "five checks", func() bool { return checks.Load() >= 5 })
	if got := ejected(svc); got != "[]" {
		t.Errorf("ejected = %s, want none", got)
	}
}

func TestRefusedReplicaIsEjected(t *testing.T) {
	b := startUpstream(t, "b", okHandler)
	svc, base := startProxy(t, ServiceConfig{Policy: "round_robin", HealthCheck: fastChecks},
		Backend{ID: 1, Addr: deadAddr(t)}, Backend{ID: 2, Addr: b.addr()})
	waitFor(t, "dead replica ejected", func() bool { return ejected(svc) == "[1]" })
	for range 4 {
		if res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)); res.status != 200 {
			t.Fatalf("status %d", res.status)
		}
	}
	if got := b.hits.Load(); got < 4 {
		t.Errorf("b served %d, want every request", got)
	}
}

// TestLastReplicaIsNeverEjected: with every replica hung, one stays in rotation.
func TestLastReplicaIsNeverEjected(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprint(n, " replicas"), func(t *testing.T) {
			var ups []*upstream
			var fs []*freezable
			for i := range n {
				f := startFreezable(t, fmt.Sprint("r", i), okHandler)
				fs = append(fs, f)
				ups = append(ups, f.upstream)
			}
			svc, _ := startProxy(t, ServiceConfig{HealthCheck: fastChecks}, backendsOf(ups...)...)
			for _, f := range fs {
				f.freeze()
			}
			// Several failed checks of every replica.
			waitFor(t, "three checks of each replica", func() bool {
				return !slices.ContainsFunc(fs, func(f *freezable) bool { return f.health.Load() < 3 })
			})
			if got, want := len(svc.Ejected()), n-1; got != want {
				t.Errorf("%d of %d hung replicas ejected, want %d", got, n, want)
			}
			if len(svc.snap.Load().pick) != 1 {
				t.Errorf("pick set %d, want 1", len(svc.snap.Load().pick))
			}
		})
	}
}

// TestSetBackendsAndEjections: a replica the controller removes stops being checked and
// counted as ejected; when only ejected replicas remain, they come back.
func TestSetBackendsAndEjections(t *testing.T) {
	m, reg := newTestMetrics(t)
	a := startFreezable(t, "a", okHandler)
	b := startFreezable(t, "b", okHandler)
	c := startFreezable(t, "c", okHandler)
	svc, _ := startProxy(t, ServiceConfig{HealthCheck: fastChecks, Metrics: m}, backendsOf(a.upstream, b.upstream, c.upstream)...)
	waitFor(t, "three health goroutines", func() bool { return svc.health.active.Load() == 3 })
	a.freeze()
	waitFor(t, "replica 1 ejected", func() bool { return ejected(svc) == "[1]" })

	all := backendsOf(a.upstream, b.upstream, c.upstream)
	svc.SetBackends(all[1:]) // the controller removes the hung replica
	waitFor(t, "its check stopped", func() bool { return svc.health.active.Load() == 2 })
	if got := seriesValue(t, reg, "ferry_replicas_ejected", "service", "llama"); got != 0 {
		t.Errorf("ferry_replicas_ejected after the removal = %v, want 0", got)
	}

	b.freeze()
	waitFor(t, "replica 2 ejected", func() bool { return ejected(svc) == "[2]" })
	svc.SetBackends(all[1:2]) // only the ejected replica left: it must be in rotation
	if got := ejected(svc); got != "[]" {
		t.Errorf("ejected with only replica 2 left = %s, want none", got)
	}
	if got := len(svc.snap.Load().pick); got != 1 {
		t.Errorf("pick set %d, want 1", got)
	}
	if got := seriesValue(t, reg, "ferry_replicas_ejected", "service", "llama"); got != 0 {
		t.Errorf("ferry_replicas_ejected = %v, want 0", got)
	}
}

func TestHealthCheckStopsAtShutdown(t *testing.T) {
	a := startUpstream(t, "a", okHandler)
	svc, err := NewService(ServiceConfig{Name: "s", HealthCheck: fastChecks})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetBackends(backendsOf(a))
	waitFor(t, "a health goroutine", func() bool { return svc.health.active.Load() == 1 })
	if err := svc.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := svc.health.active.Load(); got != 0 {
		t.Errorf("%d health goroutines after Shutdown", got)
	}
	svc.SetBackends(backendsOf(a)) // after Shutdown: starts nothing
	if got := svc.health.active.Load(); got != 0 {
		t.Errorf("%d health goroutines after a SetBackends following Shutdown", got)
	}
}

func TestHealthCheckDisabled(t *testing.T) {
	a := startFreezable(t, "a", okHandler)
	b := startUpstream(t, "b", okHandler)
	svc, base := startProxy(t, ServiceConfig{HealthCheck: HealthCheck{Interval: -1}}, backendsOf(a.upstream, b)...)
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)); res.status != 200 {
		t.Fatalf("status %d", res.status)
	}
	if svc.health != nil {
		t.Fatal("a health checker runs with health checking disabled")
	}
	snap := svc.snap.Load()
	if len(snap.pick) != 2 || &snap.pick[0] != &snap.replicas[0] {
		t.Error("pick set is not the replica set")
	}
	if a.health.Load() != 0 {
		t.Error("health checks sent with health checking disabled")
	}
}

func TestHealthCheckConfig(t *testing.T) {
	if got := (HealthCheck{}).withDefaults(); got != (HealthCheck{Path: DefaultHealthCheckPath, Interval: DefaultHealthCheckInterval, Timeout: DefaultHealthCheckTimeout}) {
		t.Errorf("defaults = %+v", got)
	}
	_, err := NewService(ServiceConfig{Name: "s", HealthCheck: HealthCheck{Path: "health", Timeout: -time.Second}})
	if err == nil || !strings.Contains(err.Error(), `health check path: "health"`) || !strings.Contains(err.Error(), "health check timeout") {
		t.Errorf("NewService with a bad health check = %v, want both errors", err)
	}
}

func TestRetryableEjection(t *testing.T) {
	if !retryable(fmt.Errorf("read: %w", errReplicaEjected)) {
		t.Error("an ejected replica's broken request is not retried")
	}
	if !retryableStatus(http.StatusInternalServerError) || retryableStatus(http.StatusNotImplemented) {
		t.Error("500 must be retried elsewhere, 501 not")
	}
	if errors.Is(errReplicaEjected, context.DeadlineExceeded) {
		t.Error("an ejection is not a timeout")
	}
}

func TestServerErrorIsRetriedElsewhere(t *testing.T) {
	broken := startUpstream(t, "broken", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"engine dead"}}`, http.StatusInternalServerError)
	})
	healthy := startUpstream(t, "healthy", okHandler)
	_, base := startProxy(t, ServiceConfig{Policy: "round_robin"}, backendsOf(broken, healthy)...)
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`))
	if res.status != 200 || res.header.Get("X-Upstream") != "healthy" {
		t.Fatalf("status %d from %q, want 200 from the healthy replica", res.status, res.header.Get("X-Upstream"))
	}
}

func readAll(r io.Reader) (string, error) {
	b, err := io.ReadAll(r)
	return string(b), err
}

func tail(s string) string { return s[max(0, len(s)-200):] }

func TestHealthCheckFor(t *testing.T) {
	if got := HealthCheckFor("", 0, 0, false).withDefaults(); got != (HealthCheck{}).withDefaults() {
		t.Errorf("zero YAML values = %+v, want the defaults", got)
	}
	got := HealthCheckFor("/ping", 0.25, 2, false)
	if got.Path != "/ping" || got.Interval != 250*time.Millisecond || got.Timeout != 2*time.Second {
		t.Errorf("HealthCheckFor = %+v", got)
	}
	if HealthCheckFor("", 0.25, 0, true).withDefaults().enabled() {
		t.Error("disabled: true left the check on")
	}
}
