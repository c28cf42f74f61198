// Package optimizer turns a task's resources into an ordered list of places to launch it: the
// launcher tries the first candidate and fails over down the list on capacity or quota errors.
//
// Planning is pure: the enabled infras (with a Kubernetes cluster's offerings already fetched)
// and the embedded price catalog go in, candidates come out, nothing is called.
//
// Rules, in the order they apply:
//   - Alternatives: any_of alternatives compete on price as one group; ordered alternatives are
//     planned one after another, every candidate of ordered[0] before any of ordered[1]. A
//     placement an earlier alternative already produced is not repeated.
//   - Infra: none written is every enabled infra, as in SkyPilot, with local a candidate only
//     for what this machine has (local.go: its CPUs and memory, and the GPUs the ferry config
//     declares; none by default); "*" is every enabled infra except local; "kubernetes" every
//     enabled context; "kubernetes/CTX" that context; "aws[/REGION[/ZONE]]" and
//     "gcp[/REGION[/ZONE]]" that cloud, narrowed to a region and zone; "local" the embedded
//     infra, which then runs anything at $0 (development against simulated replicas, so
//     accelerators, cpus and memory are not checked).
//   - instance_type pins a catalog instance type (instancetype.go): it implies the type's
//     accelerators, vCPUs and memory, conflicting ones are an error, and only its cloud plans.
//   - Accelerators are alternatives: any one of them, with exactly the requested count per
//     instance on a cloud. A fractional count (A100:0.5) shares a GPU, which only
//     local can do; a Kubernetes context fits when one of its offerings carries the GPU with at
//     least the requested count per node. A request without accelerators fits every context and
//     the clouds' CPU-only instance types (GCP n1; AWS c/m/r 6i and 7i in us-east-1).
//   - cpus and memory ("4" exactly, "4+" at least) filter cloud instance types. On Kubernetes
//     they are the pod's request and do not filter.
//   - use_spot prices clouds at spot and drops instance types without a spot price; otherwise
//     the on-demand price is used and rows without one are dropped. Kubernetes is not dropped
//     by use_spot: a cluster already paid for beats any spot VM, and its pods are not
//     preemptible, so their placements say Spot=false.
//   - Order within a group: own capacity first, then priced clouds. Local (when it is a
//     candidate), then Kubernetes contexts (by cost per hour, then name), then cloud instances
//     by price ascending, ties broken by cloud, region, zone, instance type. A context's
//     cost_per_hour orders contexts and shows in the plan, but never sends a task to a cloud
//     while a cluster fits: the cluster is already paid for, and bursting out of it is the
//     product's promise (Kubernetes first, then spot and on-demand VMs).
//   - AWS zones: the catalog has Availability Zone IDs (use1-az4), which are the same physical
//     zone in every account, while YAML zones are account-specific names (us-east-1a). With
//     Infra.ZoneNames (the account's ID → name map from DescribeAvailabilityZones) placements
//     carry zone names, zone filters match them, and AZs the account lacks are dropped. Without
//     it placements carry AZ IDs for the provider to resolve; a zone filter may then be an AZ ID
//     (matched exactly) or a zone name, which cannot be resolved: each instance type in the
//     zone's region becomes one candidate in that named zone, priced at the highest price of the
//     region's AZs so that a plan never understates cost.
package optimizer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// Kind says how an infra is planned for: where its offerings and prices come from.
type Kind int

// Infra kinds.
const (
	// Local is the embedded infra (replicas are processes on this machine).
	Local Kind = iota + 1
	// Kubernetes is one kube context; its offerings come from the cluster.
	Kubernetes
	// Cloud is AWS or GCP; offerings and prices come from the catalog.
	Cloud
)

// String names the kind for messages.
func (k Kind) String() string {
	switch k {
	case Local:
		return "local"
	case Kubernetes:
		return "kubernetes"
	case Cloud:
		return "cloud"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Infra is one enabled place to launch, as the optimizer needs to know it.
type Infra struct {
	// Name is the canonical infra: "local", "kubernetes/CONTEXT", "aws" or "gcp" (a cloud's
	// name is its catalog name).
	Name string
	Kind Kind
	// CostPerHour is what one Kubernetes pod is taken to cost (default 0: a cluster already
	// paid for). When 0, the fitting offering's PricePerHour is used instead, which is where the
	// Kubernetes provider reports its configured cost. Clouds are priced by the catalog.
	CostPerHour float64
	// Offerings are what a Kubernetes cluster's nodes carry (launcher.Offerer).
	Offerings []launcher.Offering
	// ZoneNames maps AWS Availability Zone IDs to this account's zone names (use1-az4 →
	// us-east-1a). Nil when unknown; see the package doc.
	ZoneNames map[string]string
	// SpotPrices, when set, are live spot prices (AWS's DescribeSpotPriceHistory) by instance
	// type, then catalog zone (an AZ ID on AWS): they replace the catalog's spot price where
	// given, so a plan follows the market between catalog refreshes.
	SpotPrices map[string]map[string]float64
}

// Candidate is one place to launch, with the alternative of Resources.Candidates() it satisfies.
type Candidate struct {
	Placement launcher.Placement
	// Wait is how long the task is expected to wait for this capacity (a queue, a reservation
	// window not yet open), and Free how many instances a reservation has left (capacity.go).
	Wait time.Duration
	Free int
	// Alternative indexes Resources.Candidates(): which any_of or ordered entry this is (0 for
	// a resources block without alternatives).
	Alternative int
	// Score is the value the objective ranks by (objective.go): the price per hour under
	// cost_per_hour. Scored is false when the objective cannot value this placement; Why
	// explains the score in a few words.
	Score  float64
	Scored bool
	Why    string
}

// Plan returns where r may run among the enabled infras, best first, priced from the embedded
// catalog. It returns a *NoCandidateError saying why, per alternative and infra, when nothing
// fits, and an error wrapping launcher.ErrInvalid when r itself is malformed.
func Plan(r configs.Resources, infras []Infra) ([]Candidate, error) {
	cat := catalog.Default()
	alts := r.Candidates()
	reqs := make([]request, len(alts))
	for i, alt := range alts {
		req, err := newRequest(i, alt, cat)
		if err != nil {
			return nil, err
		}
		reqs[i] = req
	}

	// Plan every alternative into raw, then emit each group (all of any_of, or one ordered
	// entry at a time) sorted, skipping placements an earlier candidate already has.
	raw := make([]Candidate, 0, capacityHint(reqs, cat, infras))
	bounds := []int{0}
	for i := range reqs {
		start := len(raw)
		raw = reqs[i].plan(raw, cat, infras)
		for j := start; j < len(raw); j++ {
			raw[j].Placement.Nodes = alts[i].NumNodes
			sc := scoreOf(alts[i].Objective, &raw[j])
			raw[j].Score, raw[j].Scored, raw[j].Why = sc.value, sc.ok, sc.why
		}
		if len(r.Ordered) > 0 || i == len(reqs)-1 {
			bounds = append(bounds, len(raw))
		}
	}
	out := make([]Candidate, 0, len(raw))
	var seen map[launcher.Placement]struct{}
	if mayOverlap(reqs, infras) {
		seen = make(map[launcher.Placement]struct{}, len(raw))
	}
	// Sorting indexes, not the wide candidates, is several times faster and keeps the sort
	// stable: equal candidates stay in planning order (accelerators as listed, earlier
	// alternatives first).
	idx := make([]int32, len(raw))
	for g := 1; g < len(bounds); g++ {
		order := idx[bounds[g-1]:bounds[g]]
		for i := range order {
			order[i] = int32(bounds[g-1] + i)
		}
		slices.SortFunc(order, func(a, b int32) int {
			if c := compareCandidates(&raw[a], &raw[b]); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
		for _, i := range order {
			if seen != nil {
				if _, dup := seen[raw[i].Placement]; dup {
					continue
				}
				seen[raw[i].Placement] = struct{}{}
			}
			out = append(out, raw[i])
		}
	}
	if len(out) == 0 {
		return nil, explain(r, alts, reqs, cat, infras)
	}
	preferNetwork(r, out) // network.go
	return out, nil
}

// capacityHint bounds how many candidates the requests can produce, so that planning
// allocates its buffer once.
func capacityHint(reqs []request, cat *catalog.Catalog, infras []Infra) int {
	n := 0
	for i := range reqs {
		req := &reqs[i]
		for j := range infras {
			inf := &infras[j]
			if !req.target.admits(inf) {
				continue
			}
			switch inf.Kind {
			case Local:
				n++
			case Kubernetes:
				n += len(req.wanted())
			case Cloud:
				for _, acc := range req.wanted() {
					n += len(cat.Lookup(inf.Name, acc.Name))
				}
			}
		}
	}
	return n
}

// mayOverlap reports whether two alternatives could produce the same placement: both admit an
// infra and ask for an accelerator of the same name. Only then is the dedupe map worth its
// hashing.
func mayOverlap(reqs []request, infras []Infra) bool {
	for i := range reqs {
		for j := i + 1; j < len(reqs); j++ {
			for k := range infras {
				if !reqs[i].target.admits(&infras[k]) || !reqs[j].target.admits(&infras[k]) {
					continue
				}
				for _, a := range reqs[i].wanted() {
					for _, b := range reqs[j].wanted() {
						if strings.EqualFold(a.Name, b.Name) {
							return true
						}
					}
				}
			}
		}
	}
	return false
}

// request is one alternative, parsed for planning.
type request struct {
	alt    int
	accs   []configs.Accelerator // nil: CPU-only
	cpus   quantity
	memory quantity
	spot   bool
	target target
	// share is the task's gpu_share: with it, or a fractional count, an accelerator is a
	// shared request that only local and sharing Kubernetes contexts take.
	share *configs.GPUShare
	// instanceType pins one catalog instance type (clouds only); "" is any.
	instanceType string
}

// shares reports whether acc is a shared GPU request.
func (req *request) shares(acc configs.Accelerator) bool {
	_, ok := configs.Resources{GPUShare: req.share}.SharedGPU(acc)
	return ok
}

func newRequest(alt int, r configs.Resources, cat *catalog.Catalog) (request, error) {
	req := request{alt: alt, accs: r.Accelerators, spot: r.UseSpot, share: r.GPUShare}
	var err error
	if req.cpus, err = parseQuantity("cpus", r.CPUs); err != nil {
		return request{}, err
	}
	if req.memory, err = parseQuantity("memory", r.Memory); err != nil {
		return request{}, err
	}
	if req.target, err = parseTarget(r); err != nil {
		return request{}, err
	}
	for _, a := range r.Accelerators {
		if !(a.Count > 0) || math.IsInf(a.Count, 0) {
			return request{}, fmt.Errorf("%w: accelerator %s: count must be positive", launcher.ErrInvalid, a.Spec())
		}
	}
	if r.InstanceType != "" {
		if err := req.pinInstanceType(cat, r.InstanceType); err != nil {
			return request{}, err
		}
	}
	return req, nil
}

// cpuOnly stands for "no accelerator" where a request has none.
var cpuOnly = []configs.Accelerator{{}}

// wanted returns the accelerator alternatives, or the one empty accelerator of a CPU-only request.
func (req *request) wanted() []configs.Accelerator {
	if len(req.accs) == 0 {
		return cpuOnly
	}
	return req.accs
}

// plan appends every candidate of this alternative across the infras it may use.
func (req *request) plan(out []Candidate, cat *catalog.Catalog, infras []Infra) []Candidate {
	for i := range infras {
		inf := &infras[i]
		if !req.target.admits(inf) {
			continue
		}
		switch inf.Kind {
		case Local:
			out = req.localCandidates(out, inf)
		case Kubernetes:
			if req.instanceType != "" {
				continue // an instance type is a cloud's
			}
			for _, acc := range req.wanted() {
				if o, ok := fittingOffering(inf, acc, req.shares(acc)); ok {
					out = append(out, req.kubeCandidate(inf, acc, o))
				}
			}
		case Cloud:
			for _, acc := range req.wanted() {
				out = req.cloudCandidates(out, inf, acc, cat.Lookup(inf.Name, acc.Name))
			}
		}
	}
	return out
}

// fittingOffering finds the offering of a Kubernetes infra that can hold acc on one node; a
// shared request needs an offering that shares GPUs.
func fittingOffering(inf *Infra, acc configs.Accelerator, shared bool) (launcher.Offering, bool) {
	for _, o := range inf.Offerings {
		if acc.Name == "" {
			if o.Accelerator == "" {
				return o, true
			}
			continue
		}
		// nvidia.com/gpu is an integer resource: a fraction is HAMi's memory and cores
		// share of one GPU, which only a context that shares GPUs takes.
		if strings.EqualFold(o.Accelerator, acc.Name) && o.AcceleratorCount >= acc.Count && (o.SharesGPU || !shared) {
			return o, true
		}
	}
	if acc.Name == "" {
		// A cluster that reported no CPU-only offering still runs CPU-only pods.
		return launcher.Offering{}, true
	}
	return launcher.Offering{}, false
}

func (req *request) kubeCandidate(inf *Infra, acc configs.Accelerator, o launcher.Offering) Candidate {
	price := inf.CostPerHour
	if price == 0 {
		price = o.PricePerHour
	}
	p := launcher.Placement{
		Infra:        inf.Name,
		VCPUs:        req.cpus.value,
		MemoryGiB:    req.memory.value,
		PricePerHour: price,
	}
	if acc.Name != "" {
		p.Accelerator, p.AcceleratorCount = o.Accelerator, acc.Count
	}
	return Candidate{Placement: p, Alternative: req.alt}
}

// cloudCandidates appends a candidate per catalog row that fits. rows are one cloud's rows for
// one accelerator, ordered by count, instance type, region and zone.
func (req *request) cloudCandidates(out []Candidate, inf *Infra, acc configs.Accelerator, rows []catalog.Row) []Candidate {
	if acc.Count != math.Trunc(acc.Count) || req.shares(acc) {
		return out // clouds sell whole GPUs
	}
	count := int(acc.Count)
	byName := req.target.unresolvedZone(inf)
	start := len(out)
	for i := range rows {
		row := &rows[i]
		if row.AcceleratorCount != count || !req.target.inRegion(row) || (req.instanceType != "" && row.InstanceType != req.instanceType) {
			continue
		}
		zone, ok := req.target.zoneOf(inf, row, byName)
		if !ok {
			continue
		}
		price, ok := row.Price(req.spot)
		if live, known := inf.SpotPrices[row.InstanceType][row.Zone]; req.spot && known && live > 0 {
			price, ok = live, true
		}
		if !ok || !req.cpus.admits(row.VCPUs) || !req.memory.admits(row.MemoryGiB) {
			continue
		}
		if byName && len(out) > start {
			// One candidate per instance type in the named zone, at the region's highest price.
			if last := &out[len(out)-1].Placement; last.InstanceType == row.InstanceType && last.Region == row.Region {
				last.PricePerHour = max(last.PricePerHour, price)
				continue
			}
		}
		out = append(out, Candidate{Alternative: req.alt, Placement: launcher.Placement{
			Infra:            inf.Name,
			Region:           row.Region,
			Zone:             zone,
			InstanceType:     row.InstanceType,
			Accelerator:      row.Accelerator,
			AcceleratorCount: float64(row.AcceleratorCount),
			VCPUs:            row.VCPUs,
			MemoryGiB:        row.MemoryGiB,
			Spot:             req.spot,
			PricePerHour:     price,
		}})
	}
	return out
}

// tier puts local first, then Kubernetes, then clouds.
func tier(p *launcher.Placement) int {
	switch {
	case p.Infra == configs.InfraLocal:
		return 0
	case p.Infra == "kubernetes" || strings.HasPrefix(p.Infra, "kubernetes/"):
		return 1
	}
	return 2
}

// compareCandidates is the order within a group: tier, price, then location and shape (Plan
// breaks remaining ties by planning order).
func compareCandidates(a, b *Candidate) int {
	pa, pb := &a.Placement, &b.Placement
	ta, tb := tier(pa), tier(pb)
	if c := cmp.Compare(ta, tb); c != 0 {
		return c
	}
	if a.Scored != b.Scored {
		if a.Scored {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(a.Score, b.Score); c != 0 {
		return c
	}
	if c := cmp.Compare(pa.PricePerHour, pb.PricePerHour); c != 0 {
		return c
	}
	if c := strings.Compare(pa.Infra, pb.Infra); c != 0 || ta < 2 {
		return c
	}
	if c := strings.Compare(pa.Region, pb.Region); c != 0 {
		return c
	}
	if c := strings.Compare(pa.Zone, pb.Zone); c != 0 {
		return c
	}
	if c := strings.Compare(pa.InstanceType, pb.InstanceType); c != 0 {
		return c
	}
	if c := strings.Compare(pa.Accelerator, pb.Accelerator); c != 0 {
		return c
	}
	return cmp.Compare(pa.AcceleratorCount, pb.AcceleratorCount)
}
