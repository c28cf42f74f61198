package optimizer

import (
	"fmt"
	"math"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// Objectives (resources.objective). cost_per_hour ranks by price, as SkyPilot does. The others
// rank by the expected cost of a unit of work, from the catalog's throughput table and spot
// interruption rates (launcher/catalog/README.md):
//
//   - cost_per_step: dollars per A100-hour of training work. Work per hour is the devices'
//     dense tensor TFLOPS over the A100's, times their count. A spot gang of N nodes is
//     interrupted N × rate times an hour (rate: the preemption traces nearest its accelerator
//     and region, catalog.InterruptionRate; the plan says when they are a stand-in),
//     and each interruption loses half a checkpoint interval plus the restart, so it does
//     useful work 1 − N·rate·(checkpoint/2 + restart) of the time (at least 5 %).
//   - cost_per_token: dollars per million generated tokens, at the decode bound of the model
//     size on the placement's devices (bandwidth over weight bytes; 0 when the weights do not
//     fit, which makes the placement unrankable). A spot replica loses its restart per
//     interruption.
//
// Placements own capacity (local, Kubernetes) still rank first: an objective orders candidates
// within a tier, never across. A placement the objective cannot score (an accelerator without
// figures, such as AWS's A10G) ranks after the scored ones of its tier, by price.

// Defaults for what an objective needs and the YAML did not say.
const (
	DefaultCheckpointMinutes = 30
	DefaultRestartMinutes    = 10
	DefaultModelSizeB        = 8
	// minUptime keeps the expected cost finite when interruptions outpace checkpoints.
	minUptime = 0.05
)

// score is a candidate's value under the objective; ok false when it cannot be computed.
type score struct {
	value float64
	ok    bool
	// why explains the value in a few words, for the plan table.
	why string
}

// scoreOf computes p's score under o. p.PricePerHour is already set.
func scoreOf(o configs.Objective, c *Candidate) score {
	p := &c.Placement
	if !o.PerWork() {
		// Gangs of different shapes compare by what the whole gang costs an hour.
		return score{value: p.PricePerHour * float64(max(o.Nodes, 1)), ok: true}
	}
	if p.Accelerator == "" {
		return score{why: "no accelerator"}
	}
	t, known := catalog.ThroughputOf(p.Accelerator)
	if !known {
		return score{why: "no throughput figures for " + p.Accelerator}
	}
	uptime, upWhy := uptimeOf(o, c)
	if o.Minimize == configs.ObjectiveCostPerStep {
		work := t.RelativeTraining() * p.AcceleratorCount
		v := p.PricePerHour / (work * uptime)
		shape := ""
		if p.Nodes > 0 {
			shape = fmt.Sprintf("%d nodes × ", p.Nodes)
		}
		return score{value: v, ok: true, why: fmt.Sprintf("%s%s×%s A100-equiv%s", shape, formatNumber(round2(t.RelativeTraining())), formatNumber(p.AcceleratorCount), upWhy)}
	}
	size := cmpOr(o.ModelSizeB, DefaultModelSizeB)
	tps := t.DecodeTokensPerSecond(p.AcceleratorCount, size)
	if tps == 0 {
		return score{why: fmt.Sprintf("%sB does not fit %s:%s", formatNumber(size), p.Accelerator, formatNumber(p.AcceleratorCount))}
	}
	v := p.PricePerHour / (tps * 3600 * uptime) * 1e6
	return score{value: v, ok: true, why: fmt.Sprintf("%.0f tok/s at %sB%s", tps, formatNumber(size), upWhy)}
}

// uptimeOf is the share of time a placement does useful work: 1 unless it is spot.
func uptimeOf(o configs.Objective, c *Candidate) (float64, string) {
	p := &c.Placement
	if !p.Spot {
		return 1, ""
	}
	rate, basis, exact, ok := catalog.InterruptionRate(p.Infra, p.Region, p.Accelerator)
	if !ok {
		return 1, ", no interruption trace of its kind"
	}
	nodes := float64(max(o.Nodes, 1))
	lostMin := cmpOr(o.RestartMinutes, DefaultRestartMinutes)
	if o.Minimize == configs.ObjectiveCostPerStep {
		lostMin += cmpOr(o.CheckpointMinutes, DefaultCheckpointMinutes) / 2
	}
	perHour := nodes * rate
	up := math.Max(minUptime, 1-perHour*lostMin/60)
	from := ""
	if !exact {
		from = " (from " + basis[:strings.IndexByte(basis, ':')] + ")"
	}
	return up, fmt.Sprintf(", %.2f interruptions/h%s → %.0f%% useful", perHour, from, 100*up)
}

func cmpOr(v, d float64) float64 {
	if v > 0 {
		return v
	}
	return d
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// Unit names the objective's unit for the plan table.
func Unit(o configs.Objective) string {
	switch o.Minimize {
	case configs.ObjectiveCostPerStep:
		return "$/A100·h of work"
	case configs.ObjectiveCostPerToken:
		return "$/M tokens"
	}
	return "$/hr"
}
