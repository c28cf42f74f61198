package kubernetes

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// TestJobFiles: a job pod's workdir and file mounts (a local directory and file, an S3
// prefix) reach it through its Secret (owned by the pod; no ConfigMap holds the files or the
// presigned URLs) and init container; the run starts in the workdir, ~/sky_workdir and the ~/
// mount are links, and the absolute mounts are at their paths (the stand-in maps paths in the
// environment to the volume's host directory). Terminate removes the Secret, and the files
// ConfigMap a pod launched before files moved to Secrets has.
func TestJobFiles(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "fm-l4-0", "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	b := vmjobtest.NewBuckets(t, "unused")
	p := newProvider(t, c, Options{Buckets: b.Client})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	work, local := t.TempDir(), t.TempDir()
	writeTestFile(t, filepath.Join(work, "train.py"), "print('train')")
	writeTestFile(t, filepath.Join(local, "conf", "a.yaml"), "a: 1")
	writeTestFile(t, filepath.Join(local, "notes.txt"), "notes")
	spec := jobSpec(t, "files", "L4", `cat train.py; echo
cat "$APP/a.yaml" ~/notes.txt "$MODELS/config.json" "$MODELS/shards/0.bin"; echo
cd ~/sky_workdir && test -f train.py && echo linked-workdir`)
	spec.Workdir = work
	spec.FileMounts = map[string]string{
		"/etc/app":    filepath.Join(local, "conf"),
		"~/notes.txt": filepath.Join(local, "notes.txt"),
		"/models":     "s3://models/llama",
	}
	spec.Envs["APP"], spec.Envs["MODELS"] = "/etc/app", "/models"
	inst, err := p.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.Client().CoreV1().Secrets(p.Namespace()).Get(ctx, filesObjectName(inst.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(files.OwnerReferences) != 1 || files.OwnerReferences[0].Name != inst.Name || files.OwnerReferences[0].Kind != "Pod" {
		t.Errorf("files Secret owners %+v, want the pod", files.OwnerReferences)
	}
	if !strings.Contains(string(files.Data[filesFetch]), "X-Amz-Signature") {
		t.Errorf("the files Secret's fetch.sh holds no presigned URL:\n%s", files.Data[filesFetch])
	}
	if _, err := c.Client().CoreV1().ConfigMaps(p.Namespace()).Get(ctx, filesObjectName(inst.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("files ConfigMap: %v, want none", err)
	}
	// What a launch before files moved to Secrets left: Terminate removes it too.
	legacy := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: filesObjectName(inst.Name), Labels: files.Labels}}
	if _, err := c.Client().CoreV1().ConfigMaps(p.Namespace()).Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ended := waitEnded(t, p, "files", 1)
	log := logOf(t, p, ended[0].ID)
	if code, ok := ended[0].Exited(); !ok || code != 0 {
		t.Fatalf("exit %s, want 0; log:\n%s", exitOf(ended[0]), log)
	}
	for _, want := range []string{"ferry: fetching 2 objects of s3://models/llama", "print('train')", "a: 1notess3-configs3-shard", "linked-workdir"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if b.S3.Presigned() != 2 {
		t.Errorf("%d presigned GETs, want 2 (the init container's)", b.S3.Presigned())
	}
	if err := p.Terminate(ctx, ended[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().Secrets(p.Namespace()).Get(ctx, files.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("files Secret after Terminate: %v, want NotFound", err)
	}
	if _, err := c.Client().CoreV1().ConfigMaps(p.Namespace()).Get(ctx, files.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("files ConfigMap of an older launch after Terminate: %v, want NotFound", err)
	}
}

// TestJobFilesRefused: past a Secret's 1 MiB, gs://, a missing bucket: ErrFiles before any
// pod exists, the first saying to use a bucket.
func TestJobFilesRefused(t *testing.T) {
	c := testcluster.Shared(t)
	b := vmjobtest.NewBuckets(t, "unused")
	p := newProvider(t, c, Options{Buckets: b.Client})
	big := t.TempDir()
	noise := make([]byte, secretMaxBytes)
	_, _ = rand.Read(noise)
	writeTestFile(t, filepath.Join(big, "blob"), string(noise))
	for name, mutate := range map[string]func(*launcher.Spec){
		"workdir too big": func(s *launcher.Spec) { s.Workdir = big },
		"gs":              func(s *launcher.Spec) { s.FileMounts = map[string]string{"/d": "gs://datasets/train"} },
		"missing bucket":  func(s *launcher.Spec) { s.FileMounts = map[string]string{"/d": "s3://no-such-bucket/x"} },
	} {
		t.Run(name, func(t *testing.T) {
			s := jobSpec(t, "refused", "L4", "true")
			mutate(&s)
			_, err := p.Launch(context.Background(), s)
			if !errors.Is(err, nodefiles.ErrFiles) {
				t.Fatalf("Launch = %v, want ErrFiles", err)
			}
			if name == "workdir too big" && !strings.Contains(err.Error(), "bucket") {
				t.Errorf("error %q does not say to use a bucket", err)
			}
			insts, _ := p.List(context.Background(), map[string]string{launcher.LabelJob: "refused"})
			if len(insts) != 0 {
				t.Errorf("a refused launch left pods: %v", insts)
			}
		})
	}
}

func writeTestFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReplicaFilesPodSpec: a service replica's pod with a workdir and mounts starts (kwok runs
// it past its init container, as a kubelet would once the init container exits 0), with the
// init container in the task's image, the files volume at FilesDir, each absolute mount as a
// subPath and the workdir in the environment.
func TestReplicaFilesPodSpec(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "fm-a10-0", "NVIDIA-A10G", 1); err != nil {
		t.Fatal(err)
	}
	b := vmjobtest.NewBuckets(t, "unused")
	p := newProvider(t, c, Options{Buckets: b.Client})
	work, local := t.TempDir(), t.TempDir()
	writeTestFile(t, filepath.Join(work, "app.py"), "app")
	writeTestFile(t, filepath.Join(local, "w.bin"), "w")
	spec := gpuSpec("svc-files", "A10G", 1)
	spec.Resources.ImageID = "docker:vllm/vllm-openai:v0.6"
	spec.Workdir = work
	spec.FileMounts = map[string]string{"/models/w.bin": filepath.Join(local, "w.bin"), "/data": "s3://models/llama"}
	inst, err := p.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Image != "vllm/vllm-openai:v0.6" {
		t.Fatalf("init containers %+v, want one in the task's image", pod.Spec.InitContainers)
	}
	mounts := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.Name == filesVolume {
			mounts[m.MountPath] = m.SubPath
		}
	}
	want := map[string]string{FilesDir: "", "/data": "mounts/0", "/models/w.bin": "mounts/1/w.bin"}
	if len(mounts) != len(want) {
		t.Errorf("files mounts %v, want %v", mounts, want)
	}
	for path, sub := range want {
		if got, ok := mounts[path]; !ok || got != sub {
			t.Errorf("mount %s: subPath %q (present %v), want %q", path, got, ok, sub)
		}
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env[nodefiles.EnvWorkdir] != FilesDir+"/workdir" || env[EnvFilesDir] != FilesDir {
		t.Errorf("env %v lacks the workdir and files dir", env)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}
