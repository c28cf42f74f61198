package chart

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartSQLiteStateOnAClaim: with controller.store=sqlite the state is a file in FERRY_HOME,
// so FERRY_HOME must outlive the pod: it is a PersistentVolumeClaim the chart creates (kept on
// uninstall) or one the user names, never an emptyDir, and the one controller is replaced with
// Recreate so that two never open the database at once. With the kubernetes store FERRY_HOME
// keeps nothing and stays an emptyDir, with a rolling update. More than one SQLite controller is
// a render error naming the value, and the one has no PodDisruptionBudget, which could only
// refuse every eviction.
func TestChartSQLiteStateOnAClaim(t *testing.T) {
	sqlite := []string{"proxy.enabled=false", "controller.leaderElect=false", "controller.store=sqlite", "controller.replicas=1"}
	for _, tc := range []struct {
		name         string
		set          []string
		wantClaim    string // the home volume's claim; "" for an emptyDir
		wantCreated  bool   // the chart renders the claim
		wantStrategy string
	}{
		{name: "kubernetes store", set: []string{"proxy.attach=llama"}, wantStrategy: "RollingUpdate"},
		{name: "sqlite", set: append(sqlite, "controller.persistence.size=5Gi", "controller.persistence.storageClass=fast"),
			wantClaim: "ferry-state", wantCreated: true, wantStrategy: "Recreate"},
		{name: "sqlite, existing claim", set: append(sqlite, "controller.persistence.existingClaim=my-state"),
			wantClaim: "my-state", wantStrategy: "Recreate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "ferry", kubeVersion, tc.set)
			var ctl, pvc *unstructured.Unstructured
			pdb := false
			for _, o := range objs {
				switch {
				case o.GetKind() == "PodDisruptionBudget" && o.GetName() == "ferry-controller":
					pdb = true
				case o.GetKind() == "Deployment" && o.GetName() == "ferry-controller":
					ctl = o
				case o.GetKind() == "PersistentVolumeClaim":
					if pvc != nil {
						t.Errorf("two claims rendered: %s and %s", pvc.GetName(), o.GetName())
					}
					pvc = o
				}
			}
			if ctl == nil {
				t.Fatal("no controller Deployment")
			}
			if got, _, _ := unstructured.NestedString(ctl.Object, "spec", "strategy", "type"); got != tc.wantStrategy {
				t.Errorf("controller strategy %q, want %q", got, tc.wantStrategy)
			}
			// minAvailable 1 over the one SQLite controller would block every node drain.
			if wantPDB := tc.wantStrategy == "RollingUpdate"; pdb != wantPDB {
				t.Errorf("controller PodDisruptionBudget rendered %v, want %v", pdb, wantPDB)
			}
			home := volume(t, ctl, "home")
			claim, _, _ := unstructured.NestedString(home, "persistentVolumeClaim", "claimName")
			_, emptyDir := home["emptyDir"]
			if claim != tc.wantClaim || emptyDir != (tc.wantClaim == "") {
				t.Errorf("home volume %v, want claim %q", home, tc.wantClaim)
			}
			if (pvc != nil) != tc.wantCreated {
				t.Fatalf("claim rendered %v, want %v", pvc != nil, tc.wantCreated)
			}
			if pvc == nil {
				return
			}
			if pvc.GetName() != tc.wantClaim || pvc.GetNamespace() != "ferry" {
				t.Errorf("claim %s/%s, want ferry/%s", pvc.GetNamespace(), pvc.GetName(), tc.wantClaim)
			}
			if pvc.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
				t.Errorf("claim annotations %v: an uninstall would delete the state", pvc.GetAnnotations())
			}
			size, _, _ := unstructured.NestedString(pvc.Object, "spec", "resources", "requests", "storage")
			class, _, _ := unstructured.NestedString(pvc.Object, "spec", "storageClassName")
			modes, _, _ := unstructured.NestedStringSlice(pvc.Object, "spec", "accessModes")
			if size != "5Gi" || class != "fast" || strings.Join(modes, ",") != "ReadWriteOnce" {
				t.Errorf("claim of %s, class %q, modes %v; want 5Gi, fast, ReadWriteOnce", size, class, modes)
			}
		})
	}
	_, err := runHelm(t, "template", "ferry", chartDir, "--kube-version", kubeVersion,
		"--set", "proxy.enabled=false,controller.leaderElect=false,controller.store=sqlite,controller.replicas=2")
	if err == nil || !strings.Contains(err.Error(), "controller.replicas") {
		t.Errorf("two SQLite controllers: %v, want an error naming controller.replicas", err)
	}
}

// volume returns the pod volume called name of a Deployment.
func volume(t *testing.T, deploy *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	vols, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		if m := v.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("%s has no volume %s", deploy.GetName(), name)
	return nil
}
