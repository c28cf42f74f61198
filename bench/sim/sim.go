package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// Inputs are the loaded data a run works on.
type Inputs struct {
	Trace  *Trace
	Prices *Prices
}

// Load reads the trace, the spot traces and the catalog named by o.
func Load(o Options) (*Inputs, error) {
	trace, err := LoadTrace(o.TracePath)
	if err != nil {
		return nil, err
	}
	spots, err := LoadSpotTraces(o.SpotDir)
	if err != nil {
		return nil, err
	}
	rows, err := LoadCatalog(o.CatalogPath)
	if err != nil {
		return nil, err
	}
	prices, err := MatchZones(rows, o.InstanceType, spots)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.CatalogPath, err)
	}
	return &Inputs{Trace: trace, Prices: prices}, nil
}

// Report is a run's whole outcome.
type Report struct {
	Options Options `json:"options"`
	// TargetQPS is SkyServe's target_qps_per_replica used, and Calibrated whether the
	// simulator chose it.
	TargetQPS    float64   `json:"target_qps_per_replica"`
	Calibrated   bool      `json:"target_qps_calibrated"`
	PeakReplicas int       `json:"fixed_peak_replicas"`
	MaxReplicas  int       `json:"max_replicas"`
	Results      []*Result `json:"results"`
	Elapsed      string    `json:"elapsed"`
	// Out is where the report files went.
	Out string `json:"-"`

	inputs *Inputs
	// loadPerMinute is the trace's arrivals per scored minute, in requests per second.
	loadPerMinute []float64
}

// Run loads the inputs, simulates every policy and writes the report: markdown on stdout and
// in summary.md, results.json and sim.svg in the output directory. Progress goes to progress.
func Run(ctx context.Context, o Options, stdout, progress io.Writer) (*Report, error) {
	start := time.Now()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := o.resolvePaths(); err != nil {
		return nil, err
	}
	in, err := Load(o)
	if err != nil {
		return nil, err
	}
	out, err := outDir(o.Out)
	if err != nil {
		return nil, err
	}
	rep, err := Simulate(ctx, o, in, progress)
	if err != nil {
		return nil, err
	}
	rep.Out = out
	rep.Elapsed = time.Since(start).Round(time.Millisecond).String()
	if err := os.WriteFile(filepath.Join(out, "sim.svg"), rep.SVG(), 0o644); err != nil {
		return nil, err
	}
	if err := benchkit.WriteReport(stdout, out, rep.Markdown(), rep); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(out, "sim.svg"))
	return rep, nil
}

// outDir is dir, or .cache/bench/sim-TIMESTAMP in the repository, or a new temporary
// directory outside one.
func outDir(dir string) (string, error) {
	if dir != "" {
		return dir, os.MkdirAll(dir, 0o755)
	}
	if root, err := benchkit.RepoRoot(); err == nil {
		return benchkit.OutDir(root, "sim", "")
	}
	return os.MkdirTemp("", "ferry-sim-")
}

// Simulate runs the policies of o on loaded inputs, o.Parallel at a time.
func Simulate(ctx context.Context, o Options, in *Inputs, progress io.Writer) (*Report, error) {
	w := World{
		Model:         o.Model,
		Zones:         in.Prices.Zones,
		OnDemandPrice: in.Prices.OnDemand,
		SpotOffset:    o.SpotOffset.Seconds(),
		Warmup:        o.Warmup,
		Duration:      o.Duration,
		SLO:           o.SLO,
		Seed:          o.Seed,
	}
	rep := &Report{Options: o, TargetQPS: o.TargetQPS, inputs: in}
	var err error
	if rep.TargetQPS == 0 {
		t0 := time.Now()
		if rep.TargetQPS, err = Calibrate(w, in.Trace); err != nil {
			return nil, err
		}
		rep.Calibrated = true
		fmt.Fprintf(progress, "sim: calibrated target_qps_per_replica = %.2f in %v\n", rep.TargetQPS, time.Since(t0).Round(time.Millisecond))
	}
	rep.PeakReplicas = int(math.Ceil(in.Trace.PeakRate(o.TimeScale)/rep.TargetQPS - 1e-9))
	rep.MaxReplicas = max(2*rep.PeakReplicas, rep.PeakReplicas+8)
	policies, err := Policies(o.Policies, PolicyParams{
		TargetQPS:      rep.TargetQPS,
		PeakReplicas:   rep.PeakReplicas,
		MaxReplicas:    rep.MaxReplicas,
		TargetInflight: o.TargetInflight,
		StableWindow:   o.StableWindow,
		Overprovision:  o.Overprovision,
	})
	if err != nil {
		return nil, err
	}
	until := (o.Warmup + o.Duration).Seconds()
	rep.Results = make([]*Result, len(policies))
	jobs := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	t0 := time.Now()
	for range min(o.Parallel, len(policies)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				p := policies[i]
				mu.Lock()
				fmt.Fprintf(progress, "sim: %-18s started at +%v\n", p.Name, time.Since(t0).Round(time.Millisecond))
				mu.Unlock()
				res := w.run(p, newLoopedTrace(in.Trace, o.TimeScale, until))
				rep.Results[i] = res
				mu.Lock()
				fmt.Fprintf(progress, "sim: %-18s done in %s: SLO %.2f%%, availability %.2f%%, $%.0f\n",
					p.Name, res.Elapsed, 100*res.SLOAttainment, 100*res.Availability, res.Cost)
				mu.Unlock()
			}
		}()
	}
	for i := range policies {
		if ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var base *Result
	for _, r := range rep.Results {
		if r.Policy == "ondemand" {
			base = r
		}
	}
	if base != nil && base.Cost > 0 {
		for _, r := range rep.Results {
			r.CostVsOnDemand = r.Cost / base.Cost
		}
	}
	rep.loadPerMinute = loadPerMinute(in.Trace, o)
	return rep, nil
}

// loadPerMinute counts the looped trace's arrivals in each scored minute, in requests/s.
func loadPerMinute(t *Trace, o Options) []float64 {
	warm, until := o.Warmup.Seconds(), (o.Warmup + o.Duration).Seconds()
	out := make([]float64, int(math.Ceil(o.Duration.Minutes())))
	src := newLoopedTrace(t, o.TimeScale, until)
	for a, ok := src.next(); ok; a, ok = src.next() {
		if a.at < warm {
			continue
		}
		if m := int((a.at - warm) / 60); m < len(out) {
			out[m] += 1.0 / 60
		}
	}
	return out
}
