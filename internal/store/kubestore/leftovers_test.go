package kubestore

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// TestLeftoverObject: a leftover is a ConfigMap kubectl can find by Ferry's labels, named by a
// short hash of its key (keys are not valid names), fenced, with the record readable as JSON.
func TestLeftoverObject(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-leftover-object-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns, Fence: func() (int64, bool) { return 5, true }, Holder: "ctl-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := launcher.Leftover{Infra: "gcp", Selector: map[string]string{"ferry.dev/service": "chat"}, Before: time.Now(), Owner: "service chat", Since: time.Now()}
	l.Key = launcher.LeftoverKey(l)
	if err := s.PutLeftover(l); err != nil {
		t.Fatal(err)
	}
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedBy + "," + LabelKind + "=leftover"})
	if err != nil || len(cms.Items) != 1 {
		t.Fatalf("leftover ConfigMaps: %v, %v; want one", cms, err)
	}
	cm := cms.Items[0]
	if !regexp.MustCompile(`^ferry-left-[0-9a-f]{16}$`).MatchString(cm.Name) || cm.Name != leftoverObject(l.Key) {
		t.Errorf("name %q, want ferry-left- and 16 hex digits of the key's hash (%s)", cm.Name, leftoverObject(l.Key))
	}
	if leftoverObject(l.Key) == leftoverObject("i-1") {
		t.Error("two keys named the same object")
	}
	if cm.Annotations[AnnotationTerm] != "5" || cm.Annotations[AnnotationHolder] != "ctl-a" {
		t.Errorf("annotations %v: want the fence", cm.Annotations)
	}
	var got launcher.Leftover
	if err := json.Unmarshal([]byte(cm.Data["leftover.json"]), &got); err != nil || got.Key != l.Key || got.Owner != "service chat" {
		t.Errorf("leftover.json = %s (%v); want the record", cm.Data["leftover.json"], err)
	}
}

// TestLeftoverNameHeldByAnotherKey: should two keys ever hash alike (or someone edit the
// object), the record under the name belongs to the key it holds: a put of the other key fails
// rather than replace it, and a delete of the other key leaves it.
func TestLeftoverNameHeldByAnotherKey(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-leftover-collision-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held := launcher.Leftover{Key: "i-held", Infra: "aws", InstanceID: "i-held", Since: time.Now().UTC()}
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(leftoverObject("i-other"), kindLeftover, "")}
	if err := putJSON(cm, keyLeftover, held); err != nil {
		t.Fatal(err)
	}
	if _, err := s.configMaps().Create(cm); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLeftover(launcher.Leftover{Key: "i-other", Infra: "aws", InstanceID: "i-other"}); !errors.Is(err, errOtherLeftover) {
		t.Errorf("put of a key whose name holds another: %v, want errOtherLeftover", err)
	}
	if err := s.DeleteLeftover("i-other"); err != nil {
		t.Errorf("delete of a key whose name holds another: %v, want nil (it has no record)", err)
	}
	got, err := s.ListLeftovers()
	if err != nil || len(got) != 1 || got[0].Key != "i-held" {
		t.Errorf("leftovers: %+v, %v; want i-held untouched", got, err)
	}
}

// generatedNamespace makes a namespace of the test's own, named by the API server from prefix.
func generatedNamespace(t *testing.T, c *testcluster.Cluster, prefix string) string {
	t.Helper()
	ns, err := c.Client().CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
