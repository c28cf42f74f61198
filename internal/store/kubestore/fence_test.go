package kubestore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/testcluster"
)

// installFence renders charts/ferry/templates/fencing-policy.yaml for ns and lease (the two
// template values it uses) and creates its policy and binding.
func installFence(t *testing.T, client kubernetes.Interface, ns, lease string) {
	t.Helper()
	root, err := testcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "charts/ferry/templates/fencing-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(raw), "{{ .Release.Namespace }}", ns)
	text = regexp.MustCompile(`\{\{ \.Values\.leaderElection\.leaseName[^}]*\}\}`).ReplaceAllString(text, lease)
	if strings.Contains(text, "{{") {
		t.Fatalf("fencing-policy.yaml uses template values this test does not fill in:\n%s", text)
	}
	docs := bytes.Split([]byte(text), []byte("\n---\n"))
	if len(docs) != 2 {
		t.Fatalf("fencing-policy.yaml: %d documents, want the policy and its binding", len(docs))
	}
	var policy admissionv1.ValidatingAdmissionPolicy
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	if err := yaml.UnmarshalStrict(docs[0], &policy); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(docs[1], &binding); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
		_ = client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{})
	})
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

// eventually retries write until it fails with a fence rejection (the API server applies a new
// policy, binding or lease a moment after it stores them), bounded; it returns the last error.
func eventuallyRejected(t *testing.T, write func() error) error {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = write(); apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return err
		}
	}
	t.Fatalf("the API server never refused the write; last error: %v", err)
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
	err := eventuallyRejected(t, func() error {
		probes++
		return never.CreateService(store.Service{Name: fmt.Sprintf("probe-%d", probes), Version: 1, Task: &configs.Task{}, Port: 1})
	})
	if !strings.Contains(err.Error(), "ferry.dev/term 2 is not the lease term 3") {
		t.Errorf("rejection does not say why: %v", err)
	}

	a := openFenced(t, c, ns, "ctl-a", 3)
	if err := a.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{Run: "x"}, Port: 1}); err != nil {
		t.Fatalf("the leader's write was refused: %v", err)
	}
	if _, err := a.NextReplicaID("chat"); err != nil {
		t.Fatal(err)
	}

	// ctl-b takes over: a's writes are refused although a still believes it leads.
	setLease(t, client, ns, lease, "ctl-b", 4)
	err = eventuallyRejected(t, func() error { return a.SetServiceStatus("chat", "READY") })
	if !strings.Contains(err.Error(), "is not the lease term 4") {
		t.Errorf("rejection does not say why: %v", err)
	}
	if _, err := a.NextReplicaID("chat"); err == nil {
		t.Error("the deposed leader handed out a replica id")
	}
	if err := a.DeleteService("chat"); err == nil {
		t.Error("the deposed leader deleted the service")
	}
	// The right term from the wrong holder is refused too.
	if err := openFenced(t, c, ns, "ctl-a", 4).SetServiceStatus("chat", "READY"); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("write by ctl-a with ctl-b's term: %v, want refused", err)
	}

	b := openFenced(t, c, ns, "ctl-b", 4)
	if err := b.SetServiceStatus("chat", "READY"); err != nil {
		t.Fatalf("the new leader's write was refused: %v", err)
	}
	id, err := b.NextReplicaID("chat")
	if err != nil || id != 2 {
		t.Errorf("new leader's replica id = %d, %v; want 2 (1 went to the old leader)", id, err)
	}
	if err := b.DeleteService("chat"); err != nil {
		t.Fatalf("the new leader's delete was refused: %v", err)
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
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(context.Background(), metav1.ListOptions{LabelSelector: kubestore.LabelManagedBy + "=" + kubestore.ManagedBy})
	if err != nil || len(cms.Items) != 0 {
		t.Errorf("objects written while not leading: %v, %v", cms, err)
	}
}
