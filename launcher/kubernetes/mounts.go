package kubernetes

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A pod mounts the buckets its task mounts (MOUNT, MOUNT_CACHED) inside its own container, as
// a VM does (nodefiles.MountScript): its command installs the FUSE client when the image lacks it
// and mounts each bucket before the task runs. What that takes:
//
//   - Privilege: FUSE needs the /dev/fuse device and CAP_SYS_ADMIN for mount(2), which a
//     container gets only privileged (a hostPath /dev/fuse is not enough: the runtime's device
//     cgroup still refuses it), so the task's container runs privileged. A cluster whose policy
//     (Pod Security "baseline" or "restricted") refuses privileged pods refuses these pods.
//   - Credentials from the container's environment, as the clients' SDKs find them: on EKS
//     the pod's IAM role (IRSA or Pod Identity) for s3://, on GKE Workload Identity for gs://,
//     or the Secret BucketCredentialsSecret in the pod's namespace, whose keys (e.g.
//     AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) become the container's environment when it
//     exists.
//   - Each absolute mount path is an emptyDir the bucket is mounted over (so the path exists
//     and is writable whatever the image), named to the mount command by FERRY_MOUNT_<i>;
//     rclone's logs and cache go to an emptyDir at MountsDir.
//   - A job's task runs as a child of the pod's shell, which passes SIGTERM on to it and, when
//     it ends, waits for MOUNT_CACHED uploads and unmounts (ferry_mounts_end) before the pod
//     ends with the task's exit status.
//
// Not done: CSI drivers (GKE's Cloud Storage FUSE CSI driver, Mountpoint for Amazon S3), which
// would mount without privilege where a cluster has them.
const (
	// BucketCredentialsSecret is the Secret whose keys become the environment of a pod that
	// mounts a bucket, when it exists in the pod's namespace.
	BucketCredentialsSecret = "ferry-bucket-credentials"
	// MountsDir holds a pod's mount logs and rclone caches (FERRY_MOUNTS_DIR).
	MountsDir         = "/ferry/mounts"
	mountsVolume      = "ferry-mounts"
	mountVolumePrefix = "ferry-mount-"
	// envMountPrefix names mount i's path in the pod's environment: FERRY_MOUNT_<i>.
	envMountPrefix = "FERRY_MOUNT_"
	// podTaskEOF ends the here-document that writes a job pod's task script.
	podTaskEOF = "FERRY_POD_TASK_EOF"
)

// attachMounts makes pod mount f's buckets (all mounted, none copied): volumes for the mount
// points, privilege, credentials, and the mount script before the task; a job's task is
// wrapped so that its mounts are flushed and unmounted when it ends.
func (p *Provider) attachMounts(pod *corev1.Pod, spec launcher.Spec, f nodefiles.Files) error {
	if len(f.Mounts) == 0 {
		return nil
	}
	ctr := &pod.Spec.Containers[0]
	optional, privileged := true, true
	fail := "ferry_mount_fail"
	failCode := 1
	if spec.Job != nil {
		failCode = launcher.ExitSetupFailed
	}
	script, err := nodefiles.MountScript(f, func(i int, m nodefiles.FileMount) (string, error) {
		rel, inHome, err := m.Remote()
		if err != nil {
			return "", err
		}
		if inHome {
			return `"$HOME"/` + nodefiles.ShellQuote(rel), nil
		}
		env := envMountPrefix + strconv.Itoa(i)
		vol := mountVolumePrefix + strconv.Itoa(i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: "/" + rel})
		ctr.Env = append(ctr.Env, corev1.EnvVar{Name: env, Value: "/" + rel})
		return `"$` + env + `"`, nil
	}, fail)
	if err != nil {
		return fmt.Errorf("%s: %w", p.infra, err)
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: mountsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: mountsVolume, MountPath: MountsDir})
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: "FERRY_MOUNTS_DIR", Value: MountsDir})
	ctr.EnvFrom = append(ctr.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: BucketCredentialsSecret}, Optional: &optional}})
	if ctr.SecurityContext == nil {
		ctr.SecurityContext = &corev1.SecurityContext{}
	}
	ctr.SecurityContext.Privileged = &privileged

	task := ctr.Command[len(ctr.Command)-1]
	if spec.Job != nil {
		if strings.Contains(task, "\n"+podTaskEOF+"\n") {
			return fmt.Errorf("%w: %s: the task's script contains the line %s", launcher.ErrInvalid, p.infra, podTaskEOF)
		}
		task = jobTaskWrapper(task)
	}
	ctr.Command[len(ctr.Command)-1] = "ferry_mount_fail() { echo \"ferry: files: $1 failed\" >&2; exit " + strconv.Itoa(failCode) + "; }\n" + script + task
	return nil
}

// jobTaskWrapper runs a job pod's task script as a child of the pod's shell, passing SIGTERM
// on to it (the shell is PID 1, which ignores it otherwise), then flushes and unmounts the
// buckets and ends with the task's exit status.
func jobTaskWrapper(task string) string {
	if !strings.HasSuffix(task, "\n") {
		task += "\n"
	}
	return `ferry_task_file=$(mktemp)
cat > "$ferry_task_file" <<'` + podTaskEOF + `'
` + task + podTaskEOF + `
bash "$ferry_task_file" &
ferry_task=$!
trap 'kill -TERM "$ferry_task" 2>/dev/null' TERM INT
wait "$ferry_task"
ferry_rc=$?
while kill -0 "$ferry_task" 2>/dev/null; do wait "$ferry_task"; ferry_rc=$?; done
ferry_mounts_end
exit "$ferry_rc"
`
}
