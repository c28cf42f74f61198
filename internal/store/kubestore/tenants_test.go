package kubestore

import (
	"context"
	"regexp"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/tenants"
)

// TestTenantsObjects: the directory is the one ConfigMap ferry-tenants, fenced; a day's usage is
// in ConfigMaps labelled with the day, a key's rows always in the same shard.
func TestTenantsObjects(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-tenants-objects-")
	s, err := Open(ctx, Options{Config: c.RESTConfig(), Namespace: ns, Fence: func() (int64, bool) { return 3, true }, Holder: "ctl-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutTenants(tenants.Directory{Version: 1, Teams: []tenants.Team{{Name: "eng"}}}); err != nil {
		t.Fatal(err)
	}
	day := tenants.DayOf(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	var rows []tenants.Row
	for _, k := range []string{"key_a", "key_b", "key_c", "key_d", "key_e"} {
		rows = append(rows, tenants.Row{KeyID: k, Service: "chat", Model: "m", Day: day, Totals: tenants.Totals{Requests: 1}})
	}
	if err := s.AddUsage(rows); err != nil {
		t.Fatal(err)
	}
	cm, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, tenantsObject, metav1.GetOptions{})
	if err != nil || cm.Labels[LabelKind] != kindTenants || cm.Annotations[AnnotationTerm] != "3" {
		t.Fatalf("directory ConfigMap: %+v, %v; want kind tenants, fenced", cm, err)
	}
	list, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: LabelKind + "=" + kindUsage + "," + labelDay + "=2026-11-01"})
	if err != nil || len(list.Items) == 0 || len(list.Items) > usageShards {
		t.Fatalf("usage ConfigMaps: %d, %v; want 1 to %d", len(list.Items), err, usageShards)
	}
	re := regexp.MustCompile(`^ferry-usage-2026-11-01-[0-7]$`)
	for _, cm := range list.Items {
		if !re.MatchString(cm.Name) {
			t.Errorf("usage ConfigMap %q: want ferry-usage-DAY-SHARD", cm.Name)
		}
	}
	if a, b := usageObject(day, "key_a"), usageObject(day+1, "key_a"); a[:len(a)-2] == b[:len(b)-2] || a[len(a)-2:] != b[len(b)-2:] {
		t.Errorf("key_a's objects on two days: %s and %s; want one per day, in the same shard", a, b)
	}
}
