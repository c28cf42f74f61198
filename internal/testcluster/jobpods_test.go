package testcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ferryserve/ferry/launcher"
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

// TestKubeletRunsJobPod runs a job pod through the stand-in: its environment from literals, a
// ConfigMap, a Secret (envFrom) and the downward API, a mount path rewritten to the host, secret
// volumes with a kubelet's file modes (0644 by default, defaultMode and items' paths), a
// downwardAPI file that follows an annotation changed while it runs, its exit code in the pod's
// status, and its log through the API server.
func TestKubeletRunsJobPod(t *testing.T) {
	c := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := c.Client()
	if err := c.AddGPUNode(ctx, "job-node", "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteNode(context.Background(), "job-node") })
	kubelet := StartKubelet(t, c, KubeletOptions{})
	ns := createNamespace(ctx, t, c)
	if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"A": "from-cm"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "sec"}, StringData: map[string]string{"B": "from-secret"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := gpuPod("job", 1, "")
	pod.Labels = map[string]string{launcher.LabelJob: "j"}
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	ownerRead := int32(0o400)
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "go", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['go']"}},
		}}}},
		{Name: "sec-all", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec"}}},
		{Name: "sec-items", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec",
			DefaultMode: &ownerRead, Items: []corev1.KeyToPath{{Key: "B", Path: "sub/b"}}}}},
	}
	ctr := &pod.Spec.Containers[0]
	ctr.Command = []string{"/bin/bash", "-c", `
echo "A=$A B=$S_B name=$MY_NAME ip=$MY_IP host=$FERRY_HOST"
echo "data=$DATA"
echo "secret files: $(stat -c %a "$SEC_ALL/B") $(stat -c %a "$SEC_ITEMS/sub/b") $(cat "$SEC_ITEMS/sub/b")"
until [ "$(cat "$INFO/go" 2>/dev/null)" = yes ]; do sleep 0.05; done
echo "told to go"
exit 3
`}
	ctr.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "info", MountPath: "/info"},
		{Name: "sec-all", MountPath: "/sec-all"}, {Name: "sec-items", MountPath: "/sec-items"}}
	ctr.EnvFrom = []corev1.EnvFromSource{{Prefix: "S_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}}}}
	ctr.Env = []corev1.EnvVar{
		{Name: "A", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "A"}}},
		{Name: "MY_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "MY_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "DATA", Value: "/data/sub"},
		{Name: "INFO", Value: "/info"},
		{Name: "SEC_ALL", Value: "/sec-all"},
		{Name: "SEC_ITEMS", Value: "/sec-items"},
	}
	pod, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod = waitPod(ctx, t, c, ns, pod.Name, "Running with an IP", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
	})
	ip := pod.Status.PodIP
	want := fmt.Sprintf("A=from-cm B=from-secret name=job ip=%s host=%s\ndata=%s/sub\nsecret files: 644 400 from-secret\n", ip, ip, filepath.Join(c.Dir(), "kubelet", "pods", string(pod.UID), "volumes", "data"))
	waitFor(ctx, t, "the job's first lines", func() bool {
		data, _ := os.ReadFile(kubelet.LogPath(ns, "job"))
		return strings.Contains(string(data), want)
	})

	patch := []byte(`{"metadata":{"annotations":{"go":"yes"}}}`)
	if _, err := client.CoreV1().Pods(ns).Patch(ctx, "job", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pod = waitPod(ctx, t, c, ns, "job", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if term := pod.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 3 || term.Reason != "Error" {
		t.Errorf("container state %+v, want terminated with exit code 3", pod.Status.ContainerStatuses[0].State)
	}
	tail := int64(1)
	logs, err := client.CoreV1().Pods(ns).GetLogs("job", &corev1.PodLogOptions{TailLines: &tail}).DoRaw(ctx)
	if err != nil || string(logs) != "told to go\n" {
		t.Errorf("last log line through the API server: %q, %v", logs, err)
	}
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
