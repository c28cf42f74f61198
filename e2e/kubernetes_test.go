package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// These tests run Ferry against a real API server, scheduler and kwok (internal/testcluster),
// with a kubelet stand-in that runs `ferry replica-sim` on each pod's loopback IP, so requests
// really flow through pods.

// kubeEnv is a Ferry home whose config enables the test cluster's context in a namespace of
// its own, with nodes of one GPU product that no other test uses.
type kubeEnv struct {
	*env
	cluster *testcluster.Cluster
	ns      string
}

func newKubeEnv(t *testing.T, product string, nodes, gpusPerNode, provisionTimeout int) *kubeEnv {
	t.Helper()
	c := testcluster.Shared(t)
	ctx := context.Background()
	for i := range nodes {
		name := fmt.Sprintf("%s-%d", strings.ToLower(product), i)
		if err := c.AddGPUNode(ctx, name, product, gpusPerNode); err != nil {
			t.Fatal(err)
		}
		// Removed last (registered first), once the namespace's pods are gone, so that the
		// next run (go test -count=N) can add it again.
		t.Cleanup(func() {
			if err := c.DeleteNode(context.Background(), name); err != nil {
				t.Errorf("delete node %s: %v", name, err)
			}
		})
	}
	ns := testNamespace(t, c, strings.ToLower(strings.NewReplacer("_", "-", "/", "-").Replace(t.Name()))+"-")
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{FerryBin: ferryBin})
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "config.yaml"), fmt.Sprintf(`kubernetes:
  kubeconfig: %s
  provision_timeout_seconds: %d
  contexts:
    - name: %s
      namespace: %s
`, c.Kubeconfig(), provisionTimeout, c.Context(), ns))
	return &kubeEnv{env: e, cluster: c, ns: ns}
}

// pods is `kubectl get pods -l ferry.service=NAME` in the env's namespace: the pods not being
// deleted.
func (k *kubeEnv) pods(service string) []corev1.Pod {
	k.t.Helper()
	list, err := k.cluster.Client().CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "ferry.service=" + service})
	if err != nil {
		k.t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// live counts the replicas that serve or will, by infra.
func live(st serviceStatus) map[string]int {
	n := map[string]int{}
	for _, r := range st.Replicas {
		switch r.Status {
		case "READY", "STARTING", "PROVISIONING", "PENDING", "NOT_READY":
			n[r.Infra]++
		}
	}
	return n
}

const burstYAML = `name: burst
resources:
  accelerators: A100:1
  ordered:
    - infra: kubernetes
    - infra: local
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b --itl 20ms
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  replica_policy:
    min_replicas: 8
    max_replicas: 10
    autoscaler: concurrency
    target_inflight_per_replica: 1
    stable_window_seconds: 8
    panic_window_seconds: 2
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b --itl 20ms
`

// TestKubernetesServeBurstAndScaleBack is issue 5's acceptance run: pods on two kwok nodes of
// 4 x A100 serve traffic; load that wants 10 replicas puts 8 in the cluster and bursts 2 to the
// next candidate (local); when load falls the 2 outside the cluster go first; serve down
// leaves nothing in the cluster.
func TestKubernetesServeBurstAndScaleBack(t *testing.T) {
	k := newKubeEnv(t, "NVIDIA-A100-SXM4-40GB", 2, 4, 2)
	file := filepath.Join(t.TempDir(), "burst.yaml")
	writeFile(t, file, burstYAML)

	out := k.mustRun("serve", "up", file, "-y")
	t.Logf("serve up:\n%s", out)
	for _, want := range []string{"kubernetes/" + k.cluster.Context(), "A100:1", "8/8 READY"} {
		if !strings.Contains(out, want) {
			t.Fatalf("serve up output lacks %q:\n%s", want, out)
		}
	}
	if pods := k.pods("burst"); len(pods) != 8 {
		t.Fatalf("%d pods labelled ferry.service=burst, want 8", len(pods))
	}
	st, err := k.status("burst")
	if err != nil {
		t.Fatal(err)
	}
	if n := live(st); n["kubernetes/"+k.cluster.Context()] != 8 {
		t.Fatalf("replicas by infra %v, want 8 in the cluster", n)
	}
	chatPlain(t, st.Endpoint) // served by a pod

	// Twelve clients streaming ~2 s completions: 12 in flight against 1 per replica wants 10.
	var ld streamLoad
	stop := make(chan struct{})
	endLoad := sync.OnceFunc(func() { close(stop) })
	defer endLoad()
	ld.start(st.Endpoint, 12, 100, stop)
	state := func() (serviceStatus, string) {
		st, err := k.status("burst")
		if err != nil {
			return st, err.Error()
		}
		return st, fmt.Sprintf("target %d, live by infra %v, %d pods", st.TargetReplicas, live(st), len(k.pods("burst")))
	}
	eventually(t, 90*time.Second, "10 READY: 8 pods and 2 burst replicas on local", func() (bool, string) {
		st, s := state()
		n := live(st)
		return st.ReadyReplicas == 10 && n["kubernetes/"+k.cluster.Context()] == 8 && n["local"] == 2, s
	})
	if pods := k.pods("burst"); len(pods) != 8 {
		t.Fatalf("%d pods after the burst, want 8 (the rest unschedulable and removed)", len(pods))
	}

	// Load falls: back to 8, and the 2 that go are the burst replicas outside the cluster.
	endLoad()
	eventually(t, 90*time.Second, "back to 8 replicas, all in the cluster", func() (bool, string) {
		st, s := state()
		n := live(st)
		return st.TargetReplicas == 8 && n["local"] == 0 && n["kubernetes/"+k.cluster.Context()] == 8 && len(k.pods("burst")) == 8, s
	})
	ld.wait(t, "through pods and burst replicas")

	k.mustRun("serve", "down", "burst", "-y")
	eventually(t, 60*time.Second, "serve down leaves no pod", func() (bool, string) {
		list, err := k.cluster.Client().CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "ferry.managed=true"})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d pods", len(list.Items))
	})
}

const killYAML = `name: adopt
resources:
  infra: kubernetes
  accelerators: H100:1
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b
service:
  readiness_probe: /health
  replicas: 4
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT
`

// TestKubernetesControllerKilledMidLaunch SIGKILLs the controller while its launches are in
// flight; the restarted controller adopts the pods it finds and launches only what is missing:
// none leaked, none duplicated.
func TestKubernetesControllerKilledMidLaunch(t *testing.T) {
	// One node with room for 2 of the 4 replicas: two launches wait on the scheduler (up to
	// the 60 s provision timeout) when the controller dies.
	k := newKubeEnv(t, "NVIDIA-H100-80GB-HBM3", 1, 2, 60)
	file := filepath.Join(t.TempDir(), "adopt.yaml")
	writeFile(t, file, killYAML)
	k.mustRun("serve", "up", file, "-y", "--no-wait")
	ctrl := k.controllerPID()

	pending := func() (all, unscheduled int) {
		for _, p := range k.pods("adopt") {
			all++
			if p.Spec.NodeName == "" {
				unscheduled++
			}
		}
		return all, unscheduled
	}
	eventually(t, 30*time.Second, "4 pods, 2 of them waiting for the scheduler", func() (bool, string) {
		all, unscheduled := pending()
		return all == 4 && unscheduled == 2, fmt.Sprintf("%d pods, %d unscheduled", all, unscheduled)
	})
	if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A new controller adopts the 4 pods, 2 of them still unscheduled, and launches nothing.
	eventually(t, 30*time.Second, "the restarted controller adopts 2 serving pods and 2 waiting ones", func() (bool, string) {
		st, err := k.status("adopt")
		if err != nil {
			return false, err.Error()
		}
		all, unscheduled := pending()
		return st.ReadyReplicas == 2 && len(st.Replicas) == 4 && all == 4 && unscheduled == 2,
			fmt.Sprintf("%d READY of %d replicas; %d pods, %d unscheduled", st.ReadyReplicas, len(st.Replicas), all, unscheduled)
	})
	// Capacity arrives; the adopted pods get scheduled and an IP, and start serving.
	if err := k.cluster.AddGPUNode(context.Background(), "nvidia-h100-80gb-hbm3-1", "NVIDIA-H100-80GB-HBM3", 2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.cluster.DeleteNode(context.Background(), "nvidia-h100-80gb-hbm3-1") }) // for the next run

	// Any command starts a new controller, which adopts and completes the service.
	eventually(t, 60*time.Second, "4 READY after the restart", func() (bool, string) {
		st, err := k.status("adopt")
		if err != nil {
			return false, err.Error()
		}
		return st.ReadyReplicas == 4, fmt.Sprintf("%d READY, %d pods", st.ReadyReplicas, len(k.pods("adopt")))
	})
	if k.controllerPID() == ctrl {
		t.Fatal("the controller was not restarted")
	}
	pods := k.pods("adopt")
	ids := map[string]bool{}
	for _, p := range pods {
		ids[p.Labels["ferry.replica-id"]] = true
	}
	if len(pods) != 4 || len(ids) != 4 {
		t.Fatalf("%d pods with replica ids %v after adoption, want 4 distinct", len(pods), ids)
	}
	st, err := k.status("adopt")
	if err != nil {
		t.Fatal(err)
	}
	chatPlain(t, st.Endpoint)

	// serve logs reads an adopted pod's output through the API server.
	if out := k.mustRun("serve", "logs", "adopt", fmt.Sprint(st.Replicas[0].ID)); !strings.Contains(out, "ferry replica-sim: serving model") {
		t.Errorf("serve logs of a pod:\n%s", out)
	}

	k.mustRun("serve", "down", "adopt", "-y")
	eventually(t, 60*time.Second, "serve down leaves no pod", func() (bool, string) {
		n := len(k.pods("adopt"))
		return n == 0, fmt.Sprintf("%d pods", n)
	})
	if b, err := os.ReadFile(filepath.Join(k.home, "controller.log")); err == nil && strings.Contains(string(b), "panic") {
		t.Errorf("controller log has a panic:\n%s", lastLines(string(b), 40))
	}
}
