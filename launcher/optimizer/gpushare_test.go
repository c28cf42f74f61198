package optimizer

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// hamiLab is a cluster whose A100 nodes run HAMi (the Kubernetes provider sets SharesGPU).
var hamiLab = Infra{Name: "kubernetes/hami", Kind: Kubernetes, Offerings: []launcher.Offering{
	{VCPUs: 32, MemoryGiB: 256, Total: -1, Free: -1},
	{Accelerator: "A100", AcceleratorCount: 1, VCPUs: 32, MemoryGiB: 256, Total: 4, Free: 4, SharesGPU: true},
}}

func TestPlanSharedGPU(t *testing.T) {
	tests := map[string]struct {
		r    configs.Resources
		want []string // candidates' infras, best first
	}{
		"a fraction goes to the sharing context only": {
			r:    configs.Resources{Infra: "kubernetes", Accelerators: accs(t, "A100:0.25")},
			want: []string{"kubernetes/hami"},
		},
		"a memory share of a whole GPU too": {
			r:    configs.Resources{Infra: "*", Accelerators: accs(t, "A100:1"), GPUShare: &configs.GPUShare{MemoryMiB: 3000}},
			want: []string{"kubernetes/hami"},
		},
		"pins alone do not make a shared request": {
			r:    configs.Resources{Infra: "kubernetes", Accelerators: accs(t, "A100:1"), GPUShare: &configs.GPUShare{UseTypes: []string{"A100"}}},
			want: []string{"kubernetes/hami", "kubernetes/lab"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cands, err := Plan(tc.r, []Infra{hamiLab, lab, cpuOnlyCluster, aws, gcp, local})
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			var got []string
			for _, c := range cands {
				got = append(got, c.Placement.Infra)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("candidates (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanSharedGPUNowhere(t *testing.T) {
	_, err := Plan(configs.Resources{Infra: "kubernetes", Accelerators: accs(t, "A100:0.5")}, everything)
	const want = "no candidate for A100:0.5 on kubernetes: kubernetes/lab cannot share A100 GPUs: no A100 node advertises HAMi (the hami.io/node-nvidia-register annotation, or nvidia.com/gpumem and nvidia.com/gpucores allocatable); A100:0.5 runs on local or on a context with HAMi; kubernetes/cpu has no A100"
	if err == nil || len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Fatalf("Plan error = %v\nwant it to start with %s", err, want)
	}
}
