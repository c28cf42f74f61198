package chart

import (
	"context"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// TestChartOneKubernetesStorePerNamespace installs releases with helm on the test cluster's
// API server. The state, its key and the fence are per namespace, and so is the launcher's
// view of the replicas' pods: a second release with the kubernetes store in a namespace that
// has one is refused, naming the first, and so is a SQLite release beside it launching replicas
// in the same namespace; the SQLite release with its replicas elsewhere, and a release of the
// same name in another namespace, install (their cluster-scoped objects do not collide, as
// TestChartClusterScopedNamesPerRelease renders); and the first release upgrades over itself.
func TestChartOneKubernetesStorePerNamespace(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	for _, ns := range []string{"guard-a", "guard-a-lite", "guard-b"} {
		createNamespace(t, ctx, c, ns)
	}
	kube := []string{"--kubeconfig", c.Kubeconfig(), "--kube-context", c.Context()}
	install := func(verb, release, ns string, set ...string) error {
		args := append([]string{verb, release, chartDir, "--namespace", ns, "--set", "proxy.attach=llama"}, kube...)
		for _, s := range set {
			args = append(args, "--set", s)
		}
		_, err := runHelm(t, args...)
		if err == nil && verb == "install" {
			t.Cleanup(func() {
				if _, err := runHelm(t, append([]string{"uninstall", release, "--namespace", ns}, kube...)...); err != nil {
					t.Error(err)
				}
			})
		}
		return err
	}
	if err := install("install", "ferry", "guard-a"); err != nil {
		t.Fatal(err)
	}
	err := install("install", "second", "guard-a")
	if err == nil {
		t.Fatal("a second kubernetes-store release in guard-a installed")
	}
	if !strings.Contains(err.Error(), `the release "ferry" already runs a controller with --store kubernetes in the namespace guard-a`) {
		t.Errorf("second release refused with %v, want the first release named", err)
	}
	lite := []string{"controller.store=sqlite", "controller.replicas=1", "controller.leaderElect=false", "proxy.enabled=false"}
	err = install("install", "lite", "guard-a", lite...)
	if err == nil {
		t.Fatal("a SQLite release launching replicas in guard-a beside ferry's installed")
	}
	if !strings.Contains(err.Error(), `the release "ferry" (Deployment ferry-controller) already launches replicas in the namespace guard-a`) {
		t.Errorf("SQLite release with the same replicas namespace refused with %v, want the first release named", err)
	}
	if err := install("install", "lite", "guard-a", append(lite, "replicas.namespace=guard-a-lite")...); err != nil {
		t.Errorf("a SQLite release beside it, its replicas elsewhere: %v", err)
	}
	// The cluster's one external.metrics.k8s.io is the first release's: the second scales its
	// proxies on CPU, and is told so when it does not.
	err = install("install", "ferry", "guard-b")
	if err == nil || !strings.Contains(err.Error(), `external.metrics.k8s.io is already served in this cluster, by the Service guard-a/ferry-controller of the release "ferry" in guard-a`) {
		t.Errorf("the release ferry in another namespace, on the load metric too: %v, want the first release's APIService named", err)
	}
	if err := install("install", "ferry", "guard-b", "proxy.autoscaling.metric=cpu"); err != nil {
		t.Errorf("the release ferry in another namespace: %v", err)
	}
	if err := install("upgrade", "ferry", "guard-a"); err != nil {
		t.Errorf("the first release upgrading over itself: %v", err)
	}
}
