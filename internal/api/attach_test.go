package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/configs"
)

// attachBackend serves the attach routes from real ReplicaSetFeeds. The embedded Backend is
// nil: these tests call no other route.
type attachBackend struct {
	Backend

	feeds map[string]*ReplicaSetFeed
	// entered receives the after of each poll as it starts waiting.
	entered chan uint64

	mu       sync.Mutex
	lastWait time.Duration
	reports  map[string][]ProxyLoadReport
}

// attachConfig is what the fake answers as every service's configuration: auth with no keys,
// the case JSON must not lose.
var attachConfig = ProxyConfig{Policy: "round_robin", AuthRequired: true, MaxQueuedRequests: -1}

func (b *attachBackend) ReplicaSet(ctx context.Context, name string, after uint64, wait time.Duration) (ReplicaSet, error) {
	feed, ok := b.feeds[name]
	if !ok {
		return ReplicaSet{}, fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	b.mu.Lock()
	b.lastWait = wait
	b.mu.Unlock()
	select {
	case b.entered <- after:
	default:
	}
	rs := feed.Wait(ctx, after, wait)
	rs.Service = name
	rs.Config = attachConfig
	return rs, nil
}

func (b *attachBackend) ReportProxyLoad(name string, r ProxyLoadReport) error {
	if _, ok := b.feeds[name]; !ok {
		return fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reports[name] = append(b.reports[name], r)
	return nil
}

const attachToken = "attach-test-token"

func startAttachServer(t *testing.T) (*attachBackend, *Client) {
	t.Helper()
	b := &attachBackend{
		feeds:   map[string]*ReplicaSetFeed{"llama": {}},
		entered: make(chan uint64, 1),
		reports: map[string][]ProxyLoadReport{},
	}
	srv := httptest.NewServer(NewHandler(b, attachToken, zaptest.NewLogger(t)))
	t.Cleanup(srv.Close)
	return b, NewClient(srv.URL, attachToken)
}

// testCtx bounds one call: a poll that should answer at once but waits fails the test instead
// of hanging it.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestReplicaSetLongPoll(t *testing.T) {
	b, c := startAttachServer(t)
	feed := b.feeds["llama"]

	// Nothing published: wait=0 answers at once with Seq 0 and the configuration.
	rs, err := c.ReplicaSet(testCtx(t), "llama", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := ReplicaSet{Service: "llama", Backends: []AttachedBackend{}, Config: attachConfig}
	if diff := cmp.Diff(want, rs); diff != "" {
		t.Fatalf("before any set (-want +got):\n%s", diff)
	}

	first := []AttachedBackend{{ID: 1, Addr: "127.0.0.1:9001", Accelerator: "L4", Version: 1}, {ID: 2, Addr: "127.0.0.1:9002", Version: 1}}
	feed.Publish(first)
	seq1 := feed.Seq()
	if seq1 == 0 {
		t.Fatal("Seq is 0 after Publish")
	}

	t.Run("answers at once when Seq differs from after", func(t *testing.T) {
		for _, after := range []uint64{0, seq1 - 1, seq1 + 1000} {
			rs, err := c.ReplicaSet(testCtx(t), "llama", after, MaxReplicaSetWait)
			if err != nil {
				t.Fatalf("after %d: %v", after, err)
			}
			if rs.Seq != seq1 || !cmp.Equal(rs.Backends, first) {
				t.Errorf("after %d: got Seq %d %v, want %d %v", after, rs.Seq, rs.Backends, seq1, first)
			}
		}
	})

	t.Run("waits for a change", func(t *testing.T) {
		got := make(chan ReplicaSet, 1)
		errc := make(chan error, 1)
		go func() {
			rs, err := c.ReplicaSet(testCtx(t), "llama", seq1, MaxReplicaSetWait)
			errc <- err
			got <- rs
		}()
		<-b.entered // the poll reached the controller with the Seq it has
		second := first[1:]
		feed.Publish(second)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		rs := <-got
		if rs.Seq <= seq1 || !cmp.Equal(rs.Backends, second) {
			t.Errorf("after a change: got Seq %d %v, want > %d %v", rs.Seq, rs.Backends, seq1, second)
		}
	})

	t.Run("answers the unchanged set when the wait ends", func(t *testing.T) {
		seq := feed.Seq()
		start := time.Now()
		rs, err := c.ReplicaSet(testCtx(t), "llama", seq, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < 200*time.Millisecond {
			t.Errorf("answered after %v, before the 200ms wait", took)
		}
		if rs.Seq != seq {
			t.Errorf("Seq %d, want the unchanged %d", rs.Seq, seq)
		}
	})

	t.Run("a configuration change moves Seq", func(t *testing.T) {
		seq := feed.Seq()
		feed.Publish(nil)
		rs, err := c.ReplicaSet(testCtx(t), "llama", seq, MaxReplicaSetWait)
		if err != nil {
			t.Fatal(err)
		}
		if rs.Seq != seq+1 || !cmp.Equal(rs.Backends, first[1:]) {
			t.Errorf("got Seq %d %v, want %d with the backends kept", rs.Seq, rs.Backends, seq+1)
		}
	})
}

func TestReplicaSetQuery(t *testing.T) {
	b, c := startAttachServer(t)
	b.feeds["llama"].Publish(nil)
	get := func(query string) (int, time.Duration) {
		t.Helper()
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, c.Base+"/v1/services/llama/replicaset"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+attachToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		return resp.StatusCode, b.lastWait
	}
	tests := map[string]struct {
		query    string
		wantCode int
		wantWait time.Duration
	}{
		"default wait":   {query: "", wantCode: 200, wantWait: DefaultReplicaSetWait},
		"fractional":     {query: "?wait=0.25", wantCode: 200, wantWait: 250 * time.Millisecond},
		"capped":         {query: "?wait=3600", wantCode: 200, wantWait: MaxReplicaSetWait},
		"negative wait":  {query: "?wait=-1", wantCode: 400},
		"not a number":   {query: "?wait=soon", wantCode: 400},
		"negative after": {query: "?after=-1", wantCode: 400},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b.mu.Lock()
			b.lastWait = -1
			b.mu.Unlock()
			code, wait := get(tc.query)
			if code != tc.wantCode {
				t.Fatalf("HTTP %d, want %d", code, tc.wantCode)
			}
			if tc.wantCode == 200 && wait != tc.wantWait {
				t.Errorf("backend got wait %v, want %v", wait, tc.wantWait)
			}
		})
	}
}

func TestProxyLoadReportRoundTrip(t *testing.T) {
	b, c := startAttachServer(t)
	r := ProxyLoadReport{ProxyID: "p1", Seq: 42, InFlight: map[string]int64{"127.0.0.1:9001": 3, "127.0.0.1:9002": 0},
		Arrivals: 1000, Waiting: 2}
	if err := c.ReportProxyLoad(testCtx(t), "llama", r); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	got := b.reports["llama"]
	b.mu.Unlock()
	if diff := cmp.Diff([]ProxyLoadReport{r}, got); diff != "" {
		t.Errorf("reports (-want +got):\n%s", diff)
	}
	err := c.ReportProxyLoad(testCtx(t), "llama", ProxyLoadReport{Seq: 1})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("report without a proxy id: %v, want ErrInvalid", err)
	}
}

func TestAttachRoutesUnknownServiceAndToken(t *testing.T) {
	_, c := startAttachServer(t)
	if _, err := c.ReplicaSet(testCtx(t), "nope", 0, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("replica set of an unknown service: %v, want ErrNotFound", err)
	}
	if err := c.ReportProxyLoad(testCtx(t), "nope", ProxyLoadReport{ProxyID: "p"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("report for an unknown service: %v, want ErrNotFound", err)
	}
	for _, token := range []string{"", "wrong"} {
		bad := NewClient(c.Base, token)
		if _, err := bad.ReplicaSet(testCtx(t), "llama", 0, 0); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("replica set with token %q: %v, want ErrUnauthorized", token, err)
		}
		if err := bad.ReportProxyLoad(testCtx(t), "llama", ProxyLoadReport{ProxyID: "p"}); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("report with token %q: %v, want ErrUnauthorized", token, err)
		}
	}
}

func TestProxyConfigFor(t *testing.T) {
	tests := map[string]struct {
		svc  *configs.Service
		want ProxyConfig
	}{
		"no auth": {svc: &configs.Service{LoadBalancingPolicy: "least_load"}, want: ProxyConfig{Policy: "least_load"}},
		"auth without keys rejects all": {
			svc:  &configs.Service{Auth: &configs.Auth{KeysFromEnv: []string{"K"}}},
			want: ProxyConfig{AuthRequired: true},
		},
		"keys, qps and limits": {
			svc: &configs.Service{
				LoadBalancingPolicy: "instance_aware_least_load",
				ReplicaPolicy:       configs.ReplicaPolicy{TargetQPSPerAccelerator: map[string]float64{"A100": 2}},
				Auth:                &configs.Auth{KeyHashes: []string{"abc"}},
				Limits: &configs.Limits{MaxRequestBodyMB: 8, MaxConcurrentRequests: 100, IdleTimeoutSeconds: 30,
					MaxQueuedRequests: -1, MaxQueueWaitSeconds: 10, MaxConcurrentStreams: 20, MaxInFlightPerReplica: 16,
					RateLimitPerKey: &configs.RateLimit{RequestsPerSecond: 0.5, Burst: 4}},
			},
			want: ProxyConfig{Policy: "instance_aware_least_load", TargetQPSPerAccelerator: map[string]float64{"A100": 2},
				AuthRequired: true, APIKeyHashes: []string{"abc"}, MaxRequestBodyMB: 8, MaxConcurrentRequests: 100,
				IdleTimeoutSeconds: 30, MaxQueuedRequests: -1, MaxQueueWaitSeconds: 10, MaxConcurrentStreams: 20, MaxInFlightPerReplica: 16,
				RateLimitPerKey: &configs.RateLimit{RequestsPerSecond: 0.5, Burst: 4}},
		},
		"health check": {
			svc:  &configs.Service{HealthCheck: &configs.HealthCheck{Path: "/ping", IntervalSeconds: 0.2, Disabled: true}},
			want: ProxyConfig{HealthCheck: &configs.HealthCheck{Path: "/ping", IntervalSeconds: 0.2, Disabled: true}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ProxyConfigFor(tc.svc)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestReplicaSetFeedWaitEndsWithContext: a poll whose caller gave up returns the current set.
func TestReplicaSetFeedWaitEndsWithContext(t *testing.T) {
	var feed ReplicaSetFeed
	feed.Publish([]AttachedBackend{{ID: 1, Addr: "127.0.0.1:9001"}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rs := feed.Wait(ctx, feed.Seq(), time.Hour)
	if rs.Seq != feed.Seq() || len(rs.Backends) != 1 {
		t.Errorf("got %+v", rs)
	}
}
