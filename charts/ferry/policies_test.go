package chart

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// policyKinds are the objects TestChartPoliciesOnTheCluster creates for real: the controller's
// identity, its RBAC and the two policies that narrow it.
var policyKinds = map[string]bool{
	"ServiceAccount": true, "Role": true, "RoleBinding": true, "ClusterRole": true, "ClusterRoleBinding": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
}

// TestChartPoliciesOnTheCluster installs the chart's service account, RBAC and admission
// policies on the test cluster and acts as the controller (impersonation): a PriorityClass, or
// a pod in one, above replicas.maxPriority is refused and one at the cap admitted; a Secret
// not labelled as Ferry's is refused to create or delete in the replicas' namespace while a
// labelled one is admitted; the Lease is the controller's own only. The rendered config.yaml
// carries both priority values.
func TestChartPoliciesOnTheCluster(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns, replicasNS := "chart-pol", "chart-pol-replicas"
	for _, n := range []string{ns, replicasNS} {
		createNamespace(t, ctx, c, n)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	objs := render(t, ns, kubeVersion, []string{"proxy.attach=llama", "replicas.namespace=" + replicasNS, "replicas.servingPriority=900", "replicas.maxPriority=1000"})
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-config") {
			cfg := fmt.Sprint(o.Object["data"])
			if !strings.Contains(cfg, "serving_priority: 900") || !strings.Contains(cfg, "max_priority: 1000") {
				t.Errorf("config.yaml lacks the priorities:\n%s", cfg)
			}
		}
		if !policyKinds[o.GetKind()] {
			continue
		}
		res := resourceFor(t, dyn, mapper, o)
		if _, err := res.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() { _ = res.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{}) })
	}
	admin := c.Client()
	cfg := c.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":ferry"}
	ferry, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	never := corev1.PreemptNever
	class := func(name string, value int32) *schedulingv1.PriorityClass {
		return &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, PreemptionPolicy: &never}
	}
	// The policies take effect once the API server has loaded them.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := ferry.SchedulingV1().PriorityClasses().Create(ctx, class("chart-pol-over", 1001), dry)
		return err != nil && strings.Contains(err.Error(), "above the cap 1000"), nil
	})
	if err != nil {
		t.Fatalf("a priority class above the cap was never refused: %v", err)
	}
	if _, err := ferry.SchedulingV1().PriorityClasses().Create(ctx, class("chart-pol-at", 1000), dry); err != nil {
		t.Errorf("a priority class at the cap refused: %v", err)
	}
	if _, err := admin.SchedulingV1().PriorityClasses().Create(ctx, class("chart-pol-high", 5000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.SchedulingV1().PriorityClasses().Delete(context.Background(), "chart-pol-high", metav1.DeleteOptions{})
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Spec: corev1.PodSpec{
		PriorityClassName: "chart-pol-high", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if _, err := ferry.CoreV1().Pods(replicasNS).Create(ctx, pod, dry); err == nil || !strings.Contains(err.Error(), "pod priority 5000 is above the cap") {
		t.Errorf("a pod in a class above the cap: %v, want refused", err)
	}
	if _, err := admin.CoreV1().Pods(replicasNS).Create(ctx, pod, dry); err != nil {
		t.Errorf("the admin's own pod refused (the cap binds Ferry's account only): %v", err)
	}
	checkSecretsPolicy(t, ctx, admin, ferry, replicasNS, dry)
	// The Lease by its name only.
	if _, err := ferry.CoordinationV1().Leases(ns).Get(ctx, "ferry-controller", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the controller's own Lease: %v, want not found (allowed)", err)
	}
	if _, err := ferry.CoordinationV1().Leases(ns).Get(ctx, "someone-elses", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("another Lease: %v, want forbidden", err)
	}
}

// checkSecretsPolicy: as the controller, only Secrets labelled as Ferry's may be written.
func checkSecretsPolicy(t *testing.T, ctx context.Context, admin, ferry kubernetes.Interface, ns string, dry metav1.CreateOptions) {
	t.Helper()
	secret := func(name string, labels map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, StringData: map[string]string{"k": "v"}}
	}
	ours := map[string]string{"app.kubernetes.io/managed-by": "ferry"}
	if _, err := ferry.CoreV1().Secrets(ns).Create(ctx, secret("svc-1-abcde-env", ours), dry); err != nil {
		t.Errorf("a pod's environment Secret refused: %v", err)
	}
	if _, err := ferry.CoreV1().Secrets(ns).Create(ctx, secret("not-ferrys", nil), dry); err == nil || !strings.Contains(err.Error(), "Ferry writes only the Secrets it labels") {
		t.Errorf("an unlabelled Secret: %v, want refused", err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, secret("ferry-bucket-credentials", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ferry.CoreV1().Secrets(ns).Delete(ctx, "ferry-bucket-credentials", metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "Ferry writes only") {
		t.Errorf("deleting someone else's Secret: %v, want refused", err)
	}
	patch := []byte(`{"metadata":{"labels":{"app.kubernetes.io/managed-by":"ferry"}}}`)
	if _, err := ferry.CoreV1().Secrets(ns).Patch(ctx, "ferry-bucket-credentials", "application/merge-patch+json", patch, metav1.PatchOptions{}); err == nil {
		t.Error("the controller took someone else's Secret by labelling it")
	}
}

// TestChartPodsNeverRunAsTheController: with the replicas in the release's namespace (the
// default), the controller's account may create a replica's pod but not one that runs as the
// controller's own service account, which a task's pod_config could name to take its rights.
func TestChartPodsNeverRunAsTheController(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := "chart-pods"
	createNamespace(t, ctx, c, ns)
	disco, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	for _, o := range render(t, ns, kubeVersion, []string{"proxy.attach=llama"}) {
		if !policyKinds[o.GetKind()] {
			continue
		}
		res := resourceFor(t, dyn, mapper, o)
		if _, err := res.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		t.Cleanup(func() { _ = res.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{}) })
	}
	cfg := c.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":ferry"}
	ferry, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	pod := func(sa string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "replica"}, Spec: corev1.PodSpec{
			ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := ferry.CoreV1().Pods(ns).Create(ctx, pod("ferry"), dry)
		return err != nil && strings.Contains(err.Error(), "may not run as the controller's service account"), nil
	})
	if err != nil {
		t.Fatalf("a pod as the controller's service account was never refused: %v", err)
	}
	for _, sa := range []string{"", "default", "training-jobs"} {
		if _, err := ferry.CoreV1().Pods(ns).Create(ctx, pod(sa), dry); err != nil {
			t.Errorf("a pod with service account %q refused: %v", sa, err)
		}
	}
}
