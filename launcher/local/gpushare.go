package local

import (
	"os"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// A task that shares a GPU (a fractional count, or gpu_share memory or cores) sees its share
// the way HAMi's in-container limiter, HAMi-core, reads it, so the same program runs locally
// and in a HAMi pod: CUDA_DEVICE_MEMORY_LIMIT ("3000m", MiB) and CUDA_DEVICE_SM_LIMIT (percent
// of SMs). Nothing enforces them locally unless HAMi-core's libvgpu.so is preloaded; a program
// may read them to size itself (vLLM's --gpu-memory-utilization, a batch size).

// Variables a sharing task sees besides HAMi-core's.
const (
	// EnvGPUMemoryPercent is the memory share when it was given as a percent (or a fraction).
	EnvGPUMemoryPercent = "FERRY_GPU_MEMORY_PERCENT"
	envMemoryLimit      = "CUDA_DEVICE_MEMORY_LIMIT"
	envSMLimit          = "CUDA_DEVICE_SM_LIMIT"
	envVisibleDevices   = "CUDA_VISIBLE_DEVICES"
)

// gpuShareEnv is the environment for spec's GPU share, empty when it shares no GPU. A
// percentage becomes MiB when the catalog knows the GPU's memory. CUDA_VISIBLE_DEVICES is the
// controller's when it has one (baseEnv passes it on), else the first devices.
func gpuShareEnv(spec launcher.Spec) []string {
	acc := configs.Accelerator{Name: spec.Placement.Accelerator, Count: spec.Placement.AcceleratorCount}
	if acc.Name == "" && len(spec.Resources.Accelerators) > 0 {
		acc = spec.Resources.Accelerators[0]
	}
	share, ok := spec.Resources.SharedGPU(acc)
	if !ok {
		return nil
	}
	var env []string
	if _, inherited := os.LookupEnv(envVisibleDevices); !inherited {
		ids := make([]string, share.GPUs)
		for i := range ids {
			ids[i] = strconv.Itoa(i)
		}
		env = append(env, envVisibleDevices+"="+strings.Join(ids, ","))
	}
	mib := share.MemoryMiB
	if share.MemoryPercent > 0 {
		env = append(env, EnvGPUMemoryPercent+"="+strconv.Itoa(share.MemoryPercent))
		if per := gpuMemoryMiB(acc.Name); per > 0 {
			mib = per * share.MemoryPercent / 100
		}
	}
	if mib > 0 {
		env = append(env, envMemoryLimit+"="+strconv.Itoa(mib)+"m")
	}
	if share.Cores > 0 {
		env = append(env, envSMLimit+"="+strconv.Itoa(share.Cores))
	}
	return env
}

// gpuMemoryMiB is one GPU's memory from the catalog (any cloud that sells it), or 0.
func gpuMemoryMiB(name string) int {
	for _, cloud := range []string{"aws", "gcp"} {
		for _, r := range catalog.Default().Lookup(cloud, name) {
			if r.GPUMemoryMiB > 0 && r.AcceleratorCount > 0 {
				return r.GPUMemoryMiB / r.AcceleratorCount
			}
		}
	}
	return 0
}
