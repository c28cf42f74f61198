package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// Markdown renders the report: inputs, the results table and the targets.
func (r *Report) Markdown() string {
	var b strings.Builder
	o, in := r.Options, r.inputs
	tr, pr := in.Trace, in.Prices
	fmt.Fprintf(&b, "# ferry sim\n\n")
	fmt.Fprintf(&b, "* **Trace**: %s: %d requests in one %.0f s pass, time-scaled ×%.3f (mean %.2f req/s, busiest minute %.2f req/s), looped over %v of warm-up and %v scored.\n",
		tr.Path, len(tr.Records), tr.Period, r.TimeScale, tr.MeanRate(r.TimeScale), tr.PeakRate(r.TimeScale), o.Warmup, o.Duration)
	r.spotLines(&b)
	m := o.Model
	fmt.Fprintf(&b, "* **Replica** (V100 16 GB, ~7B fp16, vLLM-like): cold start %v; KV cache %d tokens (= max_model_len); max %d sequences; prefill %v + %v/token; decode step %v + %v/sequence + %v/cached token.\n",
		m.ColdStart, m.KVCapacityTokens, m.MaxSeqs, m.PrefillBase, m.PrefillPerToken, m.DecodeBase, m.DecodePerSeq, m.DecodePerKVToken)
	fmt.Fprintf(&b, "* **SLO**: TTFT ≤ %v and TPOT ≤ %v; failed, rejected and unservable requests are misses.\n", o.SLO.TTFT, o.SLO.TPOT)
	how := "given"
	if r.Calibrated {
		how = fmt.Sprintf("calibrated: the highest steady Poisson rate per replica at which %d replicas meet the SLO for %.0f%% of requests", calibrationFleet, 100*calibrationAttainment)
	}
	fmt.Fprintf(&b, "* **Sizing**: min_replicas %d for every policy; target_qps_per_replica %.2f (%s); max_replicas %d.\n\n", o.Fleet, r.TargetQPS, how, r.MaxReplicas)

	b.WriteString("## Zones\n\n")
	zt := benchkit.Table{Header: []string{"zone", "price row", "spot $/h", "spot capacity in horizon: mean, share > 0 %", "price source"}}
	for _, z := range pr.Zones {
		src := "catalog"
		if z.PriceNote != "" {
			src = z.PriceNote
		}
		mean, share := capacityStats(z.Trace, o)
		zt.Rows = append(zt.Rows, []string{z.Name, z.AZID, fmt.Sprintf("%.4f", z.SpotPrice), fmt.Sprintf("%s, %.1f", mean, 100*share), src})
	}
	zt.Render(&b)

	b.WriteString("\n## Policies\n\n")
	for _, res := range r.Results {
		fmt.Fprintf(&b, "* `%s`: %s\n", res.Policy, res.Description)
	}
	b.WriteString("\n## Results\n\n")
	r.resultsTable().Render(&b)
	fmt.Fprintf(&b, "\navail %% is SpotHedge's: the share of 30 s ticks with at least %d READY replicas (min_replicas), the same for every policy; own %% counts ticks with the policy's own target (without spares) READY. cost $ is at catalog prices; norm. is SpotHedge's convention, spot h + 3 × on-demand h; both ÷ the ondemand policy's. Spares are in both costs. SLO %% counts every request of the horizon; TTFT percentiles are over served requests.\n", o.Fleet)

	if t := r.targets(); len(t.Rows) > 0 {
		b.WriteString("\n## Issue targets\n\n")
		t.Render(&b)
	}
	if r.Elapsed != "" {
		fmt.Fprintf(&b, "\nSimulated in %s.\n", r.Elapsed)
	}
	return b.String()
}

// spotLines describes the spot set, its reading and its prices.
func (r *Report) spotLines(b *strings.Builder) {
	o, pr := r.Options, r.inputs.Prices
	z0 := pr.Zones[0]
	reading := "values are counts: a launch beyond a zone's count is refused, a drop below what a policy holds reclaims the excess, newest first"
	if z0.Trace.Probe {
		reading = "values are 0/1 probes of one instance: 1 is read as capacity for any number (as SpotHedge's artifact reads its 1-node set), 0 reclaims every spot instance in the zone"
	}
	fmt.Fprintf(b, "* **Spot**: %s, %d %s zones, %g s ticks, from %v into the traces; %s. %s warns of a reclaim %v ahead, and only the instances it takes.\n",
		pr.Source, len(pr.Zones), strings.ToUpper(string(z0.Provider)), z0.Trace.Gap, o.SpotOffset, reading, cloudName(z0.Provider), o.Notice[z0.Provider])
	row := "zone letter k is AZ ID az<k> of its region"
	if z0.Provider == GCP {
		row = "regional prices (GCP's spot price is the same in every zone of a region), host + GPU rows"
	}
	fmt.Fprintf(b, "* **Prices** (%s, %s): on-demand $%.4f/h; %s.\n", o.CatalogDir, pr.InstanceType, pr.OnDemand, row)
	for _, n := range pr.Notes {
		fmt.Fprintf(b, "  * %s\n", n)
	}
}

func cloudName(p Provider) string {
	if p == GCP {
		return "Compute Engine"
	}
	return "EC2"
}

func (r *Report) resultsTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"policy", "avail %", "own %", "spot h", "on-demand h", "cost $", "÷ ondemand",
		"norm. cost", "÷ ondemand (norm.)", "preempt", "SLO %", "misses: none / short / full READY", "none READY: spells, min", "ups/downs", "TTFT p99 s", "failed", "rejected"}}
	for _, res := range r.Results {
		rel, relN := "–", "–"
		if res.CostVsOnDemand > 0 {
			rel, relN = fmt.Sprintf("%.3f", res.CostVsOnDemand), fmt.Sprintf("%.3f", res.NormalizedVsOnDemand)
		}
		t.Rows = append(t.Rows, []string{
			res.Policy,
			fmt.Sprintf("%.2f", 100*res.Availability),
			fmt.Sprintf("%.2f", 100*res.OwnTargetAvailability),
			fmt.Sprintf("%.1f", res.SpotHours),
			fmt.Sprintf("%.1f", res.OnDemandHours),
			fmt.Sprintf("%.0f", res.Cost),
			rel,
			fmt.Sprintf("%.0f", res.NormalizedCost),
			relN,
			fmt.Sprint(res.Preemptions),
			fmt.Sprintf("%.2f", 100*res.SLOAttainment),
			fmt.Sprintf("%d / %d / %d", res.Misses[missNoneReady], res.Misses[missShort], res.Misses[missFull]),
			fmt.Sprintf("%d, %.0f", res.NoneReadySpells, res.NoneReadySeconds/60),
			fmt.Sprintf("%d/%d", res.ScaleUps, res.ScaleDowns),
			fmt.Sprintf("%.2f", res.TTFTp99),
			fmt.Sprint(res.Failed),
			fmt.Sprint(res.Rejected + res.Unservable),
		})
	}
	return t
}

// targets checks the bar for the ferry policy: availability at least
// skyserve-spothedge's, cost at most its (at catalog prices and normalized), and at most half
// of all on-demand's.
func (r *Report) targets() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"target", "this run", "limit", "met"}}
	ferry, sky := r.result("ferry"), r.result("skyserve-spothedge")
	if ferry == nil {
		return t
	}
	if sky != nil {
		t.Rows = append(t.Rows, []string{"ferry availability % − skyserve-spothedge's", fmt.Sprintf("%+.2f", 100*(ferry.Availability-sky.Availability)), "≥ 0", yes(ferry.Availability >= sky.Availability)})
		if sky.Cost > 0 {
			ratio, norm := ferry.Cost/sky.Cost, ferry.NormalizedCost/sky.NormalizedCost
			t.Rows = append(t.Rows,
				[]string{"ferry cost ÷ skyserve-spothedge, catalog $", fmt.Sprintf("%.3f", ratio), "≤ 1", yes(ratio <= 1)},
				[]string{"ferry cost ÷ skyserve-spothedge, normalized", fmt.Sprintf("%.3f", norm), "≤ 1", yes(norm <= 1)})
		}
	}
	if ferry.CostVsOnDemand > 0 {
		t.Rows = append(t.Rows,
			[]string{"ferry cost ÷ ondemand, catalog $", fmt.Sprintf("%.3f", ferry.CostVsOnDemand), "≤ 0.5", yes(ferry.CostVsOnDemand <= 0.5)},
			[]string{"ferry cost ÷ ondemand, normalized", fmt.Sprintf("%.3f", ferry.NormalizedVsOnDemand), "≤ 0.5", yes(ferry.NormalizedVsOnDemand <= 0.5)})
	}
	return t
}

// result is the named policy's result, or nil.
func (r *Report) result(name string) *Result {
	for _, res := range r.Results {
		if res.Policy == name {
			return res
		}
	}
	return nil
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// capacityStats is a zone's mean spot capacity over the scored horizon ("any" for a probed
// zone) and the share of it with capacity.
func capacityStats(tr *SpotTrace, o Options) (mean string, share float64) {
	from := (o.SpotOffset + o.Warmup).Seconds()
	to := from + o.Duration.Seconds()
	up, n, sum := 0, 0, 0.0
	step := min(tr.Gap, time.Minute.Seconds())
	for t := from; t < to; t += step {
		n++
		c := tr.Capacity(t)
		if c > 0 {
			up++
		}
		sum += float64(min(c, 1000))
	}
	if n == 0 {
		return "–", 0
	}
	if tr.Probe {
		return "any", float64(up) / float64(n)
	}
	return fmt.Sprintf("%.1f", sum/float64(n)), float64(up) / float64(n)
}
