package controller

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
)

// testClock is a clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newAttachTestService is a controller with one service that has a real, idle proxy and no
// replica manager: enough for the attach paths, which read only the proxy and the task. The
// service's hub runs on clock.
func newAttachTestService(t *testing.T, clock *testClock) (*Controller, *service) {
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
	s.attach = c.newAttachHub(s, clock.Now)
	c.services["llama"] = s
	return c, s
}

// TestAttachControllerAPI drives the controller's side of attach through its API's attach
// routes: the service's hub answers with its task's configuration, holds leaving replicas for
// attached proxies, and adds their load to the autoscaler's.
func TestAttachControllerAPI(t *testing.T) {
	clock := &testClock{now: time.Now()}
	c, s := newAttachTestService(t, clock)
	const token = "attach-controller-test-token"
	srv := httptest.NewServer(api.NewHandler(c, api.Tokens{Full: token}, c.log, c.attachRoutes()...))
	t.Cleanup(srv.Close)
	client := api.NewClient(srv.URL, token).Client
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	report := func(service string, r attach.LoadReport) error { return attach.ReportLoad(ctx, client, service, r) }

	if _, err := attach.PollReplicaSet(ctx, client, "nope", 0, 0); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("replica set of an unknown service: %v", err)
	}
	if err := report("nope", attach.LoadReport{ProxyID: "p"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("load report for an unknown service: %v", err)
	}
	if err := report("llama", attach.LoadReport{}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("load report without an id: %v", err)
	}

	// Before the first set: Seq 0, and a configuration change has nothing to move.
	s.attach.ConfigChanged()
	rs, err := attach.PollReplicaSet(ctx, client, "llama", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantConfig := attach.ProxyConfig{Policy: "round_robin", AuthRequired: true, APIKeyHashes: []string{"h1"}, MaxConcurrentRequests: 7}
	if diff := cmp.Diff(attach.ReplicaSet{Service: "llama", Backends: []proxy.Backend{}, Config: wantConfig, Proxies: 1}, rs); diff != "" {
		t.Errorf("before any set (-want +got):\n%s", diff)
	}

	s.attach.Publish([]proxy.Backend{{ID: 3, Version: 2, Addr: "10.0.0.3:8080", Accelerator: "L4"}})
	rs, err = attach.PollReplicaSet(ctx, client, "llama", 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	seq := rs.Seq
	if want := []proxy.Backend{{ID: 3, Addr: "10.0.0.3:8080", Accelerator: "L4", Version: 2}}; seq == 0 || !cmp.Equal(want, rs.Backends) {
		t.Errorf("after published: Seq %d, backends %v; want non-zero, %v", seq, rs.Backends, want)
	}

	if got := c.busy(s, "10.0.0.9:8080"); got != 1 {
		t.Errorf("busy right after the first set = %d, want 1 (proxies may not have it yet)", got)
	}
	clock.Add(time.Minute) // the first set long published
	if got := c.busy(s, "10.0.0.9:8080"); got != 0 {
		t.Errorf("busy without proxies = %d, want 0", got)
	}

	// A proxy that has not applied the set holds a leaving replica; once it has, only its
	// requests count.
	if err := report("llama", attach.LoadReport{ProxyID: "p", Seq: seq - 1}); err != nil {
		t.Fatal(err)
	}
	if got := c.busy(s, "10.0.0.9:8080"); got != 1 {
		t.Errorf("busy with a lagging proxy = %d, want 1", got)
	}
	if err := report("llama", attach.LoadReport{ProxyID: "p", Seq: seq, InFlight: map[string]int64{"10.0.0.9:8080": 2}}); err != nil {
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
	s.attach.ConfigChanged()
	rs, err = attach.PollReplicaSet(ctx, client, "llama", seq, time.Minute)
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

// TestAttachServiceList drives the list of services attached gateways follow through the
// controller's API with the attach token: nothing before the stored services are restored
// (a gateway would drop them all), then the running services by name, a service being taken
// down left out at once.
func TestAttachServiceList(t *testing.T) {
	c, llama := newAttachTestService(t, &testClock{now: time.Now()})
	const full, attachToken = "controller-test-token", "attach-test-token"
	srv := httptest.NewServer(api.NewHandler(c, api.Tokens{Full: full, Attach: attachToken}, c.log, c.attachRoutes()...))
	t.Cleanup(srv.Close)
	client := api.NewClient(srv.URL, attachToken).Client
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	poll := func(after uint64) attach.ServiceList {
		t.Helper()
		list, err := attach.PollServices(ctx, client, after, 0)
		if err != nil {
			t.Fatal(err)
		}
		return list
	}

	c.publishServices() // a service started while restoring: not yet
	if diff := cmp.Diff(attach.ServiceList{Services: []string{}}, poll(0)); diff != "" {
		t.Errorf("before the restore (-want +got):\n%s", diff)
	}
	c.servicesRestored()
	first := poll(0)
	if first.Seq == 0 || !cmp.Equal(first.Services, []string{"llama"}) {
		t.Errorf("after the restore: %+v", first)
	}

	c.mu.Lock()
	c.services["mistral"] = &service{name: "mistral"}
	c.mu.Unlock()
	c.publishServices()
	if got := poll(first.Seq); got.Seq <= first.Seq || !cmp.Equal(got.Services, []string{"llama", "mistral"}) {
		t.Errorf("a service started: %+v", got)
	}

	llama.mu.Lock()
	llama.shuttingDown = true
	llama.mu.Unlock()
	c.publishServices()
	if got := poll(first.Seq); !cmp.Equal(got.Services, []string{"mistral"}) {
		t.Errorf("a service being taken down: %+v", got)
	}
}
