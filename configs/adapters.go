package configs

import (
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// service.adapters: LoRA adapters over the service's base model. SkyPilot has no field for them;
// Ferry's shape follows vLLM's flags (--lora-modules name=path, --max-loras) and its run-time
// loading (/v1/load_lora_adapter). A request names an adapter as its model.

// Adapter load modes.
const (
	// AdaptersAtStart registers every module on every replica when it starts: the replicas
	// get FERRY_LORA_MODULES for vLLM's --lora-modules.
	AdaptersAtStart = "at_start"
	// AdaptersOnDemand registers an adapter on a replica at its first request there, through
	// vLLM's /v1/load_lora_adapter, and unloads the least recently used beyond max_loaded.
	AdaptersOnDemand = "on_demand"
)

// Environment variables a replica of a service with adapters gets.
const (
	// EnvLoRAModules is vLLM's --lora-modules arguments, "name=path name=path" (at_start;
	// empty on_demand).
	EnvLoRAModules = "FERRY_LORA_MODULES"
	// EnvMaxLoRAs is max_loras, for vLLM's --max-loras.
	EnvMaxLoRAs = "FERRY_MAX_LORAS"
	// EnvRuntimeLoRA is vLLM's switch for its run-time adapter endpoints, set on_demand.
	EnvRuntimeLoRA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
)

// Adapters is service.adapters.
type Adapters struct {
	// Modules maps each adapter's name to where the replica finds it: a directory (a
	// file_mounts target, say), a Hugging Face repo id, or whatever path the engine loads.
	Modules map[string]string `json:"modules" yaml:"modules"`
	// MaxLoRAs is how many adapters a replica runs at once (vLLM's --max-loras; default 1):
	// the slots routing fills.
	MaxLoRAs int `json:"max_loras" yaml:"max_loras"`
	// Load is at_start (default) or on_demand.
	Load string `json:"load" yaml:"load"`
	// MaxLoaded is, on_demand, how many adapters a replica keeps registered (default
	// 2 × max_loras); the least recently used beyond it are unloaded.
	MaxLoaded int `json:"max_loaded" yaml:"max_loaded"`
}

var (
	adaptersKeys = keysOf[Adapters]()
	// adapterNameRE is what an adapter's name may be: what a model id may be, and nothing that
	// would split vLLM's name=path arguments.
	adapterNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$`)
)

// MaxAdapterModules bounds service.adapters.modules (the proxy's table holds 4096).
const MaxAdapterModules = 1024

// adapters reads service.adapters.
func (c *checker) adapters(n *yaml.Node, field string) *Adapters {
	f, ok := c.fields(n, field, adaptersKeys)
	if !ok {
		return nil
	}
	a := &Adapters{MaxLoRAs: 1, Load: AdaptersAtStart, Modules: map[string]string{}}
	if e, ok := f["max_loras"]; ok {
		a.MaxLoRAs, _ = c.intBetween(e.value, joinField(field, "max_loras"), 1, 1024)
	}
	if e, ok := f["load"]; ok {
		if v, ok := c.oneOf(e.value, joinField(field, "load"), []string{AdaptersAtStart, AdaptersOnDemand}, "mode", "modes"); ok {
			a.Load = v
		}
	}
	a.MaxLoaded = 2 * a.MaxLoRAs
	if e, ok := f["max_loaded"]; ok {
		lf := joinField(field, "max_loaded")
		if a.Load != AdaptersOnDemand {
			c.errorf(e.keyNode, lf, "goes with load: %s (at_start registers every module)", AdaptersOnDemand)
		} else if v, ok := c.intBetween(e.value, lf, a.MaxLoRAs, MaxAdapterModules); ok {
			a.MaxLoaded = v
		}
	}
	m, ok := f["modules"]
	if !ok {
		c.errorf(n, joinField(field, "modules"), "is required: name each adapter and its path")
		return a
	}
	mf := joinField(field, "modules")
	ps, ok := c.pairs(m.value, mf)
	if !ok {
		return a
	}
	if len(ps) == 0 || len(ps) > MaxAdapterModules {
		c.errorf(m.value, mf, "name 1 to %d adapters, got %d", MaxAdapterModules, len(ps))
	}
	for _, p := range ps {
		pf := joinField(mf, p.key)
		if !adapterNameRE.MatchString(p.key) {
			c.errorf(p.keyNode, pf, "an adapter's name is what requests send as their model: letters, digits and . _ / : -, at most 128, got %s", quoteShort(p.key))
			continue
		}
		path, ok := c.str(p.value, pf)
		if ok && (path == "" || strings.ContainsAny(path, " \t\n")) {
			c.errorf(p.value, pf, "a path without spaces is required, got %s", quoteShort(path))
			continue
		}
		a.Modules[p.key] = path
	}
	return a
}

// Names returns the adapters' names, sorted.
func (a *Adapters) Names() []string {
	if a == nil {
		return nil
	}
	out := make([]string, 0, len(a.Modules))
	for n := range a.Modules {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Env is what a replica's environment gets: FERRY_LORA_MODULES and FERRY_MAX_LORAS, and
// on_demand vLLM's switch for its run-time endpoints.
func (a *Adapters) Env() map[string]string {
	if a == nil {
		return nil
	}
	env := map[string]string{EnvMaxLoRAs: strconv.Itoa(a.MaxLoRAs), EnvLoRAModules: ""}
	if a.Load == AdaptersOnDemand {
		env[EnvRuntimeLoRA] = "True"
		return env
	}
	var b strings.Builder
	for i, n := range a.Names() {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(n + "=" + a.Modules[n])
	}
	env[EnvLoRAModules] = b.String()
	return env
}
