package sim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryserve/ferry/launcher/catalog"
)

// The gang-cost study (`ferry sim gang`, issue 22): a data-parallel job needs N GPUs' worth of
// steps; it runs either as N one-GPU spot instances or as one N-GPU on-demand instance.
//
// Model. Both shapes are taken to run a step in the same time (perfect data parallelism; the
// N×1 gang's network is not charged). The preemption traces say how long each launched spot
// instance lived (the data's README); node i of the gang lives, one after another, the
// lifetimes of zone i mod zones, starting 1/N further into them than node i−1, so nodes of one
// zone are independent samples of it. A preempted node is replaced at once, elsewhere; the
// gang then loses the work since its last checkpoint (every Checkpoint of computing) and
// restarts (Restart). All N nodes are paid throughout, each at its region's catalog spot price
// (the mean over the region's AZs that have one). The on-demand shape starts once (Restart)
// and never stops.
//
// Flip points: spot cost is linear in the spot price, so the price at which both shapes cost
// the same per step is on-demand cost / spot cost × the spot price. For interruptions, the
// lifetimes are divided by k (interruptions come k times as often) and the rate at which
// $/step crosses is interpolated between the speeds tried.

// GangOptions is one study.
type GangOptions struct {
	// SpotDir is the preemption traces (default DATA/spot-traces/preemption/1-node/aws-04-22-2023,
	// p3.2xlarge: one V100).
	SpotDir string
	// GPUs are the gang sizes N to compare, each an on-demand type with N V100s.
	GPUs []int
	// Steps and StepTime are the job: StepTime is one step on N GPUs.
	Steps    int
	StepTime time.Duration
	// Checkpoint is the interval between checkpoints of computing; Restart the time from
	// every node alive to computing again (and the on-demand instance's start).
	Checkpoint, Restart time.Duration
	// Speeds are the trace replay speeds for the interruption-rate flip point.
	Speeds []float64
}

// DefaultGangOptions is the study docs/measurements.md reports ("Cost per unit of work").
func DefaultGangOptions() GangOptions {
	return GangOptions{GPUs: []int{4, 8}, Steps: 20000, StepTime: 2 * time.Second,
		Checkpoint: 30 * time.Minute, Restart: 10 * time.Minute, Speeds: []float64{0.5, 1, 2, 4, 8, 16, 32}}
}

// onDemandV100 is the on-demand type holding N V100s, and spotV100 the one-V100 spot type.
var onDemandV100 = map[int]string{1: "p3.2xlarge", 4: "p3.8xlarge", 8: "p3.16xlarge"}

const spotV100 = "p3.2xlarge"

// GangShape is one shape's outcome.
type GangShape struct {
	Shape         string
	Hours         float64 // completion time
	Cost          float64 // dollars
	PerStep       float64 // dollars per step
	Interruptions int
	Finished      bool
}

// GangResult compares the shapes at one N.
type GangResult struct {
	GPUs             int
	Spot, OnDemand   GangShape
	SpotPrice        float64 // mean $/h of one spot node over the gang's regions
	FlipSpotPrice    float64 // spot $/h per node at which both cost the same per step
	Rate             float64 // gang interruptions per node-hour (speed 1)
	FlipRate         float64 // per node-hour; 0 when no speed tried crosses
	FlipRateBrackets string
}

// RunGang runs the study on the traces and writes a markdown table to out.
func RunGang(o GangOptions, out io.Writer) ([]GangResult, error) {
	if o.SpotDir == "" {
		dir, err := DataDir()
		if err != nil {
			return nil, err
		}
		o.SpotDir = filepath.Join(dir, "spot-traces", "preemption", "1-node", "aws-04-22-2023")
	}
	traces, err := LoadSpotTraces(o.SpotDir)
	if err != nil {
		return nil, err
	}
	if o.Steps <= 0 || o.StepTime <= 0 || o.Checkpoint <= 0 || o.Restart < 0 {
		return nil, errors.New("gang: steps, step time and checkpoint must be positive")
	}
	var results []GangResult
	for _, n := range o.GPUs {
		r, err := gangAt(o, traces, n)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, writeGang(out, o, results)
}

func gangAt(o GangOptions, traces []*SpotTrace, n int) (GangResult, error) {
	odType, ok := onDemandV100[n]
	if !ok {
		return GangResult{}, fmt.Errorf("gang: no on-demand type with %d V100s in the catalog (have 1, 4, 8)", n)
	}
	prices := make([]float64, n)
	for i := range prices {
		p, err := regionPrice(spotV100, traces[i%len(traces)].Region, true)
		if err != nil {
			return GangResult{}, err
		}
		prices[i] = p
	}
	odPrice, err := regionPrice(odType, traces[0].Region, false)
	if err != nil {
		return GangResult{}, err
	}
	work := float64(o.Steps) * o.StepTime.Seconds()
	r := GangResult{GPUs: n}
	var aliveHours float64
	r.Spot, aliveHours = replayGang(o, traces, prices, work, 1)
	r.Spot.Shape = fmt.Sprintf("%d×1 V100 spot (%s)", n, spotV100)
	hours := (o.Restart.Seconds() + work) / 3600
	r.OnDemand = GangShape{Shape: fmt.Sprintf("1×%d V100 on-demand (%s)", n, odType), Hours: hours, Cost: odPrice * hours,
		PerStep: odPrice * hours / float64(o.Steps), Finished: true}
	for _, p := range prices {
		r.SpotPrice += p / float64(n)
	}
	if r.Spot.Finished && r.Spot.Cost > 0 {
		r.FlipSpotPrice = r.SpotPrice * r.OnDemand.Cost / r.Spot.Cost
	}
	if aliveHours > 0 {
		r.Rate = float64(r.Spot.Interruptions) / aliveHours
	}
	r.FlipRate, r.FlipRateBrackets = flipRate(o, traces, prices, work, r)
	return r, nil
}

// flipRate replays the traces at each speed and interpolates the interruption rate at which
// spot's $/step reaches on-demand's.
func flipRate(o GangOptions, traces []*SpotTrace, prices []float64, work float64, r GangResult) (float64, string) {
	type point struct{ rate, perStep float64 }
	var prev *point
	var tried []string
	for _, k := range o.Speeds {
		s, alive := replayGang(o, traces, prices, work, k)
		rate := 0.0
		if alive > 0 {
			rate = float64(s.Interruptions) / alive
		}
		per := s.PerStep
		if !s.Finished {
			per = math.Inf(1)
		}
		tried = append(tried, fmt.Sprintf("%g×: %.2f/h → $%.4f", k, rate, per))
		cur := point{rate, per}
		if prev != nil && prev.perStep <= r.OnDemand.PerStep && cur.perStep > r.OnDemand.PerStep {
			if math.IsInf(cur.perStep, 1) {
				return prev.rate, strings.Join(tried, "; ")
			}
			f := (r.OnDemand.PerStep - prev.perStep) / (cur.perStep - prev.perStep)
			return prev.rate + f*(cur.rate-prev.rate), strings.Join(tried, "; ")
		}
		prev = &cur
	}
	return 0, strings.Join(tried, "; ")
}

// lifetimes are how long each launched instance of a preemption trace lived: the runs of
// alive ticks that ended in a drop (the run still alive at the trace's end is left out).
func lifetimes(tr *SpotTrace) []float64 {
	var out []float64
	run := 0.0
	for i, v := range tr.Data {
		if v > 0 {
			run += tr.Gap
			continue
		}
		if i > 0 && tr.Data[i-1] > 0 {
			out = append(out, run)
		}
		run = 0
	}
	return out
}

// replayGang runs the spot gang with every lifetime divided by speed, and returns its
// outcome and the node-hours its nodes lived. A preempted node is replaced at once (recovery
// relaunches it elsewhere, as EAGER_NEXT_REGION does); the gang then restarts from its last
// checkpoint. Node i lives the lifetimes of trace i mod zones in order, from the (i/N)th one.
func replayGang(o GangOptions, traces []*SpotTrace, prices []float64, work, speed float64) (GangShape, float64) {
	n := len(prices)
	lives := make([][]float64, n)
	next := make([]int, n)
	death := make([]float64, n)
	for i := range n {
		lives[i] = lifetimes(traces[i%len(traces)])
		if len(lives[i]) == 0 {
			lives[i] = []float64{math.Inf(1)} // never preempted in the trace
		}
		next[i] = i * len(lives[i]) / n
		death[i] = lives[i][next[i]] / speed
	}
	const tick = 10.0
	var s GangShape
	var progress, saved, sinceCkpt, perHour float64
	for _, p := range prices {
		perHour += p
	}
	restartLeft := o.Restart.Seconds()
	limit := 50 * (work + o.Restart.Seconds())
	t := 0.0
	for ; t < limit && progress < work; t += tick {
		hit := false
		for i := range n {
			for death[i] <= t {
				hit = true
				next[i] = (next[i] + 1) % len(lives[i])
				death[i] += lives[i][next[i]] / speed
			}
		}
		switch {
		case hit:
			s.Interruptions++
			progress, sinceCkpt = saved, 0
			restartLeft = o.Restart.Seconds()
		case restartLeft > 0:
			restartLeft -= tick
		default:
			progress += tick
			if sinceCkpt += tick; sinceCkpt >= o.Checkpoint.Seconds() {
				saved, sinceCkpt = progress, 0
			}
		}
	}
	s.Finished = progress >= work
	s.Hours, s.Cost = t/3600, perHour*t/3600
	s.PerStep = s.Cost / float64(o.Steps)
	return s, float64(n) * t / 3600
}

// regionPrice is the mean catalog price of an AWS instance type over the region's AZs that
// have one.
func regionPrice(instanceType, region string, spot bool) (float64, error) {
	sum, n := 0.0, 0
	for _, row := range catalog.Default().InstanceType(instanceType) {
		if p, ok := row.Price(spot); ok && row.Region == region {
			sum, n = sum+p, n+1
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("gang: the catalog has no %s price for %s in %s", map[bool]string{true: "spot", false: "on-demand"}[spot], instanceType, region)
	}
	return sum / float64(n), nil
}

func writeGang(w io.Writer, o GangOptions, results []GangResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Data-parallel job: %d steps of %s on N GPUs, checkpoint every %s, restart %s; spot traces %s\n\n",
		o.Steps, o.StepTime, o.Checkpoint, o.Restart, o.SpotDir)
	b.WriteString("| N | shape | $/step | completion (h) | interruptions | cost ($) |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, s := range []GangShape{r.Spot, r.OnDemand} {
			done := fmt.Sprintf("%.1f", s.Hours)
			if !s.Finished {
				done = "unfinished after " + done
			}
			fmt.Fprintf(&b, "| %d | %s | %.5f | %s | %d | %.2f |\n", r.GPUs, s.Shape, s.PerStep, done, s.Interruptions, s.Cost)
		}
	}
	b.WriteString("\n| N | spot $/h per node | flips at spot $/h | measured interruptions per node-hour | flips at interruptions per node-hour |\n|---|---|---|---|---|\n")
	for _, r := range results {
		flip := "none in the speeds tried"
		if r.FlipRate > 0 {
			flip = fmt.Sprintf("%.2f", r.FlipRate)
		}
		fmt.Fprintf(&b, "| %d | %.4f | %.4f | %.3f | %s |\n", r.GPUs, r.SpotPrice, r.FlipSpotPrice, r.Rate, flip)
	}
	for _, r := range results {
		fmt.Fprintf(&b, "\nN=%d replays (speed: interruptions/node-h → spot $/step; on-demand $%.5f): %s\n", r.GPUs, r.OnDemand.PerStep, r.FlipRateBrackets)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
