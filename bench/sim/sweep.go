package sim

import (
	"cmp"
	"context"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// This file is the fleet-size sweep (`ferry sim --sweep`): every set of spot traces under
// Options.SpotRoot, at every fleet size of Options.Fleets, each policy of Options.Policies, in
// one pool of Options.Parallel workers, reported as one table and one plot.

// Sweep is a sweep's outcome: one report per spot set and fleet size.
type Sweep struct {
	Options    Options   `json:"options"`
	TargetQPS  float64   `json:"target_qps_per_replica"`
	Calibrated bool      `json:"target_qps_calibrated"`
	Runs       []*Report `json:"runs"`
	Elapsed    string    `json:"elapsed"`
	// Sets are the spot sets in report order, with what their capacity allows.
	Sets []SweepSet `json:"sets"`
}

// SweepSet is one spot set as the sweep read it.
type SweepSet struct {
	Name     string   `json:"name"`
	Provider Provider `json:"provider"`
	Zones    []string `json:"zones"`
	// Probe is true for a set of 0/1 probes (capacity unbounded when 1).
	Probe bool `json:"probe"`
	// MeanCapacity and MaxCapacity are the zones' summed spot capacity over the horizon
	// (counted sets only); UpShare the mean share of the horizon a zone had capacity.
	MeanCapacity float64       `json:"mean_capacity"`
	MaxCapacity  int           `json:"max_capacity"`
	UpShare      float64       `json:"up_share"`
	Horizon      time.Duration `json:"horizon"`
	Notes        []string      `json:"notes"`
	// Floors are, per fleet size, the capacity floor: the least any policy could pay for
	// that fleet ÷ all on-demand's, at catalog prices and normalized (capacityFloor).
	Floors map[int][2]float64 `json:"capacity_floors"`
	// Covers is, per fleet size, the share of the horizon's minutes whose spot capacity holds
	// the whole fleet: where it is half or more, Ferry's cost is held to its floor.
	Covers map[int]float64 `json:"spot_covers"`
}

// RunSweep runs the sweep of o and writes sweep.md (also on stdout), results.json and
// sweep.svg to the output directory.
func RunSweep(ctx context.Context, o Options, stdout, progress io.Writer) error {
	start := time.Now()
	sw, err := SimulateSweep(ctx, o, progress)
	if err != nil {
		return err
	}
	sw.Elapsed = time.Since(start).Round(time.Second).String()
	out, err := outDir(o.Out)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "sweep.svg"), sw.SVG(), 0o644); err != nil {
		return err
	}
	if err := benchkit.WriteReport(stdout, out, sw.Markdown(), sw); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(out, "sweep.svg"))
	return nil
}

// SimulateSweep runs every set at every fleet size.
func SimulateSweep(ctx context.Context, o Options, progress io.Writer) (*Sweep, error) {
	trace, err := LoadTrace(o.TracePath)
	if err != nil {
		return nil, err
	}
	sets, err := sweepSets(o)
	if err != nil {
		return nil, err
	}
	sw := &Sweep{Options: o, TargetQPS: o.TargetQPS}
	if o.TargetQPS == 0 {
		if o.TargetQPS, err = calibrate(o, trace, progress); err != nil {
			return nil, err
		}
		sw.TargetQPS, sw.Calibrated = o.TargetQPS, true
	}
	cats := newCatalogs(o)
	type job struct {
		fn     func()
		weight float64
	}
	var jobs []job
	for _, set := range sets {
		prices, err := cats.prices(set)
		if err != nil {
			return nil, fmt.Errorf("spot set %s: %w", set.Name, err)
		}
		so := o
		so.SpotDir = set.Path
		if set.Derived != nil {
			so.SpotDir = set.Name
		}
		so.Duration = min(o.Duration, setDuration(prices.Zones)-o.Warmup-o.SpotOffset).Truncate(time.Minute)
		if so.Duration < 10*time.Minute {
			return nil, fmt.Errorf("spot set %s covers %v: too short for a %v warm-up and 10 minutes scored from --spot-offset %v",
				set.Name, setDuration(prices.Zones), o.Warmup, o.SpotOffset)
		}
		prices.Source = set.Name
		desc := describeSet(set.Name, prices, so)
		desc.Floors, desc.Covers = map[int][2]float64{}, map[int]float64{}
		for _, fleet := range o.Fleets {
			f := capacityFloor(prices, so, fleet)
			desc.Floors[fleet] = [2]float64{f.dollars, f.norm}
			desc.Covers[fleet] = f.covers
		}
		sw.Sets = append(sw.Sets, desc)
		in := &Inputs{Trace: trace, Prices: prices}
		for _, fleet := range o.Fleets {
			fo := so
			fo.Fleet = fleet
			rep, fns, err := prepare(fo, in, progress)
			if err != nil {
				return nil, err
			}
			rep.Calibrated = sw.Calibrated
			sw.Runs = append(sw.Runs, rep)
			for _, fn := range fns {
				jobs = append(jobs, job{fn, float64(fleet) * fo.Duration.Hours()})
			}
		}
	}
	// The longest first, so that the pool does not end on one long job.
	slices.SortStableFunc(jobs, func(a, b job) int { return cmp.Compare(b.weight, a.weight) })
	fns := make([]func(), len(jobs))
	for i, j := range jobs {
		fns[i] = j.fn
	}
	fmt.Fprintf(progress, "sim: sweep of %d spot sets × %d fleet sizes × %d policies = %d simulations, %d at a time\n",
		len(sw.Sets), len(o.Fleets), len(o.Policies), len(fns), o.Parallel)
	if err := runJobs(ctx, o.Parallel, fns); err != nil {
		return nil, err
	}
	for _, rep := range sw.Runs {
		rep.finish()
	}
	return sw, nil
}

// sweepSets are the sets a sweep runs: every set under o.SpotRoot, then the derived sets
// (DerivedSets) whose probes are there, or only those named in o.Sets.
func sweepSets(o Options) ([]SpotSet, error) {
	sets, err := FindSpotSets(o.SpotRoot)
	if err != nil {
		return nil, err
	}
	sets = append(sets, derivedSets(o.SpotRoot)...)
	if len(o.Sets) == 0 {
		return sets, nil
	}
	var out, unknown []string
	var picked []SpotSet
	for _, s := range sets {
		out = append(out, s.Name)
		if slices.Contains(o.Sets, s.Name) {
			picked = append(picked, s)
		}
	}
	for _, n := range o.Sets {
		if !slices.Contains(out, n) {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("--sets: %s not under %s; the sets are: %s", strings.Join(unknown, ", "), o.SpotRoot, strings.Join(out, ", "))
	}
	return picked, nil
}

// describeSet summarises what a set's capacity allows over the scored horizon of o.
func describeSet(name string, pr *Prices, o Options) SweepSet {
	s := SweepSet{Name: name, Provider: pr.Zones[0].Provider, Probe: pr.Zones[0].Trace.Probe, Horizon: o.Duration, Notes: pr.Notes}
	for _, z := range pr.Zones {
		s.Zones = append(s.Zones, z.Name)
	}
	from := (o.SpotOffset + o.Warmup).Seconds()
	to := from + o.Duration.Seconds()
	step := 60.0
	n, sum, up := 0, 0.0, 0.0
	for t := from; t < to; t += step {
		n++
		total := 0
		for _, z := range pr.Zones {
			c := z.Trace.Capacity(t)
			if c > 0 {
				up++
			}
			total += min(c, 1000)
		}
		sum += float64(total)
		s.MaxCapacity = max(s.MaxCapacity, total)
	}
	if n > 0 {
		s.MeanCapacity = sum / float64(n)
		s.UpShare = up / float64(n*len(pr.Zones))
	}
	return s
}

// floor is a fleet's capacity floor (capacityFloor).
type floor struct {
	// dollars and norm are ÷ all on-demand's cost, at catalog prices and normalized.
	dollars, norm float64
	// covers is the share of minutes the zones hold the whole fleet on spot.
	covers float64
}

// capacityFloor is the least a fleet of n could cost over o's horizon, relative to n
// on-demand replicas, at catalog prices and normalized (on-demand = 3 × spot): minute by
// minute, as many of the n as the zones hold on spot, cheapest zones first, the rest
// on-demand, with no cold start, no spare and no reclaim. No policy pays less; where it is
// above 0.5 the set does not hold enough spot capacity for the fleet to cost half of all
// on-demand.
func capacityFloor(pr *Prices, o Options, n int) floor {
	zones := slices.Clone(pr.Zones)
	slices.SortStableFunc(zones, func(a, b Zone) int { return cmp.Compare(a.SpotPrice, b.SpotPrice) })
	from := (o.SpotOffset + o.Warmup).Seconds()
	to := from + o.Duration.Seconds()
	var sumDollars, sumNorm, minutes, covered float64
	for t := from; t < to; t += 60 {
		minutes++
		left := n
		for _, z := range zones {
			take := min(left, z.Trace.Capacity(t))
			sumDollars += float64(take) * z.SpotPrice
			sumNorm += float64(take)
			left -= take
		}
		if left == 0 {
			covered++
		}
		sumDollars += float64(left) * pr.OnDemand
		sumNorm += 3 * float64(left)
	}
	if minutes == 0 || n == 0 {
		return floor{}
	}
	return floor{dollars: sumDollars / (minutes * float64(n) * pr.OnDemand), norm: sumNorm / (minutes * 3 * float64(n)),
		covers: covered / minutes}
}

// capacityText is a set's capacity in a table cell.
func (s SweepSet) capacityText() string {
	if s.Probe {
		return fmt.Sprintf("0/1 probes, zones up %.0f %%", 100*s.UpShare)
	}
	return fmt.Sprintf("counted: mean %.1f, max %d", s.MeanCapacity, s.MaxCapacity)
}

// verdict is one (set, fleet) line of the sweep's summary.
type verdict struct {
	set                       SweepSet
	fleet                     int
	ferry, sky, sky0, od      *Result
	beatsSky, halfOD, roomFor bool
	// sloKept is ferry's SLO attainment within sloSlack of SkyServe+SpotHedge's; nearFloor
	// is ferry's cost within floorSlack × the capacity floor, asked only where spot holds the
	// fleet half the time or more (covered).
	sloKept, nearFloor, covered bool
}

// The bars besides availability and cost: SLO attainment at most 0.2 points below
// SkyServe+SpotHedge's, and cost within 1.10 × the capacity floor where spot capacity covers
// the fleet at least half the time.
const (
	sloSlack   = 0.002
	floorSlack = 1.10
)

func (sw *Sweep) verdicts() []verdict {
	var out []verdict
	i := 0
	for _, set := range sw.Sets {
		for range sw.Options.Fleets {
			rep := sw.Runs[i]
			i++
			v := verdict{set: set, fleet: rep.Options.Fleet, ferry: rep.result("ferry"), sky: rep.result("skyserve-spothedge"),
				sky0: rep.result("skyserve-spothedge-0"), od: rep.result("ondemand")}
			if v.ferry != nil && v.sky != nil {
				v.beatsSky = v.ferry.Availability >= v.sky.Availability && v.ferry.Cost <= v.sky.Cost && v.ferry.NormalizedCost <= v.sky.NormalizedCost
			}
			if v.ferry != nil && v.od != nil {
				v.halfOD = v.ferry.CostVsOnDemand <= 0.5 && v.ferry.NormalizedVsOnDemand <= 0.5
			}
			// Enough spot capacity for half of all on-demand's cost to be within reach.
			f := set.Floors[v.fleet]
			v.roomFor = f[0] <= 0.5 && f[1] <= 0.5
			v.covered = set.Covers[v.fleet] >= 0.5
			if v.ferry != nil && v.sky != nil {
				v.sloKept = v.ferry.SLOAttainment >= v.sky.SLOAttainment-sloSlack
			}
			if v.ferry != nil {
				v.nearFloor = v.ferry.CostVsOnDemand <= floorSlack*f[0] && v.ferry.NormalizedVsOnDemand <= floorSlack*f[1]
			}
			out = append(out, v)
		}
	}
	return out
}

// Markdown renders the sweep: inputs, the summary table and every run's results.
func (sw *Sweep) Markdown() string {
	var b strings.Builder
	o := sw.Options
	fmt.Fprintf(&b, "# ferry sim --sweep\n\n")
	how := "given"
	if sw.Calibrated {
		how = "calibrated"
	}
	fmt.Fprintf(&b, "Every spot set under %s at fleets of %v replicas (min_replicas; the request trace %s is scaled so that its busiest minute needs that many at target_qps_per_replica %.2f, %s); each run is %v of warm-up and up to %v scored, cut to what the set covers. Availability is SpotHedge's: the share of 30 s ticks with at least min_replicas READY, the same for every policy. Costs count every replica, spares included, at catalog prices ($) and under SpotHedge's convention (norm.: on-demand = 3 × spot). Notices: EC2 %v, Compute Engine %v, to the instances reclaimed only.\n\n",
		o.SpotRoot, o.Fleets, o.TracePath, sw.TargetQPS, how, o.Warmup, o.Duration, o.Notice[AWS], o.Notice[GCP])
	b.WriteString("## Spot sets\n\n")
	st := benchkit.Table{Header: []string{"spot set", "cloud", "zones", "capacity over the horizon", "horizon"}}
	for _, s := range sw.Sets {
		st.Rows = append(st.Rows, []string{s.Name, string(s.Provider), strings.Join(s.Zones, " "), s.capacityText(), s.Horizon.String()})
	}
	st.Render(&b)
	for _, s := range sw.Sets {
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "\n* %s: %s", s.Name, n)
		}
	}
	b.WriteString("\n\n## Summary\n\n")
	sw.summaryTable().Render(&b)
	b.WriteString("\nferry beats SkyServe+SpotHedge (one spare, as in the paper) when its availability is at least as high and it costs no more at catalog prices and normalized; ≤ 0.5 × ondemand asks both costs to be at most half of all on-demand's. The capacity floor is the least any policy could pay for the fleet ÷ all on-demand's: minute by minute as much of it on spot as the zones hold, cheapest first, the rest on-demand, with no cold start, spare or reclaim; \"no (capacity)\" marks a fleet whose floor is above 0.5. SLO ≥ sky+SH − 0.2 asks ferry's SLO attainment to be at most 0.2 points below SkyServe+SpotHedge's; spot holds the fleet is the share of minutes the zones' spot capacity holds the whole fleet, and where that is half or more ≤ 1.10 × floor asks both of ferry's costs to be within 1.10 × the capacity floor.\n")
	b.WriteString("\n## Every run\n\n")
	for _, rep := range sw.Runs {
		fmt.Fprintf(&b, "### %s, fleet %d (%v scored)\n\n", rep.inputs.Prices.Source, rep.Options.Fleet, rep.Options.Duration)
		rep.resultsTable().Render(&b)
		b.WriteString("\n")
	}
	if sw.Elapsed != "" {
		fmt.Fprintf(&b, "Simulated in %s.\n", sw.Elapsed)
	}
	return b.String()
}

func (sw *Sweep) summaryTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"spot set", "fleet", "avail %: ferry / sky+SH / sky+SH-0", "ferry ÷ sky+SH, $ / norm.", "ferry ÷ ondemand, $ / norm.", "sky+SH ÷ ondemand, $ / norm.", "capacity floor, $ / norm.", "beats sky+SH", "≤ 0.5 × ondemand",
		"SLO %: ferry / sky+SH", "SLO ≥ sky+SH − 0.2", "spot holds the fleet", "ferry ÷ floor, $ / norm.", "≤ 1.10 × floor"}}
	pct := func(r *Result) string {
		if r == nil {
			return "–"
		}
		return fmt.Sprintf("%.2f", 100*r.Availability)
	}
	for _, v := range sw.verdicts() {
		if v.ferry == nil {
			continue
		}
		vsSky, vsOD, skyOD := "–", "–", "–"
		if v.sky != nil && v.sky.Cost > 0 {
			vsSky = fmt.Sprintf("%.3f / %.3f", v.ferry.Cost/v.sky.Cost, v.ferry.NormalizedCost/v.sky.NormalizedCost)
		}
		if v.od != nil {
			vsOD = fmt.Sprintf("%.3f / %.3f", v.ferry.CostVsOnDemand, v.ferry.NormalizedVsOnDemand)
			if v.sky != nil {
				skyOD = fmt.Sprintf("%.3f / %.3f", v.sky.CostVsOnDemand, v.sky.NormalizedVsOnDemand)
			}
		}
		half := yes(v.halfOD)
		if !v.halfOD && !v.roomFor {
			half = "no (capacity)"
		}
		f := v.set.Floors[v.fleet]
		slo, sloKept := "–", "–"
		if v.sky != nil {
			slo, sloKept = fmt.Sprintf("%.2f / %.2f", 100*v.ferry.SLOAttainment, 100*v.sky.SLOAttainment), yes(v.sloKept)
		}
		vsFloor, nearFloor := "–", "not asked"
		if f[0] > 0 && f[1] > 0 {
			vsFloor = fmt.Sprintf("%.3f / %.3f", v.ferry.CostVsOnDemand/f[0], v.ferry.NormalizedVsOnDemand/f[1])
		}
		if v.covered {
			nearFloor = yes(v.nearFloor)
		}
		t.Rows = append(t.Rows, []string{v.set.Name, fmt.Sprint(v.fleet), pct(v.ferry) + " / " + pct(v.sky) + " / " + pct(v.sky0), vsSky, vsOD, skyOD,
			fmt.Sprintf("%.3f / %.3f", f[0], f[1]), yes(v.beatsSky), half,
			slo, sloKept, fmt.Sprintf("%.0f %%", 100*v.set.Covers[v.fleet]), vsFloor, nearFloor})
	}
	return t
}

// SVG plots, per spot set, cost ÷ ondemand (catalog $) and availability against the fleet
// size, one line per policy.
func (sw *Sweep) SVG() []byte {
	const (
		width, left, panelW, panelH, gapX, gapY, top = 1100, 60, 470, 150, 90, 60, 50
	)
	policies := sw.Options.Policies
	colors := []string{"#1f77b4", "#d62728", "#ff7f0e", "#555555", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"}
	height := top + len(sw.Sets)*(panelH+gapY) + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">ferry sim --sweep: cost ÷ all on-demand (catalog $, left) and availability (≥ min_replicas READY, right) by fleet size</text>`+"\n", left)
	for i, p := range policies {
		x := left + i*130
		fmt.Fprintf(&b, `<line x1="%d" y1="36" x2="%d" y2="36" stroke="%s" stroke-width="2.5"/><text x="%d" y="40">%s</text>`+"\n", x, x+18, colors[i%len(colors)], x+22, html.EscapeString(p))
	}
	fleets := sw.Options.Fleets
	xAt := func(x0 float64, k int) float64 {
		if len(fleets) == 1 {
			return x0 + panelW/2
		}
		return x0 + 10 + float64(k)*(panelW-20)/float64(len(fleets)-1)
	}
	runs := 0
	for si, set := range sw.Sets {
		y0 := float64(top + si*(panelH+gapY) + 20)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s (%s)</text>`+"\n", left, y0-6, html.EscapeString(set.Name), html.EscapeString(set.capacityText()))
		reps := sw.Runs[runs : runs+len(fleets)]
		runs += len(fleets)
		for panel := range 2 {
			x0 := float64(left + panel*(panelW+gapX))
			lo, hi, label := 0.0, 1.5, "÷ ondemand"
			if panel == 1 {
				lo, hi, label = 0.5, 1.0, "avail"
			}
			yAt := func(v float64) float64 { return y0 + panelH - panelH*(min(max(v, lo), hi)-lo)/(hi-lo) }
			fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, panelW, panelH)
			for _, g := range []float64{lo, (lo + hi) / 2, hi} {
				fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end">%g</text>`+"\n", x0-4, yAt(g)+4, g)
			}
			if panel == 0 {
				fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#999" stroke-dasharray="4 3"/>`+"\n", x0, yAt(0.5), x0+panelW, yAt(0.5))
			}
			fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="end" fill="#666">%s</text>`+"\n", x0+panelW-4, y0+12, label)
			for k, f := range fleets {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`+"\n", xAt(x0, k), y0+panelH+13, f)
			}
			for pi, p := range policies {
				var pts []string
				for k, rep := range reps {
					res := rep.result(p)
					if res == nil {
						continue
					}
					v := res.CostVsOnDemand
					if panel == 1 {
						v = res.Availability
					}
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(x0, k), yAt(v)))
				}
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), colors[pi%len(colors)])
			}
		}
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}
