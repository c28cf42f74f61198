package testcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/ferryserve/ferry/launcher"
)

// A job's pod runs its first container's command and args as a host process, as a kubelet
// would run the container:
//
//   - Environment: the container's literal values, valueFrom secretKeyRef, configMapKeyRef and
//     fieldRef (metadata.name, metadata.namespace, metadata.uid, metadata.labels['k'],
//     metadata.annotations['k'], spec.nodeName, status.podIP, status.hostIP), and envFrom
//     Secrets and ConfigMaps; on top of PATH, HOME (the pod's directory), TMPDIR and HOSTNAME.
//     FERRY_HOST is the pod's IP, where a program listening on "its" address must listen (all
//     pods share the host's network). $(VAR) references are not expanded.
//   - Volumes: a PersistentVolumeClaim is the host directory of its bound volume (volumes.go),
//     which outlives the pod; a downwardAPI volume is a directory of the pod's own whose files
//     follow the pod's labels and annotations while it runs, as a kubelet refreshes them; an
//     emptyDir is a directory of the pod's own. Other volumes are not mapped.
//   - Mount paths: the process runs on the host, where nothing is mounted at a volume's
//     mountPath. An environment value that is a mountPath, or starts with one and a slash,
//     is rewritten to the volume's host directory; a program that reads a mount at a path it
//     wrote into its own code finds nothing. This is the stand-in's one big departure from a
//     real node: programs meant for it take their paths from the environment (Ferry's do:
//     FERRY_CHECKPOINT_DIR, FERRY_PODINFO_DIR).
//   - Init containers run first, one after another, each as a host process like the first
//     container (its command, environment and mounts); one that fails fails the pod. A
//     configMap or secret volume is a directory of the pod's own holding the object's keys as
//     files (or only its items, at their paths), with the volume's defaultMode (or an item's
//     mode) as a kubelet sets it: 0644 unless the pod says otherwise. A missing object keeps
//     the pod from starting until it exists, as a kubelet retries the mount.
//   - Output goes to the pod's log (LogPath), which the /containerLogs endpoint serves.
//   - Exit: the pod's status becomes Succeeded (exit 0) or Failed, with the first container's
//     state terminated {exitCode, reason Completed or Error}; a process killed by signal N
//     exits 128+N, as a container's does. kwok's stages leave such a pod alone (its
//     pod-complete stage applies only to pods a Job owns).
//   - Deletion: kwok removes a deleted pod at once, so its process is stopped after the pod
//     is gone: SIGTERM to its process group, SIGKILL after the grace period the first
//     deletion asked for (the scheduler's preemption and a plain delete use the pod's
//     terminationGracePeriodSeconds; 0 kills at once).
//   - A job pod runs once: a marker in its directory keeps a later stand-in (another test's)
//     from starting it again; such a pod is reported Failed with exit code 137, reason
//     ContainerStatusUnknown, as a kubelet reports a container it lost.

// jobProcess is what the stand-in keeps about a job pod's process.
type jobProcess struct {
	// stopping is set when the stand-in stops the process, so that its exit is not reported
	// as the program's.
	stopping atomic.Bool
	// grace is the pod's terminationGracePeriodSeconds.
	grace time.Duration
	// downward are the pod's downwardAPI volumes, refreshed while it runs.
	downward []downwardVolume
}

// downwardVolume is one downwardAPI volume: its host directory and items.
type downwardVolume struct {
	dir   string
	items []corev1.DownwardAPIVolumeFile
}

// errNotReady marks what a pod waits for before it can start (a claim not bound yet); the
// pod is tried again shortly.
var errNotReady = errors.New("not ready")

func isJobPod(pod *corev1.Pod) bool {
	_, ok := pod.Labels[launcher.LabelJob]
	return ok
}

// jobShouldRun reports whether a job pod is one the stand-in runs now.
func jobShouldRun(pod *corev1.Pod, node *corev1.Node) bool {
	return pod != nil && node != nil && pod.DeletionTimestamp == nil &&
		node.Annotations[KwokNodeAnnotation] == "fake" &&
		pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" &&
		len(pod.Spec.Containers) > 0
}

// syncJob brings a job pod's process in line with the pod. current is its process, if any.
func (k *Kubelet) syncJob(ctx context.Context, key string, pod *corev1.Pod, node *corev1.Node, current *replica, requeue func(string)) {
	if current != nil {
		same := pod != nil && pod.UID == current.podUID
		if same && jobShouldRun(pod, node) {
			if !current.proc.exited() {
				k.writeDownward(pod, current.job.downward)
			}
			return // an exited process's status is being reported
		}
		k.mu.Lock()
		delete(k.replicas, key)
		grace, asked := k.deletionGrace[current.podUID]
		delete(k.deletionGrace, current.podUID)
		k.mu.Unlock()
		if same && pod.DeletionTimestamp == nil && current.proc.exited() {
			return // ended and reported; nothing to stop
		}
		if !asked {
			grace = current.job.grace
		}
		current.job.stopping.Store(true)
		k.mu.Lock()
		k.ending[current] = key
		k.mu.Unlock()
		k.stopping.Go(func() {
			current.proc.stop(grace)
			k.mu.Lock()
			delete(k.ending, current)
			k.mu.Unlock()
		})
		if pod == nil || same {
			return
		}
	}
	if !jobShouldRun(pod, node) {
		return
	}
	podDir := k.podDir(pod.UID)
	marker := filepath.Join(podDir, "started")
	if fileExists(marker) {
		k.reportExit(ctx, pod, 137, "ContainerStatusUnknown", "the process was lost with an earlier kubelet stand-in")
		return
	}
	run, err := k.jobCommand(pod, podDir, pod.Spec.Containers[0])
	logPath := k.LogPath(pod.Namespace, pod.Name)
	if errors.Is(err, errNotReady) {
		requeue(key)
		return
	}
	defer k.markStarting(key)()
	if err == nil {
		err = os.WriteFile(marker, nil, 0o644)
	}
	if err == nil {
		var code int
		if code, err = k.runInitContainers(pod, podDir, logPath); err == nil && code != 0 {
			k.reportExit(ctx, pod, code, "Init:Error", "an init container failed")
			return
		}
	}
	var proc *process
	if err == nil {
		proc, err = startProcessIn(podDir, "job pod "+key, logPath, run.env, run.bin, run.args...)
	}
	if err != nil {
		appendLog(logPath, "kubelet stand-in: "+err.Error())
		k.reportExit(ctx, pod, 128, "StartError", err.Error())
		return
	}
	rec := &replica{podUID: pod.UID, proc: proc, job: &jobProcess{grace: run.grace, downward: run.downward}}
	k.mu.Lock()
	k.replicas[key] = rec
	k.mu.Unlock()
	go func() {
		<-proc.done
		if rec.job.stopping.Load() {
			return
		}
		code := exitStatus(proc.err)
		reason := "Completed"
		if code != 0 {
			reason = "Error"
		}
		k.reportExit(context.WithoutCancel(ctx), pod, code, reason, "")
	}()
}

// jobRun is the command line and environment of a job pod's process.
type jobRun struct {
	bin      string
	args     []string
	env      []string
	grace    time.Duration
	downward []downwardVolume
}

// jobCommand resolves what a job pod's container runs (its first, or an init container),
// making its volumes' directories.
func (k *Kubelet) jobCommand(pod *corev1.Pod, podDir string, container corev1.Container) (jobRun, error) {
	cmdline := append(slices.Clone(container.Command), container.Args...)
	if len(container.Command) == 0 {
		return jobRun{}, errors.New("the stand-in runs no images: the container must give its command")
	}
	if err := os.MkdirAll(podDir, 0o755); err != nil {
		return jobRun{}, err
	}
	run := jobRun{bin: cmdline[0], args: cmdline[1:], grace: 30 * time.Second}
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		run.grace = time.Duration(*s) * time.Second
	}

	volumeDirs := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(podDir, "volumes", v.Name)
		switch {
		case v.PersistentVolumeClaim != nil:
			claimDir, err := k.ClaimDir(pod.Namespace, v.PersistentVolumeClaim.ClaimName)
			if err != nil {
				return jobRun{}, err
			}
			dir = claimDir
		case v.DownwardAPI != nil:
			run.downward = append(run.downward, downwardVolume{dir: dir, items: v.DownwardAPI.Items})
		case v.EmptyDir != nil:
		case v.ConfigMap != nil:
			if err := k.writeConfigMap(pod.Namespace, v.ConfigMap, dir); err != nil {
				return jobRun{}, err
			}
		case v.Secret != nil:
			if err := k.writeSecret(pod.Namespace, v.Secret, dir); err != nil {
				return jobRun{}, err
			}
		default:
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return jobRun{}, err
		}
		volumeDirs[v.Name] = dir
	}
	k.writeDownward(pod, run.downward)
	mounts := map[string]string{} // mountPath → host directory
	for _, m := range container.VolumeMounts {
		if dir, ok := volumeDirs[m.Name]; ok {
			mounts[filepath.Clean(m.MountPath)] = filepath.Join(dir, m.SubPath)
		}
	}

	path := os.Getenv("PATH")
	if k.opts.FerryBin != "" {
		// The image has ferry installed, as replica pods' do: `ferry train-sim` runs as written.
		path = filepath.Dir(k.opts.FerryBin) + string(os.PathListSeparator) + path
	}
	run.env = []string{
		"PATH=" + path, "HOME=" + podDir, "TMPDIR=" + os.TempDir(), "HOSTNAME=" + pod.Name,
	}
	for _, from := range container.EnvFrom {
		values, err := k.envFrom(pod.Namespace, from)
		if err != nil {
			return jobRun{}, err
		}
		for _, name := range slices.Sorted(maps.Keys(values)) {
			run.env = append(run.env, from.Prefix+name+"="+hostPath(values[name], mounts))
		}
	}
	for _, e := range container.Env {
		value, err := k.envValue(pod, e)
		if err != nil {
			return jobRun{}, fmt.Errorf("env %s: %w", e.Name, err)
		}
		run.env = append(run.env, e.Name+"="+hostPath(value, mounts))
	}
	run.env = append(run.env, "FERRY_HOST="+pod.Status.PodIP) // last wins
	return run, nil
}

// hostPath rewrites a value that is under a mount path to the volume's host directory.
func hostPath(value string, mounts map[string]string) string {
	paths := slices.Collect(maps.Keys(mounts))
	slices.SortFunc(paths, func(a, b string) int { return len(b) - len(a) }) // deepest first
	for _, mp := range paths {
		if value == mp || strings.HasPrefix(value, strings.TrimSuffix(mp, "/")+"/") {
			return mounts[mp] + value[len(mp):]
		}
	}
	return value
}

// envValue resolves one environment variable of a container.
func (k *Kubelet) envValue(pod *corev1.Pod, e corev1.EnvVar) (string, error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return e.Value, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		secret, err := k.cluster.Client().CoreV1().Secrets(pod.Namespace).Get(context.Background(), ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ref.Optional != nil && *ref.Optional {
				return "", nil
			}
			return "", fmt.Errorf("%w: secret %s: %v", errNotReady, ref.Name, err)
		}
		v, ok := secret.Data[ref.Key]
		if !ok && (ref.Optional == nil || !*ref.Optional) {
			return "", fmt.Errorf("%w: secret %s has no key %s", errNotReady, ref.Name, ref.Key)
		}
		return string(v), nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := k.cluster.Client().CoreV1().ConfigMaps(pod.Namespace).Get(context.Background(), ref.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && ref.Optional != nil && *ref.Optional {
				return "", nil
			}
			return "", fmt.Errorf("%w: config map %s: %v", errNotReady, ref.Name, err)
		}
		return cm.Data[ref.Key], nil
	case from.FieldRef != nil:
		return fieldValue(pod, from.FieldRef.FieldPath), nil
	}
	return "", nil
}

// envFrom reads the values of one envFrom source.
func (k *Kubelet) envFrom(ns string, from corev1.EnvFromSource) (map[string]string, error) {
	values := map[string]string{}
	switch {
	case from.SecretRef != nil:
		secret, err := k.cluster.Client().CoreV1().Secrets(ns).Get(context.Background(), from.SecretRef.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && from.SecretRef.Optional != nil && *from.SecretRef.Optional {
				return values, nil
			}
			return nil, fmt.Errorf("%w: secret %s: %v", errNotReady, from.SecretRef.Name, err)
		}
		for key, v := range secret.Data {
			values[key] = string(v)
		}
	case from.ConfigMapRef != nil:
		cm, err := k.cluster.Client().CoreV1().ConfigMaps(ns).Get(context.Background(), from.ConfigMapRef.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) && from.ConfigMapRef.Optional != nil && *from.ConfigMapRef.Optional {
				return values, nil
			}
			return nil, fmt.Errorf("%w: config map %s: %v", errNotReady, from.ConfigMapRef.Name, err)
		}
		maps.Copy(values, cm.Data)
	}
	return values, nil
}

// fieldValue is a pod field as the downward API gives it; "" for paths it does not know.
func fieldValue(pod *corev1.Pod, path string) string {
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key]
	}
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key]
	}
	switch path {
	case "metadata.name":
		return pod.Name
	case "metadata.namespace":
		return pod.Namespace
	case "metadata.uid":
		return string(pod.UID)
	case "metadata.annotations":
		return formatMap(pod.Annotations)
	case "metadata.labels":
		return formatMap(pod.Labels)
	case "spec.nodeName":
		return pod.Spec.NodeName
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName
	case "status.podIP":
		return pod.Status.PodIP
	case "status.hostIP":
		return pod.Status.HostIP
	}
	return ""
}

// subscript parses "FIELD['KEY']".
func subscript(path, field string) (string, bool) {
	rest, ok := strings.CutPrefix(path, field+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// formatMap is how the downward API writes a whole map: key="value" lines, sorted.
func formatMap(m map[string]string) string {
	lines := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		lines = append(lines, fmt.Sprintf("%s=%q", k, m[k]))
	}
	return strings.Join(lines, "\n")
}

// writeDownward writes the files of a pod's downwardAPI volumes that changed, each replaced
// whole (a reader never sees half a file).
func (k *Kubelet) writeDownward(pod *corev1.Pod, volumes []downwardVolume) {
	for _, v := range volumes {
		for _, item := range v.items {
			if item.FieldRef == nil {
				continue
			}
			path := filepath.Join(v.dir, item.Path)
			want := []byte(fieldValue(pod, item.FieldRef.FieldPath))
			if have, err := os.ReadFile(path); err == nil && string(have) == string(want) {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				continue
			}
			tmp := path + ".tmp"
			if os.WriteFile(tmp, want, 0o644) == nil {
				_ = os.Rename(tmp, path)
			}
		}
	}
}

// reportExit sets a job pod's status as a kubelet does when its only container ended.
func (k *Kubelet) reportExit(ctx context.Context, pod *corev1.Pod, code int, reason, message string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pods := k.cluster.Client().CoreV1().Pods(pod.Namespace)
	_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || cur.UID != pod.UID || cur.DeletionTimestamp != nil {
			return nil // gone, replaced or going: nobody reads its status
		}
		setTerminated(cur, code, reason, message, time.Now())
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// setTerminated records the first container's end in a pod's status: phase Succeeded or
// Failed (restartPolicy Never), not ready, the container terminated with code.
func setTerminated(pod *corev1.Pod, code int, reason, message string, now time.Time) {
	pod.Status.Phase = corev1.PodFailed
	if code == 0 {
		pod.Status.Phase = corev1.PodSucceeded
	}
	for i := range pod.Status.Conditions {
		switch pod.Status.Conditions[i].Type {
		case corev1.PodReady, corev1.ContainersReady:
			pod.Status.Conditions[i].Status = corev1.ConditionFalse
			pod.Status.Conditions[i].Reason = "PodCompleted"
			pod.Status.Conditions[i].LastTransitionTime = metav1.NewTime(now)
		}
	}
	name := pod.Spec.Containers[0].Name
	idx := slices.IndexFunc(pod.Status.ContainerStatuses, func(cs corev1.ContainerStatus) bool { return cs.Name == name })
	if idx < 0 {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: name, Image: pod.Spec.Containers[0].Image})
		idx = len(pod.Status.ContainerStatuses) - 1
	}
	cs := &pod.Status.ContainerStatuses[idx]
	started := metav1.NewTime(now)
	if cs.State.Running != nil {
		started = cs.State.Running.StartedAt
	}
	started2 := false
	cs.Ready, cs.Started = false, &started2
	cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: reason, Message: message, StartedAt: started, FinishedAt: metav1.NewTime(now),
	}}
}

// exitStatus is a process's exit code as a container runtime reports it: 128+N when killed by
// signal N.
func exitStatus(err error) int {
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		if err == nil {
			return 0
		}
		return 128
	}
	if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return exitErr.ExitCode()
}

// podDir is the stand-in's directory of a pod: its HOME, markers and own volumes.
func (k *Kubelet) podDir(uid types.UID) string {
	return filepath.Join(k.cluster.Dir(), "kubelet", "pods", string(uid))
}

// appendLog adds a line to a pod's log.
func appendLog(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line + "\n")
}

// runInitContainers runs the pod's init containers in order, their output in the pod's log;
// code is the first non-zero exit status.
func (k *Kubelet) runInitContainers(pod *corev1.Pod, podDir, logPath string) (code int, err error) {
	for _, c := range pod.Spec.InitContainers {
		run, err := k.jobCommand(pod, podDir, c)
		if err != nil {
			return 0, fmt.Errorf("init container %s: %w", c.Name, err)
		}
		proc, err := startProcessIn(podDir, "init container "+c.Name+" of "+pod.Name, logPath, run.env, run.bin, run.args...)
		if err != nil {
			return 0, err
		}
		<-proc.done
		if code := exitStatus(proc.err); code != 0 {
			appendLog(logPath, fmt.Sprintf("kubelet stand-in: init container %s exited with %d", c.Name, code))
			return code, nil
		}
	}
	return 0, nil
}

// writeConfigMap writes a ConfigMap's keys (data and binaryData) as files in dir.
func (k *Kubelet) writeConfigMap(ns string, v *corev1.ConfigMapVolumeSource, dir string) error {
	cm, err := k.cluster.Client().CoreV1().ConfigMaps(ns).Get(context.Background(), v.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("%w: config map %s: %v", errNotReady, v.Name, err)
	}
	data := maps.Clone(cm.BinaryData)
	if data == nil {
		data = map[string][]byte{}
	}
	for key, value := range cm.Data {
		data[key] = []byte(value)
	}
	return writeVolumeFiles(dir, data, v.Items, v.DefaultMode)
}

// writeSecret writes a Secret's keys as files in dir.
func (k *Kubelet) writeSecret(ns string, v *corev1.SecretVolumeSource, dir string) error {
	sec, err := k.cluster.Client().CoreV1().Secrets(ns).Get(context.Background(), v.SecretName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("%w: secret %s: %v", errNotReady, v.SecretName, err)
	}
	return writeVolumeFiles(dir, sec.Data, v.Items, v.DefaultMode)
}

// writeVolumeFiles writes data as a kubelet fills a configMap or secret volume: every key as a
// file, or only items (each at its path), with the item's mode, else defaultMode, else 0644.
// The mode is set with chmod, so the process's umask does not narrow it.
func writeVolumeFiles(dir string, data map[string][]byte, items []corev1.KeyToPath, defaultMode *int32) error {
	mode := os.FileMode(corev1.SecretVolumeSourceDefaultMode)
	if defaultMode != nil {
		mode = os.FileMode(*defaultMode)
	}
	if len(items) == 0 {
		for key := range data {
			items = append(items, corev1.KeyToPath{Key: key, Path: key})
		}
	}
	for _, item := range items {
		value, ok := data[item.Key]
		if !ok {
			return fmt.Errorf("%w: volume key %s is missing", errNotReady, item.Key)
		}
		m := mode
		if item.Mode != nil {
			m = os.FileMode(*item.Mode)
		}
		path := filepath.Join(dir, filepath.Clean("/"+item.Path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, value, m); err != nil {
			return err
		}
		if err := os.Chmod(path, m); err != nil {
			return err
		}
	}
	return nil
}
