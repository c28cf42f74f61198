package chart

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartClusterScopedNamesPerRelease renders several releases, two sharing a namespace, one
// of the same name in another namespace and one whose name holds the chart's, and checks that
// no cluster-scoped object (admission policies, their bindings, ClusterRoles and bindings) is
// rendered by two of them: helm would refuse the second install, or worse, the second release
// would take over the first's policy. Each binding must still name its own release's policy or
// role. The CRD is the one object every release shares by design.
func TestChartClusterScopedNamesPerRelease(t *testing.T) {
	releases := []struct{ release, ns string }{
		{"ferry", "team-a"},
		{"canary", "team-a"},
		{"ferry", "team-b"},
		{"ferry-canary", "team-b"},
	}
	owner := map[string]string{} // kind/name of a cluster-scoped object -> the release that rendered it
	for _, r := range releases {
		id := r.release + " in " + r.ns
		objs := renderRelease(t, r.release, r.ns, kubeVersion, []string{"proxy.attach=llama"})
		own := map[string]bool{}
		var bindings []*unstructured.Unstructured
		clusterScoped := 0
		for _, o := range objs {
			// The CRD is shared by design; the APIService of external.metrics.k8s.io is one per
			// cluster whoever renders it, so a second release chooses proxy.autoscaling.metric=cpu
			// (TestChartLoadMetricAPIService).
			if o.GetNamespace() != "" || o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "APIService" {
				continue
			}
			clusterScoped++
			key := o.GetKind() + "/" + o.GetName()
			if prev, ok := owner[key]; ok {
				t.Errorf("%s is rendered by %s and by %s", key, prev, id)
			}
			owner[key] = id
			own[key] = true
			if o.GetKind() == "ValidatingAdmissionPolicyBinding" || o.GetKind() == "ClusterRoleBinding" {
				bindings = append(bindings, o)
			}
		}
		// Two fences, secrets, pods, the priority cap (each a policy and a binding), the
		// ClusterRole and its binding, and the binding to system:auth-delegator the external
		// metrics API needs: a template that stops rendering one is caught here.
		if clusterScoped != 13 {
			t.Errorf("%s: %d cluster-scoped objects, want 13", id, clusterScoped)
		}
		for _, b := range bindings {
			var target string
			if b.GetKind() == "ClusterRoleBinding" {
				name, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
				target = "ClusterRole/" + name
			} else {
				name, _, _ := unstructured.NestedString(b.Object, "spec", "policyName")
				target = "ValidatingAdmissionPolicy/" + name
			}
			if !own[target] && target != "ClusterRole/system:auth-delegator" {
				t.Errorf("%s: %s %s binds %s, which this release does not render", id, b.GetKind(), b.GetName(), target)
			}
		}
	}
}
