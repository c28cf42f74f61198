package infra

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/home"
)

// A task without infra reaches local only for what the machine has: the config's local GPUs,
// and this machine's CPUs.
func TestPlanLocalCapacity(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	h := home.Home{Dir: t.TempDir()}
	if err := os.WriteFile(ConfigPath(h), []byte("local:\n  accelerators: {L4: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := context.Background()
	l4 := configs.Resources{Accelerators: []configs.Accelerator{{Name: "L4", Count: 1}}}
	if cands, err := s.Plan(ctx, l4); err != nil || cands[0].Placement.Infra != configs.InfraLocal {
		t.Errorf("L4:1 with a declared local L4: %v, %v", cands, err)
	}
	t4 := configs.Resources{Accelerators: []configs.Accelerator{{Name: "T4", Count: 1}}}
	if cands, err := s.Plan(ctx, t4); err == nil {
		t.Errorf("T4:1 planned on %v: local declares no T4 and nothing else is enabled", cands)
	}
	huge := configs.Resources{CPUs: "100000"}
	if cands, err := s.Plan(ctx, huge); err == nil {
		t.Errorf("cpus=100000 planned on %v: more than this machine has", cands)
	}
	mem := memTotalGiB()
	if _, err := os.Stat("/proc/meminfo"); err == nil && mem <= 0 {
		t.Errorf("memTotalGiB = %v with /proc/meminfo present", mem)
	}
}
