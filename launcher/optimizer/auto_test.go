package optimizer

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// infrasOf lists the infra of each candidate, in order, without repeats.
func infrasOf(cands []Candidate) []string {
	var out []string
	for _, c := range cands {
		if len(out) == 0 || out[len(out)-1] != c.Placement.Infra {
			out = append(out, c.Placement.Infra)
		}
	}
	return out
}

// A task without infra is planned over every enabled infra (issue 25): local is a candidate
// only for what the machine has, and own capacity (local, then Kubernetes) ranks before the
// priced clouds.
func TestPlanWithoutInfra(t *testing.T) {
	small := Infra{Name: "local", Kind: Local, Offerings: LocalOfferings(2, 7.5, nil)}
	withL4 := Infra{Name: "local", Kind: Local, Offerings: LocalOfferings(16, 64, accs(t, "L4:1"))}
	tests := map[string]struct {
		r          configs.Resources
		infras     []Infra
		onlyClouds bool
		wantFirst  launcher.Placement
	}{
		"T4 skips a local without GPUs": {
			r:          configs.Resources{Accelerators: accs(t, "T4:1")},
			infras:     []Infra{lab, cpuOnlyCluster, aws, gcp, small},
			onlyClouds: true,
		},
		"A100 goes to the cluster first": {
			r:         configs.Resources{Accelerators: accs(t, "A100:1")},
			infras:    []Infra{aws, gcp, lab, small},
			wantFirst: launcher.Placement{Infra: "kubernetes/lab", Accelerator: "A100", AcceleratorCount: 1},
		},
		"CPU task fits local": {
			r:         configs.Resources{CPUs: "2"},
			infras:    []Infra{aws, cpuOnlyCluster, small},
			wantFirst: launcher.Placement{Infra: "local", VCPUs: 2},
		},
		"CPU task too big for local goes to the cluster": {
			r:         configs.Resources{CPUs: "4+"},
			infras:    []Infra{aws, cpuOnlyCluster, small},
			wantFirst: launcher.Placement{Infra: "kubernetes/cpu", VCPUs: 4},
		},
		"declared local GPU": {
			r:         configs.Resources{Accelerators: accs(t, "H100:1", "l4:0.5")},
			infras:    []Infra{aws, withL4},
			wantFirst: launcher.Placement{Infra: "local", Accelerator: "L4", AcceleratorCount: 0.5},
		},
		"infra local still runs anything": {
			r:         configs.Resources{Infra: "local", Accelerators: accs(t, "T4:1")},
			infras:    []Infra{aws, small},
			wantFirst: launcher.Placement{Infra: "local", Accelerator: "T4", AcceleratorCount: 1},
		},
		// c6i.large is the cheapest 2-vCPU type (0.085/h in us-east-1, Karpenter's table).
		"cpus 2 on aws": {
			r:         configs.Resources{Infra: "aws", CPUs: "2"},
			infras:    []Infra{aws, small},
			wantFirst: launcher.Placement{Infra: "aws", Region: "us-east-1", InstanceType: "c6i.large", VCPUs: 2, MemoryGiB: 4, PricePerHour: 0.085},
		},
		"region-priced row keeps the zone asked for": {
			r:      configs.Resources{Infra: "aws/us-east-1/us-east-1b", CPUs: "2", Memory: "8"},
			infras: []Infra{{Name: "aws", Kind: Cloud, ZoneNames: map[string]string{"use1-az1": "us-east-1b"}}},
			wantFirst: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "us-east-1b", InstanceType: "m6i.large",
				VCPUs: 2, MemoryGiB: 8, PricePerHour: 0.096},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cands, err := Plan(tc.r, tc.infras)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if tc.onlyClouds {
				for _, c := range cands {
					if c.Placement.Infra == "local" || c.Placement.PricePerHour <= 0 {
						t.Errorf("candidate %+v: want only priced clouds", c.Placement)
					}
				}
				return
			}
			if diff := cmp.Diff(tc.wantFirst, cands[0].Placement); diff != "" {
				t.Errorf("first candidate (-want +got):\n%s\nall: %v", diff, infrasOf(cands))
			}
		})
	}
}

// Own capacity first: local and Kubernetes rank before clouds whatever a context's configured
// cost, which orders contexts among themselves.
func TestPlanOwnCapacityFirst(t *testing.T) {
	pricey := Infra{Name: "kubernetes/pricey", Kind: Kubernetes, CostPerHour: 50, Offerings: []launcher.Offering{{Accelerator: "T4", AcceleratorCount: 4}}}
	cheap := Infra{Name: "kubernetes/cheap", Kind: Kubernetes, CostPerHour: 0.1, Offerings: []launcher.Offering{{Accelerator: "T4", AcceleratorCount: 1}}}
	cands, err := Plan(configs.Resources{Accelerators: accs(t, "T4:1")}, []Infra{aws, pricey, cheap, local})
	if err != nil {
		t.Fatal(err)
	}
	got := infrasOf(cands)
	if diff := cmp.Diff([]string{"kubernetes/cheap", "kubernetes/pricey", "aws"}, got); diff != "" {
		t.Errorf("infra order (-want +got):\n%s", diff)
	}
}

func TestPlanInstanceType(t *testing.T) {
	cands, err := Plan(configs.Resources{InstanceType: "g5.xlarge"}, everything)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cands {
		p := c.Placement
		if p.InstanceType != "g5.xlarge" || p.Accelerator != "A10G" || p.AcceleratorCount != 1 || p.VCPUs != 4 {
			t.Errorf("candidate %+v: want g5.xlarge with its A10G:1 and 4 vCPUs", p)
		}
	}
	if len(cands) < 10 {
		t.Errorf("%d candidates: want g5.xlarge in each AZ that has it", len(cands))
	}
	// The type's accelerator among alternatives is consistent, and case does not matter.
	if _, err := Plan(configs.Resources{InstanceType: "g5.xlarge", Accelerators: accs(t, "L4:1", "a10g:1")}, everything); err != nil {
		t.Errorf("g5.xlarge with A10G among accelerators: %v", err)
	}
	// A CPU type pins the cloud: the cluster and local are no candidates.
	cpu, err := Plan(configs.Resources{InstanceType: "m7i.large"}, everything)
	if err != nil || len(cpu) != 1 || cpu[0].Placement.Infra != "aws" || cpu[0].Placement.PricePerHour != 0.1008 {
		t.Errorf("m7i.large: %v, %+v", err, cpu)
	}
}

func TestPlanInstanceTypeErrors(t *testing.T) {
	tests := map[string]struct {
		r       configs.Resources
		wantErr string
	}{
		"unknown, with close matches": {
			r:       configs.Resources{InstanceType: "g5.xlarg"},
			wantErr: "instance_type g5.xlarge: not in the catalog; did you mean g5.xlarge, g5.2xlarge, g5.4xlarge?",
		},
		"conflicting accelerators": {
			r:       configs.Resources{InstanceType: "g5.xlarge", Accelerators: accs(t, "L4:1")},
			wantErr: "instance_type g5.xlarge: has A10G:1, which conflicts with accelerators L4:1",
		},
		"conflicting count": {
			r:       configs.Resources{InstanceType: "g5.xlarge", Accelerators: accs(t, "A10G:4")},
			wantErr: "has A10G:1, which conflicts with accelerators A10G:4",
		},
		"accelerators on a CPU type": {
			r:       configs.Resources{InstanceType: "c7i.large", Accelerators: accs(t, "T4:1")},
			wantErr: "has no accelerators, which conflicts with accelerators T4:1",
		},
		"conflicting cpus": {
			r:       configs.Resources{InstanceType: "m7i.large", CPUs: "4"},
			wantErr: "instance_type m7i.large: has 2 vCPUs, which conflicts with cpus 4",
		},
		"on kubernetes": {
			r:       configs.Resources{Infra: "kubernetes", InstanceType: "m7i.large"},
			wantErr: "an instance type is a cloud's, and infra is kubernetes",
		},
		"wrong cloud": {
			r:       configs.Resources{Infra: "gcp", InstanceType: "m7i.large"},
			wantErr: "instance_type m7i.large: is a aws instance type, and infra is gcp",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Plan(tc.r, everything)
			if !errors.Is(err, launcher.ErrInvalid) {
				t.Fatalf("Plan error %v: want launcher.ErrInvalid", err)
			}
			want := strings.Replace(tc.wantErr, "instance_type g5.xlarge: not", "instance_type g5.xlarg: not", 1)
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q\nwant it to contain %q", err, want)
			}
		})
	}
}
