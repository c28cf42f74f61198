package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// offlineProvider builds pods without a cluster (podFor needs none when nodes are not listed).
func offlineProvider(t *testing.T) *Provider {
	t.Helper()
	p, err := New(Options{RESTConfig: &rest.Config{Host: "http://127.0.0.1:1"}, Namespace: "ns", ProvisionTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// taskKubernetes parses a task's YAML with configs and returns its config.kubernetes.
func taskKubernetes(t *testing.T, yaml string) *configs.KubernetesTaskConfig {
	t.Helper()
	task, err := configs.Parse("task.yaml", []byte(yaml), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	return task.KubernetesConfig()
}

// SkyPilot's examples/aws_efa/nccl_efa.yaml's config, with the additions users make beside it:
// a toleration, a shared-memory volume and its mount, a node selector, an env variable and a
// label; its provision_timeout replaces the context's.
const efaPodConfig = `run: x
config:
  kubernetes:
    provision_timeout: 900
    custom_metadata:
      labels: {team: ml}
    pod_config:
      metadata:
        annotations: {example.com/efa: "yes"}
      spec:
        nodeSelector: {node.kubernetes.io/instance-type: p4d.24xlarge}
        tolerations:
          - {key: vpc.amazonaws.com/efa, operator: Exists, effect: NoSchedule}
        volumes:
          - name: dshm
            emptyDir: {medium: Memory}
        containers:
        - resources:
            limits:
              vpc.amazonaws.com/efa: 4
            requests:
              vpc.amazonaws.com/efa: 4
          env:
            - {name: FI_PROVIDER, value: efa}
            - {name: MODEL, value: from-pod-config}
          volumeMounts:
            - {name: dshm, mountPath: /dev/shm}
`

func TestPodConfigMergedSkyPilotsWay(t *testing.T) {
	p := offlineProvider(t)
	spec := gpuSpec("svc-1", "A100", 1)
	spec.Kubernetes = taskKubernetes(t, efaPodConfig)
	plain, err := p.podFor(gpuSpec("svc-1", "A100", 1))
	if err != nil {
		t.Fatal(err)
	}
	pod, err := p.podFor(spec)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	efa := corev1.ResourceName("vpc.amazonaws.com/efa")
	if q := c.Resources.Limits[efa]; q.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("limits[efa] = %v, want 4", q.String())
	}
	if q := c.Resources.Requests[efa]; q.Cmp(resource.MustParse("4")) != 0 {
		t.Errorf("requests[efa] = %v, want 4", q.String())
	}
	if q := c.Resources.Limits[ResourceGPU]; q.Cmp(resource.MustParse("1")) != 0 {
		t.Errorf("Ferry's GPU limit went: %v", c.Resources.Limits)
	}
	// Lists: tolerations appended to Ferry's; env merged by name (pod_config's value wins, as in
	// SkyPilot), the rest kept; volumes and mounts added.
	if want := append(slices.Clone(plain.Spec.Tolerations), corev1.Toleration{Key: "vpc.amazonaws.com/efa", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}); !reflect.DeepEqual(pod.Spec.Tolerations, want) {
		t.Errorf("tolerations %+v, want %+v", pod.Spec.Tolerations, want)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["FI_PROVIDER"] != "efa" || env["MODEL"] != "from-pod-config" || env["FERRY_PORT"] != "8000" {
		t.Errorf("env %v", env)
	}
	if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].EmptyDir == nil || pod.Spec.Volumes[0].EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("volumes %+v", pod.Spec.Volumes)
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/dev/shm" {
		t.Errorf("volume mounts %+v", c.VolumeMounts)
	}
	if pod.Spec.NodeSelector["node.kubernetes.io/instance-type"] != "p4d.24xlarge" || pod.Spec.Affinity == nil {
		t.Errorf("node selector %v (affinity %v): both Ferry's GPU affinity and the selector apply", pod.Spec.NodeSelector, pod.Spec.Affinity)
	}
	if pod.Labels["team"] != "ml" || pod.Labels[launcher.LabelService] != "svc" || pod.Annotations["example.com/efa"] != "yes" {
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}
	// Ferry's own parts are Ferry's.
	if diff := cmp.Diff(plain.Spec.Containers[0].Command, c.Command); diff != "" || c.Name != containerName || c.Image != plain.Spec.Containers[0].Image {
		t.Errorf("the container's name, image or command changed: %s", diff)
	}
	if got := p.provisionTimeout(pod); got != 900*time.Second {
		t.Errorf("provision timeout %v, want the task's 900s", got)
	}
	if got := p.provisionTimeout(plain); got != time.Minute {
		t.Errorf("without the task's: %v, want the context's minute", got)
	}
	// The task's config is not changed by the merge (a stored task is used again and again).
	again, err := p.podFor(spec)
	if err != nil || len(again.Spec.Tolerations) != len(pod.Spec.Tolerations) || len(again.Spec.Containers[0].Env) != len(c.Env) ||
		len(again.Spec.Volumes) != len(pod.Spec.Volumes) {
		t.Errorf("a second pod differs (the merge changed the task's config?): %v", err)
	}
}

// Merge rules on a pod that already has what pod_config names: a volume of the same name is
// merged into, a port of the same containerPort too; Ferry's labels stay whatever a stored
// task (not checked by configs) says.
func TestPodConfigMergeRules(t *testing.T) {
	base := map[string]any{"spec": map[string]any{
		"volumes":    []any{map[string]any{"name": "data", "emptyDir": map[string]any{}}},
		"containers": []any{map[string]any{"name": "replica", "ports": []any{map[string]any{"containerPort": 8080, "name": "serve"}}}},
	}}
	override := map[string]any{"spec": map[string]any{
		"volumes":    []any{map[string]any{"name": "data", "emptyDir": map[string]any{"sizeLimit": "1Gi"}}, map[string]any{"name": "more"}},
		"containers": []any{map[string]any{"ports": []any{map[string]any{"containerPort": int64(8080), "hostPort": int64(80)}, map[string]any{"containerPort": int64(9090)}}}},
	}}
	mergeK8s(base, override)
	want := map[string]any{"spec": map[string]any{
		"volumes": []any{map[string]any{"name": "data", "emptyDir": map[string]any{"sizeLimit": "1Gi"}}, map[string]any{"name": "more"}},
		"containers": []any{map[string]any{"name": "replica", "ports": []any{
			map[string]any{"containerPort": int64(8080), "name": "serve", "hostPort": int64(80)}, map[string]any{"containerPort": int64(9090)}}}},
	}}
	if diff := cmp.Diff(want, base); diff != "" {
		t.Errorf("merged (-want +got):\n%s", diff)
	}

	p := offlineProvider(t)
	spec := gpuSpec("svc-2", "A100", 1)
	spec.Kubernetes = &configs.KubernetesTaskConfig{PodConfig: map[string]any{
		"metadata": map[string]any{"labels": map[string]any{launcher.LabelService: "someone-else"}},
		"spec":     map[string]any{"restartPolicy": "Always", "containers": []any{map[string]any{"command": []any{"sleep"}}}},
	}}
	pod, err := p.podFor(spec)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[launcher.LabelService] != "svc" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.Containers[0].Command[0] != "/bin/bash" {
		t.Errorf("Ferry's own label, restart policy or command replaced: %v %v %v", pod.Labels, pod.Spec.RestartPolicy, pod.Spec.Containers[0].Command)
	}
}

func TestPodConfigInvalid(t *testing.T) {
	p := offlineProvider(t)
	for name, pc := range map[string]map[string]any{
		"an unknown field":           {"spec": map[string]any{"tolerationz": []any{}}},
		"a value of the wrong shape": {"spec": map[string]any{"tolerations": "all"}},
		"a bad quantity":             {"spec": map[string]any{"containers": []any{map[string]any{"resources": map[string]any{"limits": map[string]any{"x/y": "lots"}}}}}},
	} {
		t.Run(name, func(t *testing.T) {
			spec := gpuSpec("svc-3", "A100", 1)
			spec.Kubernetes = &configs.KubernetesTaskConfig{PodConfig: pc}
			_, err := p.podFor(spec)
			if !errors.Is(err, launcher.ErrInvalid) || !strings.Contains(err.Error(), "pod_config") {
				t.Errorf("err = %v, want ErrInvalid naming pod_config", err)
			}
			if err := CheckPodConfig(spec.Kubernetes); !errors.Is(err, launcher.ErrInvalid) {
				t.Errorf("CheckPodConfig = %v, want ErrInvalid", err)
			}
		})
	}
	if err := CheckPodConfig(taskKubernetes(t, efaPodConfig)); err != nil {
		t.Errorf("CheckPodConfig of SkyPilot's EFA config: %v", err)
	}
}

// The field lists configs checks pod_config against are the API's.
func TestPodConfigFieldListsMatchTheAPI(t *testing.T) {
	jsonNames := func(typ reflect.Type) []string {
		var out []string
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if name != "" && name != "-" {
				out = append(out, name)
			}
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s []string) []string { slices.Sort(s); return s }
	if diff := cmp.Diff(jsonNames(reflect.TypeOf(corev1.PodSpec{})), sorted(configs.PodSpecFields())); diff != "" {
		t.Errorf("configs' PodSpec fields (-api +configs):\n%s", diff)
	}
	if diff := cmp.Diff(jsonNames(reflect.TypeOf(corev1.Container{})), sorted(configs.ContainerFields())); diff != "" {
		t.Errorf("configs' Container fields (-api +configs):\n%s", diff)
	}
}

// addEFANode adds a kwok node, unique to this run, with efa vpc.amazonaws.com/efa devices, a
// taint only EFA pods tolerate and a label to select it by; it is deleted when t ends.
func addEFANode(t *testing.T, c *testcluster.Cluster, efa int) (selector map[string]string) {
	t.Helper()
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	name := "efa-" + run
	if err := c.AddGPUNode(ctx, name, "NVIDIA-A100-SXM4-40GB", 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client().CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	node, err := c.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Labels["efa.ferry.test/run"] = run
	node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "vpc.amazonaws.com/efa", Value: "true", Effect: corev1.TaintEffectNoSchedule})
	if node, err = c.Client().CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	q := *resource.NewQuantity(int64(efa), resource.DecimalSI)
	node.Status.Capacity["vpc.amazonaws.com/efa"], node.Status.Allocatable["vpc.amazonaws.com/efa"] = q, q
	if _, err := c.Client().CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"efa.ferry.test/run": run}
}

// efaTask is SkyPilot's nccl_efa.yaml config, with the toleration and node selector a real EFA
// node pool asks for, and a provision timeout of its own.
func efaTask(run string, efa, timeout int) string {
	return fmt.Sprintf(`run: x
config:
  kubernetes:
    provision_timeout: %d
    pod_config:
      spec:
        nodeSelector: {efa.ferry.test/run: %q}
        tolerations:
          - {key: vpc.amazonaws.com/efa, operator: Exists, effect: NoSchedule}
        containers:
        - resources:
            limits:
              vpc.amazonaws.com/efa: %d
            requests:
              vpc.amazonaws.com/efa: %d
`, timeout, run, efa, efa)
}

// TestPodConfigOnTheCluster: on the real API server and scheduler, pod_config's EFA request,
// toleration and node selector place the pod on the EFA node (which nothing else can use); a
// request beyond the node's devices is unschedulable and fails over after the task's own
// provision_timeout, not the context's ten minutes.
func TestPodConfigOnTheCluster(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	sel := addEFANode(t, c, 4)
	p := newProvider(t, c, Options{ProvisionTimeout: 10 * time.Minute})
	spec := launcher.Spec{Name: "efa-1", Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "efa", launcher.LabelVersion: "1", launcher.LabelReplicaID: "1"},
		Run: "ferry replica-sim", Port: 8000, Resources: configs.Resources{Infra: "kubernetes", CPUs: "1"}}
	spec.Kubernetes = taskKubernetes(t, efaTask(sel["efa.ferry.test/run"], 4, 30))
	inst, err := p.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := c.Client().CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
	if err != nil || node.Labels["efa.ferry.test/run"] != sel["efa.ferry.test/run"] {
		t.Fatalf("the pod ran on %s (%v), not the EFA node", pod.Spec.NodeName, err)
	}
	if q := pod.Spec.Containers[0].Resources.Limits["vpc.amazonaws.com/efa"]; q.Value() != 4 {
		t.Errorf("the pod's EFA limit: %v", q.String())
	}

	// More EFA devices than the node has: no capacity, after the task's 2 s.
	more := spec
	more.Name = "efa-2"
	more.Labels = map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "efa", launcher.LabelVersion: "1", launcher.LabelReplicaID: "2"}
	more.Kubernetes = taskKubernetes(t, efaTask(sel["efa.ferry.test/run"], 32, 2))
	start := time.Now()
	_, err = p.Launch(ctx, more)
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "vpc.amazonaws.com/efa") || !strings.Contains(err.Error(), "unschedulable for 2s") {
		t.Fatalf("launch beyond the node's EFA devices: %v, want ErrNoCapacity after 2s naming vpc.amazonaws.com/efa", err)
	}
	if d := time.Since(start); d < 2*time.Second || d > time.Minute {
		t.Errorf("gave up after %v: want the task's provision_timeout (2s)", d)
	}
}
