package kubestore

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/replicas"
)

// TestConflictRereadsAndRetries makes the conflict happen for sure: between the store's read
// and its write another writer changes the object, so the update is refused for its stale
// resourceVersion; the store must read again and re-apply its change on top, keeping both.
func TestConflictRereadsAndRetries(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-conflict-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1, Status: "INIT"}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	err = s.updateRow("chat", func(cm *corev1.ConfigMap, row *serviceRow) error {
		calls++
		if calls == 1 { // another controller writes meanwhile
			other, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, cm.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			other.Data["note"] = "written by the other"
			if _, err := c.Client().CoreV1().ConfigMaps(ns).Update(ctx, other, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		row.Target = 7
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 {
		t.Errorf("mutate ran %d times, want 2 (a conflict, then the retry on the re-read object)", calls)
	}
	got, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, serviceObject("chat"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Data["note"] != "written by the other" {
		t.Error("the other writer's change was overwritten")
	}
	if svc, err := s.GetService("chat"); err != nil || svc.Target != 7 {
		t.Errorf("the store's change: %+v, %v; want target 7", svc, err)
	}
}

// TestDeleteRetriesWhenChangedUnderIt makes the failure of issue 42 happen for sure: between a
// delete's stamp and the delete itself another writer (the status loop, the other controller's
// last write before a failover) changes the object, so the delete's precondition fails. The
// store must read again, stamp again and delete; and a delete of what is gone is success.
func TestDeleteRetriesWhenChangedUnderIt(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-delete-conflict-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1, Status: "READY"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveReplica(replicas.Record{Service: "chat", ID: 1, Version: 1, Status: replicas.StatusReady}); err != nil {
		t.Fatal(err)
	}
	cms := c.Client().CoreV1().ConfigMaps(ns)
	stamps := map[string]int{}
	s.stamped = func(name string) {
		stamps[name]++
		if stamps[name] > 1 {
			return
		}
		other, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("the other writer's read: %v", err)
			return
		}
		other.Data["note"] = "written between the stamp and the delete"
		if _, err := cms.Update(ctx, other, metav1.UpdateOptions{}); err != nil {
			t.Errorf("the other writer's write: %v", err)
		}
	}
	if err := s.DeleteReplica("chat", 1); err != nil {
		t.Fatalf("DeleteReplica with a write under it: %v", err)
	}
	if err := s.DeleteService("chat"); err != nil {
		t.Fatalf("DeleteService with a write under each delete: %v", err)
	}
	// Each ConfigMap (the replica's, the service's, its sealed values'): stamped, changed under
	// the delete, stamped again.
	want := map[string]int{replicaObject("chat", 1): 2, serviceObject("chat"): 2, sealedObject(serviceObject("chat")): 2}
	for name, n := range want {
		if stamps[name] != n {
			t.Errorf("%s stamped %d times, want %d (a precondition failure, then the retry)", name, stamps[name], n)
		}
		if _, err := cms.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s after its delete: %v, want gone", name, err)
		}
	}
	if err := s.DeleteReplica("chat", 1); err != nil {
		t.Errorf("DeleteReplica of a record gone already: %v, want success", err)
	}
	if err := s.DeleteService("chat"); err != nil {
		t.Errorf("DeleteService of a service gone already: %v, want success", err)
	}
}

// TestDeleteSeesPastAStaleCache: an object another controller created a moment ago may not be
// in this store's cache yet (here: a cache that never saw it); a delete, and an update, must
// ask the API server before they call it gone.
func TestDeleteSeesPastAStaleCache(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-delete-stale-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cms := c.Client().CoreV1().ConfigMaps(ns)
	for _, name := range []string{"ferry-left-0000000000000001", "ferry-left-0000000000000002"} {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: objectMeta(name, kindLeftover, "")}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s.cms = newWritten(listerscorev1.NewConfigMapLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})).ConfigMaps(ns))
	if err := s.configMaps().Delete("ferry-left-0000000000000001"); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Get(ctx, "ferry-left-0000000000000001", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after a delete through a cache that had not seen the object: %v, want it gone", err)
	}
	// An update through the same cache, which never sees the object: read from the API server,
	// written, and read back from the store's own write.
	if _, err := s.configMaps().Update("ferry-left-0000000000000002", func(cm *corev1.ConfigMap) error {
		cm.Data = map[string]string{"note": "updated"}
		return nil
	}); err != nil {
		t.Errorf("an update through a cache that had not seen the object: %v, want it written", err)
	}
	if got, err := s.cms.Get("ferry-left-0000000000000002"); err != nil || got.Data["note"] != "updated" {
		t.Errorf("the store reads its own update as %v, %v; want it", got, err)
	}
	if _, err := s.cms.Get("ferry-left-0000000000000001"); !apierrors.IsNotFound(err) {
		t.Errorf("the store reads its own delete as %v, want not found", err)
	}
}

// TestReplicaCreatedDuringDeleteIsRemoved makes the narrowest race of a status write with
// DeleteService happen for sure: the replica's writer has found its service not being deleted,
// and the whole delete runs before its create. The writer must see that, remove the record it
// made and fail with ErrNotFound, so that no record outlives the service. A fenced store sees
// it in its own view (or in the refusal of its counter's write, for an id it handed out), an
// unfenced one by reading the service from the API server.
func TestReplicaCreatedDuringDeleteIsRemoved(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	for _, mode := range []struct{ fenced, handedOut bool }{{}, {fenced: true}, {fenced: true, handedOut: true}} {
		s, ns := openWithChat(t, c, "ks-create-during-delete-")
		if mode.fenced {
			s, ns = openFencedWithChat(t, c, "ks-create-during-delete-fenced-", nil)
		}
		if mode.handedOut { // its counter's write races the delete too
			if id, err := s.NextReplicaIDs("chat", 1); err != nil || id != 1 {
				t.Fatalf("NextReplicaIDs = %d, %v; want 1", id, err)
			}
		}
		s.creating = func(string) {
			s.creating = nil
			if err := s.DeleteService("chat"); err != nil {
				t.Errorf("DeleteService: %v", err)
			}
		}
		err := s.SaveReplica(replicas.Record{Service: "chat", ID: 1, Version: 1, Status: replicas.StatusShuttingDown})
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%+v: SaveReplica racing DeleteService: %v, want ErrNotFound", mode, err)
		}
		if _, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, replicaObject("chat", 1), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%+v: the replica's record after its service was deleted: %v, want gone", mode, err)
		}
	}
}

// TestReplicaRecordOfAHandedOutID covers the create of a record whose id NextReplicaID handed
// out, which skips the service's row when the cache shows its counter past the id: that create
// writes nothing but the record; racing a delete it still leaves nothing; and racing a delete
// and a new service of the same name, it moves the new service's counter past its id.
func TestReplicaRecordOfAHandedOutID(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		meantime func(s *Store) error // runs right before the record's create
		wantErr  error
	}{
		{name: "alone"},
		{name: "racing a delete", meantime: func(s *Store) error { return s.DeleteService("chat") }, wantErr: store.ErrNotFound},
		{name: "racing a delete and a new service", meantime: func(s *Store) error {
			if err := s.DeleteService("chat"); err != nil {
				return err
			}
			return s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ns := openWithChat(t, c, "ks-handed-out-")
			var (
				id  int
				err error
			)
			for range 3 {
				if id, err = s.NextReplicaIDs("chat", 1); err != nil {
					t.Fatal(err)
				}
			}
			before, err := s.cms.Get(serviceObject("chat"))
			if err != nil {
				t.Fatal(err)
			}
			s.creating = func(string) {
				s.creating = nil
				if tc.meantime != nil {
					if err := tc.meantime(s); err != nil {
						t.Errorf("meantime: %v", err)
					}
				}
			}
			err = s.SaveReplica(replicas.Record{Service: "chat", ID: id, Version: 1, Status: replicas.StatusProvisioning})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("SaveReplica: %v, want %v", err, tc.wantErr)
			}
			_, recErr := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, replicaObject("chat", id), metav1.GetOptions{})
			svc, svcErr := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, serviceObject("chat"), metav1.GetOptions{})
			switch tc.name {
			case "alone":
				if recErr != nil {
					t.Errorf("the record: %v", recErr)
				}
				if svcErr != nil || svc.ResourceVersion != before.ResourceVersion {
					t.Errorf("the service's ConfigMap was written (resourceVersion %s, was %s; %v): the id was counted already", svc.ResourceVersion, before.ResourceVersion, svcErr)
				}
			case "racing a delete":
				if !apierrors.IsNotFound(recErr) {
					t.Errorf("the record after its service was deleted: %v, want gone", recErr)
				}
			default:
				if recErr != nil {
					t.Errorf("the record: %v", recErr)
				}
				var row serviceRow
				if svcErr == nil {
					_, svcErr = getJSON(svc, keyService, &row)
				}
				if svcErr != nil || row.NextReplicaID <= id {
					t.Errorf("the new service's id counter is %d (%v), want past %d, the record's", row.NextReplicaID, svcErr, id)
				}
			}
		})
	}
}

// TestWritesLeaveAMarkedObjectAlone: from a delete's mark on, Ferry's writers do not change the
// object (which would fail the delete's precondition and, with writers that never stop, starve
// it): the service's status is kept as it was, ids and records are refused as for a service
// that is gone.
func TestWritesLeaveAMarkedObjectAlone(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-marked-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1, Status: "SHUTTING_DOWN"}); err != nil {
		t.Fatal(err)
	}
	ctxMark, cancel := s.ctx()
	defer cancel()
	markedCM, err := s.configMaps().mark(ctxMark, serviceObject("chat"), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetServiceStatus("chat", "READY"); err != nil {
		t.Errorf("SetServiceStatus of a service being deleted: %v, want the write dropped", err)
	}
	if _, err := s.NextReplicaIDs("chat", 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("NextReplicaID of a service being deleted: %v, want ErrNotFound", err)
	}
	if err := s.SaveReplica(replicas.Record{Service: "chat", ID: 1, Version: 1}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SaveReplica of a service being deleted: %v, want ErrNotFound", err)
	}
	got, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, serviceObject("chat"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != markedCM.ResourceVersion {
		t.Errorf("the marked service's ConfigMap was written: resourceVersion %s, marked at %s", got.ResourceVersion, markedCM.ResourceVersion)
	}
	if svc, err := s.GetService("chat"); err != nil || svc.Status != "SHUTTING_DOWN" {
		t.Errorf("a service being deleted reads %+v, %v; want it, SHUTTING_DOWN, until it is gone", svc, err)
	}
}

// openWithChat opens a store in a new namespace, closed at the end of the test, with the service
// "chat" created in it.
func openWithChat(t *testing.T, c *testcluster.Cluster, prefix string) (*Store, string) {
	t.Helper()
	return openOn(t, c, prefix, c.RESTConfig())
}

// openOn is openWithChat on cfg.
func openOn(t *testing.T, c *testcluster.Cluster, prefix string, cfg *rest.Config) (*Store, string) {
	t.Helper()
	ns := generatedNamespace(t, c, prefix)
	s, err := Open(context.Background(), Options{Config: cfg, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1}); err != nil {
		t.Fatal(err)
	}
	return s, ns
}
