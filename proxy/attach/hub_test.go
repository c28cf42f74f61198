package attach

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/proxy"
)

func TestAttachBusy(t *testing.T) {
	const addr, other = "10.0.0.1:8080", "10.0.0.2:8080"
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	const seq = 7
	report := func(id string, reportSeq uint64, inflight int64) LoadReport {
		return LoadReport{ProxyID: id, Seq: reportSeq, InFlight: map[string]int64{addr: inflight, other: 5}}
	}
	type timed struct {
		r  LoadReport
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
			h := Hub{firstPublished: tc.published}
			for _, r := range tc.reports {
				h.record(r.r, r.at)
			}
			if got := h.busy(addr, seq, tc.started, t0); got != tc.want {
				t.Errorf("busy = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAttachRemoteLoad(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	var h Hub
	type step struct {
		r            LoadReport
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
		r:  LoadReport{ProxyID: "a", InFlight: map[string]int64{"x": 2, "y": 1}, Arrivals: 500, Waiting: 1},
		at: t0, wantInflight: 4, wantArrivals: 0,
	})
	add("arrivals since the last report", step{
		r:  LoadReport{ProxyID: "a", InFlight: map[string]int64{"x": 1}, Arrivals: 530},
		at: t0.Add(time.Second), wantInflight: 1, wantArrivals: 30,
	})
	add("a second proxy adds up", step{
		r:  LoadReport{ProxyID: "b", InFlight: map[string]int64{"x": 3}, Arrivals: 10},
		at: t0.Add(2 * time.Second), wantInflight: 4, wantArrivals: 30,
	})
	add("a counter that went down starts over", step{
		r:  LoadReport{ProxyID: "b", InFlight: map[string]int64{"x": 3}, Arrivals: 4},
		at: t0.Add(3 * time.Second), wantInflight: 4, wantArrivals: 34,
	})
	add("a stale proxy's load is dropped, its arrivals stay", step{
		r:  LoadReport{ProxyID: "b", InFlight: map[string]int64{"x": 2}, Arrivals: 6},
		at: t0.Add(7 * time.Second), wantInflight: 2, wantArrivals: 36,
	})
	for _, name := range order {
		s := steps[name]
		h.record(s.r, s.at)
		inflight, arrivals := h.load(s.at)
		if inflight != s.wantInflight || arrivals != s.wantArrivals {
			t.Errorf("%s: load = %v in flight, %d arrivals; want %v, %d", name, inflight, arrivals, s.wantInflight, s.wantArrivals)
		}
	}
	// A proxy silent for longer than reportForget is forgotten; if it comes back its counter is
	// a new baseline.
	late := t0.Add(7*time.Second + reportForget + time.Second)
	h.record(LoadReport{ProxyID: "c", Arrivals: 1}, late)
	if _, ok := h.proxies["a"]; ok {
		t.Error("proxy a not forgotten after reportForget")
	}
	if _, arrivals := h.load(late); arrivals != 36 {
		t.Errorf("arrivals = %d after forgetting, want 36", arrivals)
	}
}

// TestHubStoppingAnswersPolls: a stopping controller answers a held poll at once, with the set
// as it is, rather than hold its API server's shutdown.
func TestHubStoppingAnswersPolls(t *testing.T) {
	stopping, stop := context.WithCancel(context.Background())
	h := NewHub(HubConfig{Stopping: stopping, Config: func() ProxyConfig { return ProxyConfig{Policy: "round_robin"} }})
	h.Publish([]proxy.Backend{{ID: 1, Addr: "10.0.0.1:8080"}})
	got := make(chan ReplicaSet, 1)
	go func() { got <- h.Poll(context.Background(), h.Seq(), time.Hour) }()
	stop()
	select {
	case rs := <-got:
		if rs.Seq != h.Seq() || len(rs.Backends) != 1 || rs.Config.Policy != "round_robin" {
			t.Errorf("got %+v", rs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a held poll did not answer when the controller stopped")
	}
}

// TestHubReport: a report needs a proxy id, and one with requests waiting for a replica pokes
// the autoscaler.
func TestHubReport(t *testing.T) {
	pokes := 0
	h := NewHub(HubConfig{OnWaiting: func() { pokes++ }})
	if err := h.Report(LoadReport{}); !errors.Is(err, rpc.ErrInvalid) {
		t.Errorf("report without an id: %v, want ErrInvalid", err)
	}
	if err := h.Report(LoadReport{ProxyID: "p", InFlight: map[string]int64{"x": 1}}); err != nil || pokes != 0 {
		t.Errorf("report without waiting requests: %v, %d pokes; want nil, 0", err, pokes)
	}
	if err := h.Report(LoadReport{ProxyID: "p", Waiting: 2}); err != nil || pokes != 1 {
		t.Errorf("report with waiting requests: %v, %d pokes; want nil, 1", err, pokes)
	}
	if inflight, _ := h.Load(); inflight != 2 {
		t.Errorf("in flight = %v, want the 2 waiting", inflight)
	}
}

// TestHubSharesReplicasAmongProxies: every poll answer says how many proxies reported lately
// (at least 1), and a change of that count moves Seq, so that waiting polls return and each
// proxy takes its share of the replicas' slots at once rather than at its poll's timeout.
func TestHubSharesReplicasAmongProxies(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	h := NewHub(HubConfig{Now: func() time.Time { return now }})
	h.Publish([]proxy.Backend{{ID: 1, Addr: "10.0.0.1:8080"}})
	first := h.Poll(context.Background(), 0, 0)
	if first.Proxies != 1 {
		t.Fatalf("Proxies with none reporting = %d, want 1", first.Proxies)
	}
	for _, id := range []string{"a", "b"} {
		if err := h.Report(LoadReport{ProxyID: id, Seq: first.Seq}); err != nil {
			t.Fatal(err)
		}
	}
	two := h.Poll(context.Background(), first.Seq, time.Minute) // returns at once: Seq moved
	if two.Proxies != 2 || two.Seq == first.Seq || len(two.Backends) != 1 {
		t.Fatalf("after two proxies reported: Proxies %d, Seq %d (was %d), %d backends; want 2, a new Seq, the same set", two.Proxies, two.Seq, first.Seq, len(two.Backends))
	}
	if err := h.Report(LoadReport{ProxyID: "a", Seq: two.Seq}); err != nil || h.feed.Seq() != two.Seq {
		t.Fatalf("a report that changes no count moved Seq (%v)", err)
	}
	now = now.Add(reportFresh + time.Second) // b goes silent; a reports on
	if err := h.Report(LoadReport{ProxyID: "a", Seq: two.Seq}); err != nil {
		t.Fatal(err)
	}
	if one := h.Poll(context.Background(), two.Seq, 0); one.Proxies != 1 {
		t.Fatalf("after b went silent: Proxies %d, want 1", one.Proxies)
	}
}

// A disaggregated service's prefill pool reaches attached proxies with a new Seq, and what they
// are prefilling reaches the pool's autoscaler.
func TestHubPrefillPool(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	h := NewHub(HubConfig{Now: func() time.Time { return now }})
	h.Publish([]proxy.Backend{{ID: 1, Addr: "10.0.0.1:8080"}})
	ctx := context.Background()
	if rs := h.Poll(ctx, 0, time.Millisecond); rs.Disaggregated || rs.Prefill != nil {
		t.Fatalf("before the pool: %+v", rs)
	}
	seq := h.Seq()
	h.PublishPrefill([]proxy.Backend{})
	rs := h.Poll(ctx, seq, time.Millisecond)
	if rs.Seq <= seq || !rs.Disaggregated || len(rs.Prefill) != 0 || len(rs.Backends) != 1 {
		t.Fatalf("an empty pool: %+v, want a new Seq, disaggregated, the decode replicas kept", rs)
	}
	h.PublishPrefill([]proxy.Backend{{ID: -2, Addr: "10.0.0.2:8080"}})
	if rs := h.Poll(ctx, rs.Seq, time.Millisecond); len(rs.Prefill) != 1 || rs.Prefill[0].Addr != "10.0.0.2:8080" {
		t.Fatalf("a prefill replica: %+v", rs)
	}
	for id, tokens := range map[string]int64{"a": 3000, "b": 1000} {
		if err := h.Report(LoadReport{ProxyID: id, PrefillTokens: tokens}); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.PrefillTokens(); got != 4000 {
		t.Fatalf("PrefillTokens = %d, want both proxies' 4000", got)
	}
	now = now.Add(reportFresh + time.Second)
	if got := h.PrefillTokens(); got != 0 {
		t.Fatalf("PrefillTokens = %d from stale reports, want 0", got)
	}
}

// A prefill replica leaving waits for the prefill steps attached proxies have in flight there.
func TestHubBusyCountsPrefillSteps(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	h := NewHub(HubConfig{Now: func() time.Time { return now }, Started: now.Add(-time.Hour)})
	h.Publish([]proxy.Backend{{ID: 1, Addr: "10.0.0.1:8080"}})
	seq := h.Seq()
	if err := h.Report(LoadReport{ProxyID: "a", Seq: seq, InFlight: map[string]int64{"10.0.0.1:8080": 1},
		PrefillInFlight: map[string]int64{"10.0.0.2:8080": 2}}); err != nil {
		t.Fatal(err)
	}
	if got := h.Busy("10.0.0.2:8080"); got != 2 {
		t.Fatalf("Busy(prefill replica) = %d, want its 2 steps", got)
	}
	if inflight, _ := h.Load(); inflight != 1 {
		t.Fatalf("Load = %v: prefill steps are not the service's load", inflight)
	}
}
