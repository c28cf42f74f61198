package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// hpaServiceYAML is the service the proxies front: two local replica-sims, each request held
// about 0.8 s (400 ms to the first token, 19 more at 20 ms), so that in-flight requests are
// what the client sends at once.
const hpaServiceYAML = `name: hpa
resources:
  infra: local
service:
  readiness_probe: /health
  replicas: 2
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b --ttft 400ms --itl 20ms --max-num-seqs 256
`

// Load levels of TestProxiesHPAScalesOnLoad against the chart's HPA set to 5 requests per proxy,
// 2 to 4 proxies: 24 clients ask ceil(24/5) = 5 proxies (4 at most), 6 ask 2, and keep sending
// while the two leaving proxies drain.
const (
	hpaTargetPerProxy = 5
	hpaHighClients    = 24
	hpaLowClients     = 6
)

// TestProxiesHPAScalesOnLoad is issue 36's "the proxies' HPA on a metric that tracks load":
// on the test cluster with kube-controller-manager, the chart's HorizontalPodAutoscaler (metric
// load, rendered by helm) scales a Deployment whose pods on kwok nodes are real `ferry proxy
// --attach-all` processes, reading ferry_proxy_requests_in_flight from the controller binary's
// external metrics API through the API server's aggregation layer. A bounded load loop spread
// over the ready proxies as a Service spreads connections takes them 2 → 4 → 2, and not one
// request fails, the two proxies scaled down draining theirs (--drain-delay, /readyz).
func TestProxiesHPAScalesOnLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c, err := testcluster.Start(ctx, testcluster.Options{ControllerManager: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop) // last: after the controller and the proxies are gone
	client := c.Client()
	if err := c.AddGPUNode(ctx, "hpa-node", "NVIDIA-L4", 0); err != nil {
		t.Fatal(err)
	}
	const ns = "proxy-hpa"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The controller, serving the external metrics API with a certificate for the name the
	// aggregator checks, and reaching the API server through the cluster's kubeconfig.
	certFile, keyFile := testhttp.WriteSelfSignedFor(t, t.TempDir(), "ferry-controller."+ns+".svc")
	metricsPort := freePort(t)
	e := newEnv(t)
	e.extraEnv = append(e.extraEnv,
		"FERRY_EXTERNAL_METRICS_ADDR=127.0.0.1:"+strconv.Itoa(metricsPort),
		"FERRY_EXTERNAL_METRICS_TLS_CERT="+certFile, "FERRY_EXTERNAL_METRICS_TLS_KEY="+keyFile,
		"KUBECONFIG="+c.Kubeconfig())
	file := filepath.Join(t.TempDir(), "hpa.yaml")
	writeFile(t, file, hpaServiceYAML)
	if out := e.mustRun("serve", "up", file, "-y"); !strings.Contains(out, "2/2 READY") {
		t.Fatalf("serve up:\n%s", out)
	}
	registerExternalMetrics(ctx, t, c, ns, "ferry-controller", metricsPort, certFile)

	kubelet := testcluster.StartKubelet(t, c, testcluster.KubeletOptions{FerryBin: ferryBin, StopGrace: 30 * time.Second})
	lb := newReadyBalancer(client, ns)
	go lb.run(ctx)
	createProxyDeployment(ctx, t, client, ns, e.home)
	waitProxies(ctx, t, client, kubelet, lb, ns, 1)
	began := time.Now()
	createChartHPA(ctx, t, client, ns)
	waitProxies(ctx, t, client, kubelet, lb, ns, 2)
	t.Logf("2 proxies ready %v after the HPA's create (the Deployment at 1, as the chart leaves it)", time.Since(began).Round(time.Millisecond))

	samples := sampleMetric(ctx, client, ns)
	load := newLoadLoop(lb)
	defer load.stop()
	load.setClients(hpaHighClients)
	up := time.Now()
	waitProxies(ctx, t, client, kubelet, lb, ns, 4)
	tookUp := time.Since(up)
	t.Logf("%d clients: 4 proxies ready %v after the load began (HPA sync %v)", hpaHighClients, tookUp.Round(time.Millisecond), testcluster.HPASyncPeriod)
	time.Sleep(3 * time.Second) // served by all four for a while

	load.setClients(hpaLowClients)
	down := time.Now()
	waitProxies(ctx, t, client, kubelet, lb, ns, 2)
	tookDown := time.Since(down)
	t.Logf("%d clients: back to 2 proxies, the other two drained and exited, %v after the load fell (scale-down window 10 s)", hpaLowClients, tookDown.Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	load.stop()

	t.Logf("ferry_proxy_requests_in_flight through the aggregator, every 500 ms from the load's start: %v", samples())
	ok, failed, errs := load.result()
	t.Logf("requests: %d succeeded, %d failed", ok, failed)
	if failed > 0 || ok == 0 {
		t.Errorf("%d of %d requests failed; first errors:\n%s", failed, ok+failed, strings.Join(errs, "\n"))
	}
	hpa, err := client.AutoscalingV2().HorizontalPodAutoscalers(ns).Get(ctx, "ferry-proxy", metav1.GetOptions{})
	if err == nil {
		for _, cond := range hpa.Status.Conditions {
			t.Logf("HPA %s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
}

// registerExternalMetrics makes the aggregation layer lead external.metrics.k8s.io to the
// controller on the host: an ExternalName Service for localhost (the aggregator dials
// externalName:port) and the APIService with the controller's certificate as caBundle. It
// waits until the APIService is Available, that is, the aggregator reached the controller's
// discovery with its front-proxy certificate.
func registerExternalMetrics(ctx context.Context, t *testing.T, c *testcluster.Cluster, ns, name string, port int, certFile string) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"}}
	if _, err := c.Client().CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	caBundle, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	apiServices := dyn.Resource(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"})
	const apiService = "v1beta1.external.metrics.k8s.io"
	if _, err := apiServices.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": apiService},
		"spec": map[string]any{
			"group": "external.metrics.k8s.io", "version": "v1beta1",
			"service":              map[string]any{"namespace": ns, "name": name, "port": int64(port)},
			"caBundle":             base64.StdEncoding.EncodeToString(caBundle),
			"groupPriorityMinimum": int64(100), "versionPriority": int64(100),
		},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the APIService "+apiService+" is Available", func() (bool, string) {
		got, err := apiServices.Get(ctx, apiService, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cond := range conditions {
			if m, _ := cond.(map[string]any); m["type"] == "Available" && m["status"] == "True" {
				return true, ""
			}
		}
		return false, fmt.Sprint(conditions)
	})
}

// createProxyDeployment is the chart's proxies as the kubelet stand-in runs them: each pod a
// `ferry proxy --attach-all` on its loopback IP, following the controller in home. Like the
// chart's with autoscaling on, it leaves replicas unset (1) for the HPA to raise to its minimum.
// (That also keeps kwok v0.8.0 from giving the cluster's first two pods one IP: it makes a CIDR's
// address pool on first use, unlocked, so two pods assigned at once can each get a new pool.)
func createProxyDeployment(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, home string) {
	t.Helper()
	labels := map[string]string{"app.kubernetes.io/component": "proxy"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "ferry-proxy"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					testcluster.FerryArgsAnnotation: "proxy --attach-all --listen $(POD_IP):8000 --metrics-listen $(POD_IP):9465 --drain-delay 2s",
				}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "proxy", Image: "ferry",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}, {Name: "metrics", ContainerPort: 9465}},
					Env:   []corev1.EnvVar{{Name: "FERRY_HOME", Value: home}},
				}}},
			},
		},
	}
	if _, err := client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createChartHPA renders the chart's HPA of the proxies (metric load, its default) for 2 to 4
// proxies at hpaTargetPerProxy requests each, with a 10 s scale-down window instead of 300, and
// creates it.
func createChartHPA(ctx context.Context, t *testing.T, client kubernetes.Interface, ns string) {
	t.Helper()
	helmPath, err := exec.Command(filepath.Join(repoRoot(), "scripts", "helm.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/helm.sh: %v", err)
	}
	cmd := exec.Command(strings.TrimSpace(string(helmPath)), "template", "ferry", filepath.Join(repoRoot(), "charts", "ferry"),
		"--namespace", ns, "--kube-version", "v1.34.0", "--show-only", "templates/proxy.yaml",
		"--set", "proxy.attach=*", "--set", "proxy.autoscaling.maxReplicas=4",
		"--set", "proxy.autoscaling.targetRequestsPerProxy="+strconv.Itoa(hpaTargetPerProxy),
		"--set-json", `proxy.autoscaling.behavior={"scaleDown":{"stabilizationWindowSeconds":10,"policies":[{"type":"Percent","value":100,"periodSeconds":5}]}}`)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	dec := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var hpa autoscalingv2.HorizontalPodAutoscaler
		if err := dec.Decode(&hpa); errors.Is(err, io.EOF) {
			t.Fatalf("the chart renders no HPA:\n%s", out)
		} else if err != nil {
			t.Fatal(err)
		}
		if hpa.Kind != "HorizontalPodAutoscaler" {
			continue
		}
		if len(hpa.Spec.Metrics) != 1 || hpa.Spec.Metrics[0].Type != autoscalingv2.ExternalMetricSourceType {
			t.Fatalf("the chart's HPA metrics %+v, want the External load metric", hpa.Spec.Metrics)
		}
		if _, err := client.AutoscalingV2().HorizontalPodAutoscalers(ns).Create(ctx, &hpa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
}

// waitProxies waits until the Deployment asks for want proxies, exactly want of its pods run a
// proxy process, and the balancer sends to want ready ones.
func waitProxies(ctx context.Context, t *testing.T, client kubernetes.Interface, kubelet *testcluster.Kubelet, lb *readyBalancer, ns string, want int) {
	t.Helper()
	eventually(t, 3*time.Minute, fmt.Sprintf("%d proxies", want), func() (bool, string) {
		dep, err := client.AppsV1().Deployments(ns).Get(ctx, "ferry-proxy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		running := slices.DeleteFunc(kubelet.Running(), func(key string) bool { return !strings.HasPrefix(key, ns+"/") })
		ready := lb.backends()
		state := fmt.Sprintf("Deployment replicas %d, proxy processes %d, ready %v", ptr.Deref(dep.Spec.Replicas, 0), len(running), ready)
		return ptr.Deref(dep.Spec.Replicas, 0) == int32(want) && len(running) == want && len(ready) == want, state
	})
}

// readyBalancer spreads connections over the proxy pods as a Service does: to pods that are
// Running, not being deleted and whose readiness check (/readyz on the metrics port) passed at
// its last probe, every 200 ms, a new connection to one of them at random.
type readyBalancer struct {
	client kubernetes.Interface
	ns     string
	probe  *http.Client

	mu    sync.Mutex
	ready []string // host:port of the ready proxies' traffic listeners
}

func newReadyBalancer(client kubernetes.Interface, ns string) *readyBalancer {
	return &readyBalancer{client: client, ns: ns, probe: &http.Client{Timeout: 500 * time.Millisecond}}
}

func (b *readyBalancer) run(ctx context.Context) {
	for ctx.Err() == nil {
		pods, err := b.client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=proxy"})
		if err == nil {
			var ready []string
			for _, pod := range pods.Items {
				if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
					continue
				}
				if resp, err := b.probe.Get("http://" + net.JoinHostPort(pod.Status.PodIP, "9465") + "/readyz"); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						ready = append(ready, net.JoinHostPort(pod.Status.PodIP, "8000"))
					}
				}
			}
			slices.Sort(ready)
			b.mu.Lock()
			b.ready = ready
			b.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (b *readyBalancer) backends() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.ready)
}

// dial connects to a ready proxy, whatever address the client asked for.
func (b *readyBalancer) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	ready := b.backends()
	if len(ready) == 0 {
		return nil, errors.New("no ready proxy")
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", ready[rand.IntN(len(ready))])
}

// loadLoop runs clients that each send completions one after another through the balancer
// (keep-alive connections), counting every answer; its number of clients changes while it runs.
type loadLoop struct {
	client  *http.Client
	ok      atomic.Int64
	failed  atomic.Int64
	mu      sync.Mutex
	errs    []string
	running []chan struct{} // one per client; closing it stops that client
	wg      sync.WaitGroup
}

func newLoadLoop(lb *readyBalancer) *loadLoop {
	tr := &http.Transport{DialContext: lb.dial, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	return &loadLoop{client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// setClients starts or stops clients until n run.
func (l *loadLoop) setClients(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.running) < n {
		quit := make(chan struct{})
		l.running = append(l.running, quit)
		l.wg.Go(func() {
			for {
				select {
				case <-quit:
					return
				default:
				}
				if err := l.send(); err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					if len(l.errs) < 10 {
						l.errs = append(l.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
					}
					l.mu.Unlock()
				} else {
					l.ok.Add(1)
				}
			}
		})
	}
	for len(l.running) > n {
		close(l.running[len(l.running)-1])
		l.running = l.running[:len(l.running)-1]
	}
}

func (l *loadLoop) send() error {
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"hi"}],"max_tokens":20}`
	resp, err := l.client.Post("http://proxies/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, raw)
	}
	return nil
}

// stop stops every client and waits for their last requests. Safe to call twice.
func (l *loadLoop) stop() {
	l.setClients(0)
	l.wg.Wait()
}

func (l *loadLoop) result() (ok, failed int64, errs []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok.Load(), l.failed.Load(), slices.Clone(l.errs)
}

// sampleMetric reads the metric through the API server every 500 ms until ctx ends, as the HPA
// does; the returned func lists what it read so far (the sum over services; "?" for a failed
// read).
func sampleMetric(ctx context.Context, client kubernetes.Interface, ns string) func() []string {
	var mu sync.Mutex
	var got []string
	go func() {
		for ctx.Err() == nil {
			raw, err := client.CoreV1().RESTClient().Get().
				AbsPath("/apis/external.metrics.k8s.io/v1beta1/namespaces/" + ns + "/ferry_proxy_requests_in_flight").DoRaw(ctx)
			value := "?"
			var list struct {
				Items []struct {
					Value resource.Quantity `json:"value"`
				} `json:"items"`
			}
			if err == nil && json.Unmarshal(raw, &list) == nil {
				var sum resource.Quantity
				for _, item := range list.Items {
					sum.Add(item.Value)
				}
				value = sum.String()
			}
			mu.Lock()
			got = append(got, value)
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
