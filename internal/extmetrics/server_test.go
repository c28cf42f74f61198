package extmetrics_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	externalmetrics "k8s.io/metrics/pkg/apis/external_metrics/v1beta1"

	"github.com/ferryserve/ferry/internal/extmetrics"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/internal/testhttp"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// staticSource is a Source whose series are fixed.
type staticSource map[string][]extmetrics.Sample

func (s staticSource) ExternalMetric(_ context.Context, name string) ([]extmetrics.Sample, error) {
	return s[name], nil
}

const metric = "ferry_proxy_requests_in_flight"

// TestAggregatedThroughTheAPIServer registers the server as the test cluster's
// external.metrics.k8s.io (an APIService whose ExternalName Service leads to loopback) and reads
// the metric through the API server, as the HPA controller does: the aggregator's front-proxy
// certificate is accepted, a label selector picks a series, a user without RBAC on the metric is
// refused by a SubjectAccessReview and one with a Role reads it in that namespace only, and a
// caller without the aggregator's certificate is refused.
func TestAggregatedThroughTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := testcluster.Shared(t)
	client := c.Client()
	ns := createNamespace(ctx, t, client, "metrics-")
	other := createNamespace(ctx, t, client, "other-")

	authn := extmetrics.NewRequestHeader(client, time.Minute)
	if err := authn.Load(ctx); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := testhttp.WriteSelfSignedFor(t, t.TempDir(), "ferry-metrics."+ns+".svc")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	caBundle, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: extmetrics.NewServer(extmetrics.Options{
		Metrics: []string{metric},
		Source: staticSource{metric: {
			{Labels: map[string]string{"service": "chat"}, Value: 7},
			{Labels: map[string]string{"service": "code"}, Value: 2.5},
		}},
		Authenticator: authn,
		Authorizer:    extmetrics.NewSubjectAccessReviewer(client, time.Second),
	}), TLSConfig: extmetrics.TLSConfig(cert), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	registerAPIService(ctx, t, c.RESTConfig(), client, ns, "ferry-metrics", port, caBundle)

	all := readMetric(ctx, t, client.CoreV1().RESTClient(), ns, "")
	if diff := cmp.Diff(map[string]string{"chat": "7", "code": "2500m"}, valuesByService(all)); diff != "" {
		t.Errorf("every series (-want +got):\n%s", diff)
	}
	chat := readMetric(ctx, t, client.CoreV1().RESTClient(), ns, "service=chat")
	if diff := cmp.Diff(map[string]string{"chat": "7"}, valuesByService(chat)); diff != "" {
		t.Errorf("labelSelector service=chat (-want +got):\n%s", diff)
	}

	// alice may list the metric in ns and nowhere else: the API server's own RBAC refuses her
	// the other namespace before the aggregator proxies anything.
	grantMetric(ctx, t, client, ns, "alice")
	cfg := c.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "alice"}
	alice, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	readMetric(ctx, t, alice.CoreV1().RESTClient(), ns, "")
	if _, err := alice.CoreV1().RESTClient().Get().AbsPath(metricPath(other)).DoRaw(ctx); err == nil {
		t.Errorf("alice read the metric in %s", other)
	}

	// Straight to the server as the aggregation layer: the server asks the API server itself
	// (SubjectAccessReview) whether the user named in the headers may read the metric.
	base := "https://127.0.0.1:" + strconv.Itoa(port)
	proxyCert, proxyKey := c.FrontProxyClientCert()
	aggregator := clientWithCert(t, proxyCert, proxyKey)
	for _, tc := range []struct {
		name, user, ns string
		want           int
	}{
		{"a user the RBAC allows", "alice", ns, http.StatusOK},
		{"the same user elsewhere", "alice", other, http.StatusForbidden},
		{"a user without RBAC", "bob", ns, http.StatusForbidden},
		{"no user named", "", ns, http.StatusUnauthorized},
	} {
		if got := get(ctx, t, aggregator, base+metricPath(tc.ns), tc.user); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// Without the front-proxy certificate, headers naming a user count for nothing.
	certFile2, keyFile2 := testhttp.WriteSelfSignedFor(t, t.TempDir())
	if got := get(ctx, t, clientWithCert(t, certFile2, keyFile2), base+metricPath(ns), "system:admin"); got != http.StatusUnauthorized {
		t.Errorf("a certificate of another CA: %d, want 401", got)
	}
	if got := get(ctx, t, &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}, base+metricPath(ns), "system:admin"); got != http.StatusUnauthorized {
		t.Errorf("no client certificate: %d, want 401", got)
	}
}

// clientWithCert presents the certificate in certFile and keyFile; it does not verify the
// server's.
func clientWithCert(t *testing.T, certFile, keyFile string) *http.Client {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true,
	}}}
}

// get is GET url with X-Remote-User: user (none when empty); it returns the status code.
func get(ctx context.Context, t *testing.T, client *http.Client, url, user string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("X-Remote-User", user)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func metricPath(ns string) string {
	return "/apis/" + extmetrics.GroupVersion + "/namespaces/" + ns + "/" + metric
}

// readMetric lists the metric through the API server, retrying while the aggregator has not yet
// found the server (503).
func readMetric(ctx context.Context, t *testing.T, rc rest.Interface, ns, selector string) externalmetrics.ExternalMetricValueList {
	t.Helper()
	for {
		req := rc.Get().AbsPath(metricPath(ns))
		if selector != "" {
			req = req.Param("labelSelector", selector)
		}
		raw, err := req.DoRaw(ctx)
		if err == nil {
			var list externalmetrics.ExternalMetricValueList
			if err := json.Unmarshal(raw, &list); err != nil {
				t.Fatalf("%s: %v", raw, err)
			}
			return list
		}
		if !apierrors.IsServiceUnavailable(err) || ctx.Err() != nil {
			t.Fatalf("GET %s?labelSelector=%s: %v", metricPath(ns), selector, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func valuesByService(list externalmetrics.ExternalMetricValueList) map[string]string {
	out := map[string]string{}
	for _, item := range list.Items {
		out[item.MetricLabels["service"]] = item.Value.String()
	}
	return out
}

func createNamespace(ctx context.Context, t *testing.T, client kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// registerAPIService points v1beta1.external.metrics.k8s.io at a host port through an
// ExternalName Service for localhost, and waits until the aggregator finds it Available.
func registerAPIService(ctx context.Context, t *testing.T, cfg *rest.Config, client kubernetes.Interface, ns, name string, port int, caBundle []byte) {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	apiServices := dyn.Resource(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"})
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": extmetrics.Version + "." + extmetrics.Group},
		"spec": map[string]any{
			"group": extmetrics.Group, "version": extmetrics.Version,
			"service":              map[string]any{"namespace": ns, "name": name, "port": int64(port)},
			"caBundle":             base64.StdEncoding.EncodeToString(caBundle),
			"groupPriorityMinimum": int64(100), "versionPriority": int64(100),
		},
	}}
	if _, err := apiServices.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = apiServices.Delete(context.Background(), extmetrics.Version+"."+extmetrics.Group, metav1.DeleteOptions{})
	})
	for {
		got, err := apiServices.Get(ctx, extmetrics.Version+"."+extmetrics.Group, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cond := range conditions {
			m, _ := cond.(map[string]any)
			if m["type"] == "Available" && m["status"] == "True" {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("APIService never Available: %v", conditions)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// grantMetric lets user list the metric in ns, as a RoleBinding would let an HPA controller.
func grantMetric(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, user string) {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-" + strings.ReplaceAll(metric, "_", "-")},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{extmetrics.Group}, Resources: []string{metric}, Verbs: []string{"get", "list"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}},
	}
	_, err1 := client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{})
	_, err2 := client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{})
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
}
