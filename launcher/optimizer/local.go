package optimizer

import (
	"fmt"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// Local capacity. A task that names `infra: local` runs there whatever it asks for: local
// replicas are processes, and development runs GPU tasks against simulated replicas. A task
// that names no infra is planned over every enabled infra as SkyPilot does, and local is a
// candidate only for what this machine has: its Infra.Offerings are the machine's size (one
// CPU-only offering with VCPUs and MemoryGiB, 0 when unknown) and the GPUs the ferry config
// declares under local.accelerators, one offering each. A fraction fits a declared GPU (local
// processes share devices); a GPU request never fits a machine that declared none.

// LocalOfferings describes a machine for Infra.Offerings: vcpus and memGiB (0: unknown, not
// checked) and the GPUs it has.
func LocalOfferings(vcpus, memGiB float64, gpus []configs.Accelerator) []launcher.Offering {
	out := []launcher.Offering{{VCPUs: vcpus, MemoryGiB: memGiB, Total: -1, Free: -1}}
	for _, g := range gpus {
		out = append(out, launcher.Offering{Accelerator: g.Name, AcceleratorCount: g.Count, VCPUs: vcpus, MemoryGiB: memGiB,
			Total: int(g.Count), Free: -1})
	}
	return out
}

// localFit returns the offering of a local infra that holds one instance of acc with the
// request's cpus and memory, or why none does.
func (req *request) localFit(inf *Infra, acc configs.Accelerator) (launcher.Offering, string) {
	var machine launcher.Offering
	if len(inf.Offerings) > 0 {
		machine = inf.Offerings[0]
	}
	if machine.VCPUs > 0 && req.cpus.value > machine.VCPUs {
		return launcher.Offering{}, fmt.Sprintf("local has %s vCPUs, not %s", formatNumber(machine.VCPUs), req.cpus)
	}
	if machine.MemoryGiB > 0 && req.memory.value > machine.MemoryGiB {
		return launcher.Offering{}, fmt.Sprintf("local has %s GiB memory, not %s", formatNumber(machine.MemoryGiB), req.memory)
	}
	if acc.Name == "" {
		return machine, ""
	}
	most := 0.0
	for _, o := range inf.Offerings {
		if strings.EqualFold(o.Accelerator, acc.Name) {
			if o.AcceleratorCount >= acc.Count {
				return o, ""
			}
			most = max(most, o.AcceleratorCount)
		}
	}
	if most > 0 {
		return launcher.Offering{}, fmt.Sprintf("local has only %s %s", formatNumber(most), acc.Name)
	}
	return launcher.Offering{}, fmt.Sprintf("local has no %s (declare this machine's GPUs under local.accelerators in Ferry's config.yaml, or write infra: local to run there regardless)", acc.Name)
}

// localCandidates appends local's candidate: the request as written when local was named, else
// the first accelerator alternative that fits the machine.
func (req *request) localCandidates(out []Candidate, inf *Infra) []Candidate {
	if !req.target.auto {
		return append(out, req.localCandidate(inf, firstOr(req.accs)))
	}
	if req.instanceType != "" {
		return out // an instance type is a cloud's
	}
	for _, acc := range req.wanted() {
		if o, why := req.localFit(inf, acc); why == "" {
			if acc.Name != "" {
				acc.Name = o.Accelerator
			}
			return append(out, req.localCandidate(inf, acc))
		}
	}
	return out
}

func firstOr(accs []configs.Accelerator) configs.Accelerator {
	if len(accs) == 0 {
		return configs.Accelerator{}
	}
	return accs[0]
}

func (req *request) localCandidate(inf *Infra, acc configs.Accelerator) Candidate {
	p := launcher.Placement{Infra: inf.Name, VCPUs: req.cpus.value, MemoryGiB: req.memory.value,
		Accelerator: acc.Name, AcceleratorCount: acc.Count}
	return Candidate{Placement: p, Alternative: req.alt}
}

// localReasons says why an auto request does not fit local.
func (req *request) localReasons(inf *Infra) []string {
	if req.instanceType != "" {
		return []string{"local has no instance type " + req.instanceType}
	}
	var out []string
	for _, acc := range req.wanted() {
		if _, why := req.localFit(inf, acc); why != "" {
			out = append(out, why)
		}
	}
	return out
}
