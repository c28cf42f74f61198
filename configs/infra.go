package configs

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Where a task may run: `infra` (SkyPilot's CLOUD[/REGION[/ZONE]], with * for any part) or the
// older cloud/region/zone, read into one canonical infra string that the optimizer and the
// provisioner match against the enabled infras.

// infraClouds are the first segments `infra` accepts ("*" means anywhere Ferry can launch).
var infraClouds = []string{InfraLocal, "kubernetes", "k8s", "aws", "gcp", "*"}

// skypilotOnlyClouds are the clouds SkyPilot launches on and Ferry does not. SkyPilot skips a
// cloud that is not enabled, so an any_of or ordered alternative on one of them is dropped from
// the plan with a note rather than voiding the file; a task with no other place is an error.
var skypilotOnlyClouds = []string{"azure", "lambda", "fluidstack", "oci", "ibm", "scp", "vsphere", "runpod",
	"paperspace", "cudo", "do", "nebius", "vast", "hyperbolic", "seeweb", "primeintellect", "shadeform",
	"coreweave", "together", "ssh", "slurm"}

// regionRE is the shape of AWS and GCP region and zone names (us-east-1, us-central1-a).
var regionRE = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// awsRegionRE and gcpRegionRE tell the two clouds' region names apart (us-east-1 ends in -N,
// us-central1 in a letter then N), which is how `infra: */us-east-1` finds its cloud.
var (
	awsRegionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
	gcpRegionRE = regexp.MustCompile(`^[a-z]+(-[a-z]+)+[0-9]+$`)
)

// location reads infra, or the legacy cloud/region/zone, into a canonical infra string.
// inheritCloud is the cloud of the resources block around an any_of or ordered alternative
// ("" at the top level): an alternative that gives only region or zone runs on it, as in
// SkyPilot (its SpotHedge example: cloud: gcp with any_of [{zone: us-central1-a}, {region:
// us-east1}]).
func (c *checker) location(s *resourceSpec, f map[string]entry, field, inheritCloud string) {
	legacy := []string{"cloud", "region", "zone"}
	if infra, ok := f["infra"]; ok {
		for _, k := range legacy {
			if e, ok := f[k]; ok {
				c.errorf(e.keyNode, joinField(field, k), "cannot be combined with infra: infra replaces cloud, region and zone")
			}
		}
		v, ok := c.str(infra.value, joinField(field, "infra"))
		if !ok {
			return
		}
		canon, problem := parseInfra(v)
		if problem != "" {
			c.errorf(infra.value, joinField(field, "infra"), "%s", problem)
			return
		}
		s.r.Infra = canon
		s.given["location"] = infra.value
		return
	}

	vals := map[string]string{}
	for _, k := range legacy {
		if e, ok := f[k]; ok {
			if v, ok := c.str(e.value, joinField(field, k)); ok {
				vals[k] = strings.TrimSpace(v)
			} else {
				return
			}
		}
	}
	if len(vals) == 0 {
		return
	}
	at := f["cloud"].value
	if _, ok := f["cloud"]; !ok {
		for _, k := range []string{"region", "zone"} {
			if e, ok := f[k]; ok && at == nil {
				at = e.value
				if inheritCloud == "" {
					c.errorf(e.keyNode, joinField(field, k), "needs cloud (or write infra: CLOUD/REGION[/ZONE])")
					return
				}
			}
		}
		vals["cloud"] = inheritCloud
	}
	cl := strings.ToLower(vals["cloud"])
	region, zone := vals["region"], vals["zone"]
	if zone != "" && cl != "aws" && cl != "gcp" && !slices.Contains(skypilotOnlyClouds, cl) {
		c.errorf(f["zone"].keyNode, joinField(field, "zone"), "only aws and gcp have zones, not %s", quoteShort(vals["cloud"]))
		return
	}
	if zone != "" && region == "" {
		region = regionOfZone(cl, zone)
	}
	spec := vals["cloud"]
	for _, part := range []string{region, zone} {
		if part != "" {
			spec += "/" + part
		}
	}
	canon, problem := parseInfra(spec)
	if problem != "" {
		c.errorf(at, joinField(field, "cloud"), "%s", problem)
		return
	}
	s.r.Infra = canon
	s.given["location"] = at
}

// regionOfZone infers a zone's region, as SkyPilot does when only `zone` is given:
// us-east-1a is in us-east-1 (AWS), us-central1-a in us-central1 (GCP).
func regionOfZone(cloud, zone string) string {
	if cloud == "gcp" {
		if i := strings.LastIndexByte(zone, '-'); i > 0 {
			return zone[:i]
		}
		return zone
	}
	return strings.TrimRight(zone, "abcdefghijklmnopqrstuvwxyz")
}

// cloudOfRegion names the cloud whose region names look like region ("" when neither does).
func cloudOfRegion(region string) string {
	switch {
	case awsRegionRE.MatchString(region):
		return "aws"
	case gcpRegionRE.MatchString(region):
		return "gcp"
	}
	return ""
}

// cloudOfZone names the cloud whose zone names look like zone, and the zone's region.
func cloudOfZone(zone string) (cloud, region string) {
	for _, cl := range []string{"aws", "gcp"} {
		if r := regionOfZone(cl, zone); r != zone && cloudOfRegion(r) == cl {
			return cl, r
		}
	}
	return "", ""
}

// parseInfra validates an infra string and returns its canonical form (cloud lower-cased,
// k8s spelled kubernetes, SkyPilot's * wildcards resolved: aws/* is aws, gcp/*/us-central1-a is
// gcp/us-central1/us-central1-a, */us-east-1 is aws/us-east-1), or a problem to report. A
// cloud SkyPilot knows and Ferry lacks comes back as it is written (lackingCloud says so).
func parseInfra(s string) (canon, problem string) {
	const shape = "use local, kubernetes[/CONTEXT], aws[/REGION[/ZONE]], gcp[/REGION[/ZONE]] or *"
	s = strings.Trim(strings.TrimSpace(s), "/")
	cloud, rest, hasRest := strings.Cut(s, "/")
	switch lc := strings.ToLower(strings.TrimSpace(cloud)); lc {
	case "*":
		return parseWildcardInfra(s, rest, hasRest)
	case InfraLocal:
		if hasRest {
			return "", fmt.Sprintf("%s: local takes no region or zone", quoteShort(s))
		}
		return InfraLocal, ""
	case "kubernetes", "k8s":
		if !hasRest || rest == "*" {
			return "kubernetes", ""
		}
		if strings.TrimSpace(rest) == "" || strings.ContainsFunc(rest, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return "", fmt.Sprintf("%s: expected kubernetes/CONTEXT with a context name after the /", quoteShort(s))
		}
		return "kubernetes/" + rest, ""
	case "aws", "gcp":
		return parseCloudInfra(s, lc, rest, hasRest)
	case "":
		return "", "empty infra: " + shape
	default:
		if slices.Contains(skypilotOnlyClouds, lc) {
			if hasRest {
				return lc + "/" + rest, ""
			}
			return lc, ""
		}
		return "", fmt.Sprintf("unknown infra %s%s", quoteShort(cloud), suggest(lc, infraClouds, "infra"))
	}
}

// parseCloudInfra reads aws or gcp's REGION[/ZONE], where * is any region or zone.
func parseCloudInfra(s, cloud, rest string, hasRest bool) (canon, problem string) {
	if !hasRest {
		return cloud, ""
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 2 {
		return "", fmt.Sprintf("%s: expected %s[/REGION[/ZONE]]", quoteShort(s), cloud)
	}
	for len(parts) > 0 && parts[len(parts)-1] == "*" {
		parts = parts[:len(parts)-1]
	}
	if len(parts) == 2 && parts[0] == "*" {
		parts[0] = regionOfZone(cloud, parts[1]) // SkyPilot infers the region from the zone
	}
	for _, p := range parts {
		if !regionRE.MatchString(p) {
			return "", fmt.Sprintf("%s: %s is not a region or zone name (lowercase letters, digits and -)", quoteShort(s), quoteShort(p))
		}
	}
	if len(parts) == 2 && !strings.HasPrefix(parts[1], parts[0]) {
		return "", fmt.Sprintf("%s: zone %s is not in region %s", quoteShort(s), quoteShort(parts[1]), quoteShort(parts[0]))
	}
	if len(parts) == 0 {
		return cloud, ""
	}
	return cloud + "/" + strings.Join(parts, "/"), ""
}

// parseWildcardInfra reads */REGION[/ZONE]: any cloud with that region, which for Ferry's
// clouds is the one whose region names look like it (SkyPilot skips clouds that are not
// enabled, and Ferry's other infras have no regions).
func parseWildcardInfra(s, rest string, hasRest bool) (canon, problem string) {
	if !hasRest {
		return "*", ""
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 2 {
		return "", fmt.Sprintf("%s: expected */REGION[/ZONE]", quoteShort(s))
	}
	for len(parts) > 0 && parts[len(parts)-1] == "*" {
		parts = parts[:len(parts)-1]
	}
	switch {
	case len(parts) == 0:
		return "*", ""
	case len(parts) == 2 && parts[0] == "*":
		cloud, region := cloudOfZone(parts[1])
		if cloud == "" {
			return "", fmt.Sprintf("%s: no cloud Ferry launches on has a zone named %s (AWS zones look like us-east-1a, GCP's like us-central1-a)", quoteShort(s), quoteShort(parts[1]))
		}
		return parseCloudInfra(s, cloud, region+"/"+parts[1], true)
	}
	cloud := cloudOfRegion(parts[0])
	if cloud == "" {
		return "", fmt.Sprintf("%s: no cloud Ferry launches on has a region named %s (AWS regions look like us-east-1, GCP's like us-central1)", quoteShort(s), quoteShort(parts[0]))
	}
	return parseCloudInfra(s, cloud, strings.Join(parts, "/"), true)
}

// lackingCloud is the cloud of a canonical infra when it is one SkyPilot launches on and Ferry
// does not, else "".
func lackingCloud(infra string) string {
	cloud, _, _ := strings.Cut(infra, "/")
	if slices.Contains(skypilotOnlyClouds, cloud) {
		return cloud
	}
	return ""
}

// fillLocation derives Cloud/Region/Zone from the canonical Infra, so callers may read either
// spelling. ("*" and "" leave them empty.)
func fillLocation(r *Resources) {
	r.Cloud, r.Region, r.Zone = "", "", ""
	if r.Infra == "" || r.Infra == "*" {
		return
	}
	cloud, rest, _ := strings.Cut(r.Infra, "/")
	r.Cloud = cloud
	if cloud == "kubernetes" {
		r.Region = rest // the context
		return
	}
	r.Region, r.Zone, _ = strings.Cut(rest, "/")
}

// cloudOf is the cloud of a resources block's location ("" when none, or anywhere), the one
// its any_of and ordered alternatives inherit.
func cloudOf(s resourceSpec) string {
	if s.given["location"] == nil || s.r.Infra == "*" {
		return ""
	}
	cloud, _, _ := strings.Cut(s.r.Infra, "/")
	return cloud
}

// dropLacking removes the alternatives that would run on a cloud Ferry does not launch on
// (their own, or the one they inherit from the top), with a note for each: SkyPilot skips a
// cloud that is not enabled, and a file with other alternatives still plans. It returns nil,
// with an error, when none is left.
func (c *checker) dropLacking(top resourceSpec, alts []resourceSpec, field string, listNode *yaml.Node) []resourceSpec {
	if len(alts) == 0 {
		return alts
	}
	kept := make([]resourceSpec, 0, len(alts))
	var dropped []string
	for i, alt := range alts {
		infra := top.r.Infra
		if alt.given["location"] != nil {
			infra = alt.r.Infra
		}
		cloud := lackingCloud(infra)
		if cloud == "" {
			kept = append(kept, alt)
			continue
		}
		dropped = append(dropped, cloud)
		at := alt.given["location"]
		if at == nil {
			at = alt.node
		}
		c.notef(at, indexField(field, i), "dropped from the plan: Ferry does not launch on %s (it launches on local, kubernetes, aws and gcp); SkyPilot skips a cloud that is not enabled", cloud)
	}
	if len(kept) == 0 {
		c.errorf(listNode, field, "every alternative runs on a cloud Ferry does not launch on (%s): add one on local, kubernetes, aws or gcp", strings.Join(slices.Compact(slices.Sorted(slices.Values(dropped))), ", "))
		return nil
	}
	return kept
}

// checkLackingTop refuses a top-level location on a cloud Ferry does not launch on when no
// alternative gives another place; with alternatives (each with its own location, the others
// were dropped) the top's location is no one's, and is cleared.
func (c *checker) checkLackingTop(top *resourceSpec, f map[string]entry) {
	cloud := lackingCloud(top.r.Infra)
	if cloud == "" {
		return
	}
	_, hasAnyOf := f["any_of"]
	_, hasOrdered := f["ordered"]
	if !hasAnyOf && !hasOrdered {
		field := "resources.infra"
		if _, ok := f["infra"]; !ok {
			field = "resources.cloud"
		}
		c.errorf(top.given["location"], field, "Ferry does not launch on %s: it launches on local, kubernetes, aws and gcp (leave infra out to plan on every enabled one)", cloud)
	}
	top.r.Infra = ""
	delete(top.given, "location")
}
