package optimizer

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// accs parses "A100:1"-style strings.
func accs(t testing.TB, specs ...string) []configs.Accelerator {
	t.Helper()
	out := make([]configs.Accelerator, len(specs))
	for i, s := range specs {
		a, err := configs.ParseAccelerator(s)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = a
	}
	return out
}

var (
	aws   = Infra{Name: "aws", Kind: Cloud}
	gcp   = Infra{Name: "gcp", Kind: Cloud}
	local = Infra{Name: "local", Kind: Local}
	// lab is a cluster with 8×A100 nodes, as the Kubernetes provider reports it (a CPU-only
	// entry first).
	lab = Infra{Name: "kubernetes/lab", Kind: Kubernetes, Offerings: []launcher.Offering{
		{VCPUs: 96, MemoryGiB: 1024, Total: -1, Free: -1},
		{Accelerator: "A100", AcceleratorCount: 8, VCPUs: 96, MemoryGiB: 1024, Total: 16, Free: 10},
	}}
	// cpuOnlyCluster has no GPUs at all.
	cpuOnlyCluster = Infra{Name: "kubernetes/cpu", Kind: Kubernetes, Offerings: []launcher.Offering{
		{VCPUs: 32, MemoryGiB: 128, Total: -1, Free: -1},
	}}
	everything = []Infra{lab, cpuOnlyCluster, aws, gcp, local}
)

// first is the leading candidate, or fails the test.
func first(t *testing.T, r configs.Resources, infras []Infra) Candidate {
	t.Helper()
	cands, err := Plan(r, infras)
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	return cands[0]
}

func TestPlanPicksCheapest(t *testing.T) {
	tests := map[string]struct {
		r      configs.Resources
		infras []Infra
		want   Candidate
	}{
		// A10G:1 spot is cheapest in one AZ: g5.xlarge in usw2-az2 at 0.357 (us-east-2's
		// cheapest, use2-az1, is 0.36).
		"cheapest spot zone wins": {
			r:      configs.Resources{Infra: "aws", UseSpot: true, Accelerators: accs(t, "A10G:1")},
			infras: []Infra{aws},
			want: Candidate{Placement: launcher.Placement{Infra: "aws", Region: "us-west-2", Zone: "usw2-az2",
				InstanceType: "g5.xlarge", Accelerator: "A10G", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 16,
				Spot: true, PricePerHour: 0.357}},
		},
		// g2-standard-4 costs 0.70452 in both us-east4-a and us-east4-c: the zone name breaks the tie.
		"price tie broken by zone": {
			r:      configs.Resources{Infra: "gcp", Accelerators: accs(t, "L4:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "us-east4", Zone: "us-east4-a",
				InstanceType: "g2-standard-4", Accelerator: "L4", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 16,
				PricePerHour: 0.70452}},
		},
		// Composed n1 VM: n1-standard-4 (0.19) + 1×T4 (0.35) in us-central1-a.
		"gcp n1 with an attached T4": {
			r:      configs.Resources{Infra: "gcp", Accelerators: accs(t, "T4:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a",
				InstanceType: "n1-standard-4", Accelerator: "T4", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 15,
				PricePerHour: 0.54}},
		},
		// AWS g4dn.xlarge on-demand (0.526) beats GCP's cheapest T4 VM (0.54).
		"clouds compete on price": {
			r:      configs.Resources{Infra: "*", Accelerators: accs(t, "T4:1")},
			infras: []Infra{aws, gcp},
			want: Candidate{Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1",
				InstanceType: "g4dn.xlarge", Accelerator: "T4", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 16,
				PricePerHour: 0.526}},
		},
		"accelerator name ignores case": {
			r:      configs.Resources{Infra: "gcp", UseSpot: true, Accelerators: accs(t, "a100:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a",
				InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1, VCPUs: 12, MemoryGiB: 85,
				Spot: true, PricePerHour: 1.44296}},
		},
		// A100:1 costs 3.67 on-demand in us-central1 and 2.43 in europe-west4 (catalog problem 4).
		"region filter": {
			r:      configs.Resources{Infra: "gcp/us-central1", Accelerators: accs(t, "A100:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a",
				InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1, VCPUs: 12, MemoryGiB: 85,
				PricePerHour: 3.67339}},
		},
		"zone filter": {
			r:      configs.Resources{Infra: "gcp/us-central1/us-central1-c", Accelerators: accs(t, "A100:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-c",
				InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1, VCPUs: 12, MemoryGiB: 85,
				PricePerHour: 3.67339}},
		},
		"legacy cloud/region fields": {
			r:      configs.Resources{Cloud: "gcp", Region: "europe-west4", Accelerators: accs(t, "A100:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "europe-west4", Zone: "europe-west4-a",
				InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1, VCPUs: 12, MemoryGiB: 85,
				PricePerHour: 2.42771}},
		},
		// g5.xlarge (4 vCPUs, 1.006) is cheaper but has too few vCPUs.
		"cpus at least": {
			r:      configs.Resources{Infra: "aws", CPUs: "8+", Accelerators: accs(t, "A10G:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1",
				InstanceType: "g5.2xlarge", Accelerator: "A10G", AcceleratorCount: 1, VCPUs: 8, MemoryGiB: 32,
				PricePerHour: 1.212}},
		},
		"cpus exactly": {
			r:      configs.Resources{Infra: "aws", CPUs: "16", Memory: "64+", Accelerators: accs(t, "A10G:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1",
				InstanceType: "g5.4xlarge", Accelerator: "A10G", AcceleratorCount: 1, VCPUs: 16, MemoryGiB: 64,
				PricePerHour: 1.624}},
		},
		// L4 (0.70452 at best) is cheaper than A100 (2.42771 at best) on GCP.
		"accelerator alternatives": {
			r:      configs.Resources{Infra: "gcp", Accelerators: accs(t, "A100:1", "L4:1")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "us-east4", Zone: "us-east4-a",
				InstanceType: "g2-standard-4", Accelerator: "L4", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 16,
				PricePerHour: 0.70452}},
		},
		// The cheapest A10G on AWS (1.006) beats any A100 on GCP: any_of is one price contest.
		"any_of picks the cheapest alternative": {
			r: configs.Resources{AnyOf: []configs.Resources{
				{Infra: "gcp", Accelerators: accs(t, "A100:1")},
				{Infra: "aws", Accelerators: accs(t, "A10G:1")},
			}},
			infras: everything,
			want: Candidate{Alternative: 1, Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1",
				InstanceType: "g5.xlarge", Accelerator: "A10G", AcceleratorCount: 1, VCPUs: 4, MemoryGiB: 16,
				PricePerHour: 1.006}},
		},
		"ordered keeps the written order": {
			r: configs.Resources{Ordered: []configs.Resources{
				{Infra: "gcp", Accelerators: accs(t, "A100:1")},
				{Infra: "aws", Accelerators: accs(t, "A10G:1")},
			}},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "gcp", Region: "europe-west4", Zone: "europe-west4-a",
				InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1, VCPUs: 12, MemoryGiB: 85,
				PricePerHour: 2.42771}},
		},
		"kubernetes first at cost 0": {
			r:      configs.Resources{Infra: "*", UseSpot: true, Accelerators: accs(t, "A100:1")},
			infras: everything,
			want:   Candidate{Placement: launcher.Placement{Infra: "kubernetes/lab", Accelerator: "A100", AcceleratorCount: 1}},
		},
		"kubernetes cpus and memory are the pod's request": {
			r:      configs.Resources{Infra: "kubernetes/lab", CPUs: "200+", Memory: "8", Accelerators: accs(t, "A100:8")},
			infras: everything,
			want: Candidate{Placement: launcher.Placement{Infra: "kubernetes/lab", Accelerator: "A100", AcceleratorCount: 8,
				VCPUs: 200, MemoryGiB: 8}},
		},
		"a fraction of a GPU runs on local only (nvidia.com/gpu is whole)": {
			r:      configs.Resources{AnyOf: []configs.Resources{{Infra: "*", Accelerators: accs(t, "A100:0.5")}, {Infra: "local", Accelerators: accs(t, "A100:0.5")}}},
			infras: everything,
			want:   Candidate{Alternative: 1, Placement: launcher.Placement{Infra: "local", Accelerator: "A100", AcceleratorCount: 0.5}},
		},
		"local runs anything at no cost": {
			r:      configs.Resources{Infra: "local", CPUs: "2", Accelerators: accs(t, "H100:8")},
			infras: everything,
			want:   Candidate{Placement: launcher.Placement{Infra: "local", Accelerator: "H100", AcceleratorCount: 8, VCPUs: 2}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, first(t, tc.r, tc.infras), cmpopts.IgnoreFields(Candidate{}, "Score", "Scored", "Why")); diff != "" {
				t.Errorf("first candidate (-want +got):\n%s", diff)
			}
		})
	}
}

// summary is the part of a candidate list the ordering tests look at.
type summary struct {
	Infra, Zone, InstanceType, Accelerator string
	Alternative                            int
	Price                                  float64
}

func summarise(cands []Candidate) []summary {
	out := make([]summary, len(cands))
	for i, c := range cands {
		p := c.Placement
		out[i] = summary{p.Infra, p.Zone, p.InstanceType, p.Accelerator, c.Alternative, p.PricePerHour}
	}
	return out
}

func TestPlanOrder(t *testing.T) {
	cheapLab := lab
	cheapLab.Name = "kubernetes/zeta"
	pricyLab := lab
	pricyLab.Name = "kubernetes/alpha"
	pricyLab.CostPerHour = 2.5
	tests := map[string]struct {
		r      configs.Resources
		infras []Infra
		want   []summary
	}{
		// Every aws candidate of ordered[0] comes before ordered[1], though us-east4 L4 is cheaper.
		"ordered tries alternatives in turn": {
			r: configs.Resources{Ordered: []configs.Resources{
				{Infra: "aws/us-east-2", UseSpot: true, Accelerators: accs(t, "A10G:1"), CPUs: "48+"},
				{Infra: "gcp/us-east4", UseSpot: true, Accelerators: accs(t, "L4:1"), CPUs: "4"},
			}},
			infras: everything,
			want: []summary{
				{"aws", "use2-az3", "g5.16xlarge", "A10G", 0, 1.1837},
				{"aws", "use2-az2", "g5.16xlarge", "A10G", 0, 1.1966},
				{"aws", "use2-az1", "g5.16xlarge", "A10G", 0, 1.259},
				{"gcp", "us-east4-a", "g2-standard-4", "L4", 1, 0.28181},
				{"gcp", "us-east4-c", "g2-standard-4", "L4", 1, 0.28181},
			},
		},
		// Kubernetes by cost per hour then name, before any cloud; the GPU-less cluster is skipped.
		"kubernetes contexts by cost then name": {
			r:      configs.Resources{Infra: "*", Accelerators: accs(t, "A100:8")},
			infras: []Infra{pricyLab, cpuOnlyCluster, lab, cheapLab, aws},
			want: []summary{
				{"kubernetes/lab", "", "", "A100", 0, 0},
				{"kubernetes/zeta", "", "", "A100", 0, 0},
				{"kubernetes/alpha", "", "", "A100", 0, 2.5},
				// Equal US prices: ordered by region, then zone; eu-west-1 costs more.
				{"aws", "use1-az1", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "use1-az2", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "use1-az6", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "use2-az1", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "use2-az2", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "usw2-az1", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "usw2-az2", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "usw2-az3", "p4d.24xlarge", "A100", 0, 32.7726},
				{"aws", "euw1-az2", "p4d.24xlarge", "A100", 0, 35.39655},
			},
		},
		// Only the p4de AZs that have a spot price are candidates (the others have none).
		"spot drops rows without a spot price": {
			r:      configs.Resources{Infra: "aws", UseSpot: true, Accelerators: accs(t, "A100-80GB:8")},
			infras: everything,
			want: []summary{
				{"aws", "use1-az6", "p4de.24xlarge", "A100-80GB", 0, 5.8394},
				{"aws", "usw2-az3", "p4de.24xlarge", "A100-80GB", 0, 6.8849},
				{"aws", "usw2-az1", "p4de.24xlarge", "A100-80GB", 0, 7.107},
				{"aws", "usw2-az2", "p4de.24xlarge", "A100-80GB", 0, 7.2328},
				{"aws", "use1-az4", "p4de.24xlarge", "A100-80GB", 0, 7.8074},
			},
		},
		// p5e.48xlarge has no on-demand price: only p5en is an on-demand H200 candidate.
		"on-demand drops rows without an on-demand price": {
			r:      configs.Resources{Infra: "aws/us-east-2", Accelerators: accs(t, "H200:8")},
			infras: everything,
			want: []summary{
				{"aws", "use2-az1", "p5en.48xlarge", "H200", 0, 84.8},
				{"aws", "use2-az2", "p5en.48xlarge", "H200", 0, 84.8},
				{"aws", "use2-az3", "p5en.48xlarge", "H200", 0, 84.8},
			},
		},
		"spot includes rows with only a spot price": {
			r:      configs.Resources{Infra: "aws/us-east-2", UseSpot: true, Accelerators: accs(t, "H200:8")},
			infras: everything,
			want: []summary{
				{"aws", "use2-az3", "p5e.48xlarge", "H200", 0, 14.4663},
				{"aws", "use2-az2", "p5en.48xlarge", "H200", 0, 15.4924},
				{"aws", "use2-az1", "p5e.48xlarge", "H200", 0, 16.3895},
				{"aws", "use2-az1", "p5en.48xlarge", "H200", 0, 17.2194},
				{"aws", "use2-az3", "p5en.48xlarge", "H200", 0, 17.2405},
			},
		},
		// Without the account's AZ mapping a zone name cannot be matched to an AZ ID: one
		// candidate per instance type in the named zone, at the region's highest spot price
		// (g5.xlarge: use2-az1 0.36, az2 0.3733, az3 0.3629).
		"aws zone name without the account's mapping": {
			r:      configs.Resources{Infra: "aws/us-east-2/us-east-2a", UseSpot: true, Accelerators: accs(t, "A10G:1"), CPUs: "8"},
			infras: []Infra{aws},
			want:   []summary{{"aws", "us-east-2a", "g5.2xlarge", "A10G", 0, 0.5204}},
		},
		"aws zone name with the account's mapping": {
			r: configs.Resources{Infra: "aws/us-east-2/us-east-2a", UseSpot: true, Accelerators: accs(t, "A10G:1"), CPUs: "8"},
			infras: []Infra{{Name: "aws", Kind: Cloud, ZoneNames: map[string]string{
				"use2-az1": "us-east-2c", "use2-az2": "us-east-2a", "use2-az3": "us-east-2b",
			}}},
			want: []summary{{"aws", "us-east-2a", "g5.2xlarge", "A10G", 0, 0.4968}},
		},
		// With a mapping, placements carry zone names and AZs the account lacks are dropped.
		"aws mapping renames zones and drops unknown AZs": {
			r: configs.Resources{Infra: "aws/us-east-2", UseSpot: true, Accelerators: accs(t, "A10G:1"), CPUs: "8"},
			infras: []Infra{{Name: "aws", Kind: Cloud, ZoneNames: map[string]string{
				"use2-az1": "us-east-2c", "use2-az3": "us-east-2b",
			}}},
			want: []summary{
				{"aws", "us-east-2b", "g5.2xlarge", "A10G", 0, 0.4932},
				{"aws", "us-east-2c", "g5.2xlarge", "A10G", 0, 0.5204},
			},
		},
		"aws zone given as an AZ ID": {
			r:      configs.Resources{Infra: "aws/us-east-2/use2-az3", UseSpot: true, Accelerators: accs(t, "A10G:1"), CPUs: "8"},
			infras: []Infra{aws},
			want:   []summary{{"aws", "use2-az3", "g5.2xlarge", "A10G", 0, 0.4932}},
		},
		// A request without accelerators fits every cluster and GCP's n1 shapes; local is only
		// used when named.
		"cpu only": {
			r:      configs.Resources{Infra: "*", CPUs: "16", Memory: "60"},
			infras: everything,
			want: []summary{
				{"kubernetes/cpu", "", "", "", 0, 0},
				{"kubernetes/lab", "", "", "", 0, 0},
				{"gcp", "us-central1-a", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-central1-b", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-central1-c", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-central1-f", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-east1-b", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-east1-c", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-east1-d", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-west1-a", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-west1-b", "n1-standard-16", "", 0, 0.76},
				{"gcp", "us-west1-c", "n1-standard-16", "", 0, 0.76},
				{"gcp", "europe-west4-a", "n1-standard-16", "", 0, 0.83667},
				{"gcp", "europe-west4-b", "n1-standard-16", "", 0, 0.83667},
				{"gcp", "europe-west4-c", "n1-standard-16", "", 0, 0.83667},
				{"gcp", "us-east4-a", "n1-standard-16", "", 0, 0.85594},
				{"gcp", "us-east4-b", "n1-standard-16", "", 0, 0.85594},
				{"gcp", "us-east4-c", "n1-standard-16", "", 0, 0.85594},
				{"gcp", "asia-east1-a", "n1-standard-16", "", 0, 0.87999},
				{"gcp", "asia-east1-b", "n1-standard-16", "", 0, 0.87999},
				{"gcp", "asia-east1-c", "n1-standard-16", "", 0, 0.87999},
			},
		},
		// Overlapping alternatives do not repeat a placement: the second adds nothing new.
		"overlapping alternatives are deduplicated": {
			r: configs.Resources{AnyOf: []configs.Resources{
				{Infra: "gcp/us-east1", Accelerators: accs(t, "A100:1")},
				{Infra: "gcp", Accelerators: accs(t, "A100:1")},
			}},
			infras: everything,
			want: []summary{
				{"gcp", "europe-west4-a", "a2-highgpu-1g", "A100", 1, 2.42771},
				{"gcp", "europe-west4-b", "a2-highgpu-1g", "A100", 1, 2.42771},
				{"gcp", "us-central1-a", "a2-highgpu-1g", "A100", 1, 3.67339},
				{"gcp", "us-central1-b", "a2-highgpu-1g", "A100", 1, 3.67339},
				{"gcp", "us-central1-c", "a2-highgpu-1g", "A100", 1, 3.67339},
				{"gcp", "us-central1-f", "a2-highgpu-1g", "A100", 1, 3.67339},
				{"gcp", "us-east1-b", "a2-highgpu-1g", "A100", 0, 3.67339},
				{"gcp", "us-west1-b", "a2-highgpu-1g", "A100", 1, 3.67339},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cands, err := Plan(tc.r, tc.infras)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if diff := cmp.Diff(tc.want, summarise(cands)); diff != "" {
				t.Errorf("candidates (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanFilters(t *testing.T) {
	tests := map[string]struct {
		r      configs.Resources
		infras []Infra
		check  func(t *testing.T, c Candidate)
	}{
		"star skips local": {
			r: configs.Resources{Infra: "*", Accelerators: accs(t, "L4:1")},
			check: func(t *testing.T, c Candidate) {
				if c.Placement.Infra == "local" {
					t.Error("infra * planned on local")
				}
			},
		},
		"kubernetes without a context means every context": {
			r: configs.Resources{Infra: "kubernetes", Accelerators: accs(t, "A100:1")},
			check: func(t *testing.T, c Candidate) {
				if c.Placement.Infra != "kubernetes/lab" {
					t.Errorf("planned on %s", c.Placement.Infra)
				}
			},
		},
		"spot and region": {
			r: configs.Resources{Infra: "aws/eu-west-1", UseSpot: true, Accelerators: accs(t, "T4:1", "A10G:1")},
			check: func(t *testing.T, c Candidate) {
				if p := c.Placement; p.Region != "eu-west-1" || !p.Spot {
					t.Errorf("placement %+v is not spot in eu-west-1", p)
				}
			},
		},
		"memory exactly": {
			r: configs.Resources{Infra: "gcp", Memory: "52", Accelerators: accs(t, "T4:1", "V100:1", "P100:1")},
			check: func(t *testing.T, c Candidate) {
				if c.Placement.MemoryGiB != 52 {
					t.Errorf("memory %v, want 52", c.Placement.MemoryGiB)
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			infras := tc.infras
			if infras == nil {
				infras = everything
			}
			cands, err := Plan(tc.r, infras)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			for _, c := range cands {
				tc.check(t, c)
			}
		})
	}
}

func TestPlanNoCandidate(t *testing.T) {
	tests := map[string]struct {
		r       configs.Resources
		infras  []Infra
		wantErr string
	}{
		"count not offered": {
			r:       configs.Resources{Infra: "*", Accelerators: accs(t, "A100:3")},
			infras:  []Infra{aws, cpuOnlyCluster},
			wantErr: "no candidate for A100:3: aws has A100 only in counts 8; kubernetes/cpu has no A100",
		},
		"node too small": {
			r:       configs.Resources{Infra: "kubernetes/lab", Accelerators: accs(t, "A100:16")},
			infras:  everything,
			wantErr: "no candidate for A100:16 on kubernetes/lab: kubernetes/lab has A100 only up to 8 per node",
		},
		"fractions only share on kubernetes": {
			r:       configs.Resources{Infra: "gcp", Accelerators: accs(t, "T4:0.5")},
			infras:  everything,
			wantErr: "no candidate for T4:0.5 on gcp: gcp sells whole GPUs only (a fraction or gpu_share such as T4:0.5 runs on local, or on Kubernetes with HAMi)",
		},
		"region without the GPU": {
			r:       configs.Resources{Infra: "aws/eu-west-1", UseSpot: true, Accelerators: accs(t, "H100:8")},
			infras:  everything,
			wantErr: "no candidate for H100:8 on aws/eu-west-1 (spot): aws has H100:8 only in us-east-1, us-east-2, us-west-2",
		},
		"zone without the GPU": {
			r:       configs.Resources{Infra: "gcp/us-central1/us-central1-f", Accelerators: accs(t, "L4:1")},
			infras:  everything,
			wantErr: "no candidate for L4:1 on gcp/us-central1/us-central1-f: gcp has L4:1 in us-central1 only in zones us-central1-a, us-central1-b, us-central1-c",
		},
		// p4de in use1-az1 has no spot price (catalog problem 3).
		"no spot price": {
			r:       configs.Resources{Infra: "aws/us-east-1/use1-az1", UseSpot: true, Accelerators: accs(t, "A100-80GB:8"), Memory: "1152", CPUs: "96"},
			infras:  []Infra{aws},
			wantErr: "no candidate for A100-80GB:8 with cpus=96, memory=1152 on aws/us-east-1/use1-az1 (spot): aws has no spot price for A100-80GB:8 in us-east-1/use1-az1 (p4de.24xlarge)",
		},
		"zone the account lacks": {
			r:       configs.Resources{Infra: "aws/us-east-1", UseSpot: true, Accelerators: accs(t, "A100-80GB:8")},
			infras:  []Infra{{Name: "aws", Kind: Cloud, ZoneNames: map[string]string{"use2-az1": "us-east-2a"}}},
			wantErr: "no candidate for A100-80GB:8 on aws/us-east-1 (spot): aws has A100-80GB:8 only in AZs this account lacks (use1-az1, use1-az2, use1-az3, use1-az4, use1-az5, use1-az6)",
		},
		"too few vCPUs": {
			r:       configs.Resources{Infra: "gcp", Accelerators: accs(t, "L4:1"), CPUs: "64+"},
			infras:  everything,
			wantErr: "no candidate for L4:1 with cpus=64+ on gcp: gcp has L4:1 only with 4, 8, 12, 16, 32 vCPUs, not 64+",
		},
		// The CPU rows are priced only in us-east-1 (Karpenter's table; catalog README).
		"aws CPU-only types outside us-east-1": {
			r:       configs.Resources{Infra: "aws/us-west-2", CPUs: "2"},
			infras:  everything,
			wantErr: "no candidate for cpus=2 on aws/us-west-2: aws has CPU-only instance types only in us-east-1",
		},
		"local without GPUs, no infra named": {
			r:       configs.Resources{Accelerators: accs(t, "T4:1")},
			infras:  []Infra{local},
			wantErr: "no candidate for T4:1: local has no T4 (declare this machine's GPUs under local.accelerators in Ferry's config.yaml, or write infra: local to run there regardless)",
		},
		"local too small, no infra named": {
			r:       configs.Resources{CPUs: "8", Memory: "4+"},
			infras:  []Infra{{Name: "local", Kind: Local, Offerings: LocalOfferings(2, 7.5, accs(t, "L4:1"))}},
			wantErr: "no candidate for cpus=8, memory=4+: local has 2 vCPUs, not 8",
		},
		"local declared fewer GPUs": {
			r:       configs.Resources{Accelerators: accs(t, "L4:2")},
			infras:  []Infra{{Name: "local", Kind: Local, Offerings: LocalOfferings(2, 7.5, accs(t, "L4:1"))}},
			wantErr: "no candidate for L4:2: local has only 1 L4",
		},
		"nothing enabled": {
			r:       configs.Resources{Infra: "*", Accelerators: accs(t, "L4:1")},
			infras:  []Infra{local},
			wantErr: "no candidate for L4:1: no infra other than local is enabled (local runs only when asked for by name)",
		},
		"alternatives each explained": {
			r: configs.Resources{UseSpot: true, Ordered: []configs.Resources{
				{Infra: "kubernetes/prod", UseSpot: true, Accelerators: accs(t, "H100:1")},
				{Infra: "gcp", UseSpot: true, Accelerators: accs(t, "L40S:1", "A10G:1")},
				{Infra: "local"},
			}},
			infras: []Infra{lab, gcp},
			wantErr: "no candidate for any alternative:\n" +
				"  ordered[0] H100:1 on kubernetes/prod (spot): kubernetes/prod is not enabled (enabled: kubernetes/lab)\n" +
				"  ordered[1] L40S:1 or A10G:1 on gcp (spot): gcp has no L40S; gcp has no A10G\n" +
				"  ordered[2] any instance on local: local is not enabled",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cands, err := Plan(tc.r, tc.infras)
			var nc *NoCandidateError
			if !errors.As(err, &nc) {
				t.Fatalf("Plan = %d candidates, %v; want a NoCandidateError", len(cands), err)
			}
			if diff := cmp.Diff(tc.wantErr, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanInvalid(t *testing.T) {
	for name, r := range map[string]configs.Resources{
		"cpus":     {Infra: "*", CPUs: "lots"},
		"memory":   {Infra: "*", Memory: "-4"},
		"infra":    {Infra: "aws/us-east-1/a/b"},
		"local":    {Infra: "local/here"},
		"count":    {Infra: "*", Accelerators: []configs.Accelerator{{Name: "A100", Count: 0}}},
		"context":  {Infra: "kubernetes/"},
		"no cloud": {Infra: "/us-east-1"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Plan(r, everything); !errors.Is(err, launcher.ErrInvalid) {
				t.Errorf("Plan error = %v, want ErrInvalid", err)
			}
		})
	}
}

// TestPlanFromYAML runs the whole path a user takes: YAML through configs into Plan.
func TestPlanFromYAML(t *testing.T) {
	task, err := configs.Parse("service.yaml", []byte(`
resources:
  use_spot: true
  ordered:
    - infra: gcp
      accelerators: L4:1
    - infra: aws
      accelerators: A10G:1
run: vllm serve
service:
  readiness_probe: /health
  replicas: 1
  ports: 8000
`), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	cands, err := Plan(task.Resources, everything)
	if err != nil {
		t.Fatal(err)
	}
	if got := summarise(cands[:1]); !cmp.Equal(got, []summary{{"gcp", "asia-east1-a", "g2-standard-4", "L4", 0, 0.25294}}) {
		t.Errorf("first candidate = %+v", got)
	}
	last := cands[len(cands)-1]
	if last.Alternative != 1 || last.Placement.Infra != "aws" || !last.Placement.Spot {
		t.Errorf("last candidate = %+v, want an aws spot candidate of ordered[1]", last)
	}
}

// TestPlanLiveSpotPrices: a live spot price (DescribeSpotPriceHistory) replaces the catalog's,
// and the order follows it; on-demand plans ignore it.
func TestPlanLiveSpotPrices(t *testing.T) {
	r := configs.Resources{Infra: "aws", UseSpot: true, Accelerators: accs(t, "A10G:1")}
	live := aws
	live.SpotPrices = map[string]map[string]float64{"g5.xlarge": {"use1-az4": 0.2}}
	got := first(t, r, []Infra{live})
	if got.Placement.Zone != "use1-az4" || got.Placement.PricePerHour != 0.2 {
		t.Fatalf("with a live price of 0.2 in use1-az4: first %+v, want use1-az4 at 0.2", got.Placement)
	}
	r.UseSpot = false
	if got := first(t, r, []Infra{live}); got.Placement.PricePerHour == 0.2 {
		t.Fatalf("an on-demand plan used the spot price: %+v", got.Placement)
	}
}

// TestPlanOneGPUAtSeveralCounts: SkyPilot's Mixtral example asks {A100:4, A100:8, ...}; each
// NAME:COUNT is a candidate of its own, on the clouds (an instance type per count) and on a
// cluster whose nodes hold the larger count.
func TestPlanOneGPUAtSeveralCounts(t *testing.T) {
	task, err := configs.Parse("mixtral.yaml", []byte("run: x\nresources:\n  accelerators: {A100:4, A100:8}\n"), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	cands, err := Plan(task.Resources, []Infra{lab, gcp})
	if err != nil {
		t.Fatal(err)
	}
	type shape struct {
		infra, instanceType string
		count               float64
	}
	seen := map[shape]bool{}
	for _, c := range cands {
		seen[shape{c.Placement.Infra, c.Placement.InstanceType, c.Placement.AcceleratorCount}] = true
	}
	for _, want := range []shape{
		{"kubernetes/lab", "", 4}, {"kubernetes/lab", "", 8},
		{"gcp", "a2-highgpu-4g", 4}, {"gcp", "a2-highgpu-8g", 8},
	} {
		if !seen[want] {
			t.Errorf("no candidate %+v among %d: %v", want, len(cands), seen)
		}
	}
	// At equal price (a cluster already paid for) the order written wins: 4 before 8.
	if c := cands[0].Placement; c.Infra != "kubernetes/lab" || c.AcceleratorCount != 4 {
		t.Errorf("first candidate %+v, want 4x A100 on kubernetes/lab", c)
	}
}
