package optimizer

import (
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// TestNetworkTierBest: SkyPilot's network_tier: best puts instance types with high-bandwidth
// networking first (an A100:8 task: AWS's p4d with EFA before GCP's cheaper a2), keeping the
// price order within each part; where nothing has any, the plan is unchanged and says so.
func TestNetworkTierBest(t *testing.T) {
	parse := func(yaml string) configs.Resources {
		task, err := configs.Parse("task.yaml", []byte(yaml), configs.Overrides{})
		if err != nil {
			t.Fatal(err)
		}
		return task.Resources
	}
	standard := parse("run: x\nresources:\n  accelerators: A100:8\n")
	best := parse("run: x\nresources:\n  accelerators: A100:8\n  network_tier: best\n")
	infras := []Infra{aws, gcp, local}
	plain, err := Plan(standard, infras)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := Plan(best, infras)
	if err != nil {
		t.Fatal(err)
	}
	if len(plain) != len(fast) {
		t.Fatalf("best changed the candidates: %d vs %d", len(plain), len(fast))
	}
	if _, ok := catalog.HighBandwidth(plain[0].Placement.Infra, plain[0].Placement.InstanceType); ok {
		t.Fatalf("the standard plan starts with %+v already; the test needs a cheaper type without a fabric first", plain[0].Placement)
	}
	seenStandard := false
	for i := range fast {
		_, hb := highBandwidth(&fast[i])
		if hb && seenStandard {
			t.Fatalf("candidate %d (%s %s) has high-bandwidth networking after one without", i, fast[i].Placement.Infra, fast[i].Placement.InstanceType)
		}
		seenStandard = seenStandard || !hb
		if i > 0 && hb == isHB(&fast[i-1]) && fast[i].Placement.PricePerHour < fast[i-1].Placement.PricePerHour {
			t.Errorf("candidate %d is cheaper than %d in the same part: the price order was lost", i, i-1)
		}
	}
	if p := fast[0].Placement; p.InstanceType != "p4d.24xlarge" && p.InstanceType != "a3-highgpu-8g" && !strings.HasPrefix(p.InstanceType, "p4de") {
		t.Errorf("first with best: %s %s, want an EFA or GPUDirect type", p.Infra, p.InstanceType)
	}
	if note := NetworkNote(best, fast); !strings.Contains(note, "come first") || !strings.Contains(note, "EFA") && !strings.Contains(note, "GPUDirect") {
		t.Errorf("note %q", note)
	}
	if note := NetworkNote(standard, plain); note != "" {
		t.Errorf("a standard tier has a note: %q", note)
	}

	// V100:1 has no type with a fabric: the plan is the standard one, and says the tier does nothing.
	v100, v100best := parse("run: x\nresources:\n  accelerators: V100:1\n"), parse("run: x\nresources:\n  accelerators: V100:1\n  network_tier: best\n")
	a, _ := Plan(v100, infras)
	b, _ := Plan(v100best, infras)
	for i := range a {
		if a[i].Placement != b[i].Placement {
			t.Fatalf("candidate %d differs: %+v vs %+v", i, a[i].Placement, b[i].Placement)
		}
	}
	if note := NetworkNote(v100best, b); !strings.Contains(note, "changes nothing") {
		t.Errorf("note %q", note)
	}
}

func isHB(c *Candidate) bool { _, ok := highBandwidth(c); return ok }
