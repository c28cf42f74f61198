package testcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// Labels and resources of the GPU nodes AddGPUNode creates, named as NVIDIA's GPU operator
// (gpu-feature-discovery and the device plugin) names them on a real cluster.
const (
	GPUResource     corev1.ResourceName = "nvidia.com/gpu"
	GPUProductLabel string              = "nvidia.com/gpu.product"
	GPUCountLabel   string              = "nvidia.com/gpu.count"
)

// AddGPUNode creates a node that kwok runs, with gpus nvidia.com/gpu of the given product (e.g.
// "NVIDIA-A100-SXM4-40GB"), 32 CPUs, 256Gi of memory and room for 110 pods, and waits until it is
// Ready. It is labelled type=kwok, nvidia.com/gpu.product and nvidia.com/gpu.count.
func (c *Cluster) AddGPUNode(ctx context.Context, name, product string, gpus int) error {
	return c.addNode(ctx, name, product, gpus, nil, corev1.ResourceList{
		GPUResource: *resource.NewQuantity(int64(gpus), resource.DecimalSI),
	})
}

// HAMi's resources, annotation and default split (ANCHORS.md §3).
const (
	HAMiGPUMem           = "nvidia.com/gpumem"
	HAMiGPUMemPercentage = "nvidia.com/gpumem-percentage"
	HAMiGPUCores         = "nvidia.com/gpucores"
	HAMiRegister         = "hami.io/node-nvidia-register"
	// HAMiSplit is HAMi's default deviceSplitCount: nvidia.com/gpu counts this many slots per GPU.
	HAMiSplit = 10
)

// AddHAMiNode creates a GPU node as HAMi's device plugin presents one: gpus physical GPUs of
// memMiB each, registered in the hami.io/node-nvidia-register annotation (one JSON entry per
// GPU, UUID "GPU-<node>-<index>"), and nvidia.com/gpu allocatable in HAMiSplit slots per GPU.
// Unlike a real HAMi node, it also advertises nvidia.com/gpumem (MiB), gpumem-percentage and
// gpucores (100 per GPU) in allocatable, so that a plain kube-scheduler accounts for shares
// (HAMi's own extender does that accounting from the annotation instead).
func (c *Cluster) AddHAMiNode(ctx context.Context, name, product string, gpus, memMiB int) error {
	type device struct {
		ID      string `json:"id"`
		Index   int    `json:"index"`
		Count   int    `json:"count"`
		DevMem  int    `json:"devmem"`
		DevCore int    `json:"devcore"`
		Type    string `json:"type"`
		Numa    int    `json:"numa"`
		Mode    string `json:"mode"`
		Health  bool   `json:"health"`
	}
	devs := make([]device, gpus)
	for i := range devs {
		devs[i] = device{ID: HAMiUUID(name, i), Index: i, Count: HAMiSplit, DevMem: memMiB, DevCore: 100,
			Type: product, Mode: "hami-core", Health: true}
	}
	register, err := json.Marshal(devs)
	if err != nil {
		return err
	}
	q := func(v int) resource.Quantity { return *resource.NewQuantity(int64(v), resource.DecimalSI) }
	return c.addNode(ctx, name, product, gpus, map[string]string{HAMiRegister: string(register)}, corev1.ResourceList{
		GPUResource:          q(gpus * HAMiSplit),
		HAMiGPUMem:           q(gpus * memMiB),
		HAMiGPUMemPercentage: q(gpus * 100),
		HAMiGPUCores:         q(gpus * 100),
	})
}

// HAMiUUID is the UUID AddHAMiNode gives a node's GPU.
func HAMiUUID(node string, index int) string {
	return "GPU-" + node + "-" + strconv.Itoa(index)
}

// addNode creates a kwok node with the GPU labels, 32 CPUs, 256Gi of memory, room for 110 pods
// and the given GPU resources, and waits until it is Ready.
func (c *Cluster) addNode(ctx context.Context, name, product string, gpus int, annotations map[string]string, gpuResources corev1.ResourceList) error {
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	maps.Copy(resources, gpuResources)
	ann := map[string]string{KwokNodeAnnotation: "fake"}
	maps.Copy(ann, annotations)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: ann,
			Labels: map[string]string{
				"type":                   "kwok",
				"kubernetes.io/hostname": name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
				GPUProductLabel:          product,
				GPUCountLabel:            strconv.Itoa(gpus),
			},
		},
		// A node's status may be set on create (the kubelet registers that way); kwok keeps
		// the capacity it finds.
		Status: corev1.NodeStatus{Capacity: resources, Allocatable: resources.DeepCopy()},
	}
	if _, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	if err := c.waitNodeReady(ctx, name); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	return nil
}

// waitNodeReady watches the node until its Ready condition is True.
func (c *Cluster) waitNodeReady(ctx context.Context, name string) error {
	lw := cache.NewListWatchFromClient(c.client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll,
		fields.OneTermEqualSelector("metadata.name", name))
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, apierrors.NewNotFound(corev1.Resource("nodes"), name)
		}
		node, ok := ev.Object.(*corev1.Node)
		return ok && nodeReady(node), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Ready: %w", err)
	}
	return nil
}

func nodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// DeleteNode deletes a node and, standing in for the pod garbage collector this cluster does not
// run, the pods bound to it, as a cloud losing a machine would. A node that does not exist is
// not an error.
func (c *Cluster) DeleteNode(ctx context.Context, name string) error {
	err := c.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete node %s: %w", name, err)
	}
	pods, err := c.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String(),
	})
	if err != nil {
		return fmt.Errorf("list pods of node %s: %w", name, err)
	}
	now := int64(0)
	for _, pod := range pods.Items {
		err := c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &now})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s/%s of node %s: %w", pod.Namespace, pod.Name, name, err)
		}
	}
	return nil
}
