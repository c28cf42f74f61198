package kubestore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/store/storetest"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/jobs"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

var nsSeq atomic.Int64

// newNamespace makes a namespace of the test's own on the shared cluster.
func newNamespace(t testing.TB, c *testcluster.Cluster) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("_", "-", "/", "-", "=", "-").Replace(t.Name()))
	name = fmt.Sprintf("ks%d-%s", nsSeq.Add(1), name)
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	if _, err := c.Client().CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// opener opens kubestores on ns, each leading with term 1 as holder "test".
func opener(c *testcluster.Cluster, ns string) storetest.Opener {
	return func(t *testing.T) store.Store {
		t.Helper()
		s, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: ns,
			Fence: func() (int64, bool) { return 1, true }, Holder: "test"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

// TestKubeContract runs the store contract, the table SQLite passes, against the API server.
func TestKubeContract(t *testing.T) {
	c := testcluster.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Opener { return opener(c, newNamespace(t, c)) })
}

func jobsJob() jobs.Job {
	return jobs.Job{Name: "j", Task: &configs.Task{Run: "x"}, State: jobs.Pending}
}

// TestSecretsAreSealed: the records' ConfigMaps (readable with the state) hold the redacted
// task, and the sealed ConfigMaps beside them hold the values only encrypted; the one Secret is
// the state key; every object carries the fence; the store reads the values back; deleting the
// service deletes its sealed values.
func TestSecretsAreSealed(t *testing.T) {
	c := testcluster.Shared(t)
	ns := newNamespace(t, c)
	s := opener(c, ns)(t)
	task := &configs.Task{Run: "serve", Secrets: map[string]string{"HF_TOKEN": "hf_sekrit"}}
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: task, Port: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateJob(jobs.Job{Name: "train", Task: task, State: jobs.Pending}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: kubestore.LabelManagedBy + "=" + kubestore.ManagedBy})
	if err != nil || len(cms.Items) != 5 { // the service, the job, the job counter, the service's and job's sealed values
		t.Fatalf("ConfigMaps: %d, %v; want 5", len(cms.Items), err)
	}
	sealed := 0
	for _, cm := range cms.Items {
		for k, v := range cm.Data {
			if strings.Contains(v, "hf_sekrit") {
				t.Errorf("ConfigMap %s key %s holds the secret value", cm.Name, k)
			}
		}
		if strings.HasSuffix(cm.Name, ".sealed") && cm.Labels[kubestore.LabelKind] == "sealed" {
			sealed++
		}
		if cm.Annotations[kubestore.AnnotationTerm] != "1" || cm.Annotations[kubestore.AnnotationHolder] != "test" {
			t.Errorf("ConfigMap %s annotations %v: want the fence", cm.Name, cm.Annotations)
		}
	}
	if sealed != 2 {
		t.Errorf("%d sealed ConfigMaps, want the service's and the job's", sealed)
	}
	secrets, err := c.Client().CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(secrets.Items) != 1 || secrets.Items[0].Name != kubestore.KeySecret {
		t.Fatalf("Secrets: %v, %v; want only %s", secrets, err, kubestore.KeySecret)
	}
	if a := secrets.Items[0].Annotations; a[kubestore.AnnotationTerm] != "1" || a[kubestore.AnnotationHolder] != "test" {
		t.Errorf("Secret %s annotations %v: want the fence", kubestore.KeySecret, a)
	}
	if got, err := s.GetService("chat"); err != nil || got.Task.Secrets["HF_TOKEN"] != "hf_sekrit" {
		t.Errorf("GetService: %+v, %v; want the secret back", got.Task, err)
	}
	if err := s.DeleteService("chat"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, "ferry-svc-chat.sealed", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the service's sealed values after DeleteService: %v, want them gone", err)
	}
}

// TestConcurrentWritesAreNotLost: two controllers' stores change different fields of the same
// service row at once; conflicts are re-read and retried, so neither write overwrites the other.
func TestConcurrentWritesAreNotLost(t *testing.T) {
	c := testcluster.Shared(t)
	ns := newNamespace(t, c)
	open := opener(c, ns)
	a, b := open(t), open(t)
	if err := a.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 1, Status: "INIT"}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	errs := make(chan error, 2*n)
	for i := range n {
		go func() { errs <- a.SetTarget("chat", i) }()
		go func() { _, err := b.NextReplicaIDs("chat", 1); errs <- err }()
	}
	for range 2 * n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetServiceStatus("chat", "READY"); err != nil {
		t.Fatal(err)
	}
	id, err := a.NextReplicaIDs("chat", 1)
	if err != nil || id != n+1 {
		t.Errorf("next id after %d concurrent allocations = %d, %v; want %d", n, id, err, n+1)
	}
	got, err := a.GetService("chat")
	if err != nil || got.Status != "READY" || got.Target < 0 || got.Target >= n {
		t.Errorf("service after concurrent writes: %+v, %v; want READY and a target set", got, err)
	}
}
