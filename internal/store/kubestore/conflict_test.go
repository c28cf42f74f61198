package kubestore

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/testcluster"
)

// TestConflictRereadsAndRetries makes the conflict happen for sure: between the store's read
// and its write another writer changes the object, so the update is refused for its stale
// resourceVersion; the store must read again and re-apply its change on top, keeping both.
func TestConflictRereadsAndRetries(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := "ks-conflict"
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
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
