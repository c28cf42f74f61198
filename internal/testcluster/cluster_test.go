package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// ferryBin is the ferry binary TestMain builds, for the kubelet stand-in's replicas.
var ferryBin string

func TestMain(m *testing.M) {
	if logPath := os.Getenv(orphanHelperEnv); logPath != "" {
		runOrphanHelper(logPath)
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "testcluster-ferry-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ferryBin = filepath.Join(dir, "ferry")
	build := exec.Command("go", "build", "-o", ferryBin, "./cmd/ferry")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/ferry: %v\n%s", err, out)
		return 1
	}
	return Main(m)
}

// TestClusterSchedulesGPUPods drives the cluster the way the Kubernetes launcher will: GPU nodes,
// a pod that fits and serves traffic through the kubelet stand-in, one that does not fit and is
// reported Unschedulable, and a deletion that stops the replica.
func TestClusterSchedulesGPUPods(t *testing.T) {
	c := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := c.Client()

	if data, err := os.ReadFile(c.Kubeconfig()); err != nil || !strings.Contains(string(data), "current-context: "+c.Context()) {
		t.Fatalf("kubeconfig %s: %v\n%s", c.Kubeconfig(), err, data)
	}
	_, podNet, err := net.ParseCIDR(c.CIDR())
	if err != nil {
		t.Fatalf("CIDR() = %q: %v", c.CIDR(), err)
	}

	for _, name := range []string{"gpu-a", "gpu-b"} {
		if err := c.AddGPUNode(ctx, name, "NVIDIA-A100-SXM4-40GB", 4); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.DeleteNode(context.Background(), name) })
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "gpu-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Status.Allocatable[GPUResource]; got.Value() != 4 {
		t.Errorf("node gpu-a allocatable %s = %s, want 4", GPUResource, got.String())
	}
	if got := node.Labels[GPUProductLabel]; got != "NVIDIA-A100-SXM4-40GB" {
		t.Errorf("node gpu-a label %s = %q", GPUProductLabel, got)
	}

	kubelet := StartKubelet(t, c, KubeletOptions{FerryBin: ferryBin})
	ns := createNamespace(ctx, t, c)

	pod, err := client.CoreV1().Pods(ns).Create(ctx, gpuPod("sim", 1, "--model test-model"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod = waitPod(ctx, t, c, ns, pod.Name, "Running with an IP", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	if ip := net.ParseIP(pod.Status.PodIP); !podNet.Contains(ip) {
		t.Fatalf("pod IP %s is not in the cluster's CIDR %s", pod.Status.PodIP, c.CIDR())
	}
	if !slices.Contains([]string{"gpu-a", "gpu-b"}, pod.Spec.NodeName) {
		t.Fatalf("pod scheduled onto %q, want one of the GPU nodes", pod.Spec.NodeName)
	}
	addr := net.JoinHostPort(pod.Status.PodIP, "8000")
	body := waitHTTP(ctx, t, kubelet, ns, pod.Name, "http://"+addr+"/health")
	t.Logf("replica of %s/%s at %s: /health = %q", ns, pod.Name, addr, body)
	// REPLICA_SIM_ARGS reached the replica's command line.
	if models := waitHTTP(ctx, t, kubelet, ns, pod.Name, "http://"+addr+"/v1/models"); !strings.Contains(models, "test-model") {
		t.Errorf("/v1/models = %s, want the model from %s", models, ReplicaSimArgsEnv)
	}
	if got, want := kubelet.Running(), []string{ns + "/sim"}; !slices.Equal(got, want) {
		t.Errorf("Running() = %v, want %v", got, want)
	}
	// The pod's log, through the API server, which asks the kubelet stand-in.
	logs, err := client.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "serving model \"test-model\"") {
		t.Errorf("pod log through the API server: %q, %v; want replica-sim's start line", logs, err)
	}

	big, err := client.CoreV1().Pods(ns).Create(ctx, gpuPod("too-big", 5, ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, ns, big.Name, "PodScheduled=False, reason Unschedulable", func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled {
				return cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable
			}
		}
		return false
	})
	if big, err = client.CoreV1().Pods(ns).Get(ctx, big.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if big.Status.Phase != corev1.PodPending || big.Spec.NodeName != "" {
		t.Errorf("pod too-big: phase %s on node %q, want Pending and unbound", big.Status.Phase, big.Spec.NodeName)
	}
	// The scheduler's reason, which a launcher reads as "burst to the cloud".
	for _, cond := range big.Status.Conditions {
		if cond.Type == corev1.PodScheduled && !strings.Contains(cond.Message, "Insufficient nvidia.com/gpu") {
			t.Errorf("PodScheduled message = %q, want it to name Insufficient nvidia.com/gpu", cond.Message)
		}
	}

	if err := client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(ctx, t, c, ns, pod.Name)
	for !errors.Is(dialErr(addr), syscall.ECONNREFUSED) || slices.Contains(kubelet.Running(), ns+"/sim") {
		select {
		case <-ctx.Done():
			t.Fatalf("replica of deleted pod still serves on %s (dial: %v; running %v)", addr, dialErr(addr), kubelet.Running())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestStartFailureShowsLog checks that a component that dies while starting is named in the
// error, with the end of its log, and that nothing is left behind.
func TestStartFailureShowsLog(t *testing.T) {
	binDir := t.TempDir()
	for _, name := range binaries {
		script := "#!/bin/sh\nsleep 600\n"
		if name == "etcd" {
			script = "#!/bin/sh\necho 'etcd: disk on fire'\nexit 3\n"
		}
		if err := os.WriteFile(filepath.Join(binDir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tempDir := t.TempDir()
	c, err := Start(context.Background(), Options{BinDir: binDir, TempDir: tempDir, StartTimeout: 30 * time.Second})
	if err == nil {
		c.Stop()
		t.Fatal("Start succeeded with an etcd that exits")
	}
	for _, want := range []string{"etcd exited while starting", "disk on fire", "cluster directory kept"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	// The failed attempt kept its directory for its logs; the other components were killed,
	// so their `sleep 600` is not holding their log files.
	entries, _ := os.ReadDir(tempDir)
	if len(entries) != 1 {
		t.Fatalf("want one kept cluster dir in %s, got %d", tempDir, len(entries))
	}
}

// TestDesiredReplica covers the kubelet stand-in's decision: which pods get a replica, and the
// command line and environment it runs with.
func TestDesiredReplica(t *testing.T) {
	kwokNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{KwokNodeAnnotation: "fake"}}}
	realNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	running := func(mutate func(*corev1.Pod)) *corev1.Pod {
		pod := gpuPod("p", 1, "--model m  --ttft 5ms")
		pod.Spec.NodeName = "n"
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env,
			corev1.EnvVar{Name: "FOO", Value: "bar"},
			corev1.EnvVar{Name: "FROM_SECRET", ValueFrom: &corev1.EnvVarSource{}})
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.100.0.7"}
		if mutate != nil {
			mutate(pod)
		}
		return pod
	}
	tests := map[string]struct {
		pod      *corev1.Pod
		node     *corev1.Node
		wantRun  bool
		wantArgs []string
		wantEnv  []string
	}{
		"running pod on a kwok node": {
			pod: running(nil), node: kwokNode, wantRun: true,
			wantArgs: []string{"replica-sim", "--host", "127.100.0.7", "--port", "8000", "--model", "m", "--ttft", "5ms"},
			wantEnv:  []string{"REPLICA_SIM_ARGS=--model m  --ttft 5ms", "FOO=bar"},
		},
		"pod gone":            {pod: nil, node: kwokNode},
		"node gone":           {pod: running(nil), node: nil},
		"node not kwok's":     {pod: running(nil), node: realNode},
		"pending":             {pod: running(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }), node: kwokNode},
		"succeeded":           {pod: running(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), node: kwokNode},
		"no IP yet":           {pod: running(func(p *corev1.Pod) { p.Status.PodIP = "" }), node: kwokNode},
		"being deleted":       {pod: running(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }), node: kwokNode},
		"no container port":   {pod: running(func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }), node: kwokNode},
		"no REPLICA_SIM_ARGS": {pod: running(func(p *corev1.Pod) { p.Spec.Containers[0].Env = nil }), node: kwokNode, wantRun: true, wantArgs: []string{"replica-sim", "--host", "127.100.0.7", "--port", "8000"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, run := desiredReplica(tt.pod, tt.node)
			if run != tt.wantRun {
				t.Fatalf("run = %v, want %v", run, tt.wantRun)
			}
			if !slices.Equal(got.args, tt.wantArgs) {
				t.Errorf("args = %q, want %q", got.args, tt.wantArgs)
			}
			if !slices.Equal(got.env, tt.wantEnv) {
				t.Errorf("env = %q, want %q", got.env, tt.wantEnv)
			}
		})
	}
}

// gpuPod is a pod asking for gpus nvidia.com/gpu with a replica-sim container on port 8000.
func gpuPod(name string, gpus int64, simArgs string) *corev1.Pod {
	gpu := corev1.ResourceList{GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	container := corev1.Container{
		Name:      "replica",
		Image:     "ferry/replica-sim", // never pulled: kwok runs no containers
		Ports:     []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
		Resources: corev1.ResourceRequirements{Requests: gpu, Limits: gpu},
	}
	if simArgs != "" {
		container.Env = []corev1.EnvVar{{Name: ReplicaSimArgsEnv, Value: simArgs}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{container}},
	}
}

// createNamespace makes a namespace of the test's own, since tests share the cluster. It is not
// deleted: without a controller-manager a namespace would stay Terminating forever.
func createNamespace(ctx context.Context, t *testing.T, c *Cluster) string {
	t.Helper()
	ns, err := c.Client().CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// waitPod watches a pod until cond holds, and returns it.
func waitPod(ctx context.Context, t *testing.T, c *Cluster, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ev, err := watchtools.UntilWithSync(ctx, podListWatch(c, ns, name), &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, apierrors.NewNotFound(corev1.Resource("pods"), name)
		}
		pod, ok := ev.Object.(*corev1.Pod)
		return ok && cond(pod), nil
	})
	if err != nil {
		pod, _ := c.Client().CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		t.Fatalf("pod %s/%s never became %s: %v\nlast seen: %+v", ns, name, what, err, pod)
	}
	return ev.Object.(*corev1.Pod)
}

// waitPodGone watches a pod until it no longer exists.
func waitPodGone(ctx context.Context, t *testing.T, c *Cluster, ns, name string) {
	t.Helper()
	_, err := watchtools.UntilWithSync(ctx, podListWatch(c, ns, name), &corev1.Pod{},
		func(store cache.Store) (bool, error) { return len(store.List()) == 0, nil },
		func(ev watch.Event) (bool, error) { return ev.Type == watch.Deleted, nil })
	if err != nil {
		t.Fatalf("pod %s/%s was not deleted: %v", ns, name, err)
	}
}

func podListWatch(c *Cluster, ns, name string) cache.ListerWatcher {
	return cache.NewListWatchFromClient(c.Client().CoreV1().RESTClient(), "pods", ns,
		fields.OneTermEqualSelector("metadata.name", name))
}

// waitHTTP polls url until it answers 200 (the replica needs a moment to start) and returns the
// body. Nothing announces that a process listens, so this is the one wait that polls.
func waitHTTP(ctx context.Context, t *testing.T, k *Kubelet, ns, name, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	var lastErr error
	for {
		resp, err := client.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(body)
			}
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			log, _ := os.ReadFile(k.LogPath(ns, name))
			t.Fatalf("GET %s: %v\nreplica log:\n%s", url, lastErr, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func dialErr(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
	}
	return err
}
