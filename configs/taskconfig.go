package configs

import (
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// A task's `config:` is SkyPilot's per-task override of ~/.sky/config.yaml: the keys SkyPilot
// lets a task override (sky/skylet/constants.py, OVERRIDEABLE_CONFIG_KEYS_IN_TASK). Ferry acts
// on the Kubernetes ones that shape a pod:
//
//	config:
//	  kubernetes:
//	    pod_config:                 # merged into every pod of the task, SkyPilot's way
//	      spec:
//	        containers:
//	          - resources:
//	              limits: {vpc.amazonaws.com/efa: 4}
//	              requests: {vpc.amazonaws.com/efa: 4}
//	    custom_metadata: {labels: {team: ml}, annotations: {owner: me}}
//	    provision_timeout: 600      # seconds a pod may stay unschedulable before the launch fails over
//
// Every other key SkyPilot accepts there is refused by name, with what to do instead; a key
// SkyPilot does not know is an unknown field. Ferry's own settings stay in its config.yaml.

// TaskConfig is a task's `config:` section.
type TaskConfig struct {
	// Kubernetes shapes the task's pods; nil when the task sets none of it.
	Kubernetes *KubernetesTaskConfig `json:"kubernetes,omitempty" yaml:"kubernetes,omitempty"`
}

// KubernetesTaskConfig is `config.kubernetes`. PodConfig and CustomMetadata hold the YAML as
// JSON values (maps with string keys, lists, strings, numbers, booleans): the Kubernetes
// provider merges them into the pod it builds, with SkyPilot's rules (merge_k8s_configs).
type KubernetesTaskConfig struct {
	// PodConfig is a partial Pod (apiVersion, kind, metadata, spec).
	PodConfig map[string]any `json:"pod_config,omitempty" yaml:"pod_config,omitempty"`
	// CustomMetadata is labels and annotations added to each pod's metadata.
	CustomMetadata map[string]any `json:"custom_metadata,omitempty" yaml:"custom_metadata,omitempty"`
	// ProvisionTimeoutSeconds replaces the context's provision_timeout_seconds for this task:
	// how long a pod may stay unschedulable before its launch is a lack of capacity (and the
	// next candidate is tried). 0 keeps the context's.
	ProvisionTimeoutSeconds int `json:"provision_timeout,omitempty" yaml:"provision_timeout,omitempty"`
}

// maxProvisionTimeoutSeconds bounds config.kubernetes.provision_timeout: a day, far beyond any
// cluster autoscaler, and short of a launch that never gives up.
const maxProvisionTimeoutSeconds = 24 * 3600

// skypilotTaskConfig is every key SkyPilot lets a task's config override, by section, with why
// Ferry refuses it ("" for the ones Ferry acts on).
var skypilotTaskConfig = map[string]map[string]string{
	"kubernetes": {
		"pod_config":        "",
		"custom_metadata":   "",
		"provision_timeout": "",
		"dws":               "Ferry's queued capacity is resources.capacity: {mode: queued} (a ProvisioningRequest where the context has queued_provisioning in Ferry's config.yaml)",
		"kueue":             "Ferry finds Kueue's LocalQueue itself for resources.capacity: {mode: queued}; name one with kubernetes.kueue_local_queue in Ferry's config.yaml",
		"remote_identity":   "pods run as the namespace's default service account; set another with config.kubernetes.pod_config: {spec: {serviceAccountName: NAME}}",
	},
	"ssh": {
		"custom_metadata":   "Ferry has no SSH node pools",
		"pod_config":        "Ferry has no SSH node pools",
		"provision_timeout": "Ferry has no SSH node pools",
	},
	"docker": {
		"run_options": "Ferry runs an image_id: docker:IMAGE container on a VM with its own options (--net=host, --gpus all, the task's files bound): other docker run options are not offered",
	},
	"nvidia_gpus": {
		"disable_ecc": "Ferry does not change GPU settings on the nodes it launches",
	},
	"gcp": {
		"managed_instance_group": "Ferry launches GCP VMs one by one; for capacity that waits, write resources.capacity: {mode: queued} (GCP's flex-start)",
		"enable_gvnic":           "Ferry does not choose GCP network interfaces",
		"enable_gpu_direct":      "Ferry does not set up GPUDirect-TCPX; resources.network_tier: best prefers the machine types that have it",
		"placement_policy":       "a job's gang is placed in one zone already; Ferry sets no GCP placement policy",
	},
	"vast": {
		"datacenter_only":        "Ferry does not launch on Vast.ai",
		"create_instance_kwargs": "Ferry does not launch on Vast.ai",
	},
}

// skypilotTaskConfigTop are the keys SkyPilot takes at the top of a task's config that hold no
// section, with why Ferry refuses them.
var skypilotTaskConfigTop = map[string]string{
	"active_workspace": "Ferry has no workspaces: one controller home holds every service and job",
	"hooks":            "Ferry runs no lifecycle hooks: a job's program gets SIGTERM and job.grace_period_seconds before it is stopped",
}

var kubernetesTaskConfigKeys = keysOf[KubernetesTaskConfig]()

// taskConfig reads the task's `config:` section.
func (c *checker) taskConfig(n *yaml.Node) *TaskConfig {
	const field = "config"
	ps, ok := c.pairs(n, field)
	if !ok {
		return nil
	}
	sections := slices.Sorted(maps.Keys(skypilotTaskConfig))
	valid := append(slices.Clone(sections), slices.Sorted(maps.Keys(skypilotTaskConfigTop))...)
	tc := &TaskConfig{}
	for _, p := range ps {
		kf := joinField(field, p.key)
		if why, ok := skypilotTaskConfigTop[p.key]; ok {
			c.errorf(p.keyNode, kf, "SkyPilot's config.%s is not supported by Ferry: %s; remove it", p.key, why)
			continue
		}
		keys, ok := skypilotTaskConfig[p.key]
		if !ok {
			c.errorf(p.keyNode, kf, "unknown field %s: a task's config overrides only what SkyPilot lets a task override%s", quoteShort(p.key), suggest(p.key, valid, "fields"))
			continue
		}
		if p.key == "kubernetes" {
			tc.Kubernetes = c.kubernetesTaskConfig(p.value, kf)
			continue
		}
		c.refuseSection(p.value, kf, keys)
	}
	if tc.Kubernetes == nil {
		return nil
	}
	return tc
}

// refuseSection reports every key of a config section Ferry does not act on, each by name.
func (c *checker) refuseSection(n *yaml.Node, field string, keys map[string]string) {
	ps, ok := c.pairs(n, field)
	if !ok {
		return
	}
	valid := slices.Sorted(maps.Keys(keys))
	for _, p := range ps {
		kf := joinField(field, p.key)
		why, known := keys[p.key]
		if !known {
			c.errorf(p.keyNode, kf, "unknown field %s%s", quoteShort(p.key), suggest(p.key, valid, "fields"))
			continue
		}
		c.errorf(p.keyNode, kf, "SkyPilot's %s is not supported by Ferry: %s; remove it", kf, why)
	}
}

// kubernetesTaskConfig reads config.kubernetes.
func (c *checker) kubernetesTaskConfig(n *yaml.Node, field string) *KubernetesTaskConfig {
	ps, ok := c.pairs(n, field)
	if !ok {
		return nil
	}
	k := &KubernetesTaskConfig{}
	keys := skypilotTaskConfig["kubernetes"]
	for _, p := range ps {
		kf := joinField(field, p.key)
		why, known := keys[p.key]
		switch {
		case !known:
			c.errorf(p.keyNode, kf, "unknown field %s: a task may override %s%s", quoteShort(p.key),
				strings.Join(kubernetesTaskConfigKeys, ", "), suggest(p.key, kubernetesTaskConfigKeys, "fields"))
			continue
		case why != "":
			c.errorf(p.keyNode, kf, "SkyPilot's %s is not supported by Ferry: %s; remove it", kf, why)
			continue
		case isNull(p.value):
			continue
		}
		switch p.key {
		case "pod_config":
			k.PodConfig = c.podConfig(p.value, kf)
		case "custom_metadata":
			if md, ok := c.podMetadata(p.value, kf, false); ok {
				k.CustomMetadata = md
			}
		case "provision_timeout":
			if v, ok := c.intAtLeast(p.value, kf, 1); ok {
				if v > maxProvisionTimeoutSeconds {
					c.errorf(p.value, kf, "at most %d seconds (a day), got %d", maxProvisionTimeoutSeconds, v)
				} else {
					k.ProvisionTimeoutSeconds = v
				}
			}
		}
	}
	if k.PodConfig == nil && k.CustomMetadata == nil && k.ProvisionTimeoutSeconds == 0 {
		return nil
	}
	return k
}

// jsonValue converts a YAML value to the JSON value it reads as: a mapping (string keys only) to
// map[string]any, a list to []any, scalars to string, int64, float64, bool or nil. Problems are
// reported at their node; ok is false when any was.
func (c *checker) jsonValue(n *yaml.Node, field string, depth int) (any, bool) {
	n = c.deref(n)
	if depth > maxSubstituteDepth {
		c.errorf(n, field, "nested more than %d levels deep", maxSubstituteDepth)
		return nil, false
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, ok := c.pairs(n, field)
		out := make(map[string]any, len(ps))
		for _, p := range ps {
			v, good := c.jsonValue(p.value, joinField(field, p.key), depth+1)
			ok = ok && good
			out[p.key] = v
		}
		return out, ok
	case yaml.SequenceNode:
		out := make([]any, len(n.Content))
		ok := true
		for i, item := range n.Content {
			v, good := c.jsonValue(item, indexField(field, i), depth+1)
			ok = ok && good
			out[i] = v
		}
		return out, ok
	case yaml.ScalarNode:
		return c.jsonScalar(n, field)
	}
	c.errorf(n, field, "expected a mapping, a list or a value, got %s", describe(n))
	return nil, false
}

// jsonScalar converts a YAML scalar to its JSON value.
func (c *checker) jsonScalar(n *yaml.Node, field string) (any, bool) {
	switch n.ShortTag() {
	case "!!null":
		return nil, true
	case "!!bool":
		return c.boolean(n, field)
	case "!!int":
		var v int64
		if err := n.Decode(&v); err != nil {
			c.errorf(n, field, "integer %s is out of range", truncate(n.Value))
			return nil, false
		}
		return v, true
	case "!!float":
		return c.number(n, field)
	case "!!str":
		return n.Value, true
	}
	c.errorf(n, field, "expected a string, number or boolean, got %s", describe(n))
	return nil, false
}

// The fields of a Pod, its PodSpec and its Container that pod_config may name, as the
// Kubernetes API spells them (k8s.io/api/core/v1; launcher/kubernetes's tests check these lists
// against the types). A misspelled field is reported here, with its line; a value of the wrong
// shape is reported when the pod is built.
var (
	podConfigKeys = []string{"apiVersion", "kind", "metadata", "spec"}
	podSpecFields = []string{"volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
		"terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector", "serviceAccountName",
		"serviceAccount", "automountServiceAccountToken", "nodeName", "hostNetwork", "hostPID", "hostIPC",
		"shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname", "subdomain", "affinity",
		"schedulerName", "tolerations", "hostAliases", "priorityClassName", "priority", "dnsConfig", "readinessGates",
		"runtimeClassName", "enableServiceLinks", "preemptionPolicy", "overhead", "topologySpreadConstraints",
		"setHostnameAsFQDN", "os", "hostUsers", "schedulingGates", "resourceClaims", "resources", "hostnameOverride"}
	containerFields = []string{"name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
		"resizePolicy", "restartPolicy", "restartPolicyRules", "volumeMounts", "volumeDevices", "livenessProbe",
		"readinessProbe", "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy",
		"imagePullPolicy", "securityContext", "stdin", "stdinOnce", "tty"}
	podMetadataKeys = []string{"labels", "annotations"}
)

// PodSpecFields and ContainerFields are the lists above, for launcher/kubernetes's test that
// keeps them in step with the API's types.
func PodSpecFields() []string { return slices.Clone(podSpecFields) }

// ContainerFields: see PodSpecFields.
func ContainerFields() []string { return slices.Clone(containerFields) }

// Fields of the pod Ferry sets itself, which pod_config may not replace, and what to write
// instead.
var (
	podSpecOwned = map[string]string{
		"restartPolicy":                 "Ferry's pods never restart by themselves: the replica manager or the job's recovery replaces them",
		"terminationGracePeriodSeconds": "a job's grace is job.grace_period_seconds; a replica drains before it is stopped",
		"priorityClassName":             "Ferry sets the pod's priority class from job.priority (services stand at 1000)",
		"priority":                      "Ferry sets the pod's priority class from job.priority (services stand at 1000)",
		"preemptionPolicy":              "Ferry sets the pod's priority class from job.priority (services stand at 1000)",
	}
	containerOwned = map[string]string{
		"name":    "Ferry names the container itself",
		"image":   "write resources.image_id: docker:IMAGE",
		"command": "the container runs the task's setup and run",
		"args":    "the container runs the task's setup and run",
	}
	metadataOwned = map[string]string{
		"name":      "Ferry names each pod itself",
		"namespace": "pods go to the context's namespace in Ferry's config.yaml",
	}
)

// podConfig reads config.kubernetes.pod_config: a partial Pod, checked as far as its fields'
// names go, and returned as JSON values for the provider to merge.
func (c *checker) podConfig(n *yaml.Node, field string) map[string]any {
	before := len(c.errs)
	ps, ok := c.pairs(n, field)
	if !ok {
		return nil
	}
	for _, p := range ps {
		kf := joinField(field, p.key)
		switch p.key {
		case "apiVersion":
			c.constant(p.value, kf, "v1")
		case "kind":
			c.constant(p.value, kf, "Pod")
		case "metadata":
			c.podMetadata(p.value, kf, true)
		case "spec":
			c.podSpec(p.value, kf)
		default:
			c.errorf(p.keyNode, kf, "unknown field %s: pod_config is a Pod%s", quoteShort(p.key), suggest(p.key, podConfigKeys, "fields"))
		}
	}
	v, ok := c.jsonValue(n, field, 0)
	m, isMap := v.(map[string]any)
	if !ok || !isMap || len(c.errs) > before {
		return nil
	}
	return m
}

// constant checks a string field that may only hold want.
func (c *checker) constant(n *yaml.Node, field, want string) {
	if v, ok := c.str(n, field); ok && v != want {
		c.errorf(n, field, "must be %s, got %s", want, quoteShort(v))
	}
}

// podMetadata reads metadata labels and annotations (pod_config.metadata, or custom_metadata),
// keeping Ferry's own label keys for Ferry.
func (c *checker) podMetadata(n *yaml.Node, field string, inPod bool) (map[string]any, bool) {
	before := len(c.errs)
	ps, ok := c.pairs(n, field)
	if !ok {
		return nil, false
	}
	for _, p := range ps {
		kf := joinField(field, p.key)
		if why, owned := metadataOwned[p.key]; owned {
			c.errorf(p.keyNode, kf, "may not be set: %s", why)
			continue
		}
		if !slices.Contains(podMetadataKeys, p.key) {
			what := "custom_metadata takes labels and annotations"
			if inPod {
				what = "pod_config's metadata takes labels and annotations"
			}
			c.errorf(p.keyNode, kf, "unknown field %s: %s%s", quoteShort(p.key), what, suggest(p.key, podMetadataKeys, "fields"))
			continue
		}
		kvs, _ := c.pairs(p.value, kf)
		for _, kv := range kvs {
			lf := joinField(kf, kv.key)
			if p.key == "labels" && ferryLabelKey(kv.key) {
				c.errorf(kv.keyNode, lf, "label %s is Ferry's own: pods are found by it", quoteShort(kv.key))
				continue
			}
			c.scalarText(kv.value, lf)
		}
	}
	v, good := c.jsonValue(n, field, 0)
	m, isMap := v.(map[string]any)
	if !good || !isMap || len(c.errs) > before {
		return nil, false
	}
	return m, true
}

// ferryLabelKey reports whether a pod label key is one Ferry sets and finds its pods by.
func ferryLabelKey(k string) bool {
	lower := strings.ToLower(k)
	return strings.HasPrefix(lower, "ferry.") || strings.HasPrefix(lower, "ferry-") || lower == "app.kubernetes.io/managed-by"
}

// podSpec checks pod_config.spec's field names, and its one container's.
func (c *checker) podSpec(n *yaml.Node, field string) {
	ps, ok := c.pairs(n, field)
	if !ok {
		return
	}
	for _, p := range ps {
		kf := joinField(field, p.key)
		if why, owned := podSpecOwned[p.key]; owned {
			c.errorf(p.keyNode, kf, "may not be set in pod_config: %s", why)
			continue
		}
		if !slices.Contains(podSpecFields, p.key) {
			c.errorf(p.keyNode, kf, "unknown field %s of a PodSpec%s", quoteShort(p.key), suggest(p.key, podSpecFields, "fields"))
			continue
		}
		if p.key == "containers" {
			c.podContainers(p.value, kf)
		}
	}
}

// podContainers checks pod_config.spec.containers: SkyPilot merges the one container given
// into the pod's one container.
func (c *checker) podContainers(n *yaml.Node, field string) {
	n = c.deref(n)
	if n.Kind != yaml.SequenceNode {
		c.errorf(n, field, "expected a list holding one container, got %s", describe(n))
		return
	}
	if len(n.Content) != 1 {
		c.errorf(n, field, "expected one container, got %d: a task's pod has one container, which pod_config's is merged into", len(n.Content))
		return
	}
	cf := indexField(field, 0)
	ps, _ := c.pairs(n.Content[0], cf)
	for _, p := range ps {
		kf := joinField(cf, p.key)
		if why, owned := containerOwned[p.key]; owned {
			c.errorf(p.keyNode, kf, "may not be set in pod_config: %s", why)
			continue
		}
		if !slices.Contains(containerFields, p.key) {
			c.errorf(p.keyNode, kf, "unknown field %s of a Container%s", quoteShort(p.key), suggest(p.key, containerFields, "fields"))
		}
	}
}

// KubernetesConfig is the task's config.kubernetes, nil when it sets none (or t is nil).
func (t *Task) KubernetesConfig() *KubernetesTaskConfig {
	if t == nil || t.Config == nil {
		return nil
	}
	return t.Config.Kubernetes
}
