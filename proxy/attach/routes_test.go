package attach

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

	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/proxy"
)

// fakeService serves the attach routes from a real Feed.
type fakeService struct {
	feed Feed
	// entered receives the after of each poll as it starts waiting.
	entered chan uint64

	mu       sync.Mutex
	lastWait time.Duration
	reports  []LoadReport
}

var _ Service = (*fakeService)(nil)

// attachConfig is what the fake answers as every service's configuration: auth with no keys,
// the case JSON must not lose.
var attachConfig = ProxyConfig{Policy: "round_robin", AuthRequired: true, MaxQueuedRequests: -1}

func (s *fakeService) Poll(ctx context.Context, after uint64, wait time.Duration) ReplicaSet {
	s.mu.Lock()
	s.lastWait = wait
	s.mu.Unlock()
	select {
	case s.entered <- after:
	default:
	}
	rs := s.feed.Wait(ctx, after, wait)
	rs.Config = attachConfig
	return rs
}

func (s *fakeService) Report(r LoadReport) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports = append(s.reports, r)
	return nil
}

const attachToken = "attach-test-token"

// startAttachServer serves the attach routes of one service, "llama", behind the controller
// API's token.
func startAttachServer(t *testing.T) (*fakeService, *rpc.Client) {
	t.Helper()
	llama := &fakeService{entered: make(chan uint64, 1)}
	find := func(name string) (Service, error) {
		if name != "llama" {
			return nil, fmt.Errorf("service %q: %w", name, rpc.ErrNotFound)
		}
		return llama, nil
	}
	log := zaptest.NewLogger(t)
	srv := httptest.NewServer(rpc.NewHandler(rpc.Tokens{Full: attachToken}, Routes(find, log)))
	t.Cleanup(srv.Close)
	return llama, rpc.NewClient(srv.URL, attachToken)
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
	feed := &b.feed

	// Nothing published: wait=0 answers at once with Seq 0 and the configuration.
	rs, err := PollReplicaSet(testCtx(t), c, "llama", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := ReplicaSet{Service: "llama", Backends: []proxy.Backend{}, Config: attachConfig}
	if diff := cmp.Diff(want, rs); diff != "" {
		t.Fatalf("before any set (-want +got):\n%s", diff)
	}

	first := []proxy.Backend{{ID: 1, Addr: "127.0.0.1:9001", Accelerator: "L4", Version: 1}, {ID: 2, Addr: "127.0.0.1:9002", Version: 1}}
	feed.Publish(first)
	seq1 := feed.Seq()
	if seq1 == 0 {
		t.Fatal("Seq is 0 after Publish")
	}

	t.Run("answers at once when Seq differs from after", func(t *testing.T) {
		for _, after := range []uint64{0, seq1 - 1, seq1 + 1000} {
			rs, err := PollReplicaSet(testCtx(t), c, "llama", after, MaxPollWait)
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
			rs, err := PollReplicaSet(testCtx(t), c, "llama", seq1, MaxPollWait)
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
		rs, err := PollReplicaSet(testCtx(t), c, "llama", seq, 200*time.Millisecond)
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
		rs, err := PollReplicaSet(testCtx(t), c, "llama", seq, MaxPollWait)
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
	b.feed.Publish(nil)
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
		"default wait":   {query: "", wantCode: 200, wantWait: DefaultPollWait},
		"fractional":     {query: "?wait=0.25", wantCode: 200, wantWait: 250 * time.Millisecond},
		"capped":         {query: "?wait=3600", wantCode: 200, wantWait: MaxPollWait},
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
	r := LoadReport{ProxyID: "p1", Seq: 42, InFlight: map[string]int64{"127.0.0.1:9001": 3, "127.0.0.1:9002": 0},
		Arrivals: 1000, Waiting: 2}
	if err := ReportLoad(testCtx(t), c, "llama", r); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	got := b.reports
	b.mu.Unlock()
	if diff := cmp.Diff([]LoadReport{r}, got); diff != "" {
		t.Errorf("reports (-want +got):\n%s", diff)
	}
	err := ReportLoad(testCtx(t), c, "llama", LoadReport{Seq: 1})
	if !errors.Is(err, rpc.ErrInvalid) {
		t.Errorf("report without a proxy id: %v, want ErrInvalid", err)
	}
}

func TestAttachRoutesUnknownServiceAndToken(t *testing.T) {
	_, c := startAttachServer(t)
	if _, err := PollReplicaSet(testCtx(t), c, "nope", 0, 0); !errors.Is(err, rpc.ErrNotFound) {
		t.Errorf("replica set of an unknown service: %v, want ErrNotFound", err)
	}
	if err := ReportLoad(testCtx(t), c, "nope", LoadReport{ProxyID: "p"}); !errors.Is(err, rpc.ErrNotFound) {
		t.Errorf("report for an unknown service: %v, want ErrNotFound", err)
	}
	for _, token := range []string{"", "wrong"} {
		bad := rpc.NewClient(c.Base, token)
		if _, err := PollReplicaSet(testCtx(t), bad, "llama", 0, 0); !errors.Is(err, rpc.ErrUnauthorized) {
			t.Errorf("replica set with token %q: %v, want ErrUnauthorized", token, err)
		}
		if err := ReportLoad(testCtx(t), bad, "llama", LoadReport{ProxyID: "p"}); !errors.Is(err, rpc.ErrUnauthorized) {
			t.Errorf("report with token %q: %v, want ErrUnauthorized", token, err)
		}
	}
}
