package infra

import (
	"bufio"
	"cmp"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// localOfferings is what this machine can give a task that names no infra: its CPUs and
// memory, and the GPUs the config's local section declares (none otherwise).
func (s *Set) localOfferings() []launcher.Offering {
	cpus, mem := float64(runtime.NumCPU()), memTotalGiB()
	if cfgCPUs, cfgMem := s.localCapacity(); cfgCPUs > 0 || cfgMem > 0 {
		// What the config declares is what local tasks may hold (launcher/local/capacity.go).
		cpus, mem = cmp.Or(cfgCPUs, cpus), cmp.Or(cfgMem, mem)
	}
	return optimizer.LocalOfferings(cpus, mem, s.localGPUs())
}

// localCapacity is local.cpus and local.memory, 0 where not declared.
func (s *Set) localCapacity() (cpus, memGiB float64) {
	if s.Config == nil || s.Config.Local == nil {
		return 0, 0
	}
	return s.Config.Local.CPUs, s.Config.Local.MemoryGiB
}

func (s *Set) localGPUs() []configs.Accelerator {
	if s.Config == nil || s.Config.Local == nil {
		return nil
	}
	return s.Config.Local.Accelerators
}

// memTotalGiB reads MemTotal from /proc/meminfo; 0 (not checked) where there is none.
func memTotalGiB() float64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kib, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
		if err != nil {
			return 0
		}
		return kib / (1 << 20)
	}
	return 0
}
