package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// A task's config.kubernetes reaches its pods here (configs/taskconfig.go reads it):
// custom_metadata's labels and annotations, then pod_config, are merged into the pod Ferry
// built, by SkyPilot's rules (sky/utils/config_utils.py, merge_k8s_configs): mappings merge key by
// key; the one container of pod_config merges into the pod's one container; lists that
// Kubernetes patches by a key (volumes, volumeMounts and env by name, ports by containerPort, …)
// merge item by item on that key; every other list (tolerations, imagePullSecrets' …) is
// appended to; anything else replaces what was there. So an EFA device request, a toleration,
// a volume and its mount, a node selector or an env variable add to what Ferry asks for.
//
// What Ferry needs of its pods stays Ferry's: the container's name, image and command, the
// restart policy and Ferry's labels (configs refuses them in pod_config already; they are set
// back here whatever a stored task holds). The merged pod is decoded strictly: a field the API
// does not have, or a value of the wrong shape, fails the launch as launcher.ErrInvalid
// naming pod_config.

// patchMergeKeys are SkyPilot's _PATCH_MERGE_KEYS: the lists Kubernetes merges item by item,
// and the key that identifies an item.
var patchMergeKeys = map[string]string{
	"initContainers":            "name",
	"ephemeralContainers":       "name",
	"volumes":                   "name",
	"volumeMounts":              "name",
	"resourceClaims":            "name",
	"env":                       "name",
	"hostAliases":               "ip",
	"topologySpreadConstraints": "topologyKey",
	"ports":                     "containerPort",
	"volumeDevices":             "devicePath",
}

// annotationProvisionTimeout records a task's config.kubernetes.provision_timeout on its pods,
// in seconds, for the wait that reads it (waitStarted).
const annotationProvisionTimeout = "ferry.dev/provision-timeout"

// withPodConfig returns pod with spec's config.kubernetes applied.
func withPodConfig(pod *corev1.Pod, k *configs.KubernetesTaskConfig) (*corev1.Pod, error) {
	if k == nil {
		return pod, nil
	}
	if k.ProvisionTimeoutSeconds > 0 {
		pod.Annotations[annotationProvisionTimeout] = strconv.Itoa(k.ProvisionTimeoutSeconds)
	}
	if len(k.PodConfig) == 0 && len(k.CustomMetadata) == 0 {
		return pod, nil
	}
	base, err := toJSONMap(pod)
	if err != nil {
		return nil, err
	}
	if len(k.CustomMetadata) > 0 {
		mergeK8s(base, map[string]any{"metadata": deepCopyJSON(k.CustomMetadata)})
	}
	if len(k.PodConfig) > 0 {
		mergeK8s(base, deepCopyJSON(k.PodConfig).(map[string]any))
	}
	merged, err := fromJSONMap(base)
	if err != nil {
		return nil, fmt.Errorf("%w: config.kubernetes.pod_config does not make a valid pod: %v", launcher.ErrInvalid, err)
	}
	keepFerrys(merged, pod)
	return merged, nil
}

// keepFerrys sets back on merged what Ferry's pod needs from orig.
func keepFerrys(merged, orig *corev1.Pod) {
	merged.Name, merged.Namespace = orig.Name, orig.Namespace
	maps.Copy(merged.Labels, orig.Labels)
	merged.Spec.RestartPolicy = orig.Spec.RestartPolicy
	merged.Spec.PriorityClassName, merged.Spec.Priority = orig.Spec.PriorityClassName, orig.Spec.Priority
	merged.Spec.TerminationGracePeriodSeconds = orig.Spec.TerminationGracePeriodSeconds
	if len(merged.Spec.Containers) > 0 && len(orig.Spec.Containers) > 0 {
		c, o := &merged.Spec.Containers[0], &orig.Spec.Containers[0]
		c.Name, c.Image, c.Command, c.Args = o.Name, o.Image, o.Command, o.Args
	}
}

// mergeK8s merges override into base, SkyPilot's merge_k8s_configs.
func mergeK8s(base, override map[string]any) {
	for key, value := range override {
		cur, present := base[key]
		switch v := value.(type) {
		case map[string]any:
			if b, ok := cur.(map[string]any); ok && present {
				mergeK8s(b, v)
				continue
			}
		case []any:
			if b, ok := cur.([]any); ok && present {
				base[key] = mergeK8sList(key, b, v)
				continue
			}
		}
		base[key] = value
	}
}

// mergeK8sList merges the list override into base under key.
func mergeK8sList(key string, base, override []any) []any {
	if key == "containers" || key == "imagePullSecrets" {
		// One container per pod: pod_config's first merges into the pod's first.
		if len(base) > 0 && len(override) > 0 {
			b, okB := base[0].(map[string]any)
			o, okO := override[0].(map[string]any)
			if okB && okO {
				mergeK8s(b, o)
				return base
			}
		}
		return append(base, override...)
	}
	mk, keyed := patchMergeKeys[key]
	if !keyed {
		return append(base, override...)
	}
	for _, item := range override {
		o, ok := item.(map[string]any)
		name, named := o[mk]
		if !ok || !named || name == nil {
			base = append(base, item)
			continue
		}
		found := false
		for _, existing := range base {
			if b, ok := existing.(map[string]any); ok && jsonEqual(b[mk], name) {
				mergeK8s(b, o)
				found = true
				break
			}
		}
		if !found {
			base = append(base, item)
		}
	}
	return base
}

// jsonEqual compares two JSON scalars (a port may be 8080 in one and 8080.0 in the other).
func jsonEqual(a, b any) bool {
	return fmt.Sprint(normalizeNumber(a)) == fmt.Sprint(normalizeNumber(b))
}

func normalizeNumber(v any) any {
	switch n := v.(type) {
	case json.Number:
		if f, err := n.Float64(); err == nil {
			return f
		}
	case int64:
		return float64(n)
	case int:
		return float64(n)
	}
	return v
}

// deepCopyJSON copies a JSON value, so that merging never changes the task's own.
func deepCopyJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, item := range x {
			out[k] = deepCopyJSON(item)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			out[i] = deepCopyJSON(item)
		}
		return out
	}
	return v
}

// toJSONMap is the pod as a JSON object.
func toJSONMap(pod *corev1.Pod) (map[string]any, error) {
	raw, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// fromJSONMap decodes a JSON object into a pod, refusing fields a Pod does not have.
func fromJSONMap(m map[string]any) (*corev1.Pod, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	pod := &corev1.Pod{}
	if err := dec.Decode(pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// provisionTimeout is how long pod may stay unschedulable: its task's
// config.kubernetes.provision_timeout, else the context's.
func (p *Provider) provisionTimeout(pod *corev1.Pod) time.Duration {
	if s, err := strconv.Atoi(pod.Annotations[annotationProvisionTimeout]); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return p.opts.ProvisionTimeout
}

// CheckPodConfig reports whether k makes a valid pod when merged into one of Ferry's, for a
// plan (--dry-run) to say so before anything is launched.
func CheckPodConfig(k *configs.KubernetesTaskConfig) error {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerName}}}}
	pod.Annotations, pod.Labels = map[string]string{}, map[string]string{}
	_, err := withPodConfig(pod, k)
	return err
}
