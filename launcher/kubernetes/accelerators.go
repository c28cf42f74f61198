package kubernetes

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Node labels that name a node's GPU. NVIDIA's GPU feature discovery (and the GPU operator) set
// the first, GKE the second; the values differ ("NVIDIA-A100-SXM4-40GB" against
// "nvidia-tesla-a100"), so both are read into the catalog's names (A100, A100-80GB, ...).
const (
	LabelGPUProduct     = "nvidia.com/gpu.product"
	LabelGKEAccelerator = "cloud.google.com/gke-accelerator"
	// ResourceGPU is the extended resource NVIDIA's device plugin advertises.
	ResourceGPU corev1.ResourceName = "nvidia.com/gpu"
)

// gpuLabels are read in this order; a node carrying both is described by the first.
var gpuLabels = []string{LabelGPUProduct, LabelGKEAccelerator}

// knownGPUs are catalog accelerator names, longest first so that "A100-80GB" is not read as
// "A100" and "H100-MEGA" not as "H100".
var knownGPUs = []string{
	"A100-80GB", "V100-32GB", "H100-MEGA", "L40S", "A10G", "A100", "H100", "H200", "V100",
	"P100", "L40", "A10", "T4", "L4", "B200", "P4",
}

// canonicalGPU maps a node label value to the catalog's accelerator name, or "" when it names
// no GPU Ferry knows. Memory suffixes decide the variants the catalog tells apart: an 80 GB A100
// is "A100-80GB", a 32 GB V100 "V100-32GB"; an H100's 80 GB is its only size.
func canonicalGPU(value string) string {
	v := strings.ToUpper(value)
	v = strings.NewReplacer("_", "-", " ", "-").Replace(v)
	for _, prefix := range []string{"NVIDIA-", "TESLA-"} {
		v = strings.TrimPrefix(v, prefix)
	}
	v = strings.TrimPrefix(v, "TESLA-") // "nvidia-tesla-t4"
	tokens := strings.Split(v, "-")
	has := func(s string) bool {
		for _, t := range tokens {
			if t == s {
				return true
			}
		}
		return false
	}
	switch tokens[0] {
	case "A100":
		if has("80GB") {
			return "A100-80GB"
		}
		return "A100"
	case "V100":
		if has("32GB") {
			return "V100-32GB"
		}
		return "V100"
	case "H100":
		if has("MEGA") {
			return "H100-MEGA"
		}
		return "H100"
	}
	for _, name := range knownGPUs {
		if tokens[0] == name {
			return name
		}
	}
	return ""
}

// nodeGPU returns the node's accelerator (catalog name), the label and value that say so, and
// how many it can allocate. A node without a known GPU label returns "". A node that shares
// GPUs counts its physical GPUs, not HAMi's virtual slots.
func nodeGPU(n *corev1.Node) (name, label, value string, count int64) {
	q, ok := n.Status.Allocatable[ResourceGPU]
	if !ok || q.Value() <= 0 {
		return "", "", "", 0
	}
	if s, ok := nodeShare(n); ok && s.devices > 0 {
		q = *resource.NewQuantity(min(s.devices, q.Value()), resource.DecimalSI)
	}
	for _, l := range gpuLabels {
		if v := n.Labels[l]; v != "" {
			if c := canonicalGPU(v); c != "" {
				return c, l, v, q.Value()
			}
		}
	}
	return "", "", "", q.Value()
}
