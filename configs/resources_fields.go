package configs

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The resources fields SkyPilot has beside placement and size: instance_type, labels, autostop
// and disk_tier.

// DiskTiers are SkyPilot's disk_tier values, cheapest first.
var DiskTiers = []string{DiskTierLow, DiskTierMedium, DiskTierHigh, DiskTierUltra, DiskTierBest}

// instanceTypeRE is the shape of AWS (p4d.24xlarge) and GCP (a2-highgpu-1g) instance types.
var instanceTypeRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*(\.[a-z0-9-]+)?$`)

// labelNameRE is the name part of a Kubernetes label key, and the shape of a label value.
var labelNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// maxLabels keeps the user's labels and Ferry's own within AWS's 50 tags per instance.
const maxLabels = 40

// autostopDurationRE is SkyPilot's "<num>[m|h|d|w]" (minutes without a unit).
var autostopDurationRE = regexp.MustCompile(`^([0-9]+)([mhdw]?)$`)

// DefaultAutostopMinutes is SkyPilot's idle time for `autostop: true`.
const DefaultAutostopMinutes = 5

// autostopKeys are Autostop's keys and wait_for, which SkyPilot accepts and Ferry checks but
// has no use for (a job's nodes go when it ends).
var autostopKeys = []string{"idle_minutes", "down", "wait_for"}

// extraResourceFields reads instance_type, labels, autostop and disk_tier into s.
func (c *checker) extraResourceFields(s *resourceSpec, f map[string]entry, field string) {
	explicit := ""
	if s.given["location"] != nil {
		explicit, _, _ = strings.Cut(s.r.Infra, "/")
	}
	if e, ok := f["instance_type"]; ok {
		kf := joinField(field, "instance_type")
		if v, ok := c.str(e.value, kf); ok {
			switch {
			case !instanceTypeRE.MatchString(v) || len(v) > 64:
				c.errorf(e.value, kf, "%s is not an instance type name such as p4d.24xlarge (AWS) or a2-highgpu-1g (GCP)", quoteShort(v))
			case explicit == InfraLocal || explicit == "kubernetes":
				c.errorf(e.value, kf, "%s has no instance types (infra is %s): describe the node with cpus, memory and accelerators instead", explicit, s.r.Infra)
			default:
				s.r.InstanceType = v
				s.given["instance_type"] = e.value
			}
		}
	}
	if e, ok := f["labels"]; ok {
		if labels, ok := c.labels(e.value, joinField(field, "labels")); ok {
			s.r.Labels = labels
			s.given["labels"] = e.value
		}
	}
	if e, ok := f["disk_tier"]; ok {
		c.diskTier(s, e.value, joinField(field, "disk_tier"), explicit)
	}
	if e, ok := f["autostop"]; ok {
		s.r.Autostop = c.autostop(e.value, joinField(field, "autostop"))
		s.given["autostop"] = e.keyNode
	}
}

// diskTier reads disk_tier. Local processes and Kubernetes pods use their host's disk, which a
// tier cannot change; only `best` (whatever the infra has) is accepted there.
func (c *checker) diskTier(s *resourceSpec, n *yaml.Node, field, explicit string) {
	v, ok := c.str(n, field)
	if !ok {
		return
	}
	v = strings.ToLower(strings.TrimSpace(v))
	if !slices.Contains(DiskTiers, v) {
		c.errorf(n, field, "unknown disk tier %s%s", quoteShort(v), suggest(v, DiskTiers, "tiers"))
		return
	}
	if (explicit == InfraLocal || explicit == "kubernetes") && v != DiskTierBest {
		c.errorf(n, field, "%s runs on its host's disk, which disk_tier cannot choose: leave disk_tier out, write disk_tier: best, or pick a cloud (infra: aws or gcp)", explicit)
		return
	}
	s.r.DiskTier = v
	s.given["disk_tier"] = n
}

// labels reads resources.labels: names to string values, each a valid Kubernetes label that
// also fits GCP once escaped (the strictest of the three: pod labels and AWS tags carry them as
// they are, GCP labels through launcher/gcp's reversible escaping).
func (c *checker) labels(n *yaml.Node, field string) (map[string]string, bool) {
	ps, ok := c.pairs(n, field)
	if !ok {
		return nil, false
	}
	if len(ps) > maxLabels {
		c.errorf(n, field, "%d labels; at most %d are allowed (AWS allows 50 tags an instance, and Ferry adds its own)", len(ps), maxLabels)
		return nil, false
	}
	out := make(map[string]string, len(ps))
	for _, p := range ps {
		lf := joinField(field, p.key)
		if problem := labelKeyProblem(p.key); problem != "" {
			c.errorf(p.keyNode, lf, "%s", problem)
			ok = false
			continue
		}
		v := ""
		if !isNull(p.value) {
			text, good := c.scalarText(p.value, lf)
			if !good {
				ok = false
				continue
			}
			v = text
		}
		if v != "" && (len(v) > 63 || !labelNameRE.MatchString(v)) {
			c.errorf(p.value, lf, "label value %s: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit (the rule of Kubernetes labels)", quoteShort(v))
			ok = false
			continue
		}
		if gcpLabelLen(v) > 63 {
			c.errorf(p.value, lf, "label value %s is %d characters as a GCP label (each character outside a-z, 0-9 and - takes 3); GCP allows 63", quoteShort(v), gcpLabelLen(v))
			ok = false
			continue
		}
		out[p.key] = v
	}
	return out, ok
}

// labelKeyProblem checks a label key against Kubernetes' rules and the prefixes that belong to
// Ferry, Kubernetes and AWS.
func labelKeyProblem(k string) string {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		prefix, name = "", k
	}
	lower := strings.ToLower(k)
	switch {
	case strings.HasPrefix(lower, "ferry.") || strings.HasPrefix(lower, "ferry-"):
		return fmt.Sprintf("label %s: keys starting with ferry. or ferry- are Ferry's own", quoteShort(k))
	case strings.HasPrefix(lower, "aws:"):
		return fmt.Sprintf("label %s: keys starting with aws: are reserved by AWS", quoteShort(k))
	case prefix == "kubernetes.io" || prefix == "k8s.io" || strings.HasSuffix(prefix, ".kubernetes.io") || strings.HasSuffix(prefix, ".k8s.io"):
		return fmt.Sprintf("label %s: the %s/ prefix is reserved by Kubernetes", quoteShort(k), prefix)
	case hasPrefix && (len(prefix) > 253 || !dnsSubdomainRE.MatchString(prefix)):
		return fmt.Sprintf("label %s: the prefix before / must be a DNS subdomain such as example.com", quoteShort(k))
	case len(name) > 63 || !labelNameRE.MatchString(name):
		return fmt.Sprintf("label key %s: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit, optionally after a prefix such as example.com/ (the rule of Kubernetes labels)", quoteShort(k))
	case k[0] < 'a' || k[0] > 'z':
		return fmt.Sprintf("label key %s: GCP label keys start with a lowercase letter", quoteShort(k))
	case gcpLabelLen(k) > 63:
		return fmt.Sprintf("label key %s is %d characters as a GCP label (each character outside a-z, 0-9 and - takes 3); GCP allows 63", quoteShort(k), gcpLabelLen(k))
	}
	return ""
}

// gcpLabelLen is the length of s once launcher/gcp escapes it into a GCP label (labels.go):
// a byte outside [a-z0-9-] becomes "_xx".
func gcpLabelLen(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			n++
		} else {
			n += 3
		}
	}
	return n
}

// autostop reads SkyPilot's spellings: true (5 idle minutes), false (none), minutes as a
// number or "<num>[m|h|d|w]", or {idle_minutes, down, wait_for}. It returns nil for false.
func (c *checker) autostop(n *yaml.Node, field string) *Autostop {
	switch {
	case isScalar(n, "!!bool") || (isScalar(n, "!!str") && n.Style == 0 && isYAML11Bool(n.Value)):
		v, ok := c.boolean(n, field)
		if !ok || !v {
			return nil
		}
		return &Autostop{IdleMinutes: DefaultAutostopMinutes}
	case isScalar(n, "!!int") || isScalar(n, "!!str"):
		if m, ok := c.idleMinutes(n, field); ok {
			return &Autostop{IdleMinutes: m}
		}
		return nil
	case n.Kind == yaml.MappingNode:
		f, _ := c.fields(n, field, autostopKeys)
		a := &Autostop{IdleMinutes: DefaultAutostopMinutes}
		if e, ok := f["idle_minutes"]; ok {
			a.IdleMinutes, _ = c.idleMinutes(e.value, joinField(field, "idle_minutes"))
		}
		if e, ok := f["down"]; ok {
			a.Down, _ = c.boolean(e.value, joinField(field, "down"))
		}
		if e, ok := f["wait_for"]; ok {
			// Ferry's nodes end with their job, so every idleness rule gives the same result;
			// the value is still checked.
			c.oneOf(e.value, joinField(field, "wait_for"), []string{"jobs_and_ssh", "jobs", "none"}, "wait_for", "values")
		}
		return a
	}
	c.errorf(n, field, "expected true, false, idle minutes (10 or \"10m\", \"1h\"), or a mapping with idle_minutes and down; got %s", describe(n))
	return nil
}

func isYAML11Bool(s string) bool {
	switch strings.ToLower(s) {
	case "yes", "no", "on", "off":
		return true
	}
	return false
}

// idleMinutes reads a whole number of minutes, or "<num>[m|h|d|w]".
func (c *checker) idleMinutes(n *yaml.Node, field string) (int, bool) {
	if isScalar(n, "!!int") {
		return c.intAtLeast(n, field, 0)
	}
	m := autostopDurationRE.FindStringSubmatch(strings.TrimSpace(n.Value))
	if !isScalar(n, "!!str") || m == nil {
		c.errorf(n, field, "expected idle minutes as a whole number or a duration such as \"30m\", \"2h\", \"1d\" or \"1w\", got %s", describe(n))
		return 0, false
	}
	v, err := strconv.Atoi(m[1])
	unit := map[string]int{"": 1, "m": 1, "h": 60, "d": 60 * 24, "w": 60 * 24 * 7}[m[2]]
	if err != nil || v > maxInt/unit {
		c.errorf(n, field, "duration %s is out of range", quoteShort(n.Value))
		return 0, false
	}
	return v * unit, true
}

// sizeRE is SkyPilot's size with a unit (constants.MEMORY_SIZE_UNITS, case-insensitive as
// its documentation says): a number, then KB, KI, MB, MI, GB, GI, TB, TI, PB or PI, and for
// memory an optional + (at least).
var sizeRE = regexp.MustCompile(`(?i)^([0-9]+(?:\.[0-9]+)?)\s*([kmgtp][bi])(\+?)$`)

// unitGB is each unit's size in GB, in powers of two as SkyPilot counts them (1TB is 1024 GB).
var unitGB = map[byte]float64{'k': 1.0 / (1 << 20), 'm': 1.0 / (1 << 10), 'g': 1, 't': 1 << 10, 'p': 1 << 20}

// sizeGB converts a size with a unit to GB; ok is false when s has no unit.
func sizeGB(s string) (gb float64, atLeast, ok bool) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, false, false
	}
	num, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, false, false
	}
	return num * unitGB[strings.ToLower(m[2])[0]], m[3] == "+", true
}

// diskSize reads disk_size in GB: an integer, or SkyPilot's string with a unit ("1024GB",
// "1TB"), rounded down to whole GB as SkyPilot does.
func (c *checker) diskSize(n *yaml.Node, field string) (int, bool) {
	if !isScalar(n, "!!str") {
		return c.intAtLeast(n, field, 1)
	}
	text := strings.TrimSpace(n.Value)
	gb := 0.0
	if v, err := strconv.Atoi(text); err == nil {
		gb = float64(v)
	} else if size, atLeast, ok := sizeGB(text); ok && !atLeast {
		gb = math.Floor(size)
	} else {
		c.errorf(n, field, "expected GB as an integer (256) or a size with a unit such as \"1024GB\" or \"1TB\", got %s", describe(n))
		return 0, false
	}
	if gb < 1 || gb > maxInt {
		c.errorf(n, field, "%s is out of range: between 1 GB and %d GB", quoteShort(n.Value), maxInt)
		return 0, false
	}
	return int(gb), true
}

// memory reads resources.memory: what quantity reads, or SkyPilot's size with a unit ("64GB",
// "32GB+"), kept in GB.
func (c *checker) memory(n *yaml.Node, field string) (string, bool) {
	if isScalar(n, "!!str") {
		if gb, atLeast, ok := sizeGB(n.Value); ok {
			if !(gb > 0) || gb > maxInt {
				c.errorf(n, field, "%s is out of range", quoteShort(n.Value))
				return "", false
			}
			out := strconv.FormatFloat(gb, 'f', -1, 64)
			if atLeast {
				out += "+"
			}
			return out, true
		}
	}
	return c.quantity(n, field)
}
