package testcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// TestControllerManagerRunsDeployments starts a cluster of its own with the controller manager:
// a Deployment's pods land on a kwok node, run (as replica-sims under the kubelet stand-in) and
// make the Deployment available; a scale through the scale subresource (what an HPA writes)
// adds a pod, and deleting the Deployment lets the garbage collector remove its ReplicaSet and
// pods.
func TestControllerManagerRunsDeployments(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := Start(ctx, Options{ControllerManager: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop) // after the kubelet stand-in's cleanup, registered later
	t.Logf("cluster with controller manager up in %v", time.Since(began).Round(time.Millisecond))
	if err := c.AddGPUNode(ctx, "cm-node", "NVIDIA-L4", 0); err != nil {
		t.Fatal(err)
	}
	k := StartKubelet(t, c, KubeletOptions{FerryBin: ferryBin})

	ns := createNamespace(ctx, t, c)
	deployments := c.Client().AppsV1().Deployments(ns)
	podLabels := map[string]string{"app": "sim"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sim"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: podLabels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "replica", Image: "ferry/replica-sim",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
				}}},
			},
		},
	}
	if _, err := deployments.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	waitDeployment(ctx, t, c, k, ns, "sim", 2)
	t.Logf("2 pods available and running %v after the Deployment's create", time.Since(created).Round(time.Millisecond))

	scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "sim", Namespace: ns}, Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
	if _, err := deployments.UpdateScale(ctx, "sim", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitDeployment(ctx, t, c, k, ns, "sim", 3)

	if err := deployments.Delete(ctx, "sim", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	waitState(ctx, t, "the garbage collector to delete the Deployment's ReplicaSet and pods", func() (bool, string) {
		rs, err1 := c.Client().AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		pods, err2 := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err1 != nil || err2 != nil {
			return false, fmt.Sprint(err1, err2)
		}
		return len(rs.Items) == 0 && len(pods.Items) == 0, fmt.Sprintf("%d ReplicaSets, %d pods", len(rs.Items), len(pods.Items))
	})
}

// waitDeployment waits until the Deployment has want available replicas and the kubelet
// stand-in runs a process for exactly want of its pods.
func waitDeployment(ctx context.Context, t *testing.T, c *Cluster, k *Kubelet, ns, name string, want int) {
	t.Helper()
	waitState(ctx, t, fmt.Sprintf("Deployment %s/%s to run %d pods", ns, name, want), func() (bool, string) {
		dep, err := c.Client().AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		selector := labels.SelectorFromSet(dep.Spec.Selector.MatchLabels).String()
		pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		running := slices.DeleteFunc(k.Running(), func(key string) bool { return !strings.HasPrefix(key, ns+"/") })
		state := fmt.Sprintf("available %d, pods %d, processes %v", dep.Status.AvailableReplicas, len(pods.Items), running)
		return int(dep.Status.AvailableReplicas) == want && len(pods.Items) == want && len(running) == want, state
	})
}

// waitState polls cond every 100 ms until it holds, failing the test with cond's last state when
// ctx ends.
func waitState(ctx context.Context, t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s: %s", what, state)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
