package controller

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/leader"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/testcluster"
	kubelauncher "github.com/ferryserve/ferry/launcher/kubernetes"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// series finds the sample of name whose labels include want in reg's gather; nil when there
// is none.
func series(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// histogramCount is the count of the histogram series, 0 when absent.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) uint64 {
	t.Helper()
	return series(t, reg, name, labels).GetHistogram().GetSampleCount()
}

// writeKubeconfig writes a kubeconfig for host, the way --kubeconfig names one.
func writeKubeconfig(t *testing.T, host string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + host + `"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKubeClientRateLimit checks that --kube-api-qps and --kube-api-burst reach the
// configuration every controller client is made from (the store's, the election's, the
// FerryService watch's), and that leaving them unset takes Ferry's defaults, not client-go's
// 5 and 10.
func TestKubeClientRateLimit(t *testing.T) {
	kubeconfig := writeKubeconfig(t, "https://127.0.0.1:6443")
	tests := map[string]struct {
		qps       float32
		burst     int
		wantQPS   float32
		wantBurst int
	}{
		"defaults":  {wantQPS: kubelauncher.DefaultQPS, wantBurst: kubelauncher.DefaultBurst},
		"set":       {qps: 50, burst: 75, wantQPS: 50, wantBurst: 75},
		"unlimited": {qps: -1, wantQPS: -1, wantBurst: kubelauncher.DefaultBurst},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := StoreOptions{Kind: StoreKubernetes, Kubeconfig: kubeconfig, QPS: tc.qps, Burst: tc.burst}
			cfg, err := o.restConfig()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.QPS != tc.wantQPS || cfg.Burst != tc.wantBurst || cfg.RateLimiter != nil {
				t.Errorf("rest.Config QPS %v burst %d limiter %v; want %v, %d, none", cfg.QPS, cfg.Burst, cfg.RateLimiter, tc.wantQPS, tc.wantBurst)
			}
		})
	}
	if err := (StoreOptions{Burst: -1}).Validate(); err == nil {
		t.Error("a negative burst is accepted")
	}
}

// TestControlPlaneMetrics drives the control plane against the real API server and reads each
// new series from the controller's registry: the leader gauges follow a real Lease, a write to
// the Kubernetes store (and to SQLite) is timed, a low client-side rate limit shows up as time
// waited, and a FerryService key queued and reconciled moves the queue depth and the reconcile
// histogram.
func TestControlPlaneMetrics(t *testing.T) {
	cluster := testcluster.Shared(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "controlplane-metrics"
	if _, err := cluster.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// One request a second with no burst to spare: the store's first requests must wait.
	opts := StoreOptions{Kind: StoreKubernetes, Kubeconfig: cluster.Kubeconfig(), Namespace: ns, QPS: 1, Burst: 1}
	elector, err := opts.Elector(leader.Config{Name: "metrics", Identity: "a", URL: "http://127.0.0.1:1",
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := New(Options{Home: home.Home{Dir: t.TempDir()}, Store: opts, Elector: elector})
	if err := c.initMetrics(); err != nil {
		t.Fatal(err)
	}
	reg := c.registry

	if got := series(t, reg, "ferry_controller_leader", nil).GetGauge().GetValue(); got != 0 {
		t.Errorf("ferry_controller_leader before the election = %v, want 0", got)
	}
	if m := series(t, reg, "ferry_controller_leader_term", nil); m != nil {
		t.Errorf("a follower exports a term: %v", m)
	}
	led := make(chan struct{})
	go func() { _ = elector.Run(ctx, leader.Callbacks{OnStartedLeading: func(context.Context) { close(led) }}) }()
	select {
	case <-led:
	case <-time.After(time.Minute):
		t.Fatal("the elector did not lead")
	}
	if got := series(t, reg, "ferry_controller_leader", nil).GetGauge().GetValue(); got != 1 {
		t.Errorf("ferry_controller_leader while leading = %v, want 1", got)
	}
	if m := series(t, reg, "ferry_controller_leader_term", nil); m == nil || m.GetGauge().GetValue() != 0 {
		t.Errorf("ferry_controller_leader_term of the first leader = %v, want 0", m)
	}

	waitedBefore, _ := kubeClient(t, reg, "ferry_kube_client_rate_limiter_wait_seconds")
	_, requestsBefore := kubeClient(t, reg, "ferry_kube_client_request_duration_seconds")
	st, err := c.openStore()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc := store.Service{Name: "timed", Version: 1, Task: &configs.Task{Name: "timed", Run: "true"}, Port: 30001, Status: "CONTROLLER_INIT", Target: -1}
	if err := st.CreateService(svc); err != nil {
		t.Fatal(err)
	}
	if err := st.SetServiceStatus("timed", "READY"); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"CreateService", "SetServiceStatus"} {
		if n := histogramCount(t, reg, "ferry_store_write_duration_seconds", map[string]string{"store": StoreKubernetes, "op": op}); n != 1 {
			t.Errorf("ferry_store_write_duration_seconds{store=kubernetes,op=%s} count %d, want 1", op, n)
		}
	}
	if waited, _ := kubeClient(t, reg, "ferry_kube_client_rate_limiter_wait_seconds"); waited-waitedBefore < 0.5 {
		t.Errorf("the store's requests at 1 QPS waited %.3fs in the client-side rate limiter, want at least 0.5s", waited-waitedBefore)
	}
	if _, requests := kubeClient(t, reg, "ferry_kube_client_request_duration_seconds"); requests-requestsBefore < 2 {
		t.Errorf("ferry_kube_client_request_duration_seconds counted %d of the store's requests, want at least its two writes", requests-requestsBefore)
	}

	sqlite := New(Options{Home: home.Home{Dir: t.TempDir()}})
	if err := sqlite.initMetrics(); err != nil {
		t.Fatal(err)
	}
	sqliteStore, err := sqlite.openStore()
	if err != nil {
		t.Fatal(err)
	}
	defer sqliteStore.Close()
	if err := sqliteStore.CreateService(svc); err != nil {
		t.Fatal(err)
	}
	if n := histogramCount(t, sqlite.registry, "ferry_store_write_duration_seconds", map[string]string{"store": StoreSQLite, "op": "CreateService"}); n != 1 {
		t.Errorf("ferry_store_write_duration_seconds{store=sqlite,op=CreateService} count %d, want 1", n)
	}
	if got := series(t, sqlite.registry, "ferry_controller_leader", nil).GetGauge().GetValue(); got != 1 {
		t.Errorf("ferry_controller_leader without election = %v, want 1", got)
	}
}

// kubeClient is the sum and count of the process-wide client-go histogram name, by every verb.
func kubeClient(t *testing.T, reg prometheus.Gatherer, name string) (sum float64, count uint64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
				count += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return sum, count
}

// TestFerryServiceQueueMetrics queues FerryService keys on the controller's queue and lets
// its worker reconcile them: the depth gauge follows the queue, and each reconcile is timed.
func TestFerryServiceQueueMetrics(t *testing.T) {
	c := New(Options{})
	if err := c.initMetrics(); err != nil {
		t.Fatal(err)
	}
	depth := func() float64 {
		return series(t, c.registry, "ferry_workqueue_depth", map[string]string{"queue": queueFerryServices}).GetGauge().GetValue()
	}
	if m := series(t, c.registry, "ferry_workqueue_depth", map[string]string{"queue": queueFerryServices}); m == nil {
		t.Fatal("no ferry_workqueue_depth series before the first FerryService")
	}
	empty := cache.NewGenericLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), FerryServiceGVR.GroupResource())
	fs := &ferryServices{c: c, lister: empty.ByNamespace("ns"), log: c.log, applied: map[string]int64{},
		queue: newFerryServiceQueue(c.control), observe: c.control.observeReconcile(loopFerryServices)}
	fs.queue.Add("ns/a")
	fs.queue.Add("ns/b")
	if got := depth(); got != 2 {
		t.Errorf("depth with two keys queued = %v, want 2", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { fs.work(ctx); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for histogramCount(t, c.registry, "ferry_reconcile_duration_seconds", map[string]string{"loop": loopFerryServices}) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two FerryService reconciles were not timed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := depth(); got != 0 {
		t.Errorf("depth once both are reconciled = %v, want 0", got)
	}
	fs.queue.ShutDown()
	<-done
}

// TestTimedStoreTimesEveryWrite keeps timedStore in step with store.Store: every method is
// either declared on timedStore (timed) or a read.
func TestTimedStoreTimesEveryWrite(t *testing.T) {
	reads := map[string]bool{"Close": true, "GetService": true, "ListServices": true, "Versions": true, "Rollout": true, "Losses": true,
		"ListReplicas": true, "ListJobs": true, "ListLeftovers": true, "Tenants": true, "Usage": true}
	file, err := parser.ParseFile(token.NewFileSet(), "storemetrics.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	timed := map[string]bool{}
	for _, d := range file.Decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv != nil && fn.Name.IsExported() {
			timed[fn.Name.Name] = true
		}
	}
	iface := reflect.TypeFor[store.Store]()
	for i := range iface.NumMethod() {
		name := iface.Method(i).Name
		if !timed[name] && !reads[name] {
			t.Errorf("store.Store.%s is neither timed by timedStore nor a read: time it in storemetrics.go, or list it as a read here", name)
		}
		if timed[name] && reads[name] {
			t.Errorf("store.Store.%s is listed as a read but timed", name)
		}
	}
}
