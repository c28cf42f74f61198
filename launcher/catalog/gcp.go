package catalog

import (
	"fmt"
	"math"
	"strings"
)

// GCP prices an n1 VM with GPUs as two parts: the machine (an n1 row, no accelerator) and the
// GPUs attached to it (an "n1-attach-<GPU>" row, no machine). The a2, a3 and g2 rows in the
// file already include their built-in GPUs; the "g2-attach-L4" rows are the L4 part of the g2
// prices, listed for audit only.
const (
	n1AttachPrefix = "n1-attach-"
	g2AttachPrefix = "g2-attach-"
	n1Prefix       = "n1-"
)

// n1Limit is the largest n1 machine that may carry a number of one GPU model.
type n1Limit struct {
	vcpus     float64
	memoryGiB float64
}

// n1Limits are GCP's documented caps on the n1 machine a GPU count can attach to
// (https://cloud.google.com/compute/docs/gpus, the table SkyPilot's GCP catalog also uses as
// _NUM_ACC_TO_MAX_CPU_AND_MEMORY). P100×4 is capped at 64 vCPUs in us-east1-c and two
// europe-west1 zones; no n1 shape in the data is that large, so one cap serves. A GPU count
// with no entry here is not attachable.
var n1Limits = map[string]map[int]n1Limit{
	"T4":   {1: {48, 312}, 2: {48, 312}, 4: {96, 624}},
	"V100": {1: {12, 78}, 2: {24, 156}, 4: {48, 312}, 8: {96, 624}},
	"P100": {1: {16, 104}, 2: {32, 208}, 4: {96, 624}},
}

// attachable reports whether GCP accepts count GPUs of the model on an n1 machine that size.
func attachable(accelerator string, count int, host Row) bool {
	l, ok := n1Limits[strings.ToUpper(accelerator)][count]
	return ok && host.VCPUs <= l.vcpus && host.MemoryGiB <= l.memoryGiB
}

// composeGCP turns GCP's part rows into complete VMs. Every n1 machine row stays (a CPU-only VM)
// and is joined with every GPU attachment in the same zone that GCP allows on it, so T4:1 is
// offered on n1-standard-4/8/16 and n1-highmem-4/8 and the optimizer picks by price and by the
// request's cpus/memory. A price is the sum of both parts' prices and is missing when either
// part's is. g2-attach rows are dropped: the g2-standard rows already include them.
func composeGCP(rows []Row) ([]Row, error) {
	var out, attachments []Row
	hosts := map[string][]Row{} // zone → n1 machine rows
	for _, r := range rows {
		switch {
		case strings.HasPrefix(r.InstanceType, g2AttachPrefix):
		case strings.HasPrefix(r.InstanceType, n1AttachPrefix):
			if r.Accelerator == "" {
				return nil, fmt.Errorf("gcp_gpu.csv: %s in %s has no accelerator", r.InstanceType, r.Zone)
			}
			if _, ok := n1Limits[strings.ToUpper(r.Accelerator)][r.AcceleratorCount]; !ok {
				return nil, fmt.Errorf("gcp_gpu.csv: no n1 attachment limits for %s:%d; add GCP's documented caps to n1Limits", r.Accelerator, r.AcceleratorCount)
			}
			attachments = append(attachments, r)
		case strings.HasPrefix(r.InstanceType, n1Prefix) && r.Accelerator == "":
			hosts[r.Zone] = append(hosts[r.Zone], r)
			out = append(out, r)
		default:
			out = append(out, r)
		}
	}
	for _, a := range attachments {
		for _, h := range hosts[a.Zone] {
			if !attachable(a.Accelerator, a.AcceleratorCount, h) {
				continue
			}
			vm := h
			vm.Accelerator = a.Accelerator
			vm.AcceleratorCount = a.AcceleratorCount
			vm.GPUMemoryMiB = a.GPUMemoryMiB
			vm.OnDemandPerHour = sumIfBoth(h.OnDemandPerHour, a.OnDemandPerHour)
			vm.SpotPerHour = sumIfBoth(h.SpotPerHour, a.SpotPerHour)
			if vm.OnDemandPerHour == 0 && vm.SpotPerHour == 0 {
				continue
			}
			out = append(out, vm)
		}
	}
	return out, nil
}

// sumIfBoth adds two part prices, or returns 0 (missing) when either part is missing.
func sumIfBoth(host, gpu float64) float64 {
	if host == 0 || gpu == 0 {
		return 0
	}
	// Round to the catalog's precision so 0.38 + 0.35 is 0.73, not 0.7300000000000001.
	return math.Round((host+gpu)*1e6) / 1e6
}
