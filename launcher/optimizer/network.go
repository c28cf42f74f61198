package optimizer

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// resources.network_tier: best puts the placements whose instance type has high-bandwidth
// networking between nodes (catalog.HighBandwidth: EFA on AWS, GPUDirect on GCP's A3) before the
// others, within each group of the plan (all of any_of; each ordered alternative), keeping the
// objective's order within each part. Local processes and Kubernetes pods have none Ferry can
// tell; a plan where no placement has it is unchanged, and NetworkNote says so.

// highBandwidth is the networking of c's placement, if it has a fabric between nodes.
func highBandwidth(c *Candidate) (catalog.Network, bool) {
	return catalog.HighBandwidth(c.Placement.Infra, c.Placement.InstanceType)
}

// preferNetwork reorders a plan for r's network tier.
func preferNetwork(r configs.Resources, cands []Candidate) {
	if r.NetworkTier != configs.NetworkTierBest {
		return
	}
	group := func(c *Candidate) int {
		if len(r.Ordered) > 0 {
			return c.Alternative
		}
		return 0
	}
	standard := func(c *Candidate) int {
		if _, ok := highBandwidth(c); ok {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(group(&a), group(&b)), cmp.Compare(standard(&a), standard(&b)))
	})
}

// NetworkNote is what a plan says of r's network_tier: "" unless it is best; else how many
// placements have high-bandwidth networking and come first, or that none has and the tier
// changes nothing.
func NetworkNote(r configs.Resources, cands []Candidate) string {
	if r.NetworkTier != configs.NetworkTierBest {
		return ""
	}
	n, best := 0, ""
	for i := range cands {
		if nw, ok := highBandwidth(&cands[i]); ok {
			if n == 0 {
				best = fmt.Sprintf("%s %s (%s, %d Gbps)", cands[i].Placement.Infra, cands[i].Placement.InstanceType, nw.Fabric, nw.Gbps)
			}
			n++
		}
	}
	if n == 0 {
		return "network_tier: best changes nothing here: none of these placements has high-bandwidth networking Ferry knows of (EFA on AWS, GPUDirect on GCP's A3); on Kubernetes, ask for RDMA or EFA devices with config.kubernetes.pod_config"
	}
	return fmt.Sprintf("network_tier: best: %d of %d placements have high-bandwidth networking and come first (first: %s); Ferry picks the instance type, the image sets up its fabric (EFA or GPUDirect drivers and NCCL plugins)", n, len(cands), best)
}
