package configs

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// ResolvedYAML renders the task as Ferry will run it, with every default filled in and
// secrets redacted, so `serve up` can show exactly what was understood. The output is itself a
// valid task file: parsing it gives back t.Redacted().
//
// It is written from the task's own types: each field's yaml tag gives its key, its place
// (declaration order) and whether it is left out when empty, so a new field is written once.
// A section whose fields are not all written as they are held says how in resolvedValue.
func (t *Task) ResolvedYAML() ([]byte, error) {
	r := t.Redacted()
	doc, err := resolvedNode(reflect.ValueOf(r))
	if err != nil {
		return nil, fmt.Errorf("configs: render resolved task: %w", err)
	}
	if r.Job != nil {
		// SkyPilot's spelling puts a job's recovery under resources, where parsing reads it.
		rec, err := resolvedNode(reflect.ValueOf(r.Job.Recovery))
		if err != nil {
			return nil, fmt.Errorf("configs: render resolved task: %w", err)
		}
		insertBefore(valueOf(doc, "resources"), "job_recovery", rec, "objective")
	}
	var buf bytes.Buffer
	buf.WriteString("# Resolved by Ferry: defaults filled in, secrets redacted.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("configs: render resolved task: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("configs: render resolved task: %w", err)
	}
	return buf.Bytes(), nil
}

// shapedSection is a section some of whose fields are written in another shape than they are
// held (accelerators, workdir, file_mounts), or only when set. resolvedValue returns what to
// write under key instead of the field, nil to leave the key out; ok false writes the field
// as its tag says.
type shapedSection interface {
	resolvedValue(key string) (v any, ok bool)
}

var (
	_ shapedSection = Task{}
	_ shapedSection = Resources{}
	_ shapedSection = Service{}
	_ shapedSection = ReplicaPolicy{}
	_ shapedSection = Objective{}
)

// yamlField is one field of a section, as its yaml tag describes it.
type yamlField struct {
	index     int
	key       string
	omitEmpty bool
	flow      bool
}

// yamlFields lists t's fields that have a YAML key, in declaration order: the order
// ResolvedYAML writes them in and error messages list them in. A field tagged "-" is held
// but never written (another field says it, or it is derived).
func yamlFields(t reflect.Type) []yamlField {
	var out []yamlField
	for i := range t.NumField() {
		tag, ok := t.Field(i).Tag.Lookup("yaml")
		if !ok || tag == "-" || !t.Field(i).IsExported() {
			continue
		}
		key, opts, _ := strings.Cut(tag, ",")
		f := yamlField{index: i, key: key}
		for _, opt := range strings.Split(opts, ",") {
			f.omitEmpty = f.omitEmpty || opt == "omitempty"
			f.flow = f.flow || opt == "flow"
		}
		out = append(out, f)
	}
	return out
}

// keysOf is the keys a section of type T accepts: its fields' YAML keys, in declaration
// order, so a field's key is written once, on the field.
func keysOf[T any]() []string {
	fields := yamlFields(reflect.TypeFor[T]())
	keys := make([]string, len(fields))
	for i, f := range fields {
		keys[i] = f.key
	}
	return keys
}

// resolvedNode is v as ResolvedYAML writes it: a section from its fields' tags, strings by
// text, maps in yaml.v3's key order; what a type marshals itself (yaml.Marshaler) and values
// of no fixed type (pod_config's) are written by yaml.v3's own rules, as they always were.
func resolvedNode(v reflect.Value) (*yaml.Node, error) {
	if n, ok := v.Interface().(*yaml.Node); ok {
		return n, nil
	}
	if _, ok := v.Interface().(yaml.Marshaler); ok {
		return yamlOf(v.Interface())
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return yamlOf(nil)
		}
		return resolvedNode(v.Elem())
	case reflect.Struct:
		return sectionNode(v)
	case reflect.Map:
		if v.Type().Elem().Kind() == reflect.Interface {
			return yamlOf(v.Interface())
		}
		return mapNode(v)
	case reflect.Slice:
		seq := &yaml.Node{Kind: yaml.SequenceNode}
		for i := range v.Len() {
			n, err := resolvedNode(v.Index(i))
			if err != nil {
				return nil, err
			}
			seq.Content = append(seq.Content, n)
		}
		return seq, nil
	case reflect.String:
		return text(v.String()), nil
	}
	return yamlOf(v.Interface())
}

// sectionNode writes a struct's tagged fields in declaration order.
func sectionNode(v reflect.Value) (*yaml.Node, error) {
	out := &yaml.Node{Kind: yaml.MappingNode}
	valuer, _ := v.Interface().(shapedSection)
	for _, f := range yamlFields(v.Type()) {
		field := v.Field(f.index)
		alt, replaced := any(nil), false
		if valuer != nil {
			alt, replaced = valuer.resolvedValue(f.key)
		}
		switch {
		case replaced && alt == nil:
			continue
		case replaced:
			field = reflect.ValueOf(alt)
		case f.omitEmpty && isEmpty(field):
			continue
		}
		n, err := resolvedNode(field)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.key, err)
		}
		if f.flow {
			n.Style |= yaml.FlowStyle
		}
		out.Content = append(out.Content, keyNode(f.key), n)
	}
	return out, nil
}

// isEmpty is omitempty's rule, as yaml.v3 applies it.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return v.IsNil()
	case reflect.Map, reflect.Slice:
		return v.Len() == 0
	}
	return v.IsZero()
}

// mapNode writes a map with string keys in the order yaml.v3 gives them ("a2" before "a10"),
// which is how these maps were always written.
func mapNode(v reflect.Value) (*yaml.Node, error) {
	keys := make(map[string]bool, v.Len())
	for it := v.MapRange(); it.Next(); {
		keys[it.Key().String()] = true
	}
	order, err := yamlOf(keys)
	if err != nil {
		return nil, err
	}
	out := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(order.Content); i += 2 {
		k := order.Content[i]
		n, err := resolvedNode(v.MapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key())))
		if err != nil {
			return nil, err
		}
		out.Content = append(out.Content, k, n)
	}
	return out, nil
}

// yamlOf is v as yaml.v3 writes it by its own rules.
func yamlOf(v any) (*yaml.Node, error) {
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		return nil, err
	}
	return &n, nil
}

func keyNode(key string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}
}

// valueOf is the value under key in mapping m, nil if there is none.
func valueOf(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// insertBefore adds key: v to mapping m before the key before, or at the end without it.
func insertBefore(m *yaml.Node, key string, v *yaml.Node, before string) {
	at := len(m.Content)
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == before {
			at = i
			break
		}
	}
	m.Content = append(m.Content[:at], append([]*yaml.Node{keyNode(key), v}, m.Content[at:]...)...)
}

// text is a string as ResolvedYAML writes it, so that it reads back the same. yaml.v3 writes
// multi-line strings as block scalars, which lose a leading newline or indented first line;
// those are double-quoted instead.
func text(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if strings.Contains(s, "\n") && strings.IndexByte(" \t\r\n", s[0]) >= 0 {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

// resolvedValue writes workdir and file_mounts in the forms parsing reads them from.
func (t Task) resolvedValue(key string) (any, bool) {
	switch key {
	case "workdir":
		if t.GitWorkdir != nil {
			return t.GitWorkdir.resolvedNode(), true
		}
	case "file_mounts":
		if len(t.FileMounts) == 0 {
			return nil, true
		}
		return t.resolvedFileMounts(), true
	}
	return nil, false
}

// resolvedValue writes accelerators in the form they came in, and what every alternative
// inherits (capacity, network_tier, objective) once, at the top, where it is read.
func (r Resources) resolvedValue(key string) (any, bool) {
	switch key {
	case "accelerators":
		if n := r.acceleratorsNode(); n != nil {
			return n, true
		}
		return nil, true
	case "any_of":
		return inheriting(r.AnyOf), true
	case "ordered":
		if r.isPreferenceList() {
			return nil, true // the accelerators' list says it
		}
		return inheriting(r.Ordered), true
	case "objective":
		if r.Objective.Minimize == "" {
			return nil, true
		}
	}
	return nil, false
}

// inheriting is alternatives without what they inherit from the top of resources; nil for
// none.
func inheriting(alts []Resources) any {
	if len(alts) == 0 {
		return nil
	}
	out := make([]Resources, len(alts))
	for i, alt := range alts {
		alt.Capacity, alt.NetworkTier, alt.Objective = nil, "", Objective{}
		out[i] = alt
	}
	return out
}

// acceleratorsNode is accelerators as they read back, nil for none.
func (r Resources) acceleratorsNode() *yaml.Node {
	scalar := func(tag, value string) *yaml.Node {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value}
	}
	if r.isPreferenceList() {
		// Written back as the list it came from, which means the same ordered alternatives.
		n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, a := range r.Accelerators {
			n.Content = append(n.Content, scalar("!!str", a.Spec()))
		}
		return n
	}
	if len(r.Accelerators) == 0 {
		return nil
	}
	// A mapping is a set, as in SkyPilot: {A100: 1, L4: 0.5}. A GPU at several counts is
	// written as SkyPilot's keys, {A100:4: null, A100:8: null}, as names would repeat.
	n := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
	specKeys := repeatsName(r.Accelerators)
	for _, a := range r.Accelerators {
		if specKeys {
			n.Content = append(n.Content, scalar("!!str", a.Spec()), scalar("!!null", "null"))
			continue
		}
		n.Content = append(n.Content, scalar("!!str", a.Name), scalar(countTag(a.Count), formatCount(a.Count)))
	}
	return n
}

// repeatsName reports whether an accelerator name appears twice (at different counts).
func repeatsName(accs []Accelerator) bool {
	seen := map[string]bool{}
	for _, a := range accs {
		key := strings.ToLower(a.Name)
		if seen[key] {
			return true
		}
		seen[key] = true
	}
	return false
}

// countTag is the YAML tag a count reads back as, so the encoder writes no explicit tag.
func countTag(v float64) string {
	if v == float64(int64(v)) {
		return "!!int"
	}
	return "!!float"
}

// resolvedValue writes a fixed count as replicas (and no replica_policy), and update only
// when it is not the default.
func (s Service) resolvedValue(key string) (any, bool) {
	switch key {
	case "replicas":
		if s.FixedReplicas {
			return s.ReplicaPolicy.MinReplicas, true
		}
		return nil, true
	case "replica_policy":
		if s.FixedReplicas {
			return nil, true
		}
	case "update":
		if s.Update == DefaultUpdate() {
			return nil, true
		}
	}
	return nil, false
}

// resolvedValue writes the fields the policy's autoscaler reads. The windowed autoscalers'
// fields are written as given: their zero means the autoscaler package's default, which is
// not this package's to show.
func (p ReplicaPolicy) resolvedValue(key string) (any, bool) {
	switch key {
	case "target_qps_per_replica":
		switch {
		case p.TargetQPSPerAccelerator != nil:
			return p.TargetQPSPerAccelerator, true
		case p.TargetQPSPerReplica > 0:
			return p.TargetQPSPerReplica, true
		}
		return nil, true
	case "num_overprovision":
		// Written only when the YAML set it: absent, concurrency and llm learn a headroom.
		if p.NumOverprovisionSet {
			return p.NumOverprovision, true
		}
		return nil, true
	case "upscale_delay_seconds", "downscale_delay_seconds":
		// SkyServe's delays belong to request_rate (and are accepted with a fixed count);
		// concurrency and llm reject them.
		if p.Autoscaler != "" && p.Autoscaler != AutoscalerRequestRate {
			return nil, true
		}
	}
	return nil, false
}
