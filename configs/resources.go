package configs

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// resourceKeys are Resources' keys and the spellings SkyPilot also accepts (cloud, region
// and zone for infra, spot_recovery for job_recovery), plus job_recovery, which is held on Job.
var resourceKeys = []string{"infra", "cloud", "region", "zone", "accelerators", "cpus", "memory", "use_spot", "ports", "image_id", "disk_size", "any_of", "ordered", "job_recovery",
	"instance_type", "labels", "autostop", "disk_tier", "gpu_share", "objective", "capacity", "spot_recovery", "network_tier", "num_nodes"}

// acceleratorNameRE is an accelerator type such as A100, H100-80GB or tpu-v5e-8.
var acceleratorNameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9-]*$`)

// maxAlternatives bounds any_of and ordered; each alternative is priced on every launch.
const maxAlternatives = 64

// maxPorts bounds how many ports ranges may expand to.
const maxPorts = 1000

// Candidates returns the resources the launcher chooses among: the AnyOf or Ordered
// alternatives when there are any (each already merged with the top-level fields), else r.
func (r Resources) Candidates() []Resources {
	switch {
	case len(r.AnyOf) > 0:
		return r.AnyOf
	case len(r.Ordered) > 0:
		return r.Ordered
	}
	return []Resources{r}
}

// String is a short human form for status tables: "1x A100 (spot)", "cpus=2 (local)",
// "1x A100|1x L4 (aws)". Alternatives are joined with " | ".
func (r Resources) String() string {
	if len(r.AnyOf) > 0 || len(r.Ordered) > 0 {
		cands := r.Candidates()
		parts := make([]string, len(cands))
		for i, cand := range cands {
			parts[i] = cand.String()
		}
		return strings.Join(parts, " | ")
	}
	var what []string
	if len(r.Accelerators) > 0 {
		accs := make([]string, len(r.Accelerators))
		for i, a := range r.Accelerators {
			accs[i] = a.String()
		}
		what = append(what, strings.Join(accs, "|"))
	} else {
		if r.CPUs != "" {
			what = append(what, "cpus="+r.CPUs)
		}
		if r.Memory != "" {
			what = append(what, "mem="+r.Memory)
		}
	}
	var tags []string
	if r.Infra != "" && r.Infra != "*" {
		tags = append(tags, r.Infra)
	}
	if r.UseSpot {
		tags = append(tags, "spot")
	}
	main := strings.Join(what, " ")
	switch {
	case main == "" && len(tags) == 0:
		return "any"
	case main == "":
		return strings.Join(tags, ", ")
	case len(tags) == 0:
		return main
	}
	return main + " (" + strings.Join(tags, ", ") + ")"
}

// String renders "1x A100" (or "0.5x H100"), the form status tables use.
func (a Accelerator) String() string {
	return formatCount(a.Count) + "x " + a.Name
}

// Spec renders "A100:1", the form the YAML accepts.
func (a Accelerator) Spec() string {
	return a.Name + ":" + formatCount(a.Count)
}

func formatCount(f float64) string {
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// clone deep-copies r, so that alternatives and redacted copies never share slices.
func (r Resources) clone() Resources {
	out := r
	out.Accelerators = slices.Clone(r.Accelerators)
	out.Ports = slices.Clone(r.Ports)
	out.Labels = maps.Clone(r.Labels)
	if r.Autostop != nil {
		a := *r.Autostop
		out.Autostop = &a
	}
	out.AnyOf = cloneAll(r.AnyOf)
	out.Ordered = cloneAll(r.Ordered)
	out.GPUShare = r.GPUShare.clone()
	out.Capacity = r.Capacity.clone()
	return out
}

func cloneAll(rs []Resources) []Resources {
	if rs == nil {
		return nil
	}
	out := make([]Resources, len(rs))
	for i, r := range rs {
		out[i] = r.clone()
	}
	return out
}

// resourceSpec is one resources mapping as written: its values, and which fields it gave
// (an alternative inherits exactly the fields it does not give).
type resourceSpec struct {
	r     Resources
	given map[string]*yaml.Node // YAML key, or "location" for infra/cloud/region/zone
	node  *yaml.Node
	// preferred says accelerators was a list, which SkyPilot reads as an order of preference
	// (a mapping or a single string is a set: the cheapest wins).
	preferred bool
	// images is a per-region image_id (images.go), nil when image_id is a string or absent.
	images []regionImage
}

// resources reads the `resources:` block (n may be nil) and resolves alternatives and the
// default infra. isService turns on the rule that every candidate agrees on use_spot.
func (c *checker) resources(n *yaml.Node, isService bool) (Resources, *entry) {
	return c.resourcesAt(n, "resources", isService)
}

// resourcesAt is resources for a block at field: the task's, or a prefill pool's (pools.go).
func (c *checker) resourcesAt(n *yaml.Node, field string, isService bool) (Resources, *entry) {
	top, f := c.resourceSpec(n, field, "")
	recovery := c.recoveryEntry(f)
	if e, ok := f["objective"]; ok {
		top.r.Objective = c.objective(e.value, joinField(field, "objective"))
	}
	var anyOf, ordered []resourceSpec
	if e, ok := f["any_of"]; ok {
		anyOf = c.dropLacking(top, c.alternatives(e, joinField(field, "any_of"), cloudOf(top)), joinField(field, "any_of"), e.value)
	}
	if e, ok := f["ordered"]; ok {
		ordered = c.dropLacking(top, c.alternatives(e, joinField(field, "ordered"), cloudOf(top)), joinField(field, "ordered"), e.value)
		if _, both := f["any_of"]; both {
			c.errorf(e.keyNode, joinField(field, "ordered"), "any_of and ordered are exclusive: any_of takes the cheapest feasible alternative, ordered the first feasible one")
		}
	}
	c.checkLackingTop(&top, f)
	anyOf, ordered = c.splitRegionImages(&top, anyOf, ordered)

	located := top.given["location"] != nil
	for _, alt := range slices.Concat(anyOf, ordered) {
		located = located || alt.given["location"] != nil
	}
	// No infra anywhere: "" lets the optimizer choose among every enabled infra, local only
	// where it fits (launcher/optimizer).
	r := top.r
	r.AnyOf = mergeAll(top.r, anyOf, located)
	r.Ordered = mergeAll(top.r, ordered, located)
	fillLocation(&r)
	c.checkGPUShares(top, slices.Concat(anyOf, ordered), r)
	if e, ok := f["capacity"]; ok {
		r.setCapacity(c.capacity(e, joinField(field, "capacity"), r.Candidates(), isService))
	}

	if isService && !r.Objective.PerWork() {
		c.checkSpotAgreement(&r, "any_of", anyOf, r.AnyOf)
		c.checkSpotAgreement(&r, "ordered", ordered, r.Ordered)
	}
	if isService {
		if at := top.given["autostop"]; at != nil {
			c.errorf(at, joinField(field, "autostop"), "a service has no idle cluster to stop: its replicas scale with the load; to scale to zero when idle write service.replica_policy: {min_replicas: 0, max_replicas: N} (scale_to_zero_grace_seconds sets how long it waits)")
		}
	}
	c.preferredAccelerators(&r, top, anyOf, ordered, f)
	c.checkImages(r, top, slices.Concat(anyOf, ordered))
	c.checkShapes(top, slices.Concat(anyOf, ordered), isService)
	return r, recovery
}

// checkShapes allows num_nodes only in a job's alternatives, where each is a shape of the gang
// the optimizer compares by cost (8 nodes × 1 GPU against 1 × 8): at the top of resources it
// is the task's num_nodes, and a service's replicas all have the task's.
func (c *checker) checkShapes(top resourceSpec, alts []resourceSpec, isService bool) {
	if at := top.given["num_nodes"]; at != nil {
		c.errorf(at, "resources.num_nodes", "num_nodes is the task's: write it at the top of the task, or in an any_of or ordered alternative for a gang shape of its own")
	}
	for _, alt := range alts {
		if at := alt.given["num_nodes"]; at != nil && isService {
			c.errorf(at, "num_nodes", "a service's replicas have the task's num_nodes: an alternative's own num_nodes is for a job's gang shape")
			return
		}
	}
}

// checkImages refuses an image_id the candidate's infra would refuse at launch, so that
// --dry-run never calls valid what launch will not run. Only candidates that name their infra
// are checked; the optimizer keeps the others off infras that cannot take the image.
func (c *checker) checkImages(r Resources, top resourceSpec, specs []resourceSpec) {
	cands := r.Candidates()
	for i, cand := range cands {
		explicit := top.given["location"] != nil || (len(specs) == len(cands) && specs[i].given["location"] != nil)
		problem := imageProblem(cand.Cloud, cand.ImageID)
		if problem == "" || !explicit {
			continue
		}
		at, field := top.given["image_id"], "resources.image_id"
		if len(specs) == len(cands) {
			if n := specs[i].given["image_id"]; n != nil {
				at = n
				if len(r.AnyOf) > 0 {
					field = indexField("resources.any_of", i) + ".image_id"
				} else {
					field = indexField("resources.ordered", i) + ".image_id"
				}
			}
		}
		c.errorf(at, field, "%s", problem)
		if at == top.given["image_id"] {
			return // one message for the top-level image
		}
	}
}

// imageProblem says why cloud cannot boot image, or "".
func imageProblem(cloud, image string) string {
	if image == "" {
		return ""
	}
	docker := strings.HasPrefix(image, "docker:")
	switch {
	case cloud == "kubernetes" && !docker:
		return fmt.Sprintf("%s: Kubernetes runs container images; write image_id: docker:IMAGE", quoteShort(image))
	case cloud == "aws" && !docker && !strings.HasPrefix(image, "ami-"):
		return fmt.Sprintf("%s: on AWS image_id is an AMI (ami-...) or a container (docker:IMAGE)", quoteShort(image))
	case cloud == "gcp" && strings.HasPrefix(image, "ami-"):
		return fmt.Sprintf("%s is an AWS AMI; on GCP write a disk image (projects/PROJECT/global/images/NAME) or a container (docker:IMAGE)", quoteShort(image))
	}
	return ""
}

// preferredAccelerators applies SkyPilot's reading of an accelerators list, an order of
// preference: [L4:1, A100:1] tries every L4 placement before any A100 one, which is Ferry's
// ordered. A mapping or a string stays a set (r.Accelerators; the cheapest wins).
func (c *checker) preferredAccelerators(r *Resources, top resourceSpec, anyOf, ordered []resourceSpec, f map[string]entry) {
	const field = "resources.accelerators"
	accNode := top.given["accelerators"]
	switch {
	case top.preferred && len(anyOf) > 0:
		c.errorf(accNode, field, "a list of accelerators is an order of preference, which any_of (cheapest first) contradicts: write a set {%s} or drop any_of", acceleratorSet(top.r.Accelerators))
		return
	case len(top.r.Accelerators) > 1 && f["ordered"].value != nil:
		c.errorf(accNode, field, "several accelerators with ordered: give each ordered alternative its own accelerators instead")
		return
	case top.preferred:
		r.Ordered = make([]Resources, len(top.r.Accelerators))
		for i, a := range r.Accelerators {
			alt := r.clone()
			alt.AnyOf, alt.Ordered = nil, nil
			alt.Accelerators = []Accelerator{a}
			r.Ordered[i] = alt
		}
		return
	}
	// Inside ordered, an alternative's list expands in place; inside any_of it is a set.
	if !slices.ContainsFunc(ordered, func(s resourceSpec) bool { return s.preferred }) {
		return
	}
	var out []Resources
	for i, spec := range ordered {
		if !spec.preferred {
			out = append(out, r.Ordered[i])
			continue
		}
		for _, a := range r.Ordered[i].Accelerators {
			alt := r.Ordered[i].clone()
			alt.Accelerators = []Accelerator{a}
			out = append(out, alt)
		}
	}
	if len(out) > maxAlternatives {
		c.errorf(f["ordered"].value, "resources.ordered", "%d alternatives once accelerator lists are expanded; at most %d are allowed", len(out), maxAlternatives)
		return
	}
	r.Ordered = out
}

// isPreferenceList reports whether r's ordered alternatives are exactly its accelerators list,
// one each, as preferredAccelerators builds them.
func (r Resources) isPreferenceList() bool {
	if len(r.Accelerators) < 2 || len(r.Ordered) != len(r.Accelerators) || len(r.AnyOf) > 0 {
		return false
	}
	for i, a := range r.Accelerators {
		want := r.clone()
		want.AnyOf, want.Ordered = nil, nil
		want.Accelerators = []Accelerator{a}
		if !reflect.DeepEqual(want, r.Ordered[i]) {
			return false
		}
	}
	return true
}

// acceleratorSet writes accelerators as the body of a YAML flow mapping: "L4: 1, A100: 1".
func acceleratorSet(accs []Accelerator) string {
	parts := make([]string, len(accs))
	for i, a := range accs {
		parts[i] = a.Name + ": " + formatCount(a.Count)
	}
	return strings.Join(parts, ", ")
}

// mergeAll resolves each alternative against the top-level fields. An alternative that
// leaves infra unset while a sibling (or the top) sets it may run anywhere ("*").
func mergeAll(top Resources, alts []resourceSpec, located bool) []Resources {
	if len(alts) == 0 {
		return nil
	}
	out := make([]Resources, len(alts))
	for i, alt := range alts {
		m := top.clone()
		m.AnyOf, m.Ordered = nil, nil
		a := alt.r
		if alt.given["location"] != nil {
			m.Infra = a.Infra
		}
		if alt.given["accelerators"] != nil {
			m.Accelerators = slices.Clone(a.Accelerators)
		}
		if alt.given["cpus"] != nil {
			m.CPUs = a.CPUs
		}
		if alt.given["memory"] != nil {
			m.Memory = a.Memory
		}
		if alt.given["use_spot"] != nil {
			m.UseSpot = a.UseSpot
		}
		if alt.given["gpu_share"] != nil {
			m.GPUShare = a.GPUShare.clone()
		}
		if alt.given["ports"] != nil {
			m.Ports = slices.Clone(a.Ports)
		}
		if alt.given["image_id"] != nil {
			m.ImageID = a.ImageID
		}
		if alt.given["disk_size"] != nil {
			m.DiskSize = a.DiskSize
		}
		if alt.given["instance_type"] != nil {
			m.InstanceType = a.InstanceType
		}
		if alt.given["num_nodes"] != nil {
			m.NumNodes = a.NumNodes // a shape of its own (checkShapes)
		}
		if m.Infra == "" && located {
			m.Infra = "*"
		}
		fillLocation(&m)
		out[i] = m
	}
	return out
}

// checkSpotAgreement enforces SkyServe's rule that a service's candidates are all spot or all
// on-demand: mixing is what the fallback fields are for, and a replica count means one thing.
func (c *checker) checkSpotAgreement(r *Resources, key string, specs []resourceSpec, merged []Resources) {
	if len(merged) == 0 {
		return
	}
	first := merged[0].UseSpot
	for i := 1; i < len(merged); i++ {
		if merged[i].UseSpot == first {
			continue
		}
		at := specs[i].given["use_spot"]
		if at == nil {
			at = specs[i].node
		}
		c.errorf(at, indexField("resources."+key, i)+".use_spot",
			"all candidates of a service must agree on use_spot (%s[0] is %s, %s[%d] is %s); mix spot and on-demand with replica_policy.base_ondemand_fallback_replicas or dynamic_ondemand_fallback, or rank them by expected cost with resources.objective: cost_per_token",
			key, spotWord(first), key, i, spotWord(merged[i].UseSpot))
	}
	r.UseSpot = first
}

func spotWord(spot bool) string {
	if spot {
		return "spot"
	}
	return "on-demand"
}

// alternatives reads an any_of or ordered list.
func (c *checker) alternatives(e entry, field, inheritCloud string) []resourceSpec {
	if e.value.Kind != yaml.SequenceNode {
		c.errorf(e.value, field, "expected a list of resource mappings, got %s", describe(e.value))
		return nil
	}
	if len(e.value.Content) == 0 {
		c.errorf(e.value, field, "empty list: give at least one alternative, or leave %s out", field)
		return nil
	}
	if len(e.value.Content) > maxAlternatives {
		c.errorf(e.value, field, "%d alternatives; at most %d are allowed", len(e.value.Content), maxAlternatives)
		return nil
	}
	out := make([]resourceSpec, 0, len(e.value.Content))
	for i, item := range e.value.Content {
		itemField := indexField(field, i)
		spec, f := c.resourceSpec(item, itemField, inheritCloud)
		for _, k := range []string{"any_of", "ordered"} {
			if nested, ok := f[k]; ok {
				c.errorf(nested.keyNode, joinField(itemField, k), "alternatives cannot be nested: list every alternative at the top level")
			}
		}
		if o, ok := f["objective"]; ok {
			c.errorf(o.keyNode, joinField(itemField, "objective"), "objective applies to every alternative: set it once, at the top of resources")
		}
		for _, k := range []string{"job_recovery", "spot_recovery"} {
			if jr, ok := f[k]; ok {
				c.errorf(jr.keyNode, joinField(itemField, k), "%s applies to the whole job: set it once, at the top of resources", k)
			}
		}
		// The launcher sees the top-level block, not which alternative a placement came from.
		for _, k := range []string{"autostop", "labels", "disk_tier", "capacity", "network_tier"} {
			if e, ok := f[k]; ok {
				c.errorf(e.keyNode, joinField(itemField, k), "%s applies to every node of the task: set it once, at the top of resources", k)
			}
		}
		out = append(out, spec)
	}
	return out
}

// resourceSpec reads one resources mapping (the top level or one alternative).
// inheritCloud is the cloud an alternative inherits from the top ("" at the top).
func (c *checker) resourceSpec(n *yaml.Node, field, inheritCloud string) (resourceSpec, map[string]entry) {
	n = c.deref(n)
	s := resourceSpec{given: map[string]*yaml.Node{}, node: n}
	f, _ := c.fields(n, field, resourceKeys)
	c.location(&s, f, field, inheritCloud)
	if e, ok := f["accelerators"]; ok {
		if accs, ok := c.accelerators(e.value, joinField(field, "accelerators")); ok {
			s.r.Accelerators = accs
			s.given["accelerators"] = e.value
			s.preferred = e.value.Kind == yaml.SequenceNode && len(accs) > 1
		}
	}
	if e, ok := f["cpus"]; ok {
		if v, ok := c.quantity(e.value, joinField(field, "cpus")); ok {
			s.r.CPUs = v
			s.given["cpus"] = e.value
		}
	}
	if e, ok := f["memory"]; ok {
		if v, ok := c.memory(e.value, joinField(field, "memory")); ok {
			s.r.Memory = v
			s.given["memory"] = e.value
		}
	}
	if e, ok := f["use_spot"]; ok {
		if v, ok := c.boolean(e.value, joinField(field, "use_spot")); ok {
			s.r.UseSpot = v
			s.given["use_spot"] = e.value
		}
	}
	if e, ok := f["ports"]; ok {
		if v, ok := c.ports(e.value, joinField(field, "ports")); ok {
			s.r.Ports = v
			s.given["ports"] = e.value
		}
	}
	if e, ok := f["image_id"]; ok && e.value.Kind == yaml.MappingNode {
		c.regionImages(&s, e.value, joinField(field, "image_id"))
	} else if ok {
		if v, ok := c.str(e.value, joinField(field, "image_id")); ok {
			if v == "" {
				c.errorf(e.value, joinField(field, "image_id"), "empty image_id: give an image (e.g. docker:vllm/vllm-openai:latest) or leave image_id out")
			} else {
				s.r.ImageID = v
				s.given["image_id"] = e.value
			}
		}
	}
	if e, ok := f["gpu_share"]; ok {
		if v, ok := c.gpuShare(e.value, joinField(field, "gpu_share")); ok {
			s.r.GPUShare, s.given["gpu_share"] = v, e.value
		}
	}
	if e, ok := f["disk_size"]; ok {
		if v, ok := c.diskSize(e.value, joinField(field, "disk_size")); ok {
			s.r.DiskSize = v
			s.given["disk_size"] = e.value
		}
	}
	if e, ok := f["num_nodes"]; ok {
		if v, ok := c.intAtLeast(e.value, joinField(field, "num_nodes"), 1); ok {
			s.r.NumNodes = v
			s.given["num_nodes"] = e.keyNode
		}
	}
	c.extraResourceFields(&s, f, field)
	c.networkTier(&s, f, field) // network.go
	return s, f
}

// accelerators reads "A100:1", a list of such strings, or a map name → count; every form is a
// set of alternatives. One GPU may appear at several counts ({A100:4, A100:8}, SkyPilot's Llama
// 3 and Mixtral examples): each NAME:COUNT is a candidate of its own.
func (c *checker) accelerators(n *yaml.Node, field string) ([]Accelerator, bool) {
	var out []Accelerator
	seen := map[string]bool{}
	add := func(a Accelerator, at *yaml.Node, f string) {
		key := strings.ToLower(a.Spec())
		if seen[key] {
			c.errorf(at, f, "accelerator %s listed twice", quoteShort(a.Spec()))
			return
		}
		seen[key] = true
		out = append(out, a)
	}
	switch n.Kind {
	case yaml.ScalarNode:
		a, ok := c.accelerator(n, field)
		if !ok {
			return nil, false
		}
		return []Accelerator{a}, true
	case yaml.SequenceNode:
		if len(n.Content) == 0 {
			c.errorf(n, field, "empty list: name at least one accelerator, or leave accelerators out")
			return nil, false
		}
		ok := true
		for i, item := range n.Content {
			item = c.deref(item)
			f := indexField(field, i)
			a, good := c.accelerator(item, f)
			if !good {
				ok = false
				continue
			}
			add(a, item, f)
		}
		return out, ok && len(out) > 0
	case yaml.MappingNode:
		ps, _ := c.pairs(n, field)
		if len(ps) == 0 {
			c.errorf(n, field, "empty mapping: name at least one accelerator, or leave accelerators out")
			return nil, false
		}
		ok := true
		for _, p := range ps {
			f := joinField(field, p.key)
			// YAML flow style reads {L4:1, A100:1} as keys "L4:1" with null values; SkyPilot
			// joins key and value back into "NAME:COUNT", and so does Ferry.
			a, problem := ParseAccelerator(p.key)
			if problem != nil {
				c.errorf(p.keyNode, f, "%s", problem.Error())
				ok = false
				continue
			}
			if strings.Contains(p.key, ":") && !isNull(p.value) {
				c.errorf(p.value, f, "the count is given twice: write {%s: %s} or {%s}", a.Name, p.value.Value, a.Spec())
				ok = false
				continue
			}
			if !isNull(p.value) {
				v, good := c.positive(p.value, f)
				if good {
					if problem := countProblem(v); problem != "" {
						c.errorf(p.value, f, "%s", problem)
						good = false
					}
				}
				if !good {
					ok = false
					continue
				}
				a.Count = v
			}
			add(a, p.keyNode, f)
		}
		return out, ok
	}
	c.errorf(n, field, "expected an accelerator string (A100:1), a list of them, or a mapping of name to count, got %s", describe(n))
	return nil, false
}

// accelerator reads one "NAME[:COUNT]" string.
func (c *checker) accelerator(n *yaml.Node, field string) (Accelerator, bool) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		c.errorf(n, field, "expected an accelerator string such as \"A100:1\", got %s", describe(n))
		return Accelerator{}, false
	}
	a, problem := ParseAccelerator(n.Value)
	if problem != nil {
		c.errorf(n, field, "%s", problem.Error())
		return Accelerator{}, false
	}
	return a, true
}

// ParseAccelerator parses SkyPilot's "NAME" or "NAME:COUNT" (count defaults to 1; fractions
// below 1 share a GPU, e.g. "H100:0.5"). The CLI uses it for `--gpus`-style flags too.
func ParseAccelerator(s string) (Accelerator, error) {
	bad := func(why string) (Accelerator, error) {
		return Accelerator{}, fmt.Errorf("bad accelerator string %s: %s", quoteShort(s), why)
	}
	name, count, hasCount := strings.Cut(s, ":")
	name, count = strings.TrimSpace(name), strings.TrimSpace(count)
	if !acceleratorNameRE.MatchString(name) {
		return bad("expected NAME or NAME:COUNT with NAME like A100 (letters, digits and -, starting with a letter)")
	}
	a := Accelerator{Name: name, Count: 1}
	if hasCount {
		v, err := strconv.ParseFloat(count, 64)
		if err != nil || strings.Contains(count, ":") || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			return bad("COUNT must be a positive number, e.g. A100:1 or H100:0.5")
		}
		if problem := countProblem(v); problem != "" {
			return bad(problem)
		}
		a.Count = v
	}
	return a, nil
}

// countProblem checks a positive accelerator count: a fraction shares one device, so it must
// be below 1 (1.5 GPUs cannot be allocated).
func countProblem(v float64) string {
	if v > 1 && v != math.Trunc(v) {
		return fmt.Sprintf("count %s: a fractional count must be below 1", formatCount(v))
	}
	if v > maxInt {
		return fmt.Sprintf("count %s is out of range", formatCount(v))
	}
	return ""
}

// quantity reads cpus or memory: 4, 8.5, "4" or "4+" (at least 4). Kept as a string in
// SkyPilot's spelling, because "+" is meaningful.
func (c *checker) quantity(n *yaml.Node, field string) (string, bool) {
	switch {
	case isScalar(n, "!!int") || isScalar(n, "!!float"):
		v, ok := c.positive(n, field)
		if !ok {
			return "", false
		}
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case isScalar(n, "!!str"):
		s := strings.TrimSpace(n.Value)
		v, err := strconv.ParseFloat(strings.TrimSuffix(s, "+"), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
			c.errorf(n, field, "expected a positive number, optionally with a trailing + (e.g. 4 or 4+), got %s", quoteShort(n.Value))
			return "", false
		}
		return s, true
	}
	c.errorf(n, field, "expected a number or a string such as \"4+\", got %s", describe(n))
	return "", false
}

// ports reads a port, a "LOW-HIGH" range, or a list of either.
func (c *checker) ports(n *yaml.Node, field string) ([]int, bool) {
	items := []*yaml.Node{n}
	itemField := func(int) string { return field }
	if n.Kind == yaml.SequenceNode {
		if len(n.Content) == 0 {
			c.errorf(n, field, "empty list: give at least one port, or leave ports out")
			return nil, false
		}
		items = n.Content
		itemField = func(i int) string { return indexField(field, i) }
	}
	var out []int
	seen := map[int]bool{}
	ok := true
	for i, item := range items {
		item = c.deref(item)
		f := itemField(i)
		lo, hi, good := c.portRange(item, f)
		if !good {
			ok = false
			continue
		}
		if len(out)+hi-lo+1 > maxPorts {
			c.errorf(item, f, "too many ports (at most %d)", maxPorts)
			return nil, false
		}
		for p := lo; p <= hi; p++ {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out, ok
}

// portRange reads 8080, "8080" or "8000-8010".
func (c *checker) portRange(n *yaml.Node, field string) (lo, hi int, ok bool) {
	const want = "expected a port (1-65535) or a range such as \"8000-8010\""
	switch {
	case isScalar(n, "!!int"):
		v, ok := c.integer(n, field)
		if !ok {
			return 0, 0, false
		}
		if v < 1 || v > 65535 {
			c.errorf(n, field, "port %d is out of range 1-65535", v)
			return 0, 0, false
		}
		return v, v, true
	case isScalar(n, "!!str"):
		a, b, isRange := strings.Cut(strings.TrimSpace(n.Value), "-")
		if !isRange {
			b = a
		}
		lo, err1 := strconv.Atoi(strings.TrimSpace(a))
		hi, err2 := strconv.Atoi(strings.TrimSpace(b))
		if err1 != nil || err2 != nil {
			c.errorf(n, field, "%s, got %s", want, describe(n))
			return 0, 0, false
		}
		if lo < 1 || hi > 65535 || lo > hi {
			c.errorf(n, field, "port %s is out of range 1-65535 (or the range is reversed)", quoteShort(n.Value))
			return 0, 0, false
		}
		return lo, hi, true
	}
	c.errorf(n, field, "%s, got %s", want, describe(n))
	return 0, 0, false
}
