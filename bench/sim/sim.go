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
	prices, err := newCatalogs(o).prices(o.spotSet())
	if err != nil {
		return nil, err
	}
	return &Inputs{Trace: trace, Prices: prices}, nil
}

// catalogs loads each cloud's catalog once, for the sets that need it.
type catalogs struct {
	o    Options
	rows map[Provider][]CatalogRow
}

func newCatalogs(o Options) *catalogs { return &catalogs{o: o, rows: map[Provider][]CatalogRow{}} }

// prices loads a spot set, derives its counts when it is a derived set, and prices its zones
// from its cloud's catalog.
func (c *catalogs) prices(set SpotSet) (*Prices, error) {
	spots, err := LoadSpotTraces(set.Path)
	if err != nil {
		return nil, err
	}
	machine := c.o.GCPInstanceType
	if d := set.Derived; d != nil {
		if spots, err = d.Rule.Derive(spots); err != nil {
			return nil, fmt.Errorf("spot set %s: %w", set.Name, err)
		}
		if d.GCPInstanceType != "" {
			machine = d.GCPInstanceType
		}
	}
	p := spots[0].Provider
	file := filepath.Join(c.o.CatalogDir, string(p)+"_gpu.csv")
	if c.rows[p] == nil {
		if c.rows[p], err = LoadCatalog(file); err != nil {
			return nil, err
		}
	}
	var prices *Prices
	if p == GCP {
		prices, err = MatchGCPZones(c.rows[p], machine, spots)
	} else {
		prices, err = MatchZones(c.rows[p], c.o.AWSInstanceType, spots)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if d := set.Derived; d != nil {
		prices.Notes = append(prices.Notes, fmt.Sprintf("counted from the probes of %s: %d copies of each zone, shifted by a %d-th of the trace, in %gs ticks (CountRule); priced as %s",
			d.From, d.Rule.Copies, d.Rule.Copies, d.Rule.Gap, prices.InstanceType))
	}
	prices.Source = set.Name
	return prices, nil
}

// Report is a run's whole outcome.
type Report struct {
	Options Options `json:"options"`
	// TargetQPS is SkyServe's target_qps_per_replica used, and Calibrated whether the
	// simulator chose it.
	TargetQPS  float64 `json:"target_qps_per_replica"`
	Calibrated bool    `json:"target_qps_calibrated"`
	// TimeScale is the load's multiplier: Options.TimeScale, or the one that sizes the
	// busiest minute to Options.Fleet.
	TimeScale    float64   `json:"time_scale"`
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
	if o.Sweep {
		return nil, RunSweep(ctx, o, stdout, progress)
	}
	in, err := Load(o)
	if err != nil {
		return nil, err
	}
	// The horizon stops where the set's shortest zone does, as in the sweep: past it the
	// traces would wrap and replay their start.
	if covered := (setDuration(in.Prices.Zones) - o.Warmup - o.SpotOffset).Truncate(time.Minute); covered < o.Duration {
		if covered < 10*time.Minute {
			return nil, fmt.Errorf("--spot-traces %s covers %v: too short for a %v warm-up and 10 minutes scored from --spot-offset %v",
				o.SpotDir, setDuration(in.Prices.Zones), o.Warmup, o.SpotOffset)
		}
		fmt.Fprintf(progress, "sim: the spot traces cover %v: scoring %v, not --duration %v\n", setDuration(in.Prices.Zones), covered, o.Duration)
		o.Duration = covered
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

// Simulate runs the policies of o on loaded inputs, o.Parallel at a time, calibrating
// target_qps_per_replica first when o leaves it 0.
func Simulate(ctx context.Context, o Options, in *Inputs, progress io.Writer) (*Report, error) {
	calibrated := o.TargetQPS == 0
	if calibrated {
		qps, err := calibrate(o, in.Trace, progress)
		if err != nil {
			return nil, err
		}
		o.TargetQPS = qps
	}
	rep, jobs, err := prepare(o, in, progress)
	if err != nil {
		return nil, err
	}
	rep.Calibrated = calibrated
	if err := runJobs(ctx, o.Parallel, jobs); err != nil {
		return nil, err
	}
	rep.finish()
	return rep, nil
}

// world is what every policy of one run shares.
func world(o Options, in *Inputs) World {
	return World{
		Model:         o.Model,
		Zones:         in.Prices.Zones,
		Notice:        o.Notice,
		MinReady:      o.Fleet,
		OnDemandPrice: in.Prices.OnDemand,
		SpotOffset:    o.SpotOffset.Seconds(),
		Warmup:        o.Warmup,
		Duration:      o.Duration,
		SLO:           o.SLO,
		Seed:          o.Seed,
	}
}

// calibrate is Calibrate on o's model, with its time in progress.
func calibrate(o Options, trace *Trace, progress io.Writer) (float64, error) {
	t0 := time.Now()
	w := World{Model: o.Model, SLO: o.SLO, Seed: o.Seed}
	qps, err := Calibrate(w, trace)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(progress, "sim: calibrated target_qps_per_replica = %.2f in %v\n", qps, time.Since(t0).Round(time.Millisecond))
	return qps, nil
}

// prepare sizes the run and returns its report, to be finished once jobs, one per policy,
// have run.
func prepare(o Options, in *Inputs, progress io.Writer) (*Report, []func(), error) {
	rep := &Report{Options: o, TargetQPS: o.TargetQPS, TimeScale: o.TimeScale, inputs: in}
	if rep.TimeScale == 0 {
		rep.TimeScale = float64(o.Fleet) * o.TargetQPS / in.Trace.PeakRate(1)
	}
	rep.PeakReplicas = max(o.Fleet, int(math.Ceil(in.Trace.PeakRate(rep.TimeScale)/rep.TargetQPS-1e-9)))
	rep.MaxReplicas = max(2*rep.PeakReplicas, rep.PeakReplicas+8)
	policies, err := Policies(o.Policies, PolicyParams{
		Fleet:          o.Fleet,
		TargetQPS:      rep.TargetQPS,
		PeakReplicas:   rep.PeakReplicas,
		MaxReplicas:    rep.MaxReplicas,
		TargetInflight: o.TargetInflight,
		StableWindow:   o.StableWindow,
		Overprovision:  o.Overprovision,
	})
	if err != nil {
		return nil, nil, err
	}
	w := world(o, in)
	until := (o.Warmup + o.Duration).Seconds()
	rep.Results = make([]*Result, len(policies))
	t0 := time.Now()
	label := func(p Policy) string {
		if o.Sweep {
			return fmt.Sprintf("%s fleet %d %s", in.Prices.Source, o.Fleet, p.Name)
		}
		return p.Name
	}
	jobs := make([]func(), len(policies))
	for i, p := range policies {
		jobs[i] = func() {
			res := w.run(p, newLoopedTrace(in.Trace, rep.TimeScale, until))
			rep.Results[i] = res
			progressMu.Lock()
			defer progressMu.Unlock()
			fmt.Fprintf(progress, "sim: %-18s done in %s at +%v: SLO %.2f%%, availability %.2f%%, $%.0f\n",
				label(p), res.Elapsed, time.Since(t0).Round(time.Millisecond), 100*res.SLOAttainment, 100*res.Availability, res.Cost)
		}
	}
	return rep, jobs, nil
}

// progressMu serialises progress lines: a sweep runs the jobs of many prepared runs at once,
// all writing to one progress writer.
var progressMu sync.Mutex

// runJobs runs jobs, parallel at a time, until all are done or ctx ends.
func runJobs(ctx context.Context, parallel int, jobs []func()) error {
	ch := make(chan func())
	var wg sync.WaitGroup
	for range min(parallel, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for job := range ch {
				job()
			}
		}()
	}
	for _, job := range jobs {
		if ctx.Err() != nil {
			break
		}
		ch <- job
	}
	close(ch)
	wg.Wait()
	return ctx.Err()
}

// finish relates every result to the ondemand policy's and samples the load for the plot.
func (rep *Report) finish() {
	var base *Result
	for _, r := range rep.Results {
		if r.Policy == "ondemand" {
			base = r
		}
	}
	if base != nil && base.Cost > 0 {
		for _, r := range rep.Results {
			r.CostVsOnDemand = r.Cost / base.Cost
			r.NormalizedVsOnDemand = r.NormalizedCost / base.NormalizedCost
		}
	}
	rep.loadPerMinute = loadPerMinute(rep.inputs.Trace, rep.Options, rep.TimeScale)
}

// loadPerMinute counts the looped trace's arrivals in each scored minute, in requests/s.
func loadPerMinute(t *Trace, o Options, scale float64) []float64 {
	warm, until := o.Warmup.Seconds(), (o.Warmup + o.Duration).Seconds()
	out := make([]float64, int(math.Ceil(o.Duration.Minutes())))
	src := newLoopedTrace(t, scale, until)
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
