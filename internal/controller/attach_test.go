package controller

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/replicas"
)

// newAttachTestService is a controller with one service that has a real, idle proxy and no
// replica manager: enough for the attach paths, which read only the proxy and the task.
func newAttachTestService(t *testing.T) (*Controller, *service) {
	t.Helper()
	px, err := proxy.NewService(proxy.ServiceConfig{Name: "llama"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := proxy.NewHandover(ln, px, nil)
	t.Cleanup(func() { _ = front.Shutdown(context.Background()); ln.Close() })
	task := &configs.Task{Service: &configs.Service{LoadBalancingPolicy: "round_robin",
		Auth: &configs.Auth{KeyHashes: []string{"h1"}}, Limits: &configs.Limits{MaxConcurrentRequests: 7}}}
	s := &service{name: "llama", task: task, front: front}
	c := New(Options{})
	c.services["llama"] = s
	return c, s
}

func TestAttachBusy(t *testing.T) {
	const addr, other = "10.0.0.1:8080", "10.0.0.2:8080"
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	const seq = 7
	report := func(id string, reportSeq uint64, inflight int64) api.ProxyLoadReport {
		return api.ProxyLoadReport{ProxyID: id, Seq: reportSeq, InFlight: map[string]int64{addr: inflight, other: 5}}
	}
	type timed struct {
		r  api.ProxyLoadReport
		at time.Time
	}
	tests := map[string]struct {
		reports   []timed
		started   time.Time
		published time.Time
		want      int64
	}{
		"no proxies":                   {want: 0},
		"fresh reports add up":         {reports: []timed{{report("a", seq, 2), t0}, {report("b", seq, 3), t0.Add(-4 * time.Second)}}, want: 5},
		"stale report ignored":         {reports: []timed{{report("a", seq, 2), t0}, {report("b", seq, 3), t0.Add(-6 * time.Second)}}, want: 2},
		"latest report counts":         {reports: []timed{{report("a", seq, 4), t0.Add(-time.Second)}, {report("a", seq, 0), t0}}, want: 0},
		"lagging proxy holds at 1":     {reports: []timed{{report("a", seq-1, 0), t0}}, want: 1},
		"lagging proxy with requests":  {reports: []timed{{report("a", seq-1, 3), t0}}, want: 3},
		"stale lagging proxy ignored":  {reports: []timed{{report("a", seq-1, 0), t0.Add(-6 * time.Second)}}, want: 0},
		"proxy ahead counts as behind": {reports: []timed{{report("a", seq+1, 0), t0}}, want: 1},
		"just restarted controller":    {started: t0.Add(-2 * time.Second), want: 1},
		"restart grace over":           {started: t0.Add(-6 * time.Second), want: 0},
		"set just published":           {started: t0.Add(-time.Minute), published: t0.Add(-time.Second), want: 1},
		"published long ago":           {started: t0.Add(-time.Minute), published: t0.Add(-6 * time.Second), want: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := attachState{firstPublished: tc.published}
			for _, r := range tc.reports {
				a.record(r.r, r.at)
			}
			if got := a.busy(addr, seq, tc.started, t0); got != tc.want {
				t.Errorf("busy = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAttachRemoteLoad(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	var a attachState
	type step struct {
		r            api.ProxyLoadReport
		at           time.Time
		wantInflight float64
		wantArrivals uint64
	}
	steps := map[string]step{}
	order := []string{}
	add := func(name string, s step) {
		order = append(order, name)
		steps[name] = s
	}
	add("first report is the baseline", step{
		r:  api.ProxyLoadReport{ProxyID: "a", InFlight: map[string]int64{"x": 2, "y": 1}, Arrivals: 500, Waiting: 1},
		at: t0, wantInflight: 4, wantArrivals: 0,
	})
	add("arrivals since the last report", step{
		r:  api.ProxyLoadReport{ProxyID: "a", InFlight: map[string]int64{"x": 1}, Arrivals: 530},
		at: t0.Add(time.Second), wantInflight: 1, wantArrivals: 30,
	})
	add("a second proxy adds up", step{
		r:  api.ProxyLoadReport{ProxyID: "b", InFlight: map[string]int64{"x": 3}, Arrivals: 10},
		at: t0.Add(2 * time.Second), wantInflight: 4, wantArrivals: 30,
	})
	add("a counter that went down starts over", step{
		r:  api.ProxyLoadReport{ProxyID: "b", InFlight: map[string]int64{"x": 3}, Arrivals: 4},
		at: t0.Add(3 * time.Second), wantInflight: 4, wantArrivals: 34,
	})
	add("a stale proxy's load is dropped, its arrivals stay", step{
		r:  api.ProxyLoadReport{ProxyID: "b", InFlight: map[string]int64{"x": 2}, Arrivals: 6},
		at: t0.Add(7 * time.Second), wantInflight: 2, wantArrivals: 36,
	})
	for _, name := range order {
		s := steps[name]
		a.record(s.r, s.at)
		inflight, arrivals := a.load(s.at)
		if inflight != s.wantInflight || arrivals != s.wantArrivals {
			t.Errorf("%s: load = %v in flight, %d arrivals; want %v, %d", name, inflight, arrivals, s.wantInflight, s.wantArrivals)
		}
	}
	// A proxy silent for longer than reportForget is forgotten; if it comes back its counter is
	// a new baseline.
	late := t0.Add(7*time.Second + reportForget + time.Second)
	a.record(api.ProxyLoadReport{ProxyID: "c", Arrivals: 1}, late)
	if _, ok := a.proxies["a"]; ok {
		t.Error("proxy a not forgotten after reportForget")
	}
	if _, arrivals := a.load(late); arrivals != 36 {
		t.Errorf("arrivals = %d after forgetting, want 36", arrivals)
	}
}

func TestAttachControllerAPI(t *testing.T) {
	c, s := newAttachTestService(t)
	ctx := context.Background()

	if _, err := c.ReplicaSet(ctx, "nope", 0, 0); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ReplicaSet of an unknown service: %v", err)
	}
	if err := c.ReportProxyLoad("nope", api.ProxyLoadReport{ProxyID: "p"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ReportProxyLoad for an unknown service: %v", err)
	}
	if err := c.ReportProxyLoad("llama", api.ProxyLoadReport{}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("ReportProxyLoad without an id: %v", err)
	}

	// Before the first set: Seq 0, and a configuration change has nothing to move.
	c.configChanged(s)
	rs, err := c.ReplicaSet(ctx, "llama", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantConfig := api.ProxyConfig{Policy: "round_robin", AuthRequired: true, APIKeyHashes: []string{"h1"}, MaxConcurrentRequests: 7}
	if diff := cmp.Diff(api.ReplicaSet{Service: "llama", Backends: []api.AttachedBackend{}, Config: wantConfig}, rs); diff != "" {
		t.Errorf("before any set (-want +got):\n%s", diff)
	}

	c.published(s, []replicas.Endpoint{{ReplicaID: 3, Version: 2, Addr: "10.0.0.3:8080", Accelerator: "L4"}})
	rs, err = c.ReplicaSet(ctx, "llama", 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	seq := rs.Seq
	if want := []api.AttachedBackend{{ID: 3, Addr: "10.0.0.3:8080", Accelerator: "L4", Version: 2}}; seq == 0 || !cmp.Equal(want, rs.Backends) {
		t.Errorf("after published: Seq %d, backends %v; want non-zero, %v", seq, rs.Backends, want)
	}

	if got := c.busy(s, "10.0.0.9:8080"); got != 1 {
		t.Errorf("busy right after the first set = %d, want 1 (proxies may not have it yet)", got)
	}
	s.attach.mu.Lock()
	s.attach.firstPublished = time.Now().Add(-time.Minute) // as if long ago
	s.attach.mu.Unlock()
	if got := c.busy(s, "10.0.0.9:8080"); got != 0 {
		t.Errorf("busy without proxies = %d, want 0", got)
	}

	// A proxy that has not applied the set holds a leaving replica; once it has, only its
	// requests count.
	if err := c.ReportProxyLoad("llama", api.ProxyLoadReport{ProxyID: "p", Seq: seq - 1}); err != nil {
		t.Fatal(err)
	}
	if got := c.busy(s, "10.0.0.9:8080"); got != 1 {
		t.Errorf("busy with a lagging proxy = %d, want 1", got)
	}
	if err := c.ReportProxyLoad("llama", api.ProxyLoadReport{ProxyID: "p", Seq: seq, InFlight: map[string]int64{"10.0.0.9:8080": 2}}); err != nil {
		t.Fatal(err)
	}
	if got := c.busy(s, "10.0.0.9:8080"); got != 2 {
		t.Errorf("busy with the proxy's 2 requests = %d, want 2", got)
	}
	if got := c.busy(s, "10.0.0.3:8080"); got != 0 {
		t.Errorf("busy of a replica without requests once the proxy caught up = %d, want 0", got)
	}
	if inflight, _ := c.remoteLoad(s); inflight != 2 {
		t.Errorf("remote in flight = %v, want 2", inflight)
	}
	if got := (serviceLoad{c, s}).InFlight(); got != 2 {
		t.Errorf("concurrency = %v, want the remote 2", got)
	}

	// An update's new configuration moves Seq, so proxies fetch it; the proxy lags again.
	s.mu.Lock()
	s.task = &configs.Task{Service: &configs.Service{LoadBalancingPolicy: "least_load"}}
	s.mu.Unlock()
	c.configChanged(s)
	rs, err = c.ReplicaSet(ctx, "llama", seq, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Seq != seq+1 || rs.Config.Policy != "least_load" || rs.Config.AuthRequired || len(rs.Backends) != 1 {
		t.Errorf("after configChanged: %+v", rs)
	}
	if got := c.busy(s, "10.0.0.9:8080"); got != 2 {
		t.Errorf("busy with a lagging proxy's 2 requests = %d, want 2", got)
	}
	if got := c.busy(s, "10.0.0.3:8080"); got != 1 {
		t.Errorf("busy of a replica without requests while a proxy lags = %d, want 1", got)
	}
}
