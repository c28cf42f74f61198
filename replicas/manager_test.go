package replicas

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

const secretValue = "hf_secret_value_123"

func testTask() *configs.Task {
	return &configs.Task{
		Name:      "svc",
		Run:       "serve --port $FERRY_PORT",
		Setup:     "true",
		Envs:      map[string]string{"PLAIN": "1"},
		Secrets:   map[string]string{"HF_TOKEN": secretValue},
		Resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "A100", Count: 1}}},
		Service: &configs.Service{
			Port:           8000,
			ReadinessProbe: configs.Probe{Path: "/health", InitialDelaySeconds: 600, TimeoutSeconds: 2},
			ReplicaPolicy:  configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 1},
		},
	}
}

// harness runs one Manager against a fake provider and store.
type harness struct {
	t     *testing.T
	m     *Manager
	prov  *fakeProvider
	store *fakeStore
	clock *fakeClock
	pubs  *publications
	logs  *observer.ObservedLogs
	stop  func()
}

func newHarness(t *testing.T, prov *fakeProvider, store *fakeStore, clock *fakeClock, tweaks ...func(*Config)) *harness {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	h := &harness{t: t, prov: prov, store: store, clock: clock, pubs: &publications{}, logs: logs}
	cfg := Config{
		Service:           "svc",
		Version:           1,
		Task:              testTask(),
		Provider:          prov,
		Store:             store,
		OnReady:           h.pubs.onReady,
		Logger:            zap.New(core),
		ProbeInterval:     20 * time.Millisecond,
		ReconcileInterval: 20 * time.Millisecond,
		FailureThreshold:  3 * time.Minute,
		Now:               clock.Now,
	}
	for _, tw := range tweaks {
		tw(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	return h
}

// start runs Start in the background; stop (also run at cleanup) ends it and waits.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.m.Start(ctx) }()
	stopped := false
	h.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				h.t.Errorf("Start returned %v", err)
			}
		case <-time.After(10 * time.Second):
			h.t.Error("Start did not return after its context ended")
		}
	}
	h.t.Cleanup(h.stop)
	h.t.Cleanup(func() {
		if h.pubs.overlap.Load() {
			h.t.Error("OnReady calls overlapped")
		}
		for _, e := range h.logs.All() {
			if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), secretValue) {
				h.t.Errorf("a log line holds a secret: %s %v", e.Message, e.ContextMap())
			}
		}
	})
}

func ids(eps []Endpoint) []int {
	out := []int{}
	for _, ep := range eps {
		out = append(out, ep.ReplicaID)
	}
	return out
}

func (h *harness) status(id int) Status {
	for _, r := range h.m.Replicas() {
		if r.ID == id {
			return r.Status
		}
	}
	return ""
}

func (h *harness) record(id int) Record {
	for _, r := range h.m.Replicas() {
		if r.ID == id {
			return r
		}
	}
	h.t.Fatalf("no replica %d", id)
	return Record{}
}

// waitReady waits until both Ready() and the last publication are exactly want.
func (h *harness) waitReady(want ...int) {
	h.t.Helper()
	eventually(h.t, fmt.Sprintf("READY set %v", want), func() bool {
		last, _ := h.pubs.last()
		return slices.Equal(ids(h.m.Ready()), want) && slices.Equal(ids(last), want)
	})
}

func (h *harness) waitStatus(id int, want Status) {
	h.t.Helper()
	eventually(h.t, fmt.Sprintf("replica %d %s", id, want), func() bool { return h.status(id) == want })
}

func TestManagerLaunchesTargetAndPublishes(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	ready := h.m.Ready()
	if ready[0].Accelerator != "A100" || ready[0].Version != 1 || ready[0].Addr == "" {
		t.Errorf("endpoint = %+v, want version 1, accelerator A100 and an address", ready[0])
	}
	got := h.record(1)
	want := Record{Service: "svc", ID: 1, Version: 1, Status: StatusReady, InstanceID: got.InstanceID,
		Endpoint: ready[0].Addr, Infra: "fake", Resources: "A100:1", LaunchedAt: h.clock.Now(), ReadyAt: h.clock.Now()}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("record mismatch (-want +got):\n%s", diff)
	}
	if stored, _ := h.store.get("svc", 1); stored.Status != StatusReady {
		t.Errorf("stored status = %s, want READY", stored.Status)
	}

	var spec launcher.Spec
	h.prov.mu.Lock()
	for _, s := range h.prov.specs {
		if s.Name == "svc-1" {
			spec = s
		}
	}
	h.prov.mu.Unlock()
	wantSpec := launcher.Spec{
		Name:    "svc-1",
		Cluster: "svc-1",
		Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc",
			launcher.LabelVersion: "1", launcher.LabelReplicaID: "1", LabelKind: "ondemand"},
		Setup: "true",
		Run:   "serve --port $FERRY_PORT",
		Envs: map[string]string{"PLAIN": "1", "HF_TOKEN": secretValue, "FERRY_SERVICE": "svc",
			"FERRY_REPLICA_ID": "1", "SKYPILOT_SERVE_REPLICA_ID": "1",
			"SKYPILOT_NUM_GPUS_PER_NODE": "1"},
		SecretEnvs: []string{"HF_TOKEN"},
		Port:       8000,
		Resources:  testTask().Resources,
	}
	if diff := cmp.Diff(wantSpec, spec); diff != "" {
		t.Errorf("spec mismatch (-want +got):\n%s", diff)
	}
}

func TestManagerReplacesEndedInstances(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	h.prov.end(1, launcher.StateTerminated, "exit status 1")
	h.waitReady(2, 3)
	if got := h.record(1); got.Status != StatusFailed || got.Reason != "exit status 1" {
		t.Errorf("replica 1 = %s %q, want FAILED \"exit status 1\"", got.Status, got.Reason)
	}

	h.prov.end(2, launcher.StatePreempted, "spot reclaimed")
	h.waitReady(3, 4)
	if got := h.record(2); got.Status != StatusPreempted || got.Reason != "spot reclaimed" {
		t.Errorf("replica 2 = %s %q, want PREEMPTED", got.Status, got.Reason)
	}
	eventually(t, "ended instances cleaned up", func() bool { return h.prov.count() == 2 })
}

// TestManagerWaitsForAListToShowALaunch: a List from a cache that trails the launches does not
// show a new instance for a while; its replica must serve on, not fail as "disappeared". Once a
// List has shown the instance, its absence from a List is believed at once.
func TestManagerWaitsForAListToShowALaunch(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.prov.trail()
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	lists := h.prov.listCount()
	eventually(t, "five more Lists", func() bool { return h.prov.listCount() >= lists+5 })
	for _, id := range []int{1, 2} {
		if got := h.record(id); got.Status != StatusReady {
			t.Fatalf("replica %d = %s %q while the Lists trail its launch, want READY", id, got.Status, got.Reason)
		}
	}

	h.prov.catchUp()
	lists = h.prov.listCount()
	eventually(t, "two more Lists", func() bool { return h.prov.listCount() >= lists+2 })
	h.prov.vanish(1)
	h.waitReady(2, 3) // well within launchListGrace: the Lists had shown it
	if got := h.record(1); got.Status != StatusFailed || got.Reason != "instance disappeared" {
		t.Errorf("replica 1 = %s %q, want FAILED \"instance disappeared\"", got.Status, got.Reason)
	}
}

func TestManagerProbeFailureThreshold(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(1)
	h.waitReady(1)

	h.prov.byReplica(1).healthy.Store(false)
	h.waitStatus(1, StatusNotReady)
	h.waitReady() // out of the READY set before the threshold
	if r := h.record(1); !strings.Contains(r.Reason, "HTTP 503") {
		t.Errorf("NOT_READY reason = %q, want the probe error", r.Reason)
	}

	h.clock.Advance(3*time.Minute + time.Second)
	h.waitStatus(1, StatusFailedProbing)
	h.waitReady(2)
}

func TestManagerNotReadyRecovers(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(1)
	h.waitReady(1)
	fi := h.prov.byReplica(1)
	fi.healthy.Store(false)
	h.waitReady()
	fi.healthy.Store(true)
	h.waitReady(1)
	if h.status(1) != StatusReady {
		t.Errorf("status = %s, want READY", h.status(1))
	}
}

func TestManagerInitialDelay(t *testing.T) {
	prov := newFakeProvider(t)
	prov.unhealthyAtStart = true
	h := newHarness(t, prov, newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(1)
	h.waitStatus(1, StatusStarting)

	h.clock.Advance(600 * time.Second)
	h.waitStatus(1, StatusFailedInitialDelay)
	if r := h.record(1); !strings.Contains(r.Reason, "not ready within 10m0s") {
		t.Errorf("reason = %q", r.Reason)
	}
	// A replica that never served backs off the relaunch; time moves past it.
	h.clock.Advance(launchBackoff(1))
	h.waitStatus(2, StatusStarting)
	h.prov.byReplica(2).healthy.Store(true)
	h.waitReady(2)
}

func TestManagerLaunchErrorBacksOff(t *testing.T) {
	prov := newFakeProvider(t)
	prov.setLaunchErr(fmt.Errorf("%w: us-east-1a is full", launcher.ErrNoCapacity))
	h := newHarness(t, prov, newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(1)
	h.waitStatus(1, StatusFailedProvision)
	if r := h.record(1); !strings.Contains(r.Reason, "no capacity") {
		t.Errorf("reason = %q, want the launch error", r.Reason)
	}
	prov.setLaunchErr(nil)
	h.clock.Advance(launchBackoff(1))
	h.waitReady(2)
}

func TestManagerScaleDown(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(3)
	h.waitReady(1, 2, 3)
	h.prov.byReplica(1).healthy.Store(false)
	h.waitReady(2, 3)

	h.m.SetDesired(1)
	h.waitReady(2)
	// The store delete is an effect that runs after the step that drops the record from
	// memory, so the store is read inside the wait too.
	eventually(t, "scaled-down records forgotten, in memory and in the store", func() bool {
		_, stored := h.store.get("svc", 3)
		return slices.Equal(ids(recordsAsEndpoints(h.m.Replicas())), []int{2}) && h.prov.count() == 1 && !stored
	})
}

func TestManagerDrainsBeforeTerminating(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	var busy atomic.Int64 // requests the proxy still streams on the replica leaving
	h.m.cfg.Busy = func(string) int64 { return busy.Load() }
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	busy.Store(1)
	h.m.SetDesired(1)
	// Out of the READY set at once, but its instance lives while the stream runs: several
	// passes (20 ms apart) must not terminate it.
	h.waitReady(1)
	h.waitStatus(2, StatusShuttingDown)
	for range 10 {
		h.m.safeReconcile(context.Background())
	}
	if n := h.prov.count(); n != 2 {
		t.Fatalf("%d instances while replica 2 still streams, want 2", n)
	}
	busy.Store(0)
	eventually(t, "drained replica terminated and forgotten", func() bool {
		return h.prov.count() == 1 && slices.Equal(ids(recordsAsEndpoints(h.m.Replicas())), []int{1})
	})
}

func TestManagerDrainTimeout(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newFakeProvider(t), newFakeStore(), clock)
	h.m.cfg.Busy = func(string) int64 { return 1 } // a stream that never ends
	h.m.cfg.DrainTimeout = time.Minute
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	h.m.SetDesired(1)
	h.waitStatus(2, StatusShuttingDown)
	h.m.safeReconcile(context.Background()) // draining starts counting at this pass's clock
	clock.Advance(time.Minute)
	eventually(t, "replica terminated once the drain timed out", func() bool { return h.prov.count() == 1 })
}

func recordsAsEndpoints(recs []Record) []Endpoint {
	var out []Endpoint
	for _, r := range recs {
		out = append(out, Endpoint{ReplicaID: r.ID})
	}
	return out
}

func TestManagerAdoptsAfterRestart(t *testing.T) {
	prov, store, clock := newFakeProvider(t), newFakeStore(), newFakeClock()
	first := newHarness(t, prov, store, clock)
	first.start()
	first.m.SetDesired(2)
	first.waitReady(1, 2)
	first.stop()
	if prov.count() != 2 {
		t.Fatalf("stopping the manager left %d instances, want 2 still running", prov.count())
	}

	second := newHarness(t, prov, store, clock)
	began := time.Now()
	second.start()
	eventually(t, "a first publication", func() bool { _, n := second.pubs.last(); return n > 0 })
	if took := time.Since(began); took > 1500*time.Millisecond {
		t.Errorf("first publication after %v, want within about 1s", took)
	}
	if first, _ := second.pubs.last(); !slices.Equal(ids(first), []int{1, 2}) {
		t.Errorf("first publication = %v, want [1 2]", ids(first))
	}
	prov.mu.Lock()
	launches := len(prov.specs)
	prov.mu.Unlock()
	if launches != 2 {
		t.Errorf("%d launches in total, want the 2 of the first manager", launches)
	}
}

func TestManagerAdoptsUnrecordedInstance(t *testing.T) {
	prov := newFakeProvider(t)
	prov.add("svc-5", map[string]string{launcher.LabelService: "svc", launcher.LabelVersion: "1",
		launcher.LabelReplicaID: "5"}, true)
	prov.add("other-1", map[string]string{launcher.LabelService: "other", launcher.LabelReplicaID: "1"}, true)
	h := newHarness(t, prov, newFakeStore(), newFakeClock())
	h.start()
	h.waitReady(5)
	h.m.SetDesired(2)
	h.waitReady(1, 5)
	if prov.count() != 3 {
		t.Errorf("%d instances, want svc-5, svc-1 and other-1 untouched", prov.count())
	}
}

func TestManagerShutdown(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	ctx := context.Background()
	if _, err := h.m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.prov.count(); n != 0 {
		t.Errorf("%d instances after Shutdown", n)
	}
	if recs, _ := h.store.ListReplicas("svc"); len(recs) != 0 {
		t.Errorf("store holds %d records after Shutdown", len(recs))
	}
	if last, _ := h.pubs.last(); len(last) != 0 || len(h.m.Ready()) != 0 {
		t.Errorf("READY set after Shutdown = %v", last)
	}
	// A pass after Shutdown launches nothing, even with a target.
	h.m.SetDesired(2)
	h.m.reconcile(ctx)
	if n := h.prov.count(); n != 0 || len(h.m.Replicas()) != 0 {
		t.Errorf("after Shutdown a pass left %d instances and %d records", n, len(h.m.Replicas()))
	}
	if _, err := h.m.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown = %v", err)
	}
}

func TestManagerShutdownWithoutStart(t *testing.T) {
	prov, store := newFakeProvider(t), newFakeStore()
	labels := map[string]string{launcher.LabelService: "svc", launcher.LabelReplicaID: "1"}
	inst := prov.add("svc-1", labels, true)
	_ = store.SaveReplica(Record{Service: "svc", ID: 1, Status: StatusReady, InstanceID: inst.ID})
	_ = store.SaveReplica(Record{Service: "svc", ID: 2, Status: StatusFailed})
	h := newHarness(t, prov, store, newFakeClock())
	if _, err := h.m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if prov.count() != 0 {
		t.Error("instance left after Shutdown")
	}
	if recs, _ := store.ListReplicas("svc"); len(recs) != 0 {
		t.Errorf("records left: %+v", recs)
	}
}

// Shutdown cuts the launches under way (one hung on an infra that does not answer must not
// hold the teardown) and waits for them to return before it lists what to terminate.
func TestManagerShutdownCutsLaunches(t *testing.T) {
	prov := newFakeProvider(t)
	prov.launchBlock = make(chan struct{})
	defer close(prov.launchBlock)
	h := newHarness(t, prov, newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(1)
	h.waitStatus(1, StatusProvisioning)
	done := make(chan error, 1)
	go func() { _, err := h.m.Shutdown(context.Background()); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown waited for a launch that hangs")
	}
	if prov.count() != 0 {
		t.Error("an instance survived Shutdown")
	}
	if recs, _ := h.store.ListReplicas("svc"); len(recs) != 0 {
		t.Errorf("records left: %+v", recs)
	}
}

func TestManagerSurvivesPanickingOnReady(t *testing.T) {
	prov, store := newFakeProvider(t), newFakeStore()
	m, err := New(Config{Service: "svc", Task: testTask(), Provider: prov, Store: store,
		ProbeInterval: 20 * time.Millisecond, ReconcileInterval: 20 * time.Millisecond,
		OnReady: func([]Endpoint) { panic("subscriber bug") }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	m.SetDesired(1)
	eventually(t, "a READY replica", func() bool { return len(m.Ready()) == 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err == nil {
		t.Error("second Start succeeded")
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{Task: &configs.Task{}})
	if err == nil {
		t.Fatal("New accepted an empty config")
	}
	for _, want := range []string{"Service", "Task", "Provider", "Store"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}
