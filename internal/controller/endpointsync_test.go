package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	chart "github.com/ferryserve/ferry/charts/ferry"
	"github.com/ferryserve/ferry/internal/testcluster"
)

// endpointEnv is a namespace on the test cluster with the FerryService CRD and a proxies'
// Service, ferry-proxy, as the chart makes it.
type endpointEnv struct {
	ns   string
	kube kubernetes.Interface
	dyn  dynamic.Interface
	// queued are the FerryService names the sync's informers handed on.
	mu     sync.Mutex
	queued []string
}

var proxySelector = map[string]string{"app.kubernetes.io/name": "ferry", "app.kubernetes.io/instance": "ferry", "app.kubernetes.io/component": "proxy"}

func newEndpointEnv(t *testing.T, ctx context.Context, ns string) *endpointEnv {
	t.Helper()
	cluster := testcluster.Shared(t)
	e := &endpointEnv{ns: ns, kube: cluster.Client()}
	var err error
	if e.dyn, err = dynamic.NewForConfig(cluster.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	if _, err := chart.ApplyCRDs(ctx, e.dyn); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proxies := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ferry-proxy"}, Spec: corev1.ServiceSpec{Selector: proxySelector,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}}
	if _, err := e.kube.CoreV1().Services(ns).Create(ctx, proxies, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// sync starts an endpointSync for the FerryServices of ns with opts, logging to log.
func (e *endpointEnv) sync(t *testing.T, ctx context.Context, ns string, opts EndpointOptions, log *zap.Logger) *endpointSync {
	t.Helper()
	c := New(Options{Logger: log, Endpoints: opts})
	es, err := newEndpointSync(ctx, c, e.kube, e.dyn, ns, func(name string) {
		e.mu.Lock()
		e.queued = append(e.queued, name)
		e.mu.Unlock()
	})
	if err != nil || es == nil {
		t.Fatalf("newEndpointSync: %v, %v", es, err)
	}
	return es
}

// wasQueued says whether the sync handed on name since the last call, and forgets.
func (e *endpointEnv) wasQueued(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	found := slices.Contains(e.queued, name)
	e.queued = nil
	return found
}

// ferryService creates a FerryService named name in ns and returns it as the API server has it.
func (e *endpointEnv) ferryService(t *testing.T, ctx context.Context, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ferry.dev/v1alpha1", "kind": "FerryService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"run": "true", "service": map[string]any{"readiness_probe": "/health", "replicas": int64(0)}}}}
	got, err := e.dyn.Resource(FerryServiceGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// until polls cond for up to 30 s.
func until(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestEndpointServiceInProxiesNamespace: on the real API server, a FerryService in the proxies'
// namespace gets a ClusterIP Service of its name with their selector and port, owned by it,
// put back when edited; its status shows the Service's URL; once the FerryService is gone the
// sync finds the Service orphaned and deletes it.
func TestEndpointServiceInProxiesNamespace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEndpointEnv(t, ctx, "fsvc-endpoint-same")
	es := e.sync(t, ctx, e.ns, EndpointOptions{Via: "ferry-proxy:80"}, zap.NewNop())
	fsvc := e.ferryService(t, ctx, e.ns, "chat")
	if err := es.ensure(ctx, fsvc); err != nil {
		t.Fatal(err)
	}
	svc, err := e.kube.CoreV1().Services(e.ns).Get(ctx, "chat", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: proxySelector,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}}
	got := corev1.ServiceSpec{Type: svc.Spec.Type, Selector: svc.Spec.Selector, Ports: svc.Spec.Ports}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the FerryService's Service (-want +got):\n%s", diff)
	}
	checkKept(t, svc, fsvc)
	proxies, _ := e.kube.CoreV1().Services(e.ns).Get(ctx, "ferry-proxy", metav1.GetOptions{})
	if want, _ := es.target.desiredService(fsvc, proxies); serviceDiffers(svc, want) {
		t.Errorf("the Service as the API server keeps it differs from the one asked for: %+v", svc.Spec)
	}
	if endpoint, msg, conds := es.status(e.ns, "chat"); endpoint != "http://chat.fsvc-endpoint-same.svc:80" || msg != "" || conds[0]["status"] != "True" {
		t.Errorf("status: %q, %q, %v; want its own Service's URL, Endpoint True", endpoint, msg, conds)
	}

	// Someone points it elsewhere: the informer hands the FerryService on, and its reconcile
	// puts the selector back.
	until(t, "the sync's informer saw the Service", func() (bool, string) {
		_, err := es.services.Services(e.ns).Get("chat")
		return err == nil, fmt.Sprint(err)
	})
	e.wasQueued("chat")
	svc.Spec.Selector = map[string]string{"app": "elsewhere"}
	if _, err := e.kube.CoreV1().Services(e.ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(t, "the edited Service's FerryService is queued", func() (bool, string) { return e.wasQueued("chat"), "" })
	if err := es.ensure(ctx, fsvc); err != nil {
		t.Fatal(err)
	}
	if svc, _ := e.kube.CoreV1().Services(e.ns).Get(ctx, "chat", metav1.GetOptions{}); !cmp.Equal(svc.Spec.Selector, proxySelector) {
		t.Errorf("selector after the reconcile: %v, want the proxies' %v", svc.Spec.Selector, proxySelector)
	}

	if err := e.dyn.Resource(FerryServiceGVR).Namespace(e.ns).Delete(ctx, "chat", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	exists := func(name string) bool {
		_, err := e.dyn.Resource(FerryServiceGVR).Namespace(e.ns).Get(ctx, name, metav1.GetOptions{})
		return !apierrors.IsNotFound(err)
	}
	if got := es.orphans(exists); !cmp.Equal(got, []string{"chat"}) {
		t.Errorf("orphans once the FerryService is deleted: %v, want [chat]", got)
	}
	if err := es.remove(ctx, e.ns, "chat"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.CoreV1().Services(e.ns).Get(ctx, "chat", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Service after its FerryService went: %v, want not found", err)
	}
}

// checkKept checks that obj carries Ferry's labels and fsvc as its owner.
func checkKept(t *testing.T, obj metav1.Object, fsvc *unstructured.Unstructured) {
	t.Helper()
	if l := obj.GetLabels(); l[labelManagedBy] != "ferry" || l[labelFerryService] != fsvc.GetName() {
		t.Errorf("%s's labels: %v", obj.GetName(), l)
	}
	owners := obj.GetOwnerReferences()
	if len(owners) != 1 || owners[0].UID != fsvc.GetUID() || owners[0].Kind != "FerryService" || owners[0].Name != fsvc.GetName() {
		t.Errorf("%s's owners: %+v, want the FerryService %s (%s)", obj.GetName(), owners, fsvc.GetName(), fsvc.GetUID())
	}
}

// TestEndpointServiceInAnotherNamespace: a FerryService outside the proxies' namespace gets an
// ExternalName Service for their Service's DNS name, with their port.
func TestEndpointServiceInAnotherNamespace(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEndpointEnv(t, ctx, "fsvc-endpoint-proxies")
	tenant := "fsvc-endpoint-tenant"
	if _, err := e.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	es := e.sync(t, ctx, tenant, EndpointOptions{Via: "https://ferry-proxy." + e.ns + ":80"}, zap.NewNop())
	fsvc := e.ferryService(t, ctx, tenant, "chat")
	if err := es.ensure(ctx, fsvc); err != nil {
		t.Fatal(err)
	}
	svc, err := e.kube.CoreV1().Services(tenant).Get(ctx, "chat", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Type != corev1.ServiceTypeExternalName || svc.Spec.ExternalName != "ferry-proxy.fsvc-endpoint-proxies.svc.cluster.local" ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 || len(svc.Spec.Selector) != 0 {
		t.Errorf("the Service in another namespace: %+v; want an ExternalName for the proxies' Service, port 80", svc.Spec)
	}
	checkKept(t, svc, fsvc)
	if endpoint, _, _ := es.status(tenant, "chat"); endpoint != "https://chat.fsvc-endpoint-tenant.svc:80" {
		t.Errorf("endpoint %q", endpoint)
	}
	// What the API server fills in is no difference, or every reconcile would write it again.
	if want, _ := es.target.desiredService(fsvc, nil); serviceDiffers(svc, want) {
		t.Errorf("the Service as the API server keeps it differs from the one asked for: %+v", svc.Spec)
	}
}

// TestEndpointNameTaken: a same-named Service Ferry did not make is left as it is, through
// ensure and remove, and the FerryService's status says why it has none of its own and
// gives the proxies' shared endpoint meanwhile.
func TestEndpointNameTaken(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEndpointEnv(t, ctx, "fsvc-endpoint-taken")
	foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "chat", Labels: map[string]string{"team": "web"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 8080}}}}
	before, err := e.kube.CoreV1().Services(e.ns).Create(ctx, foreign, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es := e.sync(t, ctx, e.ns, EndpointOptions{Via: "ferry-proxy:80"}, zap.NewNop())
	fsvc := e.ferryService(t, ctx, e.ns, "chat")
	var taken *NameTakenError
	if err := es.ensure(ctx, fsvc); !errors.As(err, &taken) {
		t.Fatalf("ensure over someone else's Service: %v, want a NameTakenError", err)
	}
	if err := es.remove(ctx, e.ns, "chat"); err != nil {
		t.Fatal(err)
	}
	after, err := e.kube.CoreV1().Services(e.ns).Get(ctx, "chat", metav1.GetOptions{})
	if err != nil || after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("someone else's Service after ensure and remove: %v (resourceVersion %s, was %s)", err, after.ResourceVersion, before.ResourceVersion)
	}
	if err := es.ensure(ctx, fsvc); !errors.As(err, &taken) {
		t.Fatalf("second ensure: %v", err)
	}
	endpoint, msg, conds := es.status(e.ns, "chat")
	if endpoint != "http://ferry-proxy.fsvc-endpoint-taken.svc:80" || !strings.Contains(msg, "a Service named chat exists in namespace fsvc-endpoint-taken that Ferry did not create") ||
		conds[0]["status"] != "False" || conds[0]["reason"] != "ServiceNameTaken" {
		t.Errorf("status with the name taken: %q, %q, %v", endpoint, msg, conds)
	}
}

// TestEndpointHTTPRoutes: with parents configured and no Gateway API, one log line says why
// there are no routes and Services are still kept; with the real HTTPRoute CRD installed, a
// FerryService gets a route with the parents, its hostname and its Service as the backend,
// which the API server accepts and which goes with the FerryService.
func TestEndpointHTTPRoutes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEndpointEnv(t, ctx, "fsvc-endpoint-routes")
	opts := EndpointOptions{Via: "ferry-proxy:80", RouteParents: []string{"name=public,namespace=gateways,sectionName=https"}, RouteHostname: "{name}.{namespace}.example.com"}
	core, logs := observer.New(zapcore.InfoLevel)
	es := e.sync(t, ctx, e.ns, opts, zap.New(core))
	if es.routes != nil {
		t.Fatal("HTTPRoutes kept before the Gateway API is installed")
	}
	if n := logs.FilterMessageSnippet("does not serve the Gateway API's HTTPRoute").Len(); n != 1 {
		t.Errorf("%d log lines about the missing HTTPRoute API, want 1: %v", n, logs.All())
	}
	if err := es.ensure(ctx, e.ferryService(t, ctx, e.ns, "before")); err != nil {
		t.Fatalf("without the Gateway API: %v", err)
	}

	if err := testcluster.Shared(t).InstallHTTPRouteCRD(ctx); err != nil {
		t.Fatal(err)
	}
	// Discovery may trail the CRD being served for a moment, and a sync made then keeps no
	// routes (what failed CI once: the route was never made).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if es = e.sync(t, ctx, e.ns, opts, zap.NewNop()); es.routes != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sync found the HTTPRoute API in 30 s after its CRD was served")
		}
	}
	fsvc := e.ferryService(t, ctx, e.ns, "chat")
	if err := es.ensure(ctx, fsvc); err != nil {
		t.Fatal(err)
	}
	route, err := e.dyn.Resource(HTTPRouteGVR).Namespace(e.ns).Get(ctx, "chat", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkKept(t, route, fsvc)
	parents, _, _ := unstructured.NestedSlice(route.Object, "spec", "parentRefs")
	hosts, _, _ := unstructured.NestedStringSlice(route.Object, "spec", "hostnames")
	rules, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	wantParent := map[string]any{"name": "public", "namespace": "gateways", "sectionName": "https"}
	if len(parents) != 1 || !contains(parents[0], wantParent) || !cmp.Equal(hosts, []string{"chat.fsvc-endpoint-routes.example.com"}) || len(rules) != 1 ||
		!contains(rules[0], map[string]any{"backendRefs": []any{map[string]any{"name": "chat", "port": int64(80)}}}) {
		t.Errorf("the HTTPRoute's spec: %v", route.Object["spec"])
	}
	if _, _, conds := es.status(e.ns, "chat"); len(conds) != 2 || conds[1]["type"] != "Routed" || conds[1]["status"] != "True" {
		t.Errorf("conditions: %v, want Endpoint and Routed True", conds)
	}
	// The API server's defaults (a path match, a backend's kind and weight) are no difference,
	// or every reconcile would write the route again.
	if routeDiffers(route, es.target.desiredRoute(fsvc)) {
		t.Errorf("the route as the API server keeps it differs from the one asked for: %v", route.Object["spec"])
	}
	if err := es.remove(ctx, e.ns, "chat"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.dyn.Resource(HTTPRouteGVR).Namespace(e.ns).Get(ctx, "chat", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the HTTPRoute after remove: %v, want not found", err)
	}
}
