package kubernetes

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
)

// TestJobMountsInPod: a job pod that mounts an s3:// bucket (MOUNT: goofys; MOUNT_CACHED:
// rclone) runs privileged, with the bucket credentials Secret as its environment and an
// emptyDir at the mount path, and mounts the bucket in its own container before the task
// (the FUSE stand-ins, run by the kubelet stand-in): the task reads an earlier run's object
// and writes over it, and the write is in the bucket when the pod has ended, signed with the
// Secret's key; a second pod reads it.
func TestJobMountsInPod(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "mnt-l4-0", "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	b := vmjobtest.NewBuckets(t, "unused")
	vmjobtest.MountEnv(t, b)
	p := newProvider(t, c, Options{Buckets: b.Client})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	if _, err := c.Client().CoreV1().Secrets(p.Namespace()).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: BucketCredentialsSecret},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDPOD", "AWS_SECRET_ACCESS_KEY": "pod-secret", "AWS_ENDPOINT_URL_S3": b.S3.URL()},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []configs.MountMode{configs.ModeMount, configs.ModeMountCached} {
		t.Run(string(mode), func(t *testing.T) {
			prefix := strings.ToLower(strings.ReplaceAll(string(mode), "_", "-"))
			b.S3.Put("ckpt", prefix+"/step", []byte("1\n"))
			spec := jobSpec(t, "mnt-"+prefix, "L4", `echo "resumed from step $(cat "$CKPT/step")"; echo 2 > "$CKPT/step"`)
			spec.FileMounts = map[string]string{"/data/ckpt": "s3://ckpt/" + prefix}
			spec.MountModes = map[string]configs.MountMode{"/data/ckpt": mode}
			spec.Envs["CKPT"] = "/data/ckpt"
			if mode == configs.ModeMount {
				// The stand-in's rounds are the first and the one at unmount only: what is in
				// the bucket went up when the pod's shell unmounted after the task.
				spec.Envs["FAKEFUSE_INTERVAL"] = "1h"
			}
			inst, err := p.Launch(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			checkMountPod(t, pod)
			ended := waitEnded(t, p, spec.Name, 1)
			log := logOf(t, p, ended[0].ID)
			if code, ok := ended[0].Exited(); !ok || code != 0 || !strings.Contains(log, "resumed from step 1") {
				t.Fatalf("exit %s, want 0 after reading the bucket's step; log:\n%s", exitOf(ended[0]), log)
			}
			if got, _ := b.S3.Get("ckpt", prefix+"/step"); string(got) != "2\n" {
				t.Errorf("bucket's step %q when the pod ended, want the task's write; log:\n%s", got, log)
			}
			for _, w := range b.S3.Writes() {
				if w.AccessKey != "AKIDPOD" {
					t.Errorf("write %+v not signed with the Secret's key", w)
				}
			}
			again := jobSpec(t, "mnt-again-"+prefix, "L4", `echo "next pod reads step $(cat "$CKPT/step")"`)
			again.FileMounts, again.MountModes, again.Envs["CKPT"] = spec.FileMounts, spec.MountModes, "/data/ckpt"
			if _, err := p.Launch(ctx, again); err != nil {
				t.Fatal(err)
			}
			ended = waitEnded(t, p, again.Name, 1)
			if log := logOf(t, p, ended[0].ID); !strings.Contains(log, "next pod reads step 2") {
				t.Errorf("second pod's log:\n%s", log)
			}
		})
	}
}

// checkMountPod checks what a pod that mounts /data/ckpt is given: privilege, the credentials
// Secret (optional), an emptyDir at the mount path named to its command, and no files
// ConfigMap or init container (it copies nothing).
func checkMountPod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctr := pod.Spec.Containers[0]
	if sc := ctr.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("container security context %+v, want privileged (FUSE needs /dev/fuse and CAP_SYS_ADMIN)", sc)
	}
	if len(ctr.EnvFrom) != 1 || ctr.EnvFrom[0].SecretRef == nil || ctr.EnvFrom[0].SecretRef.Name != BucketCredentialsSecret || !*ctr.EnvFrom[0].SecretRef.Optional {
		t.Errorf("envFrom %+v, want the optional %s Secret", ctr.EnvFrom, BucketCredentialsSecret)
	}
	mounted := false
	for _, vm := range ctr.VolumeMounts {
		mounted = mounted || (vm.MountPath == "/data/ckpt" && strings.HasPrefix(vm.Name, mountVolumePrefix))
	}
	env := false
	for _, e := range ctr.Env {
		env = env || (e.Name == envMountPrefix+"0" && e.Value == "/data/ckpt")
	}
	if !mounted || !env {
		t.Errorf("volume mounts %+v, env %+v: want an emptyDir at /data/ckpt named by %s0", ctr.VolumeMounts, ctr.Env, envMountPrefix)
	}
	if len(pod.Spec.InitContainers) != 0 {
		t.Errorf("init containers %+v for a pod that copies nothing", pod.Spec.InitContainers)
	}
}
