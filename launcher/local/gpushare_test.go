package local

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// TestGPUShareEnvironment: a local replica that shares a GPU sees its share as HAMi-core's
// variables, so the same task runs locally and in a HAMi pod.
func TestGPUShareEnvironment(t *testing.T) {
	vars := []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", EnvGPUMemoryPercent}
	tests := map[string]struct {
		controllerDevices string // "" leaves CUDA_VISIBLE_DEVICES unset in the controller
		resources         configs.Resources
		placement         launcher.Placement
		want              map[string]string
	}{
		"a quarter of an A100 (40960 MiB in the catalog)": {
			resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "A100", Count: 0.25}}},
			placement: launcher.Placement{Infra: "local", Accelerator: "A100", AcceleratorCount: 0.25},
			want: map[string]string{"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_MEMORY_LIMIT": "10240m",
				"CUDA_DEVICE_SM_LIMIT": "25", EnvGPUMemoryPercent: "25"},
		},
		"explicit MiB and cores keep the controller's devices": {
			controllerDevices: "3",
			resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}},
				GPUShare: &configs.GPUShare{MemoryMiB: 3000, Cores: 30}},
			want: map[string]string{"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_MEMORY_LIMIT": "3000m", "CUDA_DEVICE_SM_LIMIT": "30"},
		},
		"a percent of a GPU the catalog does not know": {
			resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "MI300X", Count: 2}},
				GPUShare: &configs.GPUShare{MemoryPercent: 40}},
			want: map[string]string{"CUDA_VISIBLE_DEVICES": "0,1", EnvGPUMemoryPercent: "40"},
		},
		"a whole GPU is not a share": {
			resources: configs.Resources{Accelerators: []configs.Accelerator{{Name: "A100", Count: 1}},
				GPUShare: &configs.GPUShare{UseTypes: []string{"A100"}}},
			want: map[string]string{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("CUDA_VISIBLE_DEVICES", tc.controllerDevices)
			if tc.controllerDevices == "" {
				os.Unsetenv("CUDA_VISIBLE_DEVICES")
			}
			p := newProvider(t, Options{})
			inst, err := p.Launch(context.Background(), launcher.Spec{Name: "share", Run: "env",
				Resources: tc.resources, Placement: tc.placement})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "instance to end", func() bool { return listOne(t, p, nil).State == launcher.StateTerminated })
			got := map[string]string{}
			for _, line := range strings.Split(readFile(t, filepath.Join(p.opts.Dir, inst.ID, logFile)), "\n") {
				if k, v, ok := strings.Cut(line, "="); ok && slices.Contains(vars, k) {
					got[k] = v
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("GPU variables (-want +got):\n%s", diff)
			}
		})
	}
}
