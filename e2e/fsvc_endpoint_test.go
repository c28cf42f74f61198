package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/ferryserve/ferry/internal/testcluster"
)

var httpRouteGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}

// endpointProxySelector is the chart's proxies' pod selector, release "ferry".
var endpointProxySelector = map[string]string{"app.kubernetes.io/name": "ferry", "app.kubernetes.io/instance": "ferry", "app.kubernetes.io/component": "proxy"}

// TestFerryServiceEndpoint: a controller run as the chart runs it with proxies attached to "*"
// ($FERRY_SERVICE_ENDPOINTS_VIA, and the HTTPRoute settings, with the Gateway API's own
// HTTPRoute CRD installed) gives an applied FerryService a Service of its name selecting the
// proxies, and an HTTPRoute to it, and shows the Service's URL as its endpoint in `kubectl get
// fsvc`; a Service deleted by hand comes back; both go with the FerryService. A FerryService
// whose name a Service Ferry did not make holds says so in its status, shows the proxies'
// shared endpoint, and that Service is never changed or deleted.
func TestFerryServiceEndpoint(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.InstallHTTPRouteCRD(ctx); err != nil {
		t.Fatal(err)
	}
	_, ns, dyn := newFerryServiceEnv(t, "e2e-fsvc-endpoint-", "FERRY_SERVICE_ENDPOINTS_VIA=ferry-proxy:80",
		"FERRY_SERVICE_HTTPROUTE_PARENTS=name=public,namespace=gateways,sectionName=https", "FERRY_SERVICE_HTTPROUTE_HOSTNAME={name}.llm.example.com")
	services := c.Client().CoreV1().Services(ns)
	proxies := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ferry-proxy"}, Spec: corev1.ServiceSpec{Selector: endpointProxySelector,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}}
	if _, err := services.Create(ctx, proxies, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	foreign, err := services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "taken"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 8080}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"chat", "taken"} {
		if err := applyFerryService(ctx, dyn, ns, name, fmt.Sprintf(fsvcSpec, 0)); err != nil {
			t.Fatal(err)
		}
	}
	waitEndpointService(t, ctx, c, dyn, ns, "chat", "chat.llm.example.com")
	checkNameTaken(t, ctx, c, dyn, ns, foreign)

	// Kept: a Service deleted by hand is made again.
	if err := services.Delete(ctx, "chat", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEndpointService(t, ctx, c, dyn, ns, "chat", "chat.llm.example.com")

	for _, name := range []string{"chat", "taken"} {
		if err := dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "the deleted FerryService's Service and HTTPRoute go", func() (bool, string) {
		_, svcErr := services.Get(ctx, "chat", metav1.GetOptions{})
		_, routeErr := dyn.Resource(httpRouteGVR).Namespace(ns).Get(ctx, "chat", metav1.GetOptions{})
		return apierrors.IsNotFound(svcErr) && apierrors.IsNotFound(routeErr), fmt.Sprintf("Service: %v, HTTPRoute: %v", svcErr, routeErr)
	})
	if after, err := services.Get(ctx, "taken", metav1.GetOptions{}); err != nil || after.ResourceVersion != foreign.ResourceVersion {
		t.Errorf("someone else's Service once its namesake FerryService is deleted: %v, %v (resourceVersion was %s)", after, err, foreign.ResourceVersion)
	}
}

// waitEndpointService waits until the FerryService name has its Service (the proxies'
// selector and port, owned by it), its HTTPRoute for host, and the Service's URL as its
// endpoint.
func waitEndpointService(t *testing.T, ctx context.Context, c *testcluster.Cluster, dyn dynamic.Interface, ns, name, host string) {
	t.Helper()
	want := fmt.Sprintf("http://%s.%s.svc:80", name, ns)
	eventually(t, 60*time.Second, name+"'s Service, HTTPRoute and endpoint", func() (bool, string) {
		svc, err := c.Client().CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if svc.Spec.Type != corev1.ServiceTypeClusterIP || !maps.Equal(svc.Spec.Selector, endpointProxySelector) || len(svc.Spec.Ports) != 1 ||
			svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort != intstr.FromString("http") ||
			len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Kind != "FerryService" || svc.Labels["app.kubernetes.io/managed-by"] != "ferry" {
			return false, fmt.Sprintf("Service: %+v %+v", svc.ObjectMeta, svc.Spec)
		}
		route, err := dyn.Resource(httpRouteGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		spec := fmt.Sprint(route.Object["spec"])
		for _, part := range []string{"hostnames:[" + host + "]", "name:public", "name:" + name + " port:80"} {
			if !strings.Contains(spec, part) {
				return false, fmt.Sprintf("HTTPRoute spec %s lacks %s", spec, part)
			}
		}
		table, err := getTable(ctx, c, ns)
		if err != nil {
			return false, err.Error()
		}
		return table[name]["Endpoint"] == want, fmt.Sprintf("kubectl get fsvc: %v, want endpoint %s", table[name], want)
	})
}

// checkNameTaken: the FerryService named like someone else's Service says so, and shows the
// proxies' shared endpoint; that Service is as it was.
func checkNameTaken(t *testing.T, ctx context.Context, c *testcluster.Cluster, dyn dynamic.Interface, ns string, foreign *corev1.Service) {
	t.Helper()
	eventually(t, 60*time.Second, "the FerryService taken says its name is taken", func() (bool, string) {
		u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "taken", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		endpoint, _, _ := unstructured.NestedString(u.Object, "status", "endpoint")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "message")
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		cond := ""
		for _, c := range conds {
			if m := c.(map[string]any); m["type"] == "Endpoint" {
				cond = fmt.Sprint(m["status"], " ", m["reason"])
			}
		}
		return endpoint == "http://ferry-proxy."+ns+".svc:80" && cond == "False ServiceNameTaken" &&
				strings.Contains(msg, "a Service named taken exists in namespace "+ns+" that Ferry did not create"),
			fmt.Sprintf("endpoint %q, Endpoint condition %q, message %q", endpoint, cond, msg)
	})
	after, err := c.Client().CoreV1().Services(ns).Get(ctx, "taken", metav1.GetOptions{})
	if err != nil || after.ResourceVersion != foreign.ResourceVersion {
		t.Errorf("someone else's Service: %v, resourceVersion %s, was %s", err, after.ResourceVersion, foreign.ResourceVersion)
	}
	if _, err := dyn.Resource(httpRouteGVR).Namespace(ns).Get(ctx, "taken", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("an HTTPRoute for the FerryService without a Service of its own: %v, want none", err)
	}
}

// TestChartRBACKeepsFerryServiceEndpoints: the chart's RBAC for proxies attached to "*" with
// HTTPRoutes (rendered by helm, created for real) is enough for a controller running as the
// chart's ServiceAccount, with the flags the chart gives it, to keep a FerryService's Service
// and HTTPRoute and delete them, and it never meets "forbidden".
func TestChartRBACKeepsFerryServiceEndpoints(t *testing.T) {
	k := newKubeEnv(t, "Tesla-T4", 0, 1, 30)
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(k.cluster.RESTConfig())
	installFerryServiceCRD(t, dyn)
	if err := k.cluster.InstallHTTPRouteCRD(ctx); err != nil {
		t.Fatal(err)
	}
	applyChart(t, ctx, k, "proxy.attach=*,proxy.httpRoute.parentRefs[0].name=public,proxy.httpRoute.hostname=ai-{name}.example.com",
		func(o *unstructured.Unstructured) bool { return !strings.HasPrefix(o.GetName(), "ferry-fence") }, func(string) bool { return false })
	waitSecretsPolicy(t, ctx, k)
	proxies := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ferry-proxy"}, Spec: corev1.ServiceSpec{Selector: endpointProxySelector,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}}
	if _, err := k.cluster.Client().CoreV1().Services(k.ns).Create(ctx, proxies, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := impersonatingKubeconfig(t, k.cluster.Kubeconfig(), k.cluster.Context(), "system:serviceaccount:"+k.ns+":ferry")
	// The flags the chart renders for these values (charts/ferry/endpoints_test.go).
	k.extraEnv = []string{"FERRY_STORE=kubernetes", "KUBECONFIG=" + kubeconfig, "FERRY_NAMESPACE=" + k.ns,
		"FERRY_SERVICE_ENDPOINTS_VIA=ferry-proxy:80", "FERRY_SERVICE_HTTPROUTE_PARENTS=name=public", "FERRY_SERVICE_HTTPROUTE_HOSTNAME=ai-{name}.example.com"}
	k.mustRun("serve", "status") // starts the controller as the ServiceAccount
	if err := applyFerryService(ctx, dyn, k.ns, "chat", fmt.Sprintf(fsvcSpec, 0)); err != nil {
		t.Fatal(err)
	}
	waitEndpointService(t, ctx, k.cluster, dyn, k.ns, "chat", "ai-chat.example.com")
	if err := dyn.Resource(fsvcGVR).Namespace(k.ns).Delete(ctx, "chat", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the Service and HTTPRoute deleted as the chart's ServiceAccount", func() (bool, string) {
		_, svcErr := k.cluster.Client().CoreV1().Services(k.ns).Get(ctx, "chat", metav1.GetOptions{})
		_, routeErr := dyn.Resource(httpRouteGVR).Namespace(k.ns).Get(ctx, "chat", metav1.GetOptions{})
		return apierrors.IsNotFound(svcErr) && apierrors.IsNotFound(routeErr), fmt.Sprintf("Service: %v, HTTPRoute: %v", svcErr, routeErr)
	})
	ctlLog, err := os.ReadFile(filepath.Join(k.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(ctlLog)), "forbidden") {
		t.Errorf("the controller met forbidden as the chart's ServiceAccount:\n%s", grepLines(strings.ToLower(string(ctlLog)), "forbidden"))
	}
}
