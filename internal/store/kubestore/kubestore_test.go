package kubestore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/store/storetest"
	"github.com/ferryserve/ferry/internal/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

var nsSeq atomic.Int64

// newNamespace makes a namespace of the test's own on the shared cluster.
func newNamespace(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("_", "-", "/", "-").Replace(t.Name()))
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
