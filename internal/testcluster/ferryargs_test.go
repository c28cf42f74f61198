package testcluster

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDesiredReplicaFerryArgs: a pod annotated with FerryArgsAnnotation runs that ferry command,
// its $(POD_IP) filled in, with the container's literal env; without the annotation it is a
// replica-sim as before.
func TestDesiredReplicaFerryArgs(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{KwokNodeAnnotation: "fake"}}}
	pod := gpuPod("p", 0, "")
	pod.Annotations = map[string]string{FerryArgsAnnotation: "proxy --attach-all --listen $(POD_IP):8000  --metrics-listen $(POD_IP):9465"}
	pod.Spec.NodeName = "n"
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "FERRY_HOME", Value: "/tmp/home"}}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.100.0.9"}

	got, run := desiredReplica(pod, node)
	wantArgs := []string{"proxy", "--attach-all", "--listen", "127.100.0.9:8000", "--metrics-listen", "127.100.0.9:9465"}
	if !run || !slices.Equal(got.args, wantArgs) || !slices.Equal(got.env, []string{"FERRY_HOME=/tmp/home"}) {
		t.Errorf("desiredReplica = %q %q, %v; want %q [FERRY_HOME=/tmp/home], true", got.args, got.env, run, wantArgs)
	}

	delete(pod.Annotations, FerryArgsAnnotation)
	if got, _ := desiredReplica(pod, node); got.args[0] != "replica-sim" {
		t.Errorf("without the annotation: %q, want a replica-sim", got.args)
	}
}
