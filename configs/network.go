package configs

import (
	"slices"
	"strings"
)

// SkyPilot's resources.network_tier: `best` asks for the fastest networking between nodes
// (EFA on AWS, GPUDirect-TCPX on GCP's A3), `standard` for the default. Ferry's optimizer puts
// the instance types that have such networking first (launcher/catalog's network table); where
// no candidate has any (local, Kubernetes, a GPU type no such instance carries) the plan says
// that the tier changes nothing.

// Network tiers, SkyPilot's names.
const (
	NetworkTierStandard = "standard"
	NetworkTierBest     = "best"
)

// NetworkTiers are SkyPilot's network_tier values.
var NetworkTiers = []string{NetworkTierStandard, NetworkTierBest}

// networkTier reads resources.network_tier into s.
func (c *checker) networkTier(s *resourceSpec, f map[string]entry, field string) {
	e, ok := f["network_tier"]
	if !ok {
		return
	}
	kf := joinField(field, "network_tier")
	v, ok := c.str(e.value, kf)
	if !ok {
		return
	}
	v = strings.ToLower(strings.TrimSpace(v))
	if !slices.Contains(NetworkTiers, v) {
		c.errorf(e.value, kf, "unknown network tier %s%s", quoteShort(v), suggest(v, NetworkTiers, "tiers"))
		return
	}
	s.r.NetworkTier = v
	s.given["network_tier"] = e.value
}
