package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher/buckets/fakefuse"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
	"github.com/ferryserve/ferry/launcher/kubernetes"
)

// kubeMountJob keeps its checkpoints in a bucket mounted with MOUNT_CACHED, spelled as
// SkyPilot's docs/source/reference/storage.rst ("Storing model checkpoints") spells it, with
// store s3. The run reads the mount path from $CKPT: the test cluster's pods are host
// processes, and the kubelet stand-in maps paths in the environment, not in the command.
const kubeMountJob = `name: kube-mount
resources:
  infra: kubernetes
  accelerators: L4:1
envs:
  CKPT: /checkpoint
file_mounts:
  /checkpoint:
    name: ferry-e2e-kube
    store: s3
    mode: MOUNT_CACHED
setup: mkdir -p "$CKPT/train"
run: |
  ferry train-sim --steps=300 --step-time=50ms --checkpoint-every=5 --checkpoint-dir="$CKPT/train"
`

// On the test cluster: a job pod mounts an S3 bucket in its container (rclone with its VFS
// cache: the stand-in) with the credentials of the namespace's ferry-bucket-credentials Secret;
// its checkpoints reach the bucket while it runs; when its pod is deleted (the node lost), the
// job recovers in a new pod that mounts the bucket again, resumes from the checkpoint there,
// and succeeds.
func TestKubernetesJobMountCheckpoint(t *testing.T) {
	fakefuse.Install(t)
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.MakeBucket("ferry-e2e-kube")
	c := testcluster.Shared(t)
	ctx := context.Background()
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	ns, node := "mount-"+suffix, "mount-l4-"+suffix
	if err := c.AddGPUNode(ctx, node, "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		_ = c.DeleteNode(context.Background(), node)
	})
	if _, err := c.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: kubernetes.BucketCredentialsSecret},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDKUBE", "AWS_SECRET_ACCESS_KEY": "kube-secret", "AWS_ENDPOINT_URL_S3": s3.URL()},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{FerryBin: ferryBin})
	e := newEnv(t)
	e.extraEnv = append(append([]string{}, awsEnv...), "AWS_ENDPOINT_URL_S3="+s3.URL(), "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	writeFile(t, filepath.Join(e.home, "config.yaml"), fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  contexts:\n    - name: %s\n      namespace: %s\n",
		c.Kubeconfig(), c.Context(), ns))
	file := filepath.Join(t.TempDir(), "kube-mount.yaml")
	writeFile(t, file, kubeMountJob)

	id := e.launchDetached(file)
	j := e.waitJob(id, 2*time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" && len(j.Nodes) == 1 })
	eventually(t, time.Minute, "a checkpoint in the bucket", func() (bool, string) {
		_, ok := s3.Get("ferry-e2e-kube", "train/checkpoint.json")
		return ok, fmt.Sprint(s3.Writes())
	})
	pod := j.Nodes[0].InstanceID[strings.LastIndex(j.Nodes[0].InstanceID, "/")+1:]
	if err := c.Client().CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitJob(id, 2*time.Minute, "recovered", func(j jobView) bool { return j.State == "RUNNING" && j.Attempt == 2 })
	e.waitJob(id, 3*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	log := e.mustRun("jobs", "logs", strconv.FormatInt(id, 10))
	for _, want := range []string{"ferry: mounting s3://ferry-e2e-kube at /checkpoint (MOUNT_CACHED)", "resuming from checkpoint at step", "training done: 300 steps"} {
		if !strings.Contains(log, want) {
			t.Errorf("job log lacks %q:\n%s", want, lastLines(log, 30))
		}
	}
	for _, w := range s3.Writes() {
		if w.AccessKey != "AKIDKUBE" {
			t.Errorf("write %+v not signed with the Secret's key", w)
		}
	}
}
