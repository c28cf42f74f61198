package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseGPUShare(t *testing.T) {
	const head = "run: serve\nresources:\n  infra: kubernetes\n"
	tests := map[string]struct {
		yaml      string
		want      *GPUShare
		wantShare SharedGPU
		wantOK    bool
	}{
		"fraction alone": {
			yaml:      head + "  accelerators: A100:0.25\n",
			wantShare: SharedGPU{GPUs: 1, MemoryPercent: 25, Cores: 25}, wantOK: true,
		},
		"fraction rounds up to a whole percent": {
			yaml:      head + "  accelerators: A100:0.333\n",
			wantShare: SharedGPU{GPUs: 1, MemoryPercent: 34, Cores: 34}, wantOK: true,
		},
		"whole gpu, no share": {
			yaml: head + "  accelerators: A100:1\n",
		},
		"memory in MiB and cores": {
			yaml:      head + "  accelerators: A100:1\n  gpu_share: {memory: 3000MiB, cores: 30}\n",
			want:      &GPUShare{MemoryMiB: 3000, Cores: 30},
			wantShare: SharedGPU{GPUs: 1, MemoryMiB: 3000, Cores: 30}, wantOK: true,
		},
		"bare integer memory is MiB": {
			yaml:      head + "  accelerators: L4\n  gpu_share: {memory: 2048}\n",
			want:      &GPUShare{MemoryMiB: 2048},
			wantShare: SharedGPU{GPUs: 1, MemoryMiB: 2048}, wantOK: true,
		},
		"GiB": {
			yaml:      head + "  accelerators: L4\n  gpu_share: {memory: 3GiB}\n",
			want:      &GPUShare{MemoryMiB: 3072},
			wantShare: SharedGPU{GPUs: 1, MemoryMiB: 3072}, wantOK: true,
		},
		"explicit share wins over the fraction": {
			yaml:      head + "  accelerators: A100:0.5\n  gpu_share: {memory: 25%, cores: \"10%\"}\n",
			want:      &GPUShare{MemoryPercent: 25, Cores: 10},
			wantShare: SharedGPU{GPUs: 1, MemoryPercent: 25, Cores: 10}, wantOK: true,
		},
		"two devices, each shared": {
			yaml:      head + "  accelerators: A100:2\n  gpu_share: {memory: 4000}\n",
			want:      &GPUShare{MemoryMiB: 4000},
			wantShare: SharedGPU{GPUs: 2, MemoryMiB: 4000}, wantOK: true,
		},
		"pins and policies only: not a shared request": {
			yaml: head + "  accelerators: A100:1\n  gpu_share:\n    use_gpu_types: A100\n    avoid_gpu_types: [T4, V100]\n" +
				"    use_gpu_uuids: [GPU-0fc3eda5-e98b]\n    node_policy: spread\n    gpu_policy: binpack\n",
			want: &GPUShare{UseTypes: []string{"A100"}, AvoidTypes: []string{"T4", "V100"},
				UseUUIDs: []string{"GPU-0fc3eda5-e98b"}, NodePolicy: PolicySpread, GPUPolicy: PolicyBinpack},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			r := task.Resources
			if diff := cmp.Diff(tc.want, r.GPUShare); diff != "" {
				t.Errorf("GPUShare (-want +got):\n%s", diff)
			}
			share, ok := r.SharedGPU(r.Accelerators[0])
			if ok != tc.wantOK || share != tc.wantShare {
				t.Errorf("SharedGPU = %+v, %v; want %+v, %v", share, ok, tc.wantShare, tc.wantOK)
			}
			if r.SharesGPU() != tc.wantOK {
				t.Errorf("SharesGPU = %v, want %v", r.SharesGPU(), tc.wantOK)
			}
			// ResolvedYAML writes gpu_share back in a spelling that parses to the same thing.
			again, out := reparse(t, task)
			if diff := cmp.Diff(r.GPUShare, again.Resources.GPUShare); diff != "" {
				t.Errorf("round trip (-first +again):\n%s\n%s", diff, out)
			}
		})
	}
}

func TestGPUShareAlternativesInherit(t *testing.T) {
	yaml := "run: serve\nresources:\n  gpu_share: {cores: 50, node_policy: binpack}\n  any_of:\n" +
		"    - {infra: kubernetes, accelerators: A100:0.5}\n" +
		"    - {infra: local, accelerators: L4:1, gpu_share: {memory: 10%}}\n"
	task, err := Parse("task.yaml", []byte(yaml), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	alts := task.Resources.AnyOf
	if diff := cmp.Diff(&GPUShare{Cores: 50, NodePolicy: PolicyBinpack}, alts[0].GPUShare); diff != "" {
		t.Errorf("any_of[0] inherits the top gpu_share (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&GPUShare{MemoryPercent: 10}, alts[1].GPUShare); diff != "" {
		t.Errorf("any_of[1] replaces it (-want +got):\n%s", diff)
	}
	alts[0].GPUShare.UseTypes = append(alts[0].GPUShare.UseTypes, "X")
	if task.Resources.GPUShare.UseTypes != nil {
		t.Error("an alternative shares its gpu_share with the top level")
	}
}

func TestParseGPUShareErrors(t *testing.T) {
	const head = "run: serve\nresources:\n  accelerators: A100:0.5\n"
	tests := map[string]struct {
		yaml string
		want []wantErr
	}{
		"unknown key": {
			yaml: head + "  gpu_share: {memroy: 10%}\n",
			want: []wantErr{{4, 15, "resources.gpu_share.memroy", `did you mean "memory"?`}},
		},
		"memory over 100%": {
			yaml: head + "  gpu_share:\n    memory: 120%\n",
			want: []wantErr{{5, 13, "resources.gpu_share.memory", "at most 100%"}},
		},
		"memory unit": {
			yaml: head + "  gpu_share:\n    memory: 3GB\n",
			want: []wantErr{{5, 13, "resources.gpu_share.memory", `expected GPU memory per device in MiB`}},
		},
		"memory zero": {
			yaml: head + "  gpu_share:\n    memory: 0\n",
			want: []wantErr{{5, 13, "resources.gpu_share.memory", "out of range"}},
		},
		"cores out of range": {
			yaml: head + "  gpu_share:\n    cores: 150\n",
			want: []wantErr{{5, 12, "resources.gpu_share.cores", "1-100, got 150"}},
		},
		"cores not a number": {
			yaml: head + "  gpu_share:\n    cores: [1]\n",
			want: []wantErr{{5, 12, "resources.gpu_share.cores", "expected a percent"}},
		},
		"policy typo": {
			yaml: head + "  gpu_share:\n    node_policy: binpak\n",
			want: []wantErr{{5, 18, "resources.gpu_share.node_policy", `did you mean "binpack"?`}},
		},
		"comma in a type": {
			yaml: head + "  gpu_share:\n    use_gpu_types: [\"A100,T4\"]\n",
			want: []wantErr{{5, 21, "resources.gpu_share.use_gpu_types[0]", "no commas"}},
		},
		"pinned and avoided": {
			yaml: head + "  gpu_share:\n    use_gpu_types: [A100]\n    avoid_gpu_types: [a100]\n",
			want: []wantErr{{6, 22, "resources.gpu_share.avoid_gpu_types", `"A100" is in both use_gpu_types and avoid_gpu_types`}},
		},
		"type listed twice": {
			yaml: head + "  gpu_share:\n    avoid_gpu_types: [T4, t4]\n",
			want: []wantErr{{5, 27, "resources.gpu_share.avoid_gpu_types[1]", "listed twice"}},
		},
		"empty": {
			yaml: head + "  gpu_share: {}\n",
			want: []wantErr{{4, 14, "resources.gpu_share", "empty gpu_share"}},
		},
		"no accelerators": {
			yaml: "run: serve\nresources:\n  cpus: 2\n  gpu_share: {cores: 30}\n",
			want: []wantErr{{4, 14, "resources.gpu_share", "gpu_share needs accelerators"}},
		},
		"alternative without accelerators": {
			yaml: "run: serve\nresources:\n  gpu_share: {cores: 30}\n  any_of:\n    - {accelerators: L4:0.5}\n    - {cpus: 4}\n",
			want: []wantErr{{3, 14, "resources.gpu_share", "gpu_share needs accelerators"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err == nil {
				t.Fatal("Parse succeeded, want errors")
			}
			got := Errors(err)
			if diff := cmp.Diff(tc.want, project(got, tc.want)); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}

func TestFerryConfigGPUSchedulerName(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte("kubernetes:\n  gpu_scheduler_name: hami-scheduler-v2\n"))
	if err != nil || cfg.Kubernetes.GPUSchedulerName != "hami-scheduler-v2" {
		t.Fatalf("got %+v, %v; want gpu_scheduler_name hami-scheduler-v2", cfg.Kubernetes, err)
	}
	_, err = ParseFerryConfig("config.yaml", []byte("kubernetes:\n  gpu_scheduler_name: HAMi Scheduler\n"))
	if got := Errors(err); len(got) != 1 || got[0].Error() != `config.yaml:2:23: kubernetes.gpu_scheduler_name: "HAMi Scheduler" is not a scheduler name (lowercase letters, digits, '-' and '.')` {
		t.Fatalf("errors %v, want the bad name at 2:23", got)
	}
}
