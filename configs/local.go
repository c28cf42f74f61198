package configs

import "gopkg.in/yaml.v3"

// LocalConfig is the ferry config's `local:` section: what this machine can give a task that
// names no infra. Ferry cannot see GPUs from Go, so it takes them from here; without this
// section local has no GPUs, and a GPU task without infra goes to an infra that has them
// (`infra: local` still runs anything, for development against simulated replicas).
//
//	local:
//	  accelerators: {L4: 2}             # the GPUs this machine has, by name and count
type LocalConfig struct {
	Accelerators []Accelerator `json:"accelerators,omitempty" yaml:"accelerators"`
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
	return l
}
