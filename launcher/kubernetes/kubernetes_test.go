package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// These tests run against a real API server, scheduler and kwok (internal/testcluster). Each
// test has its own namespace and its own GPU product, so that they share one cluster.

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		runHelper(mode, os.Args[1:]) // a job's program (jobs_test.go), not the tests
	}
	testcluster.Main(m)
}

var nsSeq atomic.Int64

// newProvider makes a namespace and a provider for it, through the cluster's kubeconfig unless
// opts names another (an APIProxy's).
func newProvider(t *testing.T, c *testcluster.Cluster, opts Options) *Provider {
	t.Helper()
	ns := "t" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-" + strconv.FormatInt(nsSeq.Add(1), 10)
	ctx := context.Background()
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client().CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	if opts.Kubeconfig == "" {
		opts.Kubeconfig = c.Kubeconfig()
	}
	opts.Context = c.Context()
	opts.Namespace = ns
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func gpuSpec(name, gpu string, count float64) launcher.Spec {
	return launcher.Spec{
		Name: name,
		Labels: map[string]string{
			launcher.LabelOwner: "true", launcher.LabelService: "svc", launcher.LabelVersion: "1",
			launcher.LabelReplicaID: strings.TrimPrefix(name, "svc-"),
		},
		Run:        "ferry replica-sim",
		Envs:       map[string]string{"HF_TOKEN": "hf_secret", "MODEL": "llama"},
		SecretEnvs: []string{"HF_TOKEN"},
		Port:       8000,
		Resources:  configs.Resources{Infra: "kubernetes", Accelerators: []configs.Accelerator{{Name: gpu, Count: count}}, CPUs: "4+"},
	}
}

// eventually waits for cond, observed through the provider's watch cache.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLaunchListTerminate(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "lt-a100-0", "NVIDIA-A100-SXM4-40GB", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{CostPerHour: 1.25})

	inst, err := p.Launch(ctx, gpuSpec("svc-1", "A100", 2))
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(inst.Endpoint)
	if err != nil {
		t.Fatalf("endpoint %q: %v", inst.Endpoint, err)
	}
	_, cidr, _ := net.ParseCIDR(c.CIDR())
	if port != "8000" || !cidr.Contains(net.ParseIP(host)) {
		t.Errorf("endpoint %s: want a pod IP in %s, port 8000", inst.Endpoint, c.CIDR())
	}
	if inst.Infra != "kubernetes/"+c.Context() || inst.PricePerHour != 1.25 || !strings.HasPrefix(inst.ID, inst.Infra+"/"+p.Namespace()+"/svc-1-") {
		t.Errorf("instance %+v: want infra, price and id from the provider", inst)
	}

	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := pod.Spec.Containers[0]
	if q := ctr.Resources.Limits[ResourceGPU]; q.Value() != 2 {
		t.Errorf("GPU limit %v, want 2", q.String())
	}
	if q := ctr.Resources.Requests[corev1.ResourceCPU]; q.String() != "4" {
		t.Errorf("cpu request %v, want 4", q.String())
	}
	if pod.Spec.NodeName != "lt-a100-0" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod on %q with restart policy %q", pod.Spec.NodeName, pod.Spec.RestartPolicy)
	}
	if got := describeAffinity(pod); got != "nvidia.com/gpu.product in (NVIDIA-A100-SXM4-40GB)" {
		t.Errorf("affinity %q", got)
	}
	if !strings.Contains(ctr.Command[2], "ferry replica-sim") || ctr.Image != DefaultImage {
		t.Errorf("container %v %q: want the task's run in bash, default image", ctr.Command, ctr.Image)
	}
	if pod.Labels[launcher.LabelService] != "svc" || pod.Labels[labelManagedBy] != "ferry" {
		t.Errorf("labels %v", pod.Labels)
	}
	// The secret is in a Secret the pod owns; the pod spec holds only a reference.
	raw, _ := json.Marshal(pod.Spec)
	if strings.Contains(string(raw), "hf_secret") || !strings.Contains(string(raw), `"value":"llama"`) {
		t.Errorf("pod spec %s: want MODEL inline and HF_TOKEN only by reference", raw)
	}
	sec, err := c.Client().CoreV1().Secrets(p.Namespace()).Get(ctx, secretName(inst.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(sec.Data["HF_TOKEN"]) != "hf_secret" || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != pod.UID {
		t.Errorf("secret %s: data %q, owners %+v; want the token, owned by the pod", sec.Name, sec.Data, sec.OwnerReferences)
	}

	// Listed by label, Running, from the watch cache.
	eventually(t, "the pod is listed Running", func() bool {
		got, err := p.List(ctx, map[string]string{launcher.LabelService: "svc"})
		return err == nil && len(got) == 1 && got[0].ID == inst.ID && got[0].State == launcher.StateRunning && got[0].Endpoint == inst.Endpoint
	})
	if got, err := p.List(ctx, map[string]string{launcher.LabelService: "other"}); err != nil || len(got) != 0 {
		t.Errorf("List(other) = %v, %v", got, err)
	}

	// A second provider (a restarted controller) adopts it by label.
	p2, err := New(Options{Kubeconfig: c.Kubeconfig(), Context: c.Context(), Namespace: p.Namespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if got, err := p2.List(ctx, map[string]string{launcher.LabelService: "svc"}); err != nil || len(got) != 1 || got[0].PricePerHour != 1.25 {
		t.Fatalf("restarted provider lists %v, %v; want the pod with its price", got, err)
	}

	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("second Terminate: %v, want nil for a pod already gone", err)
	}
	eventually(t, "the pod is gone", func() bool {
		_, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if _, err := c.Client().CoreV1().Secrets(p.Namespace()).Get(ctx, secretName(inst.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("secret after Terminate: %v, want it deleted", err)
	}
	eventually(t, "the pod leaves the list", func() bool {
		got, err := p.List(ctx, nil)
		return err == nil && len(got) == 0
	})
	if err := p.Terminate(ctx, "kubernetes/other/ns/x"); !errors.Is(err, launcher.ErrInvalid) {
		t.Errorf("Terminate(foreign id) = %v, want ErrInvalid", err)
	}
}

func TestUnschedulableIsNoCapacity(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "us-l40s-0", "NVIDIA-L40S", 2); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{ProvisionTimeout: 2 * time.Second})

	first, err := p.Launch(ctx, gpuSpec("svc-1", "L40S", 2))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.Launch(ctx, gpuSpec("svc-2", "L40S", 1))
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "Insufficient nvidia.com/gpu") {
		t.Fatalf("second launch on a full node: %v, want ErrNoCapacity with the scheduler's reason", err)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("gave up after %v, before the provision timeout", d)
	}
	// The unschedulable pod was deleted; only the first remains.
	eventually(t, "only the first pod remains", func() bool {
		pods, err := c.Client().CoreV1().Pods(p.Namespace()).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		live := 0
		for _, pod := range pods.Items {
			if pod.DeletionTimestamp == nil {
				live++
				if pod.Name != first.Name {
					return false
				}
			}
		}
		return live == 1
	})
	if secs, err := c.Client().CoreV1().Secrets(p.Namespace()).List(ctx, metav1.ListOptions{LabelSelector: "ferry.managed=true"}); err != nil || len(secs.Items) != 1 {
		t.Errorf("secrets after the failed launch: %v, %v; want only the first pod's", secs, err)
	}

	// No node has the GPU at all, or not that many per node: no capacity, without waiting.
	for _, tc := range []struct {
		gpu   string
		count float64
		want  string
	}{
		{"H200", 1, "no node has H200"},
		{"L40S", 3, "no node has 3 x L40S (largest: 2)"},
	} {
		start := time.Now()
		_, err := p.Launch(ctx, gpuSpec("svc-3", tc.gpu, tc.count))
		if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v x %s: %v, want ErrNoCapacity saying %q", tc.count, tc.gpu, err, tc.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%v x %s took %v; the node list answers at once", tc.count, tc.gpu, d)
		}
	}
}

func TestInvalidRequests(t *testing.T) {
	c := testcluster.Shared(t)
	p := newProvider(t, c, Options{})
	ctx := context.Background()
	// A fractional GPU is no longer invalid: it shares a GPU where HAMi runs
	// (TestGPUShareRefusedWithoutHAMi).
	badImage := gpuSpec("svc-2", "A100", 1)
	badImage.Resources.ImageID = "ami-123"
	badLabel := gpuSpec("svc-3", "A100", 1)
	badLabel.Labels[launcher.LabelService] = "not a label value!"
	for name, spec := range map[string]launcher.Spec{"image_id": badImage, "label": badLabel} {
		if _, err := p.Launch(ctx, spec); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestOfferings(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	for i := range 2 {
		if err := c.AddGPUNode(ctx, "of-t4-"+strconv.Itoa(i), "Tesla-T4", 4); err != nil {
			t.Fatal(err)
		}
	}
	p := newProvider(t, c, Options{CostPerHour: 0.5})
	if _, err := p.Launch(ctx, gpuSpec("svc-1", "T4", 3)); err != nil {
		t.Fatal(err)
	}
	offers, err := p.Offerings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var t4 *launcher.Offering
	for i := range offers {
		if offers[i].Accelerator == "T4" {
			t4 = &offers[i]
		}
	}
	if t4 == nil {
		t.Fatalf("offerings %+v: no T4", offers)
	}
	if t4.AcceleratorCount != 4 || t4.Total != 8 || t4.Free != 5 || t4.PricePerHour != 0.5 || t4.VCPUs != 32 {
		t.Errorf("T4 offering %+v, want 4 per node, 8 total, 5 free, $0.5, 32 vCPUs", *t4)
	}
	if err := p.Check(ctx); err != nil {
		t.Errorf("Check: %v", err)
	}
}

func TestPreemptedPod(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "pr-a10g-0", "NVIDIA-A10G", 1); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	inst, err := p.Launch(ctx, gpuSpec("svc-1", "A10G", 1))
	if err != nil {
		t.Fatal(err)
	}
	// What the kubelet writes when it evicts a pod under node pressure.
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase, pod.Status.Reason, pod.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
	if _, err := c.Client().CoreV1().Pods(p.Namespace()).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pod reads as preempted", func() bool {
		got, err := p.List(ctx, nil)
		return err == nil && len(got) == 1 && got[0].State == launcher.StatePreempted && strings.Contains(got[0].Reason, "low on resource")
	})
}

func TestUnreachableCluster(t *testing.T) {
	c := testcluster.Shared(t)
	cfg := c.RESTConfig()
	cfg.Host = "https://127.0.0.1:1" // nothing listens there
	cfg.Timeout = 2 * time.Second
	p, err := New(Options{RESTConfig: cfg, Context: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.Check(ctx); err == nil || !strings.Contains(err.Error(), "kubernetes/gone") {
		t.Errorf("Check = %v, want an error naming the infra", err)
	}
	if _, err := p.List(ctx, nil); err == nil {
		t.Error("List on an unreachable cluster: want an error, not an empty list")
	}
}
