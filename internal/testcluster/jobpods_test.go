package testcluster

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHostPath covers rewriting environment values under a mount path to the host directory.
func TestHostPath(t *testing.T) {
	mounts := map[string]string{"/ckpt": "/tmp/c/vol", "/etc/ferry/podinfo": "/tmp/p/info", "/etc/ferry": "/tmp/p/etc"}
	tests := map[string]struct{ value, want string }{
		"the mount itself":        {"/ckpt", "/tmp/c/vol"},
		"under the mount":         {"/ckpt/step-3/model.pt", "/tmp/c/vol/step-3/model.pt"},
		"deepest mount wins":      {"/etc/ferry/podinfo/node-ips", "/tmp/p/info/node-ips"},
		"shallower mount":         {"/etc/ferry/other", "/tmp/p/etc/other"},
		"a name that only starts": {"/ckpt2", "/ckpt2"},
		"not a path":              {"llama", "llama"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := hostPath(tt.value, mounts); got != tt.want {
				t.Errorf("hostPath(%q) = %q, want %q", tt.value, got, tt.want)
			}
		})
	}
}

// TestLastLines covers the kubelet's tailLines.
func TestLastLines(t *testing.T) {
	tests := map[string]struct {
		data string
		n    int
		want string
	}{
		"all":                 {"a\nb\nc\n", -1, "a\nb\nc\n"},
		"none":                {"a\nb\nc\n", 0, ""},
		"two":                 {"a\nb\nc\n", 2, "b\nc\n"},
		"more than there are": {"a\nb\n", 5, "a\nb\n"},
		"unterminated last":   {"a\nb\nc", 1, "c"},
		"exactly all of them": {"a\nb\n", 2, "a\nb\n"},
		"empty":               {"", 3, ""},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := string(lastLines([]byte(tt.data), tt.n)); got != tt.want {
				t.Errorf("lastLines(%q, %d) = %q, want %q", tt.data, tt.n, got, tt.want)
			}
		})
	}
}

// TestFieldValue covers what the downward API gives for the fields job pods use.
func TestFieldValue(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "p", Namespace: "ns", UID: "u-1",
			Labels:      map[string]string{"ferry.job": "train"},
			Annotations: map[string]string{"ferry.dev/node-ips": "127.0.0.2\n127.0.0.3", "b": `say "hi"`},
		},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{PodIP: "127.0.0.2"},
	}
	tests := map[string]string{
		"metadata.annotations['ferry.dev/node-ips']": "127.0.0.2\n127.0.0.3",
		"metadata.annotations['missing']":            "",
		"metadata.labels['ferry.job']":               "train",
		"metadata.annotations":                       "b=\"say \\\"hi\\\"\"\nferry.dev/node-ips=\"127.0.0.2\\n127.0.0.3\"",
		"metadata.name":                              "p",
		"metadata.uid":                               "u-1",
		"spec.nodeName":                              "n1",
		"status.podIP":                               "127.0.0.2",
		"spec.unknown":                               "",
	}
	for path, want := range tests {
		if got := fieldValue(pod, path); got != want {
			t.Errorf("fieldValue(%s) = %q, want %q", path, got, want)
		}
	}
}

// TestSetTerminated covers the status a job pod gets when its process ends.
func TestSetTerminated(t *testing.T) {
	started := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	now := time.Date(2026, 1, 1, 0, 5, 0, 0, time.UTC)
	pod := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "replica", Image: "ubuntu"}}},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "replica", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
			}},
		},
	}
	setTerminated(pod, 7, "Error", "", now)
	if pod.Status.Phase != corev1.PodFailed || pod.Status.Conditions[0].Status != corev1.ConditionFalse {
		t.Errorf("phase %s, ready %s; want Failed, not ready", pod.Status.Phase, pod.Status.Conditions[0].Status)
	}
	want := &corev1.ContainerStateTerminated{ExitCode: 7, Reason: "Error", StartedAt: started, FinishedAt: metav1.NewTime(now)}
	if diff := cmp.Diff(want, pod.Status.ContainerStatuses[0].State.Terminated); diff != "" || pod.Status.ContainerStatuses[0].State.Running != nil {
		t.Errorf("terminated state (-want +got):\n%s", diff)
	}
	setTerminated(pod, 0, "Completed", "", now)
	if pod.Status.Phase != corev1.PodSucceeded {
		t.Errorf("exit 0: phase %s, want Succeeded", pod.Status.Phase)
	}
}

// TestExitStatus covers exit codes as a container runtime reports them.
func TestExitStatus(t *testing.T) {
	for script, want := range map[string]int{"exit 0": 0, "exit 7": 7, "kill -TERM $$": 143, "kill -KILL $$": 137} {
		err := exec.Command("bash", "-c", script).Run()
		if got := exitStatus(err); got != want {
			t.Errorf("%s: exitStatus = %d, want %d (%v)", script, got, want, err)
		}
	}
	if got := exitStatus(errors.New("not started")); got != 128 {
		t.Errorf("exitStatus(other error) = %d, want 128", got)
	}
}
