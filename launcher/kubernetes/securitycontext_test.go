package kubernetes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
)

// enforcePodSecurity labels the provider's namespace so that the API server's Pod Security
// admission enforces level on every pod created there.
func enforcePodSecurity(t *testing.T, c *testcluster.Cluster, ns, level string) {
	t.Helper()
	ctx := context.Background()
	patch := `{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"` + level + `","pod-security.kubernetes.io/enforce-version":"latest"}}}`
	if _, err := c.Client().CoreV1().Namespaces().Patch(ctx, ns, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podOf reads inst's pod from the API server.
func podOf(t *testing.T, c *testcluster.Cluster, p *Provider, inst launcher.Instance) *corev1.Pod {
	t.Helper()
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(context.Background(), inst.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// checkRestricted checks Ferry's defaults on a pod that is not privileged: no token, the
// runtime's seccomp profile, and in every container (init containers included) no privilege
// escalation and no capability but those in add.
func checkRestricted(t *testing.T, pod *corev1.Pod, add ...corev1.Capability) {
	t.Helper()
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false", a)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v, want seccompProfile RuntimeDefault", sc)
	}
	for _, ctr := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		sc := ctr.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s: security context %+v, want allowPrivilegeEscalation false and no privilege", ctr.Name, sc)
			continue
		}
		if c := sc.Capabilities; c == nil || !slices.Equal(c.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(c.Add, add) {
			t.Errorf("container %s: capabilities %+v, want drop ALL, add %v", ctr.Name, c, add)
		}
	}
}

// TestPodSecurityRestricted: in a namespace whose Pod Security admission enforces
// "restricted", the API server admits Ferry's pod (its files' init container included) once
// the task names a non-root user, and Ferry then sets runAsNonRoot; without one, the refusal
// names runAsNonRoot alone (no privilege escalation, capabilities or seccomp profile to fix),
// and says what to write. A task's pod_config asks for more: a capability it adds, the
// service-account token.
func TestPodSecurityRestricted(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "psa-t4-0", "Tesla-T4", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	enforcePodSecurity(t, c, p.Namespace(), "restricted")
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "model.txt"), []byte("tiny\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	_, err := p.Launch(ctx, gpuSpec("svc-1", "T4", 1))
	if err == nil {
		t.Fatal("a pod without a non-root user was admitted in a restricted namespace")
	}
	msg := err.Error()
	if !strings.Contains(msg, "runAsNonRoot != true") || !strings.Contains(msg, "securityContext: {runAsUser: 1000}") {
		t.Errorf("error %q: want the runAsNonRoot violation and what to write", msg)
	}
	for _, fixed := range []string{"allowPrivilegeEscalation", "unrestricted capabilities", "seccompProfile", "privileged"} {
		if strings.Contains(strings.SplitN(msg, " (the namespace's", 2)[0], fixed) {
			t.Errorf("error %q names %s, which Ferry's defaults should satisfy", msg, fixed)
		}
	}

	nonRoot := gpuSpec("svc-2", "T4", 1)
	nonRoot.Workdir = work // an init container unpacks it: restricted too
	nonRoot.Kubernetes = taskKubernetes(t, `run: x
config:
  kubernetes:
    pod_config:
      spec:
        securityContext: {runAsUser: 1000, runAsGroup: 1000}
`)
	inst, err := p.Launch(ctx, nonRoot)
	if err != nil {
		t.Fatalf("a non-root pod refused in a restricted namespace: %v", err)
	}
	pod := podOf(t, c, p, inst)
	checkRestricted(t, pod)
	if len(pod.Spec.InitContainers) != 1 {
		t.Errorf("init containers %d, want the files' one", len(pod.Spec.InitContainers))
	}
	for _, ctr := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		if sc := ctr.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("container %s: runAsNonRoot not set for a task whose user is 1000", ctr.Name)
		}
	}

	more := gpuSpec("svc-3", "T4", 1)
	more.Kubernetes = taskKubernetes(t, `run: x
config:
  kubernetes:
    pod_config:
      spec:
        automountServiceAccountToken: true
        containers:
        - securityContext: {runAsUser: 1000, capabilities: {add: [NET_BIND_SERVICE]}}
`)
	inst, err = p.Launch(ctx, more)
	if err != nil {
		t.Fatal(err)
	}
	pod = podOf(t, c, p, inst)
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || !*a {
		t.Errorf("automountServiceAccountToken %v, want the task's true", a)
	}
	pod.Spec.AutomountServiceAccountToken = new(false) // the rest as checked above
	checkRestricted(t, pod, "NET_BIND_SERVICE")
}

// TestPodSecurityDefaultsWithoutPodConfig: a replica and a job node, with nothing asked,
// mount no token and run restricted but for the user, which stays the image's.
func TestPodSecurityDefaultsWithoutPodConfig(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "psd-t4-0", "Tesla-T4", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	enforcePodSecurity(t, c, p.Namespace(), "baseline")
	replica := gpuSpec("svc-1", "T4", 1)
	job := jobSpec(t, "psd-job", "T4", "true")
	job.Job.CheckpointClaim = "" // an emptyDir: the test cluster has no storage
	for _, spec := range []launcher.Spec{replica, job} {
		inst, err := p.Launch(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		pod := podOf(t, c, p, inst)
		checkRestricted(t, pod)
		if sc := pod.Spec.Containers[0].SecurityContext; sc.RunAsNonRoot != nil || sc.RunAsUser != nil {
			t.Errorf("%s: user %+v, want the image's (Ferry cannot know it is not root)", spec.Name, sc)
		}
	}
}

// TestPodSecurityHint: only Pod Security refusals get the hint.
func TestPodSecurityHint(t *testing.T) {
	other := errors.New("pods is forbidden: exceeded quota")
	if got := podSecurityHint(other); got != other {
		t.Errorf("hint on %v: %v", other, got)
	}
	refused := errors.New(`pods "x" is forbidden: violates PodSecurity "baseline:latest": privileged (container "replica" must not set securityContext.privileged=true)`)
	if got := podSecurityHint(refused); !errors.Is(got, refused) || !strings.Contains(got.Error(), "mode: COPY") {
		t.Errorf("hint %v", got)
	}
}

// TestPodSecurityMountIsPrivileged: a replica that mounts a bucket with FUSE keeps its
// explicit exception, a privileged container (with no allowPrivilegeEscalation, which the API
// server refuses beside privileged), and the rest of Ferry's defaults; a namespace at Pod
// Security "baseline" refuses it, with what to do.
func TestPodSecurityMountIsPrivileged(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "psm-t4-0", "Tesla-T4", 4); err != nil {
		t.Fatal(err)
	}
	b := vmjobtest.NewBuckets(t, "unused")
	b.S3.Put("ckpt", "psm/step", []byte("1\n"))
	p := newProvider(t, c, Options{Buckets: b.Client})
	spec := gpuSpec("svc-1", "T4", 1)
	spec.FileMounts = map[string]string{"/data/ckpt": "s3://ckpt/psm"}
	spec.MountModes = map[string]configs.MountMode{"/data/ckpt": configs.ModeMount}
	inst, err := p.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	pod := podOf(t, c, p, inst)
	sc := pod.Spec.Containers[0].SecurityContext
	if sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.AllowPrivilegeEscalation != nil || sc.Capabilities != nil {
		t.Errorf("mounting container's security context %+v, want privileged and nothing taken away", sc)
	}
	if a := pod.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken %v, want false on a mounting pod too", a)
	}
	if psc := pod.Spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v, want seccompProfile RuntimeDefault", psc)
	}

	enforcePodSecurity(t, c, p.Namespace(), "baseline")
	spec.Name = "svc-2"
	_, err = p.Launch(ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "privileged") || !strings.Contains(err.Error(), "mode: COPY") {
		t.Errorf("mounting pod in a baseline namespace: %v, want refused as privileged, with what to do", err)
	}
}
