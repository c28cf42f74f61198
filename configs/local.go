package configs

import (
	"strconv"

	"gopkg.in/yaml.v3"
)

// LocalConfig is the ferry config's `local:` section: what this machine can give a task that
// names no infra. Ferry cannot see GPUs from Go, so it takes them from here; without this
// section local has no GPUs, and a GPU task without infra goes to an infra that has them
// (`infra: local` still runs anything, for development against simulated replicas).
//
//	local:
//	  accelerators: {L4: 2}             # the GPUs this machine has, by name and count
//	  cpus: 16                          # the CPUs and memory (GiB) local tasks may hold
//	  memory: 64
//
// What it declares is a capacity (launcher/local/capacity.go): tasks asking for a declared
// GPU, or for cpus or memory once those are declared, hold them while they run, and a launch
// that does not fit waits, as on a Kubernetes node.
type LocalConfig struct {
	Accelerators []Accelerator `json:"accelerators,omitempty" yaml:"accelerators"`
	CPUs         float64       `json:"cpus,omitempty" yaml:"cpus,omitempty"`
	MemoryGiB    float64       `json:"memory,omitempty" yaml:"memory,omitempty"`
}

var localKeys = keysOf[LocalConfig]()

func (c *checker) localConfig(n *yaml.Node) *LocalConfig {
	const field = "local"
	l := &LocalConfig{}
	f, ok := c.fields(n, field, localKeys)
	if !ok {
		return l
	}
	if e, ok := f["accelerators"]; ok {
		if accs, ok := c.accelerators(e.value, joinField(field, "accelerators")); ok {
			for _, a := range accs {
				if a.Count < 1 {
					c.errorf(e.value, joinField(field, "accelerators"), "%s: give whole devices (the count this machine has)", a.Spec())
				}
			}
			l.Accelerators = accs
		}
	}
	if e, ok := f["cpus"]; ok {
		if v, ok := c.positive(e.value, joinField(field, "cpus")); ok {
			l.CPUs = v
		}
	}
	if e, ok := f["memory"]; ok {
		if v, ok := c.memory(e.value, joinField(field, "memory")); ok {
			if gb, err := strconv.ParseFloat(v, 64); err != nil {
				c.errorf(e.value, joinField(field, "memory"), "give this machine's memory in GiB (64, or 64GB), not a lower bound")
			} else {
				l.MemoryGiB = gb
			}
		}
	}
	return l
}
