package optimizer

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/catalog"
)

func planAnyOf(t *testing.T, o configs.Objective, alts ...configs.Resources) []Candidate {
	t.Helper()
	for i := range alts {
		alts[i].Objective = o
	}
	cands, err := Plan(configs.Resources{Objective: o, AnyOf: alts}, []Infra{aws, gcp, local})
	if err != nil {
		t.Fatal(err)
	}
	return cands
}

// Per token, an A100 on-demand beats an L4 that is cheaper per hour: the A100 reads weights
// five times as fast for 3.5× the price.
func TestCostPerTokenPrefersThroughput(t *testing.T) {
	alts := func() []configs.Resources {
		return []configs.Resources{
			{Infra: "gcp", Accelerators: accs(t, "L4:1")},
			{Infra: "gcp", Accelerators: accs(t, "A100:1")},
		}
	}
	byHour := planAnyOf(t, configs.Objective{}, alts()...)
	byToken := planAnyOf(t, configs.Objective{Minimize: configs.ObjectiveCostPerToken, Nodes: 1}, alts()...)
	if byHour[0].Placement.Accelerator != "L4" {
		t.Fatalf("by hour: %s wins, want L4 (the premise)", byHour[0].Placement.Accelerator)
	}
	w := byToken[0]
	if w.Placement.Accelerator != "A100" || !w.Scored {
		t.Fatalf("by token: %+v wins, want a scored A100", w)
	}
	// The score is price / tokens per hour, in $/M tokens, at the 8B default.
	a100, _ := catalog.ThroughputOf("A100")
	want := w.Placement.PricePerHour / (a100.HBMGBps / 16 * 3600) * 1e6
	if math.Abs(w.Score-want) > 1e-9 {
		t.Errorf("score %v, want %v", w.Score, want)
	}
	for _, c := range byToken[1:] {
		if c.Score < w.Score {
			t.Errorf("%+v scores below the winner", c)
		}
	}
	// 70B does not fit one L4 or one A100: nothing can be scored, and the plan says why.
	big := planAnyOf(t, configs.Objective{Minimize: configs.ObjectiveCostPerToken, ModelSizeB: 70}, alts()...)
	if big[0].Scored || big[0].Why == "" {
		t.Errorf("70B on one GPU: %+v, want unscored with a reason", big[0])
	}
}

// A spot gang is interrupted whenever any node is: with enough nodes, on-demand wins per step
// even at several times the spot price.
func TestCostPerStepCountsInterruptions(t *testing.T) {
	alts := func() []configs.Resources {
		return []configs.Resources{
			{Infra: "aws/us-east-1", UseSpot: true, Accelerators: accs(t, "V100:1")},
			{Infra: "aws/us-east-1", Accelerators: accs(t, "V100:1")},
		}
	}
	step := configs.Objective{Minimize: configs.ObjectiveCostPerStep}
	step.Nodes = 1
	one := planAnyOf(t, step, alts()...)
	if !one[0].Placement.Spot {
		t.Errorf("1 node: %+v wins, want spot", one[0].Placement)
	}
	step.Nodes = 16
	gang := planAnyOf(t, step, alts()...)
	if gang[0].Placement.Spot {
		t.Errorf("16 nodes: %+v (%s) wins, want on-demand", gang[0].Placement, gang[0].Why)
	}
	rate, _, _, _ := catalog.InterruptionRate("aws", "us-east-1", "V100")
	for _, c := range gang {
		if !c.Placement.Spot {
			continue
		}
		up := math.Max(minUptime, 1-16*rate*(DefaultCheckpointMinutes/2+DefaultRestartMinutes)/60)
		if want := c.Placement.PricePerHour / (125.0 / 312 * up); math.Abs(c.Score-want) > 1e-9 {
			t.Errorf("spot score %v, want %v", c.Score, want)
		}
		break
	}
}

// A placement without throughput figures (A10G) ranks after scored ones, whatever its price.
func TestUnscoredRanksLast(t *testing.T) {
	cands := planAnyOf(t, configs.Objective{Minimize: configs.ObjectiveCostPerToken},
		configs.Resources{Infra: "aws", Accelerators: accs(t, "A10G:1")},
		configs.Resources{Infra: "aws", Accelerators: accs(t, "H100:8")})
	if !cands[0].Scored || cands[0].Placement.Accelerator != "H100" {
		t.Errorf("first %+v: want the scored H100", cands[0])
	}
	if last := cands[len(cands)-1]; last.Scored || last.Placement.Accelerator != "A10G" {
		t.Errorf("last %+v: want an unscored A10G", last)
	}
}

func TestObjectiveTable(t *testing.T) {
	o := configs.Objective{Minimize: configs.ObjectiveCostPerToken, Nodes: 1}
	cands := planAnyOf(t, o,
		configs.Resources{Infra: "gcp", Accelerators: accs(t, "L4:1")},
		configs.Resources{Infra: "gcp", Accelerators: accs(t, "A100:1")})
	var b strings.Builder
	if err := WriteObjectiveTable(&b, cands, 0, 3, o); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"COST_PER_TOKEN ($/M tokens)", "Objective cost_per_token ($/M tokens): chose A100:1 a2-highgpu-1g on gcp at $ ",
		"tok/s at 8B), vs L4:1 g2-standard-4 on gcp at $ "} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var plain strings.Builder
	if err := WriteTable(&plain, cands, 0, 3); err != nil || strings.Contains(plain.String(), "Objective") {
		t.Errorf("cost_per_hour table changed: %v\n%s", err, plain.String())
	}
}

// Gang shapes (an alternative's own num_nodes): eight 1-GPU spot nodes against one 8-GPU
// on-demand node, per step of work. On the public V100 traces of us-east-2 (0.06
// interruptions an hour) the spot gang is cheaper per step; on a fleet's own, more volatile history (FERRY_SPOT_INTERRUPTIONS) its eight nodes
// are interrupted so often that the on-demand node wins. Under cost_per_hour the shapes
// compare by what the whole gang costs.
func TestGangShapesFlipWithVolatility(t *testing.T) {
	task, err := configs.Parse("shapes.yaml", []byte(`name: train
resources:
  infra: aws/us-east-2
  objective: {minimize: cost_per_step}
  any_of:
    - {accelerators: V100:1, use_spot: true, num_nodes: 8}
    - {accelerators: V100:8}
run: train
`), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	best := func() Candidate {
		t.Helper()
		cands, err := Plan(task.Resources, []Infra{aws})
		if err != nil {
			t.Fatal(err)
		}
		return cands[0]
	}
	calm := best()
	if !calm.Placement.Spot || calm.Placement.Nodes != 8 || !strings.Contains(calm.Why, "8 nodes ×") {
		t.Fatalf("on the public traces: %+v (%s), want the 8-node spot gang", calm.Placement, calm.Why)
	}
	volatile := filepath.Join(t.TempDir(), "ours.csv")
	if err := os.WriteFile(volatile, []byte("cloud,region,zone,traced,instance_hours,interruptions,trace\naws,us-east-2,us-east-2a,v100_1,100,150,ours\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(catalog.EnvSpotInterruptions, volatile)
	stormy := best()
	if stormy.Placement.Spot || stormy.Placement.Nodes != 0 || stormy.Placement.AcceleratorCount != 8 {
		t.Fatalf("on a volatile history: %+v (%s), want the 8-GPU on-demand node", stormy.Placement, stormy.Why)
	}

	hourly := task.Resources
	hourly.Objective.Minimize = ""
	for i := range hourly.AnyOf {
		hourly.AnyOf[i].Objective.Minimize = ""
	}
	cands, err := Plan(hourly, []Infra{aws})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cands {
		if want := c.Placement.PricePerHour * float64(max(c.Placement.Nodes, 1)); c.Score != want {
			t.Errorf("%+v: score %v, want the gang's price %v", c.Placement, c.Score, want)
		}
	}
}
