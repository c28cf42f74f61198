package kubestore

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/replicas"
)

// openFencedWithChat is openWithChat behind the chart's fencing policy: a Lease held by ctl-a
// in term 1, and a store (on cfg, the cluster's when nil) stamping that term. A policy takes
// effect a moment after it is stored, so the store is opened again until its probe finds the
// fence, bounded.
func openFencedWithChat(t *testing.T, c *testcluster.Cluster, prefix string, cfg *rest.Config) (*Store, string) {
	t.Helper()
	ctx := context.Background()
	ns := generatedNamespace(t, c, prefix)
	holder, term := "ctl-a", int32(1)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "ferry-controller"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseTransitions: &term}}
	if _, err := c.Client().CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.InstallFencing(ctx, c.Client(), ns, "ferry-controller", testcluster.FenceState); err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = c.RESTConfig()
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		s, err := Open(ctx, Options{Config: cfg, Namespace: ns, Holder: holder, Fence: func() (int64, bool) { return int64(term), true }})
		if err != nil {
			t.Fatal(err)
		}
		if !s.Fenced() {
			s.Close()
			continue
		}
		t.Cleanup(func() { s.Close() })
		if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1}); err != nil {
			t.Fatal(err)
		}
		return s, ns
	}
	t.Fatal("the store never found the fencing policy in force")
	return nil, ""
}

// TestFenceProbe: a store finds the fence only where the API server enforces it: not without
// leader election, not with election in a namespace without the policy.
func TestFenceProbe(t *testing.T) {
	c := testcluster.Shared(t)
	plain, _ := openWithChat(t, c, "ks-probe-plain-")
	if plain.Fenced() {
		t.Error("a store without leader election believes it is fenced")
	}
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-probe-nopolicy-")
	elected, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns, Holder: "ctl-a", Fence: func() (int64, bool) { return 1, true }})
	if err != nil {
		t.Fatal(err)
	}
	defer elected.Close()
	if elected.Fenced() {
		t.Error("a store with leader election but no fencing policy believes it is fenced")
	}
	fenced, fns := openFencedWithChat(t, c, "ks-probe-fenced-", nil)
	if !fenced.Fenced() {
		t.Fatal("openFencedWithChat returned a store that is not fenced")
	}
	// The probe is a dry run: it leaves nothing.
	if _, err := c.Client().CoreV1().ConfigMaps(fns).Get(ctx, fenceProbe, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the fence probe's object: %v, want none stored", err)
	}
}

// TestFenceProbeWhenTheAPIServerFails: a dry run answered with an error, or never answered,
// leaves the store unfenced (it keeps its reads from the API server) within probeBudget, in a
// namespace whose policy is in force.
func TestFenceProbeWhenTheAPIServerFails(t *testing.T) {
	c := testcluster.Shared(t)
	defer func(b time.Duration) { probeBudget = b }(probeBudget)
	probeBudget = time.Second
	_, ns := openFencedWithChat(t, c, "ks-probe-fails-", nil)
	for _, fault := range []string{"erring", "hung"} {
		cfg := rest.CopyConfig(c.RESTConfig())
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.URL.Query().Get("dryRun") == "" {
					return rt.RoundTrip(req)
				}
				if fault == "hung" {
					<-req.Context().Done()
					return nil, req.Context().Err()
				}
				return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"text/plain"}},
					Body: io.NopCloser(strings.NewReader("unavailable")), Request: req}, nil
			})
		}
		start := time.Now()
		s, err := Open(context.Background(), Options{Config: cfg, Namespace: ns, Holder: "ctl-a", Fence: func() (int64, bool) { return 1, true }})
		if err != nil {
			t.Fatalf("%s dry run: Open: %v", fault, err)
		}
		took := time.Since(start)
		fenced := s.Fenced()
		s.Close()
		if fenced {
			t.Errorf("%s dry run: the store believes it is fenced", fault)
		}
		if took > 10*probeBudget {
			t.Errorf("%s dry run: Open took %v, want about the probe's budget (%v)", fault, took, probeBudget)
		}
	}
}

// TestFencedCreateIsOneRequest: a fenced store creates a record whose id NextReplicaIDs handed
// out with one request to the API server, the create; unfenced it also reads the service back.
func TestFencedCreateIsOneRequest(t *testing.T) {
	c := testcluster.Shared(t)
	for _, fenced := range []bool{false, true} {
		var counting atomic.Bool
		var requests atomic.Int32
		cfg := rest.CopyConfig(c.RESTConfig())
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if counting.Load() {
					requests.Add(1)
				}
				return rt.RoundTrip(req)
			})
		}
		var s *Store
		if fenced {
			s, _ = openFencedWithChat(t, c, "ks-one-request-", cfg)
		} else {
			s, _ = openOn(t, c, "ks-two-requests-", cfg)
		}
		id, err := s.NextReplicaIDs("chat", 1)
		if err != nil {
			t.Fatal(err)
		}
		counting.Store(true)
		if err := s.SaveReplica(replicas.Record{Service: "chat", ID: id, Version: 1, Status: replicas.StatusProvisioning}); err != nil {
			t.Fatal(err)
		}
		counting.Store(false)
		if want := map[bool]int32{false: 2, true: 1}[fenced]; requests.Load() != want {
			t.Errorf("fenced %v: a new record took %d requests, want %d", fenced, requests.Load(), want)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCreateReservesInitialIDs: CreateService reserves the initial replicas' ids in its create,
// and the store hands them out first with no request; asked for more than are left, it drops
// them and moves the counter. Another store, or a service made again under the same name, never
// gets a reserved id.
func TestCreateReservesInitialIDs(t *testing.T) {
	c := testcluster.Shared(t)
	var requests atomic.Int32
	cfg := rest.CopyConfig(c.RESTConfig())
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			requests.Add(1)
			return rt.RoundTrip(req)
		})
	}
	ns := generatedNamespace(t, c, "ks-reserved-")
	a, err := Open(context.Background(), Options{Config: cfg, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := openStore(t, c, ns)
	three := &configs.Task{Service: &configs.Service{FixedReplicas: true, ReplicaPolicy: configs.ReplicaPolicy{MinReplicas: 3, MaxReplicas: 3}}}
	for _, name := range []string{"chat", "embed"} {
		if err := a.CreateService(store.Service{Name: name, Version: 1, Task: three, Port: 1}); err != nil {
			t.Fatal(err)
		}
	}
	// next checks the ids, and for a whether it asked the API server (written: a write of the
	// counter, more requests when it conflicts with b's) or not.
	next := func(s *Store, service string, n, want int, written bool) {
		t.Helper()
		before := requests.Load()
		id, err := s.NextReplicaIDs(service, n)
		if err != nil || id != want {
			t.Errorf("NextReplicaIDs(%s, %d) = %d, %v; want %d", service, n, id, err, want)
		}
		if took := requests.Load() - before; s == a && (took > 0) != written {
			t.Errorf("NextReplicaIDs(%s, %d) took %d requests; want a write of the counter: %v", service, n, took, written)
		}
	}
	next(b, "chat", 1, 4, true) // another store: past the reserved ids
	next(a, "chat", 2, 1, false)
	next(a, "chat", 1, 3, false)
	next(a, "chat", 1, 5, true)  // none left: the counter
	next(a, "embed", 4, 4, true) // more than are left: dropped
	next(a, "embed", 1, 8, true)

	// Made again under the same name by another store: a's reserved ids are not that
	// service's, whose first ids b reserved.
	if err := a.CreateService(store.Service{Name: "again", Version: 1, Task: three, Port: 1}); err != nil {
		t.Fatal(err)
	}
	old, err := a.cms.Get(serviceObject("again"))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteService("again"); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateService(store.Service{Name: "again", Version: 1, Task: three, Port: 1}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if cm, err := a.cms.Get(serviceObject("again")); err == nil && cm.UID != old.UID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("store a never saw the service made again")
		}
	}
	next(a, "again", 1, 4, true)
	next(b, "again", 3, 1, false)
}

// openStore opens a store on ns, closed when the test ends.
func openStore(t *testing.T, c *testcluster.Cluster, ns string) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
