package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// GPU sharing is HAMi's (ANCHORS.md §3): a pod asks for nvidia.com/gpu (devices) plus a
// memory and a cores share of each, and goes to HAMi's scheduler, which picks the devices and
// writes them into the pod for HAMi's device plugin and in-container limiter.
//
// A node shares when HAMi's device plugin registered it (the hami.io/node-nvidia-register
// annotation: one JSON entry per physical GPU with its UUID, memory, cores and type), or when
// its allocatable has nvidia.com/gpumem or nvidia.com/gpucores, as the test cluster's nodes
// (and any setup that lets kube-scheduler account for shares) do. On a HAMi node,
// nvidia.com/gpu allocatable counts virtual slots (physical × deviceSplitCount), not GPUs.
const (
	ResourceGPUMem           corev1.ResourceName = "nvidia.com/gpumem"
	ResourceGPUMemPercentage corev1.ResourceName = "nvidia.com/gpumem-percentage"
	ResourceGPUCores         corev1.ResourceName = "nvidia.com/gpucores"

	AnnotationUseGPUType   = "nvidia.com/use-gputype"
	AnnotationNoUseGPUType = "nvidia.com/nouse-gputype"
	AnnotationUseGPUUUID   = "nvidia.com/use-gpuuuid"
	AnnotationNoUseGPUUUID = "nvidia.com/nouse-gpuuuid"
	AnnotationNodePolicy   = "hami.io/node-scheduler-policy"
	AnnotationGPUPolicy    = "hami.io/gpu-scheduler-policy"
	// AnnotationHAMiRegister is where HAMi's device plugin lists a node's GPUs.
	AnnotationHAMiRegister = "hami.io/node-nvidia-register"
	// LabelGPUCount is the physical GPU count NVIDIA's feature discovery labels nodes with.
	LabelGPUCount = "nvidia.com/gpu.count"

	// DefaultGPUSchedulerName is HAMi chart's schedulerName.
	DefaultGPUSchedulerName = "hami-scheduler"
)

// hamiDevice is one entry of the hami.io/node-nvidia-register annotation (HAMi's current JSON
// encoding; the older colon-separated one is not read).
type hamiDevice struct {
	ID      string `json:"id"`
	Count   int    `json:"count"`
	DevMem  int64  `json:"devmem"`
	DevCore int64  `json:"devcore"`
	Type    string `json:"type"`
	Health  bool   `json:"health"`
}

// shareNode is what a sharing node offers: physical GPUs, and memory (MiB) and cores (percent,
// 100 per GPU) over all of them; 0 where the node does not say.
type shareNode struct {
	devices  int64
	memMiB   int64
	cores    int64
	uuids    []string
	types    []string // card types HAMi registered
	register bool     // from HAMi's annotation, rather than allocatable alone
}

// nodeShare reports whether n shares GPUs, and what it offers.
func nodeShare(n *corev1.Node) (shareNode, bool) {
	var s shareNode
	if raw := n.Annotations[AnnotationHAMiRegister]; raw != "" {
		var devs []hamiDevice
		if err := json.Unmarshal([]byte(raw), &devs); err == nil && len(devs) > 0 {
			s.register = true
			for _, d := range devs {
				s.devices++
				s.memMiB += d.DevMem
				s.cores += d.DevCore
				s.uuids = append(s.uuids, d.ID)
				if !slices.Contains(s.types, d.Type) {
					s.types = append(s.types, d.Type)
				}
			}
			return s, true
		}
	}
	mem, hasMem := n.Status.Allocatable[ResourceGPUMem]
	cores, hasCores := n.Status.Allocatable[ResourceGPUCores]
	if !hasMem && !hasCores {
		return s, false
	}
	s.memMiB, s.cores = mem.Value(), cores.Value()
	if c, err := strconv.ParseInt(n.Labels[LabelGPUCount], 10, 64); err == nil && c > 0 {
		s.devices = c
	} else {
		s.devices = max(s.cores/100, 1)
	}
	return s, true
}

// typeMatches is HAMi's rule for use-gputype/nouse-gputype: a case-insensitive substring of
// the card type. A node's types are its registered ones, its GPU label's value and Ferry's name.
func typeMatches(nodeTypes []string, want []string) bool {
	for _, t := range nodeTypes {
		for _, w := range want {
			if strings.Contains(strings.ToUpper(t), strings.ToUpper(w)) {
				return true
			}
		}
	}
	return false
}

// nodeTypes lists the names a node's GPUs go by.
func nodeTypes(n *corev1.Node) []string {
	name, _, value, _ := nodeGPU(n)
	out := []string{name, value}
	if s, ok := nodeShare(n); ok {
		out = append(out, s.types...)
	}
	return slices.DeleteFunc(out, func(s string) bool { return s == "" })
}

// admitsNode applies the task's type and UUID pins to a node; avoided UUIDs do not exclude a
// node, since its other GPUs may do.
func admitsNode(n *corev1.Node, share *configs.GPUShare) bool {
	if share == nil {
		return true
	}
	types := nodeTypes(n)
	if len(share.UseTypes) > 0 && !typeMatches(types, share.UseTypes) {
		return false
	}
	if len(share.AvoidTypes) > 0 {
		name, _, value, _ := nodeGPU(n)
		if typeMatches([]string{name, value}, share.AvoidTypes) {
			return false
		}
	}
	if len(share.UseUUIDs) > 0 {
		s, ok := nodeShare(n)
		if !ok || !slices.ContainsFunc(s.uuids, func(u string) bool { return slices.Contains(share.UseUUIDs, u) }) {
			return false
		}
	}
	return true
}

// sharedResources fills req for a shared request and returns the node affinity: nodes that
// share, carry acc and pass the pins. No such node is launcher.ErrNoCapacity naming the
// context and why, so the provisioner fails over and a dry run says so.
func (p *Provider) sharedResources(req corev1.ResourceRequirements, acc string, share configs.SharedGPU, pins *configs.GPUShare) (corev1.ResourceRequirements, *corev1.Affinity, error) {
	set := func(name corev1.ResourceName, v int64) {
		q := *resource.NewQuantity(v, resource.DecimalSI)
		req.Requests[name], req.Limits[name] = q, q
	}
	set(ResourceGPU, int64(share.GPUs))
	switch {
	case share.MemoryMiB > 0:
		set(ResourceGPUMem, int64(share.MemoryMiB))
	case share.MemoryPercent > 0:
		set(ResourceGPUMemPercentage, int64(share.MemoryPercent))
	}
	if share.Cores > 0 {
		set(ResourceGPUCores, int64(share.Cores))
	}
	if p.nodes == nil {
		return req, nil, fmt.Errorf("%w: %s: nodes may not be listed, so whether the cluster shares GPUs (HAMi) is unknown", launcher.ErrNoCapacity, p.infra)
	}
	nodes, err := p.nodes.List(labels.Everything())
	if err != nil {
		return req, nil, err
	}
	values, hosts := map[string][]string{}, []string{}
	sharing, typed := 0, 0
	for _, n := range nodes {
		s, ok := nodeShare(n)
		if !ok {
			continue
		}
		sharing++
		name, label, value, _ := nodeGPU(n)
		if !strings.EqualFold(name, acc) || s.devices < int64(share.GPUs) {
			continue
		}
		typed++
		if !admitsNode(n, pins) || label == "" {
			continue
		}
		if !slices.Contains(values[label], value) {
			values[label] = append(values[label], value)
		}
		hosts = append(hosts, n.Name)
	}
	switch {
	case sharing == 0:
		return req, nil, fmt.Errorf("%w: %s cannot share GPUs: no node advertises HAMi (the %s annotation, or %s and %s allocatable)", launcher.ErrNoCapacity, p.infra, AnnotationHAMiRegister, ResourceGPUMem, ResourceGPUCores)
	case typed == 0:
		return req, nil, fmt.Errorf("%w: %s: no node that shares GPUs has %d x %s", launcher.ErrNoCapacity, p.infra, share.GPUs, acc)
	case len(hosts) == 0:
		return req, nil, fmt.Errorf("%w: %s: no node that shares %s passes gpu_share's type and UUID pins", launcher.ErrNoCapacity, p.infra, acc)
	}
	for _, v := range values {
		slices.Sort(v)
	}
	aff := gpuAffinity(values)
	if pins != nil && len(pins.UseUUIDs) > 0 {
		// Only some nodes hold the pinned devices: name them.
		slices.Sort(hosts)
		terms := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		for i := range terms {
			terms[i].MatchExpressions = append(terms[i].MatchExpressions, corev1.NodeSelectorRequirement{
				Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: hosts})
		}
	}
	return req, aff, nil
}

// applyGPUShare adds HAMi's annotations for the task's pins and policies, and sends a pod that
// shares a GPU to the sharing scheduler.
func (p *Provider) applyGPUShare(pod *corev1.Pod, r configs.Resources, shared bool) {
	if shared {
		pod.Spec.SchedulerName = p.opts.GPUSchedulerName
	}
	s := r.GPUShare
	if s == nil {
		return
	}
	for key, vals := range map[string][]string{
		AnnotationUseGPUType: s.UseTypes, AnnotationNoUseGPUType: s.AvoidTypes,
		AnnotationUseGPUUUID: s.UseUUIDs, AnnotationNoUseGPUUUID: s.AvoidUUIDs,
	} {
		if len(vals) > 0 {
			pod.Annotations[key] = strings.Join(vals, ",")
		}
	}
	if s.NodePolicy != "" {
		pod.Annotations[AnnotationNodePolicy] = s.NodePolicy
	}
	if s.GPUPolicy != "" {
		pod.Annotations[AnnotationGPUPolicy] = s.GPUPolicy
	}
}

// sharesGPU reports requests that share a GPU (any of HAMi's share resources).
func sharesGPU(req corev1.ResourceRequirements) bool {
	for _, r := range []corev1.ResourceName{ResourceGPUMem, ResourceGPUMemPercentage, ResourceGPUCores} {
		if _, ok := req.Requests[r]; ok {
			return true
		}
	}
	return false
}

// NodeShare is one sharing node's GPU capacity, for `ferry show-gpus`: physical GPUs, memory
// (MiB) and cores (percent, 100 per GPU) in all and still free, and the pods using them.
type NodeShare struct {
	Node        string `json:"node"`
	Accelerator string `json:"accelerator"`
	GPUs        int64  `json:"gpus"`
	MemoryMiB   int64  `json:"memory_mib"`
	MemoryFree  int64  `json:"memory_free_mib"`
	Cores       int64  `json:"cores"`
	CoresFree   int64  `json:"cores_free"`
	Pods        int    `json:"pods"`
}

// SharedCapacity lists the nodes that share GPUs, with what their unfinished pods (in every
// namespace) have taken. HAMi's own accounting is per device; this one is per node, which is
// what a user choosing a share needs to know.
func (p *Provider) SharedCapacity(ctx context.Context) ([]NodeShare, error) {
	if err := p.ensureStarted(ctx); err != nil {
		return nil, err
	}
	if p.nodes == nil {
		return nil, fmt.Errorf("%w: %s: nodes may not be listed", launcher.ErrUnauthorized, p.infra)
	}
	nodes, err := p.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	byNode := map[string]*NodeShare{}
	perGPU := map[string]int64{} // memory of one GPU, for percentage requests
	var out []NodeShare
	for _, n := range nodes {
		s, ok := nodeShare(n)
		if !ok {
			continue
		}
		name, _, value, _ := nodeGPU(n)
		if name == "" {
			name = value
		}
		out = append(out, NodeShare{Node: n.Name, Accelerator: name, GPUs: s.devices,
			MemoryMiB: s.memMiB, MemoryFree: s.memMiB, Cores: s.cores, CoresFree: s.cores})
		perGPU[n.Name] = s.memMiB / max(s.devices, 1)
	}
	for i := range out {
		byNode[out[i].Node] = &out[i]
	}
	pods, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: "status.phase!=Succeeded,status.phase!=Failed",
	})
	if err != nil {
		return nil, p.classify(err, "list pods in every namespace")
	}
	for _, pod := range pods.Items {
		ns := byNode[pod.Spec.NodeName]
		if ns == nil {
			continue
		}
		mem, cores, any := podShare(&pod, perGPU[pod.Spec.NodeName])
		if !any {
			continue
		}
		ns.Pods++
		ns.MemoryFree = max(ns.MemoryFree-mem, 0)
		ns.CoresFree = max(ns.CoresFree-cores, 0)
	}
	slices.SortFunc(out, func(a, b NodeShare) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

// podShare is the memory (MiB) and cores a pod's containers take from a sharing node, by
// HAMi's defaults: no memory share is the whole device's memory, no cores share reserves no
// cores unless the GPU is requested whole.
func podShare(pod *corev1.Pod, gpuMiB int64) (mem, cores int64, uses bool) {
	for _, c := range pod.Spec.Containers {
		q, ok := c.Resources.Limits[ResourceGPU]
		if !ok {
			q, ok = c.Resources.Requests[ResourceGPU]
		}
		if !ok || q.Value() <= 0 {
			continue
		}
		uses = true
		gpus := q.Value()
		amount := func(name corev1.ResourceName) (int64, bool) {
			v, ok := c.Resources.Limits[name]
			if !ok {
				v, ok = c.Resources.Requests[name]
			}
			return v.Value(), ok
		}
		mib, okMiB := amount(ResourceGPUMem)
		pct, okPct := amount(ResourceGPUMemPercentage)
		cpct, okCores := amount(ResourceGPUCores)
		whole := !okMiB && !okPct && !okCores
		switch {
		case okMiB:
			mem += gpus * mib
		case okPct:
			mem += gpus * gpuMiB * pct / 100
		default: // HAMi's defaultMemory 0: the whole device's memory
			mem += gpus * gpuMiB
		}
		switch {
		case okCores:
			cores += gpus * cpct
		case whole: // a whole GPU; a share without cores reserves none (defaultCores 0)
			cores += gpus * 100
		}
	}
	return mem, cores, uses
}
