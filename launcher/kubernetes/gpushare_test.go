package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// The placement tests run Ferry's pods through a second real kube-scheduler standing in for
// HAMi's (testcluster.StartSharingScheduler): profile "hami-scheduler" binpacks nodes on the
// HAMi resources, "hami-scheduler-spread" spreads them. They prove that Ferry's pods carry what
// HAMi reads and that a scheduler accounting for those resources places them as asked; they
// cannot prove HAMi's per-GPU choices or its memory isolation.

const spreadScheduler = "hami-scheduler-spread"

var sharingScheduler struct {
	once sync.Once
	err  error
}

// withSharingScheduler starts the cluster's sharing scheduler once per test binary.
func withSharingScheduler(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	sharingScheduler.once.Do(func() {
		sharingScheduler.err = c.StartSharingScheduler(context.Background(), map[string]string{
			DefaultGPUSchedulerName: testcluster.Binpack,
			spreadScheduler:         testcluster.Spread,
		})
	})
	if sharingScheduler.err != nil {
		t.Fatalf("start the sharing scheduler: %v", sharingScheduler.err)
	}
}

// addHAMiNodes adds HAMi nodes of one GPU each, deleted (with their pods) when the test ends.
func addHAMiNodes(t *testing.T, c *testcluster.Cluster, product string, memMiB int, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := c.AddHAMiNode(context.Background(), n, product, 1, memMiB); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.DeleteNode(context.Background(), n) })
	}
}

func shareSpec(name, gpu string, count float64, share *configs.GPUShare) launcher.Spec {
	spec := gpuSpec(name, gpu, count)
	spec.Resources.GPUShare = share
	return spec
}

// launchAll launches the specs one after another and returns each pod as the API server has it.
func launchAll(t *testing.T, p *Provider, specs ...launcher.Spec) []*corev1.Pod {
	t.Helper()
	var pods []*corev1.Pod
	for _, spec := range specs {
		inst, err := p.Launch(context.Background(), spec)
		if err != nil {
			t.Fatalf("launch %s: %v", spec.Name, err)
		}
		pod, err := p.client.CoreV1().Pods(p.Namespace()).Get(context.Background(), inst.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
	}
	return pods
}

func nodesOf(pods []*corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, pod := range pods {
		out[i] = pod.Spec.NodeName
	}
	return out
}

// The no-sharing test runs first in this package (files run in name order, accelerators_test
// adds no nodes): the cluster then has GPU nodes, none of them HAMi's.
func TestGPUShareRefusedWithoutHAMi(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "gs-plain-l4", "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteNode(context.Background(), "gs-plain-l4") })
	nodes, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if _, ok := nodeShare(&n); ok {
			t.Fatalf("node %s shares GPUs: this test needs a cluster without HAMi nodes", n.Name)
		}
	}
	p := newProvider(t, c, Options{ProvisionTimeout: 3 * time.Second})

	_, err = p.Launch(ctx, gpuSpec("svc-1", "L4", 0.5))
	want := p.Infra() + " cannot share GPUs: no node advertises HAMi (the hami.io/node-nvidia-register annotation, or nvidia.com/gpumem and nvidia.com/gpucores allocatable)"
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Launch L4:0.5 = %v\nwant ErrNoCapacity saying %q", err, want)
	}

	// The dry run plans from the offerings, and names the context and why.
	offers, err := p.Offerings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = optimizer.Plan(configs.Resources{Infra: "kubernetes", Accelerators: []configs.Accelerator{{Name: "L4", Count: 0.5}}},
		[]optimizer.Infra{{Name: p.Infra(), Kind: optimizer.Kubernetes, Offerings: offers}})
	wantPlan := p.Infra() + " cannot share L4 GPUs: no L4 node advertises HAMi"
	if err == nil || !strings.Contains(err.Error(), wantPlan) {
		t.Fatalf("Plan L4:0.5 = %v\nwant an error saying %q", err, wantPlan)
	}
}

func TestGPUShareBinpack(t *testing.T) {
	c := testcluster.Shared(t)
	withSharingScheduler(t, c)
	addHAMiNodes(t, c, "NVIDIA-H200", 80000, "gsb-0", "gsb-1", "gsb-2", "gsb-3")
	p := newProvider(t, c, Options{})

	share := &configs.GPUShare{NodePolicy: configs.PolicyBinpack, GPUPolicy: configs.PolicySpread}
	var specs []launcher.Spec
	for i := range 4 {
		specs = append(specs, shareSpec(fmt.Sprintf("svc-%d", i+1), "H200", 0.25, share))
	}
	pods := launchAll(t, p, specs...)
	for _, pod := range pods {
		checkSharedPod(t, pod, DefaultGPUSchedulerName, map[corev1.ResourceName]int64{
			ResourceGPU: 1, ResourceGPUMemPercentage: 25, ResourceGPUCores: 25,
		}, map[string]string{AnnotationNodePolicy: "binpack", AnnotationGPUPolicy: "spread"})
	}
	if got := nodesOf(pods); got[0] == "" || got[1] != got[0] || got[2] != got[0] || got[3] != got[0] {
		t.Fatalf("binpack: four quarter-GPU pods on nodes %v, want one node", got)
	}

	// show-gpus: that node's GPU is fully taken, the others are free.
	shares, err := p.SharedCapacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var want []NodeShare
	for _, n := range []string{"gsb-0", "gsb-1", "gsb-2", "gsb-3"} {
		ns := NodeShare{Node: n, Accelerator: "H200", GPUs: 1, MemoryMiB: 80000, MemoryFree: 80000, Cores: 100, CoresFree: 100}
		if n == pods[0].Spec.NodeName {
			ns.MemoryFree, ns.CoresFree, ns.Pods = 0, 0, 4
		}
		want = append(want, ns)
	}
	if diff := cmp.Diff(want, onNodes(shares, "gsb-")); diff != "" {
		t.Errorf("SharedCapacity (-want +got):\n%s", diff)
	}
}

func onNodes(shares []NodeShare, prefix string) []NodeShare {
	var out []NodeShare
	for _, s := range shares {
		if strings.HasPrefix(s.Node, prefix) {
			out = append(out, s)
		}
	}
	return out
}

func TestGPUShareSpread(t *testing.T) {
	c := testcluster.Shared(t)
	withSharingScheduler(t, c)
	addHAMiNodes(t, c, "NVIDIA-H200", 80000, "gss-0", "gss-1", "gss-2", "gss-3")
	p := newProvider(t, c, Options{GPUSchedulerName: spreadScheduler})

	share := &configs.GPUShare{MemoryMiB: 3000, Cores: 25, NodePolicy: configs.PolicySpread}
	var specs []launcher.Spec
	for i := range 4 {
		specs = append(specs, shareSpec(fmt.Sprintf("svc-%d", i+1), "H200", 1, share))
	}
	pods := launchAll(t, p, specs...)
	seen := map[string]bool{}
	for _, pod := range pods {
		checkSharedPod(t, pod, spreadScheduler, map[corev1.ResourceName]int64{
			ResourceGPU: 1, ResourceGPUMem: 3000, ResourceGPUCores: 25,
		}, map[string]string{AnnotationNodePolicy: "spread"})
		seen[pod.Spec.NodeName] = true
	}
	if len(seen) != 4 || seen[""] {
		t.Fatalf("spread: four pods on nodes %v, want four different nodes", nodesOf(pods))
	}
}

func TestGPUSharePinnedType(t *testing.T) {
	c := testcluster.Shared(t)
	withSharingScheduler(t, c)
	addHAMiNodes(t, c, "NVIDIA-A100-SXM4-40GB", 40960, "gsp-sxm")
	addHAMiNodes(t, c, "NVIDIA-A100-PCIE-40GB", 40960, "gsp-pcie")
	// Spread would use both nodes: the pin alone keeps the pods on one.
	p := newProvider(t, c, Options{GPUSchedulerName: spreadScheduler, ProvisionTimeout: 3 * time.Second})

	pin := &configs.GPUShare{UseTypes: []string{"PCIE"}}
	var specs []launcher.Spec
	for i := range 4 {
		specs = append(specs, shareSpec(fmt.Sprintf("svc-%d", i+1), "A100", 0.25, pin))
	}
	pods := launchAll(t, p, specs...)
	for _, pod := range pods {
		checkSharedPod(t, pod, spreadScheduler, nil, map[string]string{AnnotationUseGPUType: "PCIE"})
		if pod.Spec.NodeName != "gsp-pcie" {
			t.Errorf("pod pinned to PCIE on %s", pod.Spec.NodeName)
		}
	}
	// The PCIE card is full; the SXM one has room, and the pinned pod still does not go there.
	_, err := p.Launch(context.Background(), shareSpec("svc-5", "A100", 0.25, pin))
	if !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("fifth pinned quarter: %v, want ErrNoCapacity (the pinned type is full)", err)
	}

	avoid := launchAll(t, p, shareSpec("svc-6", "A100", 0.25, &configs.GPUShare{AvoidTypes: []string{"pcie"}}))[0]
	checkSharedPod(t, avoid, spreadScheduler, nil, map[string]string{AnnotationNoUseGPUType: "pcie"})
	uuid := testcluster.HAMiUUID("gsp-sxm", 0)
	byUUID := launchAll(t, p, shareSpec("svc-7", "A100", 0.25, &configs.GPUShare{UseUUIDs: []string{uuid}}))[0]
	checkSharedPod(t, byUUID, spreadScheduler, nil, map[string]string{AnnotationUseGPUUUID: uuid})
	if avoid.Spec.NodeName != "gsp-sxm" || byUUID.Spec.NodeName != "gsp-sxm" {
		t.Errorf("avoiding PCIE landed on %s, pinning the SXM GPU's UUID on %s; want gsp-sxm for both", avoid.Spec.NodeName, byUUID.Spec.NodeName)
	}

	// A whole GPU with a type pin is no share: the default scheduler, the pin as node affinity
	// (other tests' SXM A100 nodes are left out) and as HAMi's annotation.
	whole := launchAll(t, p, shareSpec("svc-8", "A100", 1, pin))[0]
	checkSharedPod(t, whole, corev1.DefaultSchedulerName, map[corev1.ResourceName]int64{ResourceGPU: 1}, map[string]string{AnnotationUseGPUType: "PCIE"})
	if _, ok := whole.Spec.Containers[0].Resources.Limits[ResourceGPUCores]; ok || whole.Spec.NodeName != "gsp-pcie" {
		t.Errorf("whole pinned GPU on %s with limits %v; want gsp-pcie and no share", whole.Spec.NodeName, whole.Spec.Containers[0].Resources.Limits)
	}

	// A pin no node passes is refused before a pod is made, shared or whole.
	nowhere := &configs.GPUShare{UseTypes: []string{"SXM5"}}
	for _, count := range []float64{0.25, 1} {
		_, err := p.Launch(context.Background(), shareSpec("svc-9", "A100", count, nowhere))
		if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "passes gpu_share's type and UUID pins") {
			t.Errorf("A100:%v pinned to SXM5: %v, want ErrNoCapacity naming the pins", count, err)
		}
	}
}

// checkSharedPod checks the scheduler, the requests (equal to the limits) and the annotations
// of a pod that shares a GPU.
func checkSharedPod(t *testing.T, pod *corev1.Pod, scheduler string, want map[corev1.ResourceName]int64, annotations map[string]string) {
	t.Helper()
	if pod.Spec.SchedulerName != scheduler {
		t.Errorf("pod %s: schedulerName %q, want %q", pod.Name, pod.Spec.SchedulerName, scheduler)
	}
	res := pod.Spec.Containers[0].Resources
	for name, v := range want {
		req, lim := res.Requests[name], res.Limits[name]
		if req.Value() != v || lim.Value() != v {
			t.Errorf("pod %s: %s request %s, limit %s; want %d", pod.Name, name, req.String(), lim.String(), v)
		}
	}
	for k, v := range annotations {
		if pod.Annotations[k] != v {
			t.Errorf("pod %s: annotation %s=%q, want %q", pod.Name, k, pod.Annotations[k], v)
		}
	}
}

func TestNodeShare(t *testing.T) {
	qty := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
	node := func(ann map[string]string, labels map[string]string, alloc corev1.ResourceList) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: ann, Labels: labels}, Status: corev1.NodeStatus{Allocatable: alloc}}
	}
	register := `[{"id":"GPU-a","index":0,"count":10,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","health":true},` +
		`{"id":"GPU-b","index":1,"count":10,"devmem":40960,"devcore":100,"type":"NVIDIA-A100-SXM4-40GB","health":true}]`
	tests := map[string]struct {
		n         *corev1.Node
		want      shareNode
		wantOK    bool
		wantCount int64 // nodeGPU's count: physical GPUs on a sharing node
	}{
		"HAMi's register annotation": {
			n: node(map[string]string{AnnotationHAMiRegister: register}, map[string]string{LabelGPUProduct: "NVIDIA-A100-SXM4-40GB"},
				corev1.ResourceList{ResourceGPU: qty(20)}),
			want:   shareNode{devices: 2, memMiB: 81920, cores: 200, uuids: []string{"GPU-a", "GPU-b"}, types: []string{"NVIDIA-A100-SXM4-40GB"}, register: true},
			wantOK: true, wantCount: 2,
		},
		"allocatable alone, count from the label": {
			n: node(nil, map[string]string{LabelGPUProduct: "NVIDIA-L4", LabelGPUCount: "4"},
				corev1.ResourceList{ResourceGPU: qty(40), ResourceGPUMem: qty(4 * 23034), ResourceGPUCores: qty(400)}),
			want:   shareNode{devices: 4, memMiB: 4 * 23034, cores: 400},
			wantOK: true, wantCount: 4,
		},
		"a garbled annotation falls back to allocatable": {
			n: node(map[string]string{AnnotationHAMiRegister: "GPU-a,10,40960,100,A100,0,true:"}, map[string]string{LabelGPUProduct: "NVIDIA-L4"},
				corev1.ResourceList{ResourceGPU: qty(10), ResourceGPUCores: qty(100)}),
			want:   shareNode{devices: 1, cores: 100},
			wantOK: true, wantCount: 1,
		},
		"a plain GPU node does not share": {
			n:         node(nil, map[string]string{LabelGPUProduct: "NVIDIA-L4"}, corev1.ResourceList{ResourceGPU: qty(8)}),
			wantCount: 8,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := nodeShare(tc.n)
			if ok != tc.wantOK {
				t.Fatalf("nodeShare ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(shareNode{})); diff != "" {
				t.Errorf("nodeShare (-want +got):\n%s", diff)
			}
			if _, _, _, count := nodeGPU(tc.n); count != tc.wantCount {
				t.Errorf("nodeGPU count %d, want %d", count, tc.wantCount)
			}
		})
	}
}

func TestPodShare(t *testing.T) {
	qty := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
	pod := func(limits corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: limits}}}}}
	}
	tests := map[string]struct {
		pod             *corev1.Pod
		wantMem, wantCo int64
		wantUses        bool
	}{
		"MiB and cores, two GPUs": {pod: pod(corev1.ResourceList{ResourceGPU: qty(2), ResourceGPUMem: qty(3000), ResourceGPUCores: qty(30)}),
			wantMem: 6000, wantCo: 60, wantUses: true},
		"a percentage of a 40960 MiB GPU": {pod: pod(corev1.ResourceList{ResourceGPU: qty(1), ResourceGPUMemPercentage: qty(25), ResourceGPUCores: qty(25)}),
			wantMem: 10240, wantCo: 25, wantUses: true},
		"memory only reserves no cores": {pod: pod(corev1.ResourceList{ResourceGPU: qty(1), ResourceGPUMem: qty(1000)}),
			wantMem: 1000, wantUses: true},
		"a whole GPU takes all of it": {pod: pod(corev1.ResourceList{ResourceGPU: qty(1)}),
			wantMem: 40960, wantCo: 100, wantUses: true},
		"no GPU": {pod: pod(corev1.ResourceList{corev1.ResourceCPU: qty(2)})},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			mem, cores, uses := podShare(tc.pod, 40960)
			if mem != tc.wantMem || cores != tc.wantCo || uses != tc.wantUses {
				t.Errorf("podShare = %d MiB, %d%% cores, %v; want %d, %d, %v", mem, cores, uses, tc.wantMem, tc.wantCo, tc.wantUses)
			}
		})
	}
}
