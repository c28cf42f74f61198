package replicas

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// Environment variables every replica gets, so a program can tell which replica it is.
// SKYPILOT_SERVE_REPLICA_ID keeps SkyServe programs working unchanged.
const (
	EnvService         = "FERRY_SERVICE"
	EnvReplicaID       = "FERRY_REPLICA_ID"
	EnvSkyPilotReplica = "SKYPILOT_SERVE_REPLICA_ID"
)

// LabelKind records whether a replica was launched as a spot or an on-demand replica: the
// autoscaler's mix counts replicas by the kind they were launched as, whatever capacity they
// landed on (a spot replica placed on a Kubernetes cluster is still the spot kind).
const LabelKind = "ferry.kind"

// LabelNodes is a multi-node replica's gang size, on each of its nodes (a replica of one node
// has none): a pass tells a gang that lost a node from a replica of one node by what the nodes
// themselves say, so a restarted controller judges an adopted gang with nothing from the store.
const LabelNodes = "ferry.nodes"

// Kind label values.
const (
	kindSpot     = "spot"
	kindOnDemand = "ondemand"
)

// replicaName is the instance name of a replica, unique per service because ids never repeat.
func replicaName(service string, id int) string {
	return service + "-" + strconv.Itoa(id)
}

// serviceSelector selects every instance of a service, whatever its version.
func serviceSelector(service string) map[string]string {
	return map[string]string{launcher.LabelService: service}
}

// replicaSpec is what the launcher runs for replica id. Envs hold the task's secrets: the
// result must never be logged.
func replicaSpec(service string, version int, task *configs.Task, id int, spot bool) launcher.Spec {
	envs := make(map[string]string, len(task.Envs)+len(task.Secrets)+4)
	if task.Service != nil {
		// FERRY_LORA_MODULES and FERRY_MAX_LORAS, for the run command's vLLM flags; the
		// task's own envs may override them.
		maps.Copy(envs, task.Service.Adapters.Env())
		if task.Service.Disaggregated() {
			// The decode pool; a prefill pool's task names its own (configs.Task.PoolTask).
			envs[configs.EnvPool] = configs.PoolDecode
		}
	}
	for k, v := range task.Envs {
		envs[k] = v
	}
	for k, v := range task.Secrets {
		envs[k] = v
	}
	envs[EnvService] = service
	envs[EnvReplicaID] = strconv.Itoa(id)
	envs[EnvSkyPilotReplica] = strconv.Itoa(id)
	if _, set := envs[launcher.EnvNumGPUsPerNode]; !set {
		// SkyPilot's serving examples size tensor parallelism by it (vLLM's --tensor-parallel-size).
		envs[launcher.EnvNumGPUsPerNode] = strconv.Itoa(gpusPerNode(task.Resources))
	}
	port := 0
	if task.Service != nil {
		port = task.Service.Port
	}
	kind := kindOnDemand
	if spot {
		kind = kindSpot
	}
	// The task's resources.labels (configs keeps them off Ferry's ferry.* keys).
	labels := maps.Clone(task.Resources.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, map[string]string{
		launcher.LabelOwner:     "true",
		launcher.LabelService:   service,
		launcher.LabelVersion:   strconv.Itoa(version),
		launcher.LabelReplicaID: strconv.Itoa(id),
		LabelKind:               kind,
	})
	spec := launcher.Spec{
		Name:         replicaName(service, id),
		Cluster:      replicaName(service, id),
		Labels:       labels,
		InstanceType: task.Resources.InstanceType,
		Setup:        task.Setup,
		Run:          task.Run,
		Workdir:      task.Workdir,
		GitWorkdir:   task.GitWorkdir,
		Kubernetes:   task.KubernetesConfig(),
		FileMounts:   task.FileMounts,
		MountModes:   task.MountModes,
		Envs:         envs,
		SecretEnvs:   task.SecretEnvNames(),
		Port:         port,
		Resources:    withSpot(task.Resources, spot),
	}
	if n := gangSize(task); n > 1 {
		spec.Labels[LabelNodes] = strconv.Itoa(n)
		// Infras deliver a gang's addresses (SKYPILOT_NODE_IPS) to nodes that carry a JobSpec:
		// a replica's nodes get one at serving priority, never preemptible for a service.
		spec.Job = &launcher.JobSpec{Priority: launcher.ServingPriority}
	}
	return spec
}

// gangSize is how many nodes each replica of task runs on: num_nodes.
func gangSize(task *configs.Task) int {
	return max(task.NumNodes, 1)
}

// gpusPerNode is SKYPILOT_NUM_GPUS_PER_NODE for a replica: the most GPUs any candidate of its
// resources asks for (as jobs count it; a task allowing several counts gets the largest).
func gpusPerNode(r configs.Resources) int {
	n := 0.0
	for _, c := range r.Candidates() {
		for _, a := range c.Accelerators {
			n = math.Max(n, a.Count)
		}
	}
	return int(math.Ceil(n))
}

// withSpot asks for spot or on-demand capacity in r and every alternative: a service's spot
// and on-demand fallback replicas share one resources block. Alternatives that mix spot and
// on-demand under a cost-per-work objective are left as written: the optimizer weighs each
// one's expected cost, interruptions included, and the fallback split does not apply.
func withSpot(r configs.Resources, spot bool) configs.Resources {
	alts := slices.Concat(r.AnyOf, r.Ordered)
	if r.Objective.PerWork() && slices.ContainsFunc(alts, func(a configs.Resources) bool { return a.UseSpot != alts[0].UseSpot }) {
		return r
	}
	if r.UseSpot == spot && !slices.ContainsFunc(alts, func(a configs.Resources) bool { return a.UseSpot != spot }) {
		return r
	}
	r.UseSpot = spot
	r.AnyOf = slices.Clone(r.AnyOf)
	r.Ordered = slices.Clone(r.Ordered)
	for i := range r.AnyOf {
		r.AnyOf[i].UseSpot = spot
	}
	for i := range r.Ordered {
		r.Ordered[i].UseSpot = spot
	}
	return r
}

// describeResources is the short RESOURCES column of `serve status`, e.g. "A100:1, cpus=4+, spot".
func describeResources(r configs.Resources) string {
	var parts []string
	if len(r.Accelerators) > 0 {
		alts := make([]string, len(r.Accelerators))
		for i, a := range r.Accelerators {
			alts[i] = a.Name + ":" + strconv.FormatFloat(a.Count, 'f', -1, 64)
		}
		parts = append(parts, strings.Join(alts, "|"))
	}
	if r.CPUs != "" {
		parts = append(parts, "cpus="+r.CPUs)
	}
	if r.Memory != "" {
		parts = append(parts, "mem="+r.Memory)
	}
	if r.UseSpot {
		parts = append(parts, "spot")
	}
	return strings.Join(parts, ", ")
}

// accelerator is the GPU type an instance-aware policy should assume for this task's replicas:
// known only when the task allows exactly one type.
func accelerator(r configs.Resources) string {
	if len(r.Accelerators) == 1 {
		return r.Accelerators[0].Name
	}
	return ""
}

// MixFor reads the spot part of a task: use_spot from its resources (every candidate agrees,
// configs checks that) and the fallback fields of its replica policy.
func MixFor(r configs.Resources, p configs.ReplicaPolicy) policy.MixSpec {
	return policy.MixSpec{UseSpot: r.UseSpot, BaseOnDemand: p.BaseOndemandFallbackReplicas, DynamicFallback: p.DynamicOndemandFallback}
}
