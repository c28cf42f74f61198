package chart

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartLoadMetricAPIService renders the proxies' HPA with each metric. With load (the
// default) the HPA reads ferry_proxy_requests_in_flight per proxy as an External metric; the
// controller serves it on its external metrics port behind the controller Service's port 443;
// the APIService leads there with the very certificate of the controller's TLS Secret as its
// caBundle (one render makes one certificate); and the controller's service account may read the
// aggregation layer's CA and review access. With cpu none of that is rendered, and another
// metric is a render error.
func TestChartLoadMetricAPIService(t *testing.T) {
	objs := renderRelease(t, "ferry", "ferry", kubeVersion, []string{"proxy.attach=*", "proxy.autoscaling.targetRequestsPerProxy=40"})
	byKindName := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		byKindName[o.GetKind()+"/"+o.GetName()] = o
	}
	hpa := byKindName["HorizontalPodAutoscaler/ferry-proxy"]
	metrics, _, _ := unstructured.NestedSlice(hpa.Object, "spec", "metrics")
	want := []any{map[string]any{"type": "External", "external": map[string]any{
		"metric": map[string]any{"name": "ferry_proxy_requests_in_flight"},
		"target": map[string]any{"type": "AverageValue", "averageValue": "40"},
	}}}
	if diff := cmp.Diff(want, metrics); diff != "" {
		t.Errorf("HPA metrics (-want +got):\n%s", diff)
	}
	args := containerArgs(t, byKindName["Deployment/ferry-controller"])
	for _, arg := range []string{"--external-metrics-addr=0.0.0.0:6443", "--external-metrics-tls-cert=/etc/ferry/tls/tls.crt", "--external-metrics-tls-key=/etc/ferry/tls/tls.key"} {
		if !slices.Contains(args, arg) {
			t.Errorf("controller args %v lack %s", args, arg)
		}
	}
	ports, _, _ := unstructured.NestedSlice(byKindName["Service/ferry-controller"].Object, "spec", "ports")
	if !slices.ContainsFunc(ports, func(p any) bool {
		m := p.(map[string]any)
		return fmt.Sprint(m["port"]) == "443" && m["targetPort"] == "ext-metrics"
	}) {
		t.Errorf("controller Service ports %v: none 443 -> ext-metrics", ports)
	}
	api := byKindName["APIService/v1beta1.external.metrics.k8s.io"]
	if api == nil {
		t.Fatal("no APIService")
	}
	svc, _, _ := unstructured.NestedMap(api.Object, "spec", "service")
	if diff := cmp.Diff(map[string]string{"namespace": "ferry", "name": "ferry-controller", "port": "443"}, stringValues(svc)); diff != "" {
		t.Errorf("APIService service (-want +got):\n%s", diff)
	}
	caBundle, _, _ := unstructured.NestedString(api.Object, "spec", "caBundle")
	crt, _, _ := unstructured.NestedString(byKindName["Secret/ferry-controller-tls"].Object, "data", "tls.crt")
	if caBundle == "" || caBundle != crt {
		t.Errorf("APIService caBundle is not the controller's certificate (%d and %d bytes)", len(caBundle), len(crt))
	}
	for key, role := range map[string]string{
		"RoleBinding/ferry-auth-reader-ferry":           "extension-apiserver-authentication-reader",
		"ClusterRoleBinding/ferry-auth-delegator-ferry": "system:auth-delegator",
	} {
		b := byKindName[key]
		if b == nil {
			t.Errorf("no %s", key)
			continue
		}
		if got, _, _ := unstructured.NestedString(b.Object, "roleRef", "name"); got != role {
			t.Errorf("%s binds %s, want %s", key, got, role)
		}
	}

	cpu := renderRelease(t, "ferry", "ferry", kubeVersion, []string{"proxy.attach=*", "proxy.autoscaling.metric=cpu"})
	for _, o := range cpu {
		switch o.GetKind() {
		case "APIService", "ClusterRoleBinding", "RoleBinding":
			if o.GetKind() == "APIService" || strings.Contains(o.GetName(), "auth-") {
				t.Errorf("metric cpu renders %s %s", o.GetKind(), o.GetName())
			}
		case "HorizontalPodAutoscaler":
			if m, _, _ := unstructured.NestedSlice(o.Object, "spec", "metrics"); len(m) != 1 || m[0].(map[string]any)["type"] != "Resource" {
				t.Errorf("metric cpu: HPA metrics %v", m)
			}
		case "Deployment":
			if args := containerArgs(t, o); slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--external-metrics") }) {
				t.Errorf("metric cpu: %s args %v", o.GetName(), args)
			}
		}
	}
	if _, err := runHelm(t, "template", "ferry", chartDir, "--kube-version", kubeVersion, "--set", "proxy.attach=*", "--set", "proxy.autoscaling.metric=rps"); err == nil ||
		!strings.Contains(err.Error(), `proxy.autoscaling.metric "rps": want load or cpu`) {
		t.Errorf("metric rps: %v", err)
	}
}

// stringValues is m with its values as text: decoded YAML numbers are float64 or int64.
func stringValues(m map[string]any) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}
