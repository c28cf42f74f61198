package kubestore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/leader"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/store/storetest"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// TestRaceAcrossLeaseHandover races many writers through a Lease handover, as issue 42's
// failover did: two controllers, each a real elector (internal/leader) on one Lease with the
// chart's fencing policy installed, and a store fenced by its elector's term. Controller A
// leads and writes a service from many goroutines (status, target, versions and rollouts,
// replica records with deletes, leftovers); a third store stamps A's term for ever, as a
// paused A that never noticed it lost would. Midway A steps down and B takes over, its own
// writers starting as soon as the API server admits its term. Then B's writers race B's
// DeleteService. Nothing may fail but with the fence's refusal (A's after the handover) or
// ErrNotFound (after the delete); nothing written may be lost; B's writes come last; and
// nothing of the service is left in the namespace.
func TestRaceAcrossLeaseHandover(t *testing.T) {
	c := testcluster.Shared(t)
	ns := newNamespace(t, c)
	const lease = "ferry-controller"
	installFence(t, c.Client(), ns, lease)
	a := startCandidate(t, c, ns, lease, "ctl-a")
	waitFor(t, a.leads, "ctl-a leads")
	b := startCandidate(t, c, ns, lease, "ctl-b")
	waitFenceAdmits(t, a.store)
	termA, _, _ := a.elector.Term()
	stale := openFenced(t, c, ns, "ctl-a", termA)
	if err := a.store.CreateService(store.Service{Name: "race", Version: 1, Task: &configs.Task{Run: "serve v1"}, Port: 1, Status: "INIT"}); err != nil {
		t.Fatal(err)
	}

	bAdmitted, bDone := make(chan struct{}), make(chan struct{})
	wa := &storetest.Writers{Service: "race", Name: "a", Owners: 4, Ops: 12, Versions: []int{2, 4, 6}, Allowed: fenced}
	wStale := &storetest.Writers{Service: "race", Name: "stale", Owners: 2, Ops: 4, Versions: []int{10, 11}, Allowed: fenced, Until: bDone}
	wb := &storetest.Writers{Service: "race", Name: "b", Owners: 4, Ops: 8, Versions: []int{3, 5}, Gate: bAdmitted}
	da, dStale, db := wa.Start(a.store), wStale.Start(stale), wb.Start(b.store)
	waitFor(t, wa.After(15), "15 of ctl-a's writes")
	a.stop() // steps down, releasing the Lease: ctl-b takes over
	waitFor(t, b.leads, "ctl-b leads")
	waitFenceAdmits(t, b.store)
	close(bAdmitted)
	waitFor(t, db, "ctl-b's writers")
	close(bDone)
	waitFor(t, da, "ctl-a's writers")
	waitFor(t, dStale, "the stale writers")
	for _, w := range []*storetest.Writers{wa, wStale, wb} {
		w.Unexpected(t)
	}
	if wa.Refused() == 0 || wStale.Refused() == 0 {
		t.Errorf("refused writes: ctl-a %d, the stale store %d; want some of each: the handover came after the writes", wa.Refused(), wStale.Refused())
	}
	reader := openReader(t, c, ns)
	storetest.CheckState(t, reader, wa, wStale, wb)
	checkLastWriter(t, c, ns, reader, wb, "ctl-b")

	deleted := make(chan struct{})
	wb2 := &storetest.Writers{Service: "race", Name: "b2", Owners: 4, Ops: 6, Versions: []int{7, 8}, Allowed: storetest.NotFound, Until: deleted}
	db2 := wb2.Start(b.store)
	waitFor(t, wb2.After(10), "10 of ctl-b's writes")
	if err := b.store.DeleteService("race"); err != nil {
		t.Fatalf("the new leader's delete of a service its writers still write: %v", err)
	}
	close(deleted)
	waitFor(t, db2, "ctl-b's writers")
	wb2.Unexpected(t)
	storetest.CheckGone(t, openReader(t, c, ns), "race")
	checkNothingLeft(t, c, ns, "race")
}

// candidate is one controller: an elector on the Lease and a store fenced by its term.
type candidate struct {
	elector *leader.Elector
	store   *kubestore.Store
	leads   chan struct{}
	// stop ends the campaign (a leader releases the Lease) and waits for it.
	stop func()
}

func startCandidate(t *testing.T, c *testcluster.Cluster, ns, lease, id string) *candidate {
	t.Helper()
	e, err := leader.New(leader.Config{Client: c.Client().CoordinationV1(), Namespace: ns, Name: lease, Identity: id,
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: ns, Holder: id,
		Fence: func() (int64, bool) { term, _, ok := e.Term(); return term, ok }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	cand := &candidate{elector: e, store: s, leads: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.Run(ctx, leader.Callbacks{OnStartedLeading: func(context.Context) { close(cand.leads) }})
	}()
	cand.stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(cand.stop)
	return cand
}

// fenced allows the refusals of a controller that does not lead: its own, or the API server's.
func fenced(err error) bool {
	return errors.Is(err, kubestore.ErrNotLeader) || apierrors.IsForbidden(err) || apierrors.IsInvalid(err)
}

// waitFor fails the test when ch is not closed within a minute.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for %s", what)
	}
}

// waitFenceAdmits waits until the API server admits s's writes: its fencing policy sees a new
// Lease a moment after it is written, and refuses until then.
func waitFenceAdmits(t *testing.T, s *kubestore.Store) {
	t.Helper()
	probe := launcher.Leftover{Key: "fence-probe", Infra: "aws", InstanceID: "fence-probe"}
	var err error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); <-tick.C {
		if err = s.PutLeftover(probe); err == nil {
			if err := s.DeleteLeftover(probe.Key); err != nil {
				t.Fatal(err)
			}
			return
		}
		if !fenced(err) {
			t.Fatalf("a probe write: %v", err)
		}
	}
	t.Fatalf("the API server never admitted the leader's writes: %v", err)
}

// openReader is a store that only reads, as a restarted controller would first.
func openReader(t *testing.T, c *testcluster.Cluster, ns string) *kubestore.Store {
	t.Helper()
	s, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkLastWriter wants the service's row to be the new leader's last write: no write of the
// deposed one landed after it.
func checkLastWriter(t *testing.T, c *testcluster.Cluster, ns string, s store.Store, w *storetest.Writers, holder string) {
	t.Helper()
	svc, err := s.GetService(w.Service)
	if err != nil {
		t.Fatal(err)
	}
	if svc.Status != w.LastStatus() {
		t.Errorf("service status %q, want %q, the new leader's last", svc.Status, w.LastStatus())
	}
	cm, err := c.Client().CoreV1().ConfigMaps(ns).Get(context.Background(), "ferry-svc-"+w.Service, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Annotations[kubestore.AnnotationHolder]; got != holder {
		t.Errorf("the service's ConfigMap was last written by %q, want %q", got, holder)
	}
}

// checkNothingLeft wants no ConfigMap or Secret of service in ns, as the API server lists them.
func checkNothingLeft(t *testing.T, c *testcluster.Cluster, ns, service string) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: kubestore.LabelService + "=" + service}
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := c.Client().CoreV1().Secrets(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		t.Errorf("ConfigMap %s left after DeleteService: %v", cm.Name, cm.Data)
	}
	for _, s := range secrets.Items {
		t.Errorf("Secret %s left after DeleteService", s.Name)
	}
}
