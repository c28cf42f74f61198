package optimizer

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// target is where one alternative may run, from its infra string.
type target struct {
	// anywhere is "*": every enabled infra except local.
	anywhere bool
	// auto is no infra written: every enabled infra, local only where it fits (localFit).
	auto bool
	kind Kind
	// name is the exact infra ("kubernetes/CTX", "aws"); "" admits every infra of the kind.
	name         string
	region, zone string
	// spec is the infra as written, for messages.
	spec string
}

// parseTarget reads Infra (or, when empty, the older Cloud/Region/Zone). No location at all is
// auto; "*" is anywhere. A first segment other than local, kubernetes (k8s) and * names a cloud, which only
// admits an enabled Cloud infra of that name.
func parseTarget(r configs.Resources) (target, error) {
	spec := r.Infra
	if spec == "" && r.Cloud != "" {
		spec = strings.Join(nonEmpty(r.Cloud, r.Region, r.Zone), "/")
	}
	switch spec {
	case "":
		return target{auto: true, spec: "every enabled infra"}, nil
	case "*":
		return target{anywhere: true, spec: "*"}, nil
	}
	bad := func(why string) (target, error) {
		return target{}, fmt.Errorf("%w: infra %q: %s", launcher.ErrInvalid, spec, why)
	}
	first, rest, hasRest := strings.Cut(spec, "/")
	switch first = strings.ToLower(first); first {
	case configs.InfraLocal:
		if hasRest {
			return bad("local takes no region or zone")
		}
		return target{kind: Local, name: configs.InfraLocal, spec: spec}, nil
	case "kubernetes", "k8s":
		t := target{kind: Kubernetes, spec: spec}
		if hasRest {
			if rest == "" {
				return bad("expected kubernetes/CONTEXT")
			}
			t.name = "kubernetes/" + rest
		}
		return t, nil
	case "":
		return bad("empty cloud name")
	}
	t := target{kind: Cloud, name: first, spec: spec}
	if hasRest {
		var more bool
		t.region, t.zone, more = strings.Cut(rest, "/")
		if t.region == "" || (more && (t.zone == "" || strings.Contains(t.zone, "/"))) {
			return bad("expected CLOUD[/REGION[/ZONE]]")
		}
	}
	return t, nil
}

func nonEmpty(parts ...string) []string {
	out := parts[:0:0]
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// admits reports whether the alternative may use inf.
func (t *target) admits(inf *Infra) bool {
	if t.auto {
		return true
	}
	if t.anywhere {
		return inf.Kind != Local
	}
	return inf.Kind == t.kind && (t.name == "" || inf.Name == t.name)
}

func (t *target) inRegion(row *catalog.Row) bool {
	return t.region == "" || row.Region == t.region
}

// unresolvedZone reports whether the zone filter is an AWS zone name that cannot be mapped to
// the catalog's AZ IDs (no ZoneNames for the account).
func (t *target) unresolvedZone(inf *Infra) bool {
	return t.zone != "" && inf.ZoneNames == nil && inf.Name == catalog.AWS && !isAZID(t.zone)
}

// zoneOf returns the zone a row's placement carries, and whether the zone filter admits it.
// byName is unresolvedZone's answer: every zone of the region stands for the named zone.
func (t *target) zoneOf(inf *Infra, row *catalog.Row, byName bool) (string, bool) {
	if row.Zone == "" {
		// Priced per region: any zone of it, the filter's if there is one (the provider
		// resolves a name or AZ ID), else the provider's choice.
		return t.zone, true
	}
	zone := row.Zone
	if inf.ZoneNames != nil {
		name, ok := inf.ZoneNames[row.Zone]
		if !ok {
			return "", false // this account has no such AZ
		}
		zone = name
	}
	switch {
	case t.zone == "":
		return zone, true
	case byName:
		return t.zone, true
	}
	return zone, zone == t.zone || row.Zone == t.zone
}

// isAZID reports whether zone is an AWS Availability Zone ID such as use1-az4.
func isAZID(zone string) bool {
	i := strings.LastIndex(zone, "-az")
	if i <= 0 || i+3 == len(zone) {
		return false
	}
	for _, c := range zone[i+3:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// quantity is a cpus or memory constraint: exactly value, or at least value; 0 is none.
type quantity struct {
	value   float64
	atLeast bool
}

func parseQuantity(field, s string) (quantity, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return quantity{}, nil
	}
	num, atLeast := strings.CutSuffix(s, "+")
	v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return quantity{}, fmt.Errorf("%w: %s %q: expected a positive number, optionally with a trailing + (4 or 4+)", launcher.ErrInvalid, field, s)
	}
	return quantity{value: v, atLeast: atLeast}, nil
}

func (q quantity) admits(v float64) bool {
	return q.value == 0 || v == q.value || (q.atLeast && v > q.value)
}

func (q quantity) String() string {
	s := formatNumber(q.value)
	if q.atLeast {
		s += "+"
	}
	return s
}

// formatNumber writes 4, 0.5 or 22.5: the shortest exact form.
func formatNumber(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}
