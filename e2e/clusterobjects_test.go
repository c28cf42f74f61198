package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// The tests share one cluster per test binary, and `go test -count=N` runs each of them N times
// against it: every object a test creates there must have a name of that run's own, and go when
// the test ends.

// testNamespace creates a namespace named by the API server from prefix (a new one on every
// run) and removes it when the test ends, after the test's own cleanups (register it before
// them). The test cluster runs no controller-manager to empty a deleted namespace, so what the
// tests leave in one (Ferry's ConfigMaps and Secrets, the controllers' Lease, pods, the chart's
// ServiceAccount and Roles) is deleted here, and the namespace is then finalized by hand rather
// than left Terminating.
func testNamespace(t *testing.T, c *testcluster.Cluster, prefix string) string {
	t.Helper()
	ctx := context.Background()
	ns, err := c.Client().CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeNamespace(c, ns.Name); err != nil {
			t.Errorf("remove namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

func removeNamespace(c *testcluster.Cluster, ns string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	core, all := c.Client().CoreV1(), metav1.ListOptions{}
	now := metav1.DeleteOptions{GracePeriodSeconds: new(int64)}
	errs := []error{
		core.Pods(ns).DeleteCollection(ctx, now, all),
		core.ConfigMaps(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		core.Secrets(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		c.Client().CoordinationV1().Leases(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		core.ServiceAccounts(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		c.Client().RbacV1().Roles(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
		c.Client().RbacV1().RoleBindings(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, all),
	}
	if err := core.Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	got, err := core.Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err == nil {
		got.Spec.Finalizers = nil
		_, err = core.Namespaces().Finalize(ctx, got, metav1.UpdateOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
