package kubestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// installFence creates the chart's fencing policies, the state's and FerryService status's, for
// ns and lease (testcluster.InstallFencing).
func installFence(t *testing.T, client kubernetes.Interface, ns, lease string) {
	t.Helper()
	if err := testcluster.InstallFencing(context.Background(), client, ns, lease, testcluster.FenceState|testcluster.FenceStatus); err != nil {
		t.Fatal(err)
	}
}

func readRepoFile(t *testing.T, path string) []byte {
	t.Helper()
	root, err := testcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func setLease(t *testing.T, client kubernetes.Interface, ns, name, holder string, transitions int32) {
	t.Helper()
	ctx := context.Background()
	leases := client.CoordinationV1().Leases(ns)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &holder, &transitions
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &holder, &transitions
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func openFenced(t *testing.T, c *testcluster.Cluster, ns, holder string, term int64) *kubestore.Store {
	t.Helper()
	s, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: ns,
		Fence: func() (int64, bool) { return term, true }, Holder: holder})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// eventuallyRejected retries write until the API server refuses it with a message containing
// want (a new policy, binding or lease takes effect a moment after it is stored, and until the
// policy sees the lease it refuses for want of it), bounded; it returns that error.
func eventuallyRejected(t *testing.T, want string, write func() error) error {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = write(); (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), want) {
			return err
		}
	}
	t.Fatalf("the API server never refused the write for %q; last error: %v", want, err)
	return nil
}

// TestFenceRejectsStaleTerm installs the chart's fencing policy with a hand-made Lease and checks
// that the API server itself refuses a deposed leader's writes.
func TestFenceRejectsStaleTerm(t *testing.T) {
	c := testcluster.Shared(t)
	client := c.Client()
	ns := newNamespace(t, c)
	const lease = "ferry-controller"
	setLease(t, client, ns, lease, "ctl-a", 3)
	installFence(t, client, ns, lease)

	// A store stamping a term that never led is refused from the start: this is also how the
	// test knows the policy is in force.
	never := openFenced(t, c, ns, "ctl-a", 2)
	probes := 0
	eventuallyRejected(t, "ferry.dev/term 2 is not the lease term 3", func() error {
		probes++
		return never.CreateService(store.Service{Name: fmt.Sprintf("probe-%d", probes), Version: 1, Task: &configs.Task{}, Port: 1})
	})

	a := openFenced(t, c, ns, "ctl-a", 3)
	if err := a.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{Run: "x"}, Port: 1}); err != nil {
		t.Fatalf("the leader's write was refused: %v", err)
	}
	if _, err := a.NextReplicaIDs("chat", 1); err != nil {
		t.Fatal(err)
	}

	// ctl-b takes over: a's writes are refused although a still believes it leads.
	setLease(t, client, ns, lease, "ctl-b", 4)
	eventuallyRejected(t, "is not the lease term 4", func() error { return a.SetServiceStatus("chat", "READY") })
	if _, err := a.NextReplicaIDs("chat", 1); err == nil {
		t.Error("the deposed leader handed out a replica id")
	}
	// The right term from the wrong holder is refused too.
	if err := openFenced(t, c, ns, "ctl-a", 4).SetServiceStatus("chat", "READY"); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("write by ctl-a with ctl-b's term: %v, want refused", err)
	}

	b := openFenced(t, c, ns, "ctl-b", 4)
	if err := b.SetServiceStatus("chat", "READY"); err != nil {
		t.Fatalf("the new leader's write was refused: %v", err)
	}
	id, err := b.NextReplicaIDs("chat", 1)
	if err != nil || id != 2 {
		t.Errorf("new leader's replica id = %d, %v; want 2 (1 went to the old leader)", id, err)
	}
	if err := b.DeleteService("chat"); err != nil {
		t.Fatalf("the new leader's delete was refused: %v", err)
	}
	if err := b.PutLeftover(launcher.Leftover{Key: "i-9", Infra: "aws", InstanceID: "i-9"}); err != nil {
		t.Fatalf("the new leader's leftover was refused: %v", err)
	}
	// The deposed leader's delete must reach the API server to be refused: wait until its
	// cache shows the leftover (a delete of what it does not see sends nothing).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got, err := a.ListLeftovers(); err == nil && len(got) == 1 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the deposed leader's cache never showed the new leader's leftover: %+v, %v", got, err)
		}
	}
	if err := a.DeleteLeftover("i-9"); err == nil {
		t.Error("the deposed leader forgot a leftover")
	}
	if got, err := b.ListLeftovers(); err != nil || len(got) != 1 {
		t.Errorf("leftovers after the deposed leader's delete: %+v, %v; want i-9 kept", got, err)
	}
	if err := b.DeleteLeftover("i-9"); err != nil {
		t.Fatalf("the new leader's delete of a leftover was refused: %v", err)
	}
}

// TestNotLeaderRefusesLocally: a store whose fence says it does not lead sends nothing.
func TestNotLeaderRefusesLocally(t *testing.T) {
	c := testcluster.Shared(t)
	ns := newNamespace(t, c)
	s, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: ns,
		Fence: func() (int64, bool) { return 7, false }, Holder: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateService(store.Service{Name: "a", Version: 1, Task: &configs.Task{}, Port: 1}); !errors.Is(err, kubestore.ErrNotLeader) {
		t.Errorf("CreateService while not leading: %v, want ErrNotLeader", err)
	}
	if _, err := s.CreateJob(jobsJob()); !errors.Is(err, kubestore.ErrNotLeader) {
		t.Errorf("CreateJob while not leading: %v, want ErrNotLeader", err)
	}
	if err := s.PutLeftover(launcher.Leftover{Key: "i-1", Infra: "aws", InstanceID: "i-1"}); !errors.Is(err, kubestore.ErrNotLeader) {
		t.Errorf("PutLeftover while not leading: %v, want ErrNotLeader", err)
	}
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{LabelSelector: kubestore.LabelManagedBy + "=" + kubestore.ManagedBy})
	if err != nil || len(cms.Items) != 0 {
		t.Errorf("objects written while not leading: %v, %v", cms, err)
	}
}

var (
	crdGVR  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	fsvcGVR = schema.GroupVersionResource{Group: "ferry.dev", Version: "v1alpha1", Resource: "ferryservices"}
)

// installCRD creates the FerryService CRD from charts/ferry/crds and waits until it is served.
func installCRD(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	var crd unstructured.Unstructured
	if err := yaml.Unmarshal(readRepoFile(t, "charts/ferry/crds/ferryservices.ferry.dev.yaml"), &crd.Object); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := dyn.Resource(fsvcGVR).Namespace("default").List(ctx, metav1.ListOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the FerryService CRD is not served: %v", err)
		}
	}
}

// TestFenceGuardsFerryServiceStatus: a FerryService's spec is people's to write, unfenced; its
// status, which only the leader writes, must carry the lease's term and holder in status.fence.
func TestFenceGuardsFerryServiceStatus(t *testing.T) {
	c := testcluster.Shared(t)
	client := c.Client()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	installCRD(t, dyn)
	ns := newNamespace(t, c)
	setLease(t, client, ns, "ferry-controller", "ctl-a", 3)
	installFence(t, client, ns, "ferry-controller")
	ctx := context.Background()
	res := dyn.Resource(fsvcGVR).Namespace(ns)
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ferry.dev/v1alpha1", "kind": "FerryService",
		"metadata": map[string]any{"name": "chat"}, "spec": map[string]any{"run": "x", "service": map[string]any{"replicas": int64(1)}}}}
	if _, err := res.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a person's create, unfenced, was refused: %v", err)
	}
	writeStatus := func(term, holder string) error {
		cur, err := res.Get(ctx, "chat", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Object["status"] = map[string]any{"status": "READY", "fence": map[string]any{"term": term, "holder": holder}}
		_, err = res.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	}
	eventuallyRejected(t, "status.fence term 2 holder ctl-a is not the lease term 3", func() error { return writeStatus("2", "ctl-a") })
	if err := writeStatus("3", "ctl-a"); err != nil {
		t.Fatalf("the leader's status write was refused: %v", err)
	}
	setLease(t, client, ns, "ferry-controller", "ctl-b", 4)
	eventuallyRejected(t, "is not the lease term 4", func() error { return writeStatus("3", "ctl-a") })
	if err := writeStatus("4", "ctl-b"); err != nil {
		t.Fatalf("the new leader's status write was refused: %v", err)
	}
	cur, err := res.Get(ctx, "chat", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(cur.Object, int64(2), "spec", "service", "replicas"); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Errorf("a person's spec update, unfenced, was refused: %v", err)
	}
}
