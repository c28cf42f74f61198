package testcluster

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestKubeletServesReplicasInProcess runs the stand-in with InProcessReplicas on the real API
// server: a pod's replica-sim answers on the pod's IP with the model its REPLICA_SIM_ARGS name,
// the pod's container env reaches its defaults as it would a process's, a pod whose arguments
// the command would reject runs nothing and says why in its log, and a deleted pod's replica
// stops listening.
func TestKubeletServesReplicasInProcess(t *testing.T) {
	c := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := c.Client()
	if err := c.AddGPUNode(ctx, "inproc-0", "NVIDIA-L4", 2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteNode(context.Background(), "inproc-0") })
	kubelet := StartKubelet(t, c, KubeletOptions{InProcessReplicas: true})
	ns := createNamespace(ctx, t, c)

	sim := gpuPod("sim", 1, "--model inproc-model")
	// Read by replica-sim's defaults, not its flags: the env must reach them as it would reach
	// the process.
	sim.Spec.Containers[0].Env = append(sim.Spec.Containers[0].Env, corev1.EnvVar{Name: "FERRY_LORA_MODULES", Value: "inproc-adapter=/nowhere"})
	pod, err := client.CoreV1().Pods(ns).Create(ctx, sim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod = waitPod(ctx, t, c, ns, pod.Name, "Running with an IP", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	addr := net.JoinHostPort(pod.Status.PodIP, "8000")
	models := waitHTTP(ctx, t, kubelet, ns, pod.Name, "http://"+addr+"/v1/models")
	if !strings.Contains(models, `"inproc-model"`) || !strings.Contains(models, `"inproc-adapter"`) {
		t.Errorf("/v1/models = %s, want the model from %s and the adapter from FERRY_LORA_MODULES", models, ReplicaSimArgsEnv)
	}
	if got, want := kubelet.Running(), []string{ns + "/sim"}; !slices.Equal(got, want) {
		t.Errorf("Running() = %v, want %v", got, want)
	}

	bad, err := client.CoreV1().Pods(ns).Create(ctx, gpuPod("bad", 1, "--no-such-flag"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPod(ctx, t, c, ns, bad.Name, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	for {
		log, _ := os.ReadFile(kubelet.LogPath(ns, bad.Name))
		if strings.Contains(string(log), "unknown flag: --no-such-flag") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("log of pod bad: %q, want the flag error", log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if got, want := kubelet.Running(), []string{ns + "/sim"}; !slices.Equal(got, want) {
		t.Errorf("Running() with a replica that failed to start = %v, want %v", got, want)
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
	if err := client.CoreV1().Pods(ns).Delete(ctx, bad.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodGone(ctx, t, c, ns, bad.Name)
}
