package configs

import (
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// GPUShare is `resources.gpu_share`: how much of each GPU a task takes when it shares devices,
// and which devices it may be given. It follows HAMi's vocabulary (ANCHORS.md §3), because HAMi
// is what shares GPUs on Kubernetes:
//
//	resources:
//	  accelerators: A100:0.5         # a fraction alone means that share of memory and cores
//	  gpu_share:
//	    memory: 3000MiB              # per GPU: MiB (3000, 3000MiB, 3GiB) or a share ("25%")
//	    cores: 30                    # per GPU: percent of its SMs
//	    use_gpu_types: [A100]        # only these card types (HAMi: case-insensitive substring)
//	    avoid_gpu_types: [T4]        # never these
//	    use_gpu_uuids: [GPU-8a1...]  # only these devices; avoid_gpu_uuids: never these
//	    node_policy: binpack         # fill nodes one by one (binpack) or spread across them
//	    gpu_policy: spread           # the same, among the GPUs of a node
//
// Type and UUID pins and the policies also apply to whole GPUs; memory and cores (or a
// fractional count) make the request a shared one, which only sharing-capable infras take.
type GPUShare struct {
	// MemoryMiB or MemoryPercent (at most one is set) caps the memory of each GPU.
	MemoryMiB     int `json:"memory_mib,omitempty"`
	MemoryPercent int `json:"memory_percent,omitempty"`
	// Cores is the percent of each GPU's compute (SMs) the task may use.
	Cores int `json:"cores,omitempty"`
	// UseTypes and AvoidTypes pin or exclude card types; HAMi matches them as substrings of
	// the card's type, ignoring case ("A100" matches "NVIDIA-A100-SXM4-40GB").
	UseTypes   []string `json:"use_gpu_types,omitempty"`
	AvoidTypes []string `json:"avoid_gpu_types,omitempty"`
	// UseUUIDs and AvoidUUIDs pin or exclude devices by their UUID (exact match).
	UseUUIDs   []string `json:"use_gpu_uuids,omitempty"`
	AvoidUUIDs []string `json:"avoid_gpu_uuids,omitempty"`
	// NodePolicy and GPUPolicy are PolicyBinpack or PolicySpread ("" leaves the scheduler's
	// default: HAMi's chart binpacks nodes and spreads GPUs).
	NodePolicy string `json:"node_policy,omitempty"`
	GPUPolicy  string `json:"gpu_policy,omitempty"`
}

// Placement policies for nodes and GPUs, as HAMi spells them.
const (
	PolicyBinpack = "binpack"
	PolicySpread  = "spread"
)

var (
	// gpuShareKeys are written out: memory fills one of two fields (MiB or a percent).
	gpuShareKeys   = []string{"memory", "cores", "use_gpu_types", "avoid_gpu_types", "use_gpu_uuids", "avoid_gpu_uuids", "node_policy", "gpu_policy"}
	sharePolicies  = []string{PolicyBinpack, PolicySpread}
	memoryShareRE  = regexp.MustCompile(`^([0-9]+)\s*(MiB|Mi|GiB|Gi|%)?$`)
	gpuTypeRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 ._-]*$`)
	gpuUUIDRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]*$`)
	maxShareMemory = 1 << 24 // MiB: 16 TiB, far above any GPU
)

// SharedGPU is what one accelerator request amounts to on an infra that shares GPUs: how many
// devices, and per device the memory (MiB or percent) and the percent of cores.
type SharedGPU struct {
	GPUs          int
	MemoryMiB     int
	MemoryPercent int
	Cores         int
}

// SharedGPU reports whether acc, under r's gpu_share, is a shared request (a fractional count,
// or a memory or cores share), and what it asks for. A fraction f stands for ceil(100·f)% of
// one GPU's memory and cores; explicit memory and cores win over it.
func (r Resources) SharedGPU(acc Accelerator) (SharedGPU, bool) {
	s := r.GPUShare
	fractional := acc.Count > 0 && acc.Count < 1
	if !fractional && (s == nil || (s.MemoryMiB == 0 && s.MemoryPercent == 0 && s.Cores == 0)) {
		return SharedGPU{}, false
	}
	out := SharedGPU{GPUs: max(1, int(acc.Count))}
	if fractional {
		pct := int(math.Ceil(acc.Count*100 - 1e-9))
		out.MemoryPercent, out.Cores = pct, pct
	}
	if s != nil {
		if s.MemoryMiB > 0 || s.MemoryPercent > 0 {
			out.MemoryMiB, out.MemoryPercent = s.MemoryMiB, s.MemoryPercent
		}
		if s.Cores > 0 {
			out.Cores = s.Cores
		}
	}
	return out, true
}

// SharesGPU reports whether any of r's accelerators is a shared request.
func (r Resources) SharesGPU() bool {
	for _, a := range r.Accelerators {
		if _, ok := r.SharedGPU(a); ok {
			return true
		}
	}
	return false
}

func (s *GPUShare) clone() *GPUShare {
	if s == nil {
		return nil
	}
	out := *s
	out.UseTypes, out.AvoidTypes = slices.Clone(s.UseTypes), slices.Clone(s.AvoidTypes)
	out.UseUUIDs, out.AvoidUUIDs = slices.Clone(s.UseUUIDs), slices.Clone(s.AvoidUUIDs)
	return &out
}

// MarshalYAML writes the block in the spelling gpuShare reads, for ResolvedYAML.
func (s GPUShare) MarshalYAML() (any, error) {
	type plain struct {
		Memory     string   `yaml:"memory,omitempty"`
		Cores      int      `yaml:"cores,omitempty"`
		UseTypes   []string `yaml:"use_gpu_types,omitempty,flow"`
		AvoidTypes []string `yaml:"avoid_gpu_types,omitempty,flow"`
		UseUUIDs   []string `yaml:"use_gpu_uuids,omitempty,flow"`
		AvoidUUIDs []string `yaml:"avoid_gpu_uuids,omitempty,flow"`
		NodePolicy string   `yaml:"node_policy,omitempty"`
		GPUPolicy  string   `yaml:"gpu_policy,omitempty"`
	}
	out := plain{Cores: s.Cores, UseTypes: s.UseTypes, AvoidTypes: s.AvoidTypes, UseUUIDs: s.UseUUIDs,
		AvoidUUIDs: s.AvoidUUIDs, NodePolicy: s.NodePolicy, GPUPolicy: s.GPUPolicy}
	switch {
	case s.MemoryMiB > 0:
		out.Memory = strconv.Itoa(s.MemoryMiB) + "MiB"
	case s.MemoryPercent > 0:
		out.Memory = strconv.Itoa(s.MemoryPercent) + "%"
	}
	return out, nil
}

// gpuShare reads a gpu_share mapping.
func (c *checker) gpuShare(n *yaml.Node, field string) (*GPUShare, bool) {
	n = c.deref(n)
	f, ok := c.fields(n, field, gpuShareKeys)
	if !ok {
		return nil, false
	}
	s := &GPUShare{}
	good := true
	if e, ok := f["memory"]; ok {
		good = c.shareMemory(e.value, joinField(field, "memory"), s) && good
	}
	if e, ok := f["cores"]; ok {
		good = c.shareCores(e.value, joinField(field, "cores"), s) && good
	}
	lists := []struct {
		key string
		dst *[]string
		re  *regexp.Regexp
	}{
		{"use_gpu_types", &s.UseTypes, gpuTypeRE}, {"avoid_gpu_types", &s.AvoidTypes, gpuTypeRE},
		{"use_gpu_uuids", &s.UseUUIDs, gpuUUIDRE}, {"avoid_gpu_uuids", &s.AvoidUUIDs, gpuUUIDRE},
	}
	for _, l := range lists {
		if e, ok := f[l.key]; ok {
			*l.dst = c.shareNames(e.value, joinField(field, l.key), l.re)
			good = good && *l.dst != nil
		}
	}
	good = c.disjoint(f, field, "use_gpu_types", "avoid_gpu_types", s.UseTypes, s.AvoidTypes) && good
	good = c.disjoint(f, field, "use_gpu_uuids", "avoid_gpu_uuids", s.UseUUIDs, s.AvoidUUIDs) && good
	for _, p := range []struct {
		key string
		dst *string
	}{{"node_policy", &s.NodePolicy}, {"gpu_policy", &s.GPUPolicy}} {
		if e, ok := f[p.key]; ok {
			v, ok := c.oneOf(e.value, joinField(field, p.key), sharePolicies, "policy", "policies")
			*p.dst, good = v, good && ok
		}
	}
	if n.Kind == yaml.MappingNode && len(n.Content) == 0 {
		c.errorf(n, field, "empty gpu_share: give memory, cores, a type or UUID pin, or a policy, or leave gpu_share out")
		good = false
	}
	return s, good
}

// shareMemory reads 3000 (MiB), "3000MiB", "3GiB" or "25%".
func (c *checker) shareMemory(n *yaml.Node, field string, s *GPUShare) bool {
	const want = "expected GPU memory per device in MiB (3000, 3000MiB, 3GiB) or a share of it (25%)"
	if n.Kind != yaml.ScalarNode || isNull(n) || (!isScalar(n, "!!int") && !isScalar(n, "!!str")) {
		c.errorf(n, field, "%s, got %s", want, describe(n))
		return false
	}
	m := memoryShareRE.FindStringSubmatch(strings.TrimSpace(n.Value))
	if m == nil {
		c.errorf(n, field, "%s, got %s", want, quoteShort(n.Value))
		return false
	}
	v, err := strconv.Atoi(m[1])
	if err != nil || v <= 0 || v > maxShareMemory {
		c.errorf(n, field, "%s is out of range: give a positive amount", quoteShort(n.Value))
		return false
	}
	switch m[2] {
	case "%":
		if v > 100 {
			c.errorf(n, field, "%s: a share of a GPU's memory is at most 100%%", quoteShort(n.Value))
			return false
		}
		s.MemoryPercent = v
	case "GiB", "Gi":
		if v > maxShareMemory/1024 {
			c.errorf(n, field, "%s is out of range", quoteShort(n.Value))
			return false
		}
		s.MemoryMiB = v * 1024
	default:
		s.MemoryMiB = v
	}
	return true
}

// shareCores reads 30 or "30%": a percent of one GPU's SMs.
func (c *checker) shareCores(n *yaml.Node, field string, s *GPUShare) bool {
	text := strings.TrimSuffix(strings.TrimSpace(n.Value), "%")
	v, err := strconv.Atoi(text)
	if n.Kind != yaml.ScalarNode || isNull(n) || err != nil || (!isScalar(n, "!!int") && !isScalar(n, "!!str")) {
		c.errorf(n, field, "expected a percent of one GPU's cores (1-100, e.g. 30), got %s", describe(n))
		return false
	}
	if v < 1 || v > 100 {
		c.errorf(n, field, "cores is a percent of one GPU's compute: 1-100, got %d", v)
		return false
	}
	s.Cores = v
	return true
}

// shareNames reads a name or a list of names (GPU types or UUIDs). HAMi joins them with
// commas into one annotation, so a comma inside a name is refused.
func (c *checker) shareNames(n *yaml.Node, field string, re *regexp.Regexp) []string {
	items := []*yaml.Node{n}
	itemField := func(int) string { return field }
	if n.Kind == yaml.SequenceNode {
		if len(n.Content) == 0 {
			c.errorf(n, field, "empty list: give at least one, or leave %s out", field)
			return nil
		}
		items, itemField = n.Content, func(i int) string { return indexField(field, i) }
	}
	out := []string{}
	ok := true
	for i, item := range items {
		item = c.deref(item)
		v, good := c.str(item, itemField(i))
		v = strings.TrimSpace(v)
		switch {
		case !good:
			ok = false
		case !re.MatchString(v):
			c.errorf(item, itemField(i), "%s: expected letters, digits, '-', '_', '.' or spaces (no commas)", quoteShort(v))
			ok = false
		case slices.ContainsFunc(out, func(o string) bool { return strings.EqualFold(o, v) }):
			c.errorf(item, itemField(i), "%s is listed twice", quoteShort(v))
			ok = false
		default:
			out = append(out, v)
		}
	}
	if !ok {
		return nil
	}
	return out
}

// disjoint reports a name both pinned and avoided.
func (c *checker) disjoint(f map[string]entry, field, useKey, avoidKey string, use, avoid []string) bool {
	for _, u := range use {
		if slices.ContainsFunc(avoid, func(a string) bool { return strings.EqualFold(a, u) }) {
			c.errorf(f[avoidKey].value, joinField(field, avoidKey), "%s is in both %s and %s", quoteShort(u), useKey, avoidKey)
			return false
		}
	}
	return true
}

// checkGPUShares reports a candidate with a gpu_share but no accelerator to share: the
// resolved resources r, with top the top-level mapping and alts its alternatives as written.
func (c *checker) checkGPUShares(top resourceSpec, alts []resourceSpec, r Resources) {
	specs, merged := []resourceSpec{top}, []Resources{r}
	if len(alts) > 0 {
		specs, merged = alts, slices.Concat(r.AnyOf, r.Ordered)
	}
	for i, m := range merged {
		if m.GPUShare == nil || len(m.Accelerators) > 0 || i >= len(specs) {
			continue
		}
		at := specs[i].given["gpu_share"]
		if at == nil {
			at = top.given["gpu_share"]
		}
		c.errorf(at, "resources.gpu_share", "gpu_share needs accelerators to share (e.g. accelerators: A100:0.5 or A100:1)")
		return
	}
}
