package configs

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// This file holds the typed accessors over yaml.v3 nodes. Decoding through nodes rather than
// into structs is what lets every error carry a line and column, and lets one pass report every
// problem in a file.

const budgetMsg = "too many YAML nodes, counting each use of an alias"

// maxMergeDepth bounds `<<` merge keys that merge maps that merge maps; it also stops cycles.
const maxMergeDepth = 32

// entry is one key/value pair of a mapping, values already resolved through aliases.
type entry struct {
	key     string
	keyNode *yaml.Node
	value   *yaml.Node
}

// joinField appends a key to a dotted field path.
func joinField(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

// indexField appends a list index to a field path.
func indexField(field string, i int) string {
	return fmt.Sprintf("%s[%d]", field, i)
}

// nullAt is a null scalar placed where n is, for when a node cannot be followed further.
func nullAt(n *yaml.Node) *yaml.Node {
	out := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
	if n != nil {
		out.Line, out.Column = n.Line, n.Column
	}
	return out
}

// deref follows aliases and charges the visit to the budget. Once the budget is spent it
// returns nulls, and err() reports only the budget problem.
func (c *checker) deref(n *yaml.Node) *yaml.Node {
	for hops := 0; n != nil && n.Kind == yaml.AliasNode; hops++ {
		if hops > 64 || n.Alias == nil {
			return nullAt(n)
		}
		n = n.Alias
	}
	if n == nil {
		return nullAt(nil)
	}
	c.budget--
	if c.budget < 0 {
		if !c.exhausted {
			c.exhausted = true
			c.errorf(n, "", "document too large: %s (limit %d)", budgetMsg, maxNodeVisits)
		}
		return nullAt(n)
	}
	return n
}

// isNull reports whether n is YAML null (or missing), which Ferry treats as "not given".
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func isScalar(n *yaml.Node, tag string) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == tag
}

// quoteShort quotes a value for a message, cut short so that a pasted blob stays readable.
func quoteShort(s string) string {
	return strconv.Quote(truncate(s))
}

// truncate cuts s to a length fit for a one-line message.
func truncate(s string) string {
	const limit = 40
	if utf8.RuneCountInString(s) > limit {
		s = string([]rune(s)[:limit]) + "..."
	}
	return s
}

// describe names what a node is, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "null"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode:
		switch tag := n.ShortTag(); tag {
		case "!!str":
			return "string " + quoteShort(n.Value)
		case "!!int":
			return "integer " + truncate(n.Value)
		case "!!float":
			return "number " + truncate(n.Value)
		case "!!bool":
			return "boolean " + n.Value
		default:
			return strings.TrimPrefix(tag, "!!") + " " + quoteShort(n.Value)
		}
	}
	return "an unexpected YAML node"
}

// isMergeKey reports whether k is YAML's `<<` merge key.
func isMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge"
}

// pairs returns a mapping's entries in order with `<<` merges expanded (keys written in the map
// win over merged ones, earlier merges over later), reporting duplicate and non-scalar keys.
// A null node is an empty mapping. ok is false when n is not a mapping at all.
func (c *checker) pairs(n *yaml.Node, field string) (out []entry, ok bool) {
	return c.pairsDepth(n, field, 0)
}

func (c *checker) pairsDepth(n *yaml.Node, field string, depth int) ([]entry, bool) {
	n = c.deref(n)
	if isNull(n) {
		return nil, true
	}
	if n.Kind != yaml.MappingNode {
		c.errorf(n, field, "expected a mapping, got %s", describe(n))
		return nil, false
	}
	var out, merged []entry
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := c.deref(n.Content[i])
		if isMergeKey(k) {
			merged = append(merged, c.mergeEntries(n.Content[i+1], field, depth+1)...)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			c.errorf(k, field, "keys must be plain strings, got %s", describe(k))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			c.errorf(k, joinField(field, k.Value), "duplicate key (first given at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, entry{key: k.Value, keyNode: k, value: c.deref(n.Content[i+1])})
	}
	for _, m := range merged {
		if _, dup := seen[m.key]; !dup {
			seen[m.key] = m.keyNode
			out = append(out, m)
		}
	}
	return out, true
}

// mergeEntries expands the value of a `<<` key: a mapping or a list of mappings.
func (c *checker) mergeEntries(v *yaml.Node, field string, depth int) []entry {
	v = c.deref(v)
	if depth > maxMergeDepth {
		c.errorf(v, field, "merge keys (<<) nested more than %d deep", maxMergeDepth)
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		out, _ := c.pairsDepth(v, field, depth)
		return out
	case yaml.SequenceNode:
		var out []entry
		seen := map[string]bool{}
		for _, item := range v.Content {
			item = c.deref(item)
			if item.Kind != yaml.MappingNode {
				c.errorf(item, field, "a merge key (<<) takes a mapping or a list of mappings, got %s", describe(item))
				continue
			}
			got, _ := c.pairsDepth(item, field, depth)
			for _, e := range got {
				if !seen[e.key] {
					seen[e.key] = true
					out = append(out, e)
				}
			}
		}
		return out
	}
	c.errorf(v, field, "a merge key (<<) takes a mapping or a list of mappings, got %s", describe(v))
	return nil
}

// fields reads a mapping whose keys are a fixed schema: unknown keys are reported with a
// did-you-mean hint, and keys whose value is null are left out, as if not written.
func (c *checker) fields(n *yaml.Node, field string, allowed []string) (map[string]entry, bool) {
	ps, ok := c.pairs(n, field)
	if !ok {
		return nil, false
	}
	out := make(map[string]entry, len(ps))
	for _, p := range ps {
		if !slices.Contains(allowed, p.key) {
			if why := unsupportedReason(field, p.key); why != "" && c.taskFile {
				c.errorf(p.keyNode, joinField(field, p.key), "SkyPilot's %s is not supported by Ferry: %s", p.key, why)
				continue
			}
			c.errorf(p.keyNode, joinField(field, p.key), "unknown field %s%s", quoteShort(p.key), suggest(p.key, allowed, "fields"))
			continue
		}
		if isNull(p.value) {
			continue
		}
		out[p.key] = p
	}
	return out, true
}

// maxInt bounds every integer field, so arithmetic on them downstream cannot overflow.
const maxInt = 1 << 30

// integer reads an integer scalar. Floats and quoted numbers are errors: SkyServe's schema
// types these fields as integers, and "2.5 replicas" is a mistake worth catching.
func (c *checker) integer(n *yaml.Node, field string) (int, bool) {
	if !isScalar(n, "!!int") {
		c.errorf(n, field, "expected an integer, got %s", describe(n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil || v > maxInt || v < -maxInt {
		c.errorf(n, field, "integer %s is out of range", n.Value)
		return 0, false
	}
	return int(v), true
}

// intAtLeast reads an integer that must be at least min.
func (c *checker) intAtLeast(n *yaml.Node, field string, min int) (int, bool) {
	v, ok := c.integer(n, field)
	if ok && v < min {
		c.errorf(n, field, "must be at least %d, got %d", min, v)
		return v, false
	}
	return v, ok
}

// number reads a finite number written as an integer or a float.
func (c *checker) number(n *yaml.Node, field string) (float64, bool) {
	if !isScalar(n, "!!int") && !isScalar(n, "!!float") {
		c.errorf(n, field, "expected a number, got %s", describe(n))
		return 0, false
	}
	var v float64
	if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		c.errorf(n, field, "expected a finite number, got %s", n.Value)
		return 0, false
	}
	return v, true
}

// positive reads a number that must be greater than zero.
func (c *checker) positive(n *yaml.Node, field string) (float64, bool) {
	v, ok := c.number(n, field)
	if ok && v <= 0 {
		c.errorf(n, field, "must be greater than 0, got %s", n.Value)
		return v, false
	}
	return v, ok
}

// boolean reads true/false. Unquoted yes/no/on/off are accepted too, because SkyPilot reads
// YAML with PyYAML (YAML 1.1), where they are booleans, and its users write them.
func (c *checker) boolean(n *yaml.Node, field string) (bool, bool) {
	if isScalar(n, "!!bool") {
		var v bool
		if err := n.Decode(&v); err == nil {
			return v, true
		}
	}
	if isScalar(n, "!!str") && n.Style == 0 {
		switch strings.ToLower(n.Value) {
		case "yes", "on":
			return true, true
		case "no", "off":
			return false, true
		}
	}
	c.errorf(n, field, "expected a boolean (true or false), got %s", describe(n))
	return false, false
}

// str reads a string scalar. Numbers and booleans are errors: in a string field they are
// almost always a slip (and YAML would have changed them, e.g. 010 or 1e3).
func (c *checker) str(n *yaml.Node, field string) (string, bool) {
	if !isScalar(n, "!!str") {
		c.errorf(n, field, "expected a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// oneOf reads a string that must be one of valid; noun names one value in the error ("policy")
// and plural the list of them ("policies").
func (c *checker) oneOf(n *yaml.Node, field string, valid []string, noun, plural string) (string, bool) {
	v, ok := c.str(n, field)
	if !ok {
		return "", false
	}
	if !slices.Contains(valid, v) {
		c.errorf(n, field, "unknown %s %s%s", noun, quoteShort(v), suggest(v, valid, plural))
		return "", false
	}
	return v, true
}

// scalarText reads any non-null scalar as the text written in the file, for env values and
// headers, where `PORT: 8080` and `DEBUG: true` mean the strings "8080" and "true".
func (c *checker) scalarText(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		c.errorf(n, field, "expected a string, number or boolean, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// suggest returns "; did you mean X?" for the nearest valid name (edit distance at most 2, or
// one a prefix of the other), else the list of valid names.
func suggest(got string, valid []string, what string) string {
	lower := strings.ToLower(got)
	best, bestScore := "", math.MaxInt
	for _, v := range valid {
		score := math.MaxInt
		if d := levenshtein(lower, v); d <= 2 && d < len(v) {
			score = d
		} else if len(lower) >= 2 && (strings.HasPrefix(v, lower) || strings.HasPrefix(lower, v)) {
			score = 3 + abs(len(v)-len(lower))
		}
		if score < bestScore {
			best, bestScore = v, score
		}
	}
	if best != "" {
		return fmt.Sprintf("; did you mean %q?", best)
	}
	return fmt.Sprintf(" (valid %s: %s)", what, strings.Join(valid, ", "))
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// levenshtein is the edit distance between a and b, counted in bytes (keys are ASCII).
func levenshtein(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
