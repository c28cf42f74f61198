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
	fmt.Fprintf(&b, "* **Trace**: %s: %d requests in one %.0f s pass (mean %.2f req/s, busiest minute %.2f req/s at time-scale %g), looped over %v of warm-up and %v scored.\n",
		tr.Path, len(tr.Records), tr.Period, tr.MeanRate(o.TimeScale), tr.PeakRate(o.TimeScale), o.TimeScale, o.Warmup, o.Duration)
	gap := pr.Zones[0].Trace.Gap
	fmt.Fprintf(&b, "* **Spot**: %s, %d zones of %s, %g s ticks; the simulation starts %v into the traces. A value > 0 is read as capacity for any number of spot replicas in the zone, 0 as none (replicas there are preempted, launches refused).\n",
		o.SpotDir, len(pr.Zones), pr.InstanceType, gap, o.SpotOffset)
	fmt.Fprintf(&b, "* **Prices** (%s): on-demand $%.4f/h. Zone letter k is AZ ID az<k> of its region.\n", o.CatalogPath, pr.OnDemand)
	for _, n := range pr.Notes {
		fmt.Fprintf(&b, "  * %s\n", n)
	}
	m := o.Model
	fmt.Fprintf(&b, "* **Replica** (V100 16 GB, ~7B fp16, vLLM-like): cold start %v; KV cache %d tokens (= max_model_len); max %d sequences; prefill %v + %v/token; decode step %v + %v/sequence + %v/cached token.\n",
		m.ColdStart, m.KVCapacityTokens, m.MaxSeqs, m.PrefillBase, m.PrefillPerToken, m.DecodeBase, m.DecodePerSeq, m.DecodePerKVToken)
	fmt.Fprintf(&b, "* **SLO**: TTFT ≤ %v and TPOT ≤ %v; failed, rejected and unservable requests are misses.\n", o.SLO.TTFT, o.SLO.TPOT)
	how := "given"
	if r.Calibrated {
		how = fmt.Sprintf("calibrated: the highest steady Poisson rate per replica at which %d replicas meet the SLO for %.0f%% of requests", calibrationFleet, 100*calibrationAttainment)
	}
	fmt.Fprintf(&b, "* **Sizing**: target_qps_per_replica %.2f (%s); fixed-peak %d replicas; max_replicas %d.\n\n", r.TargetQPS, how, r.PeakReplicas, r.MaxReplicas)

	b.WriteString("## Zones\n\n")
	zt := benchkit.Table{Header: []string{"zone", "AZ ID", "spot $/h", "spot capacity in horizon %", "price source"}}
	for _, z := range pr.Zones {
		src := "catalog"
		if z.PriceNote != "" {
			src = z.PriceNote
		}
		zt.Rows = append(zt.Rows, []string{z.Name, z.AZID, fmt.Sprintf("%.4f", z.SpotPrice),
			fmt.Sprintf("%.1f", 100*capacityShare(z.Trace, o)), src})
	}
	zt.Render(&b)

	b.WriteString("\n## Policies\n\n")
	for _, res := range r.Results {
		fmt.Fprintf(&b, "* `%s`: %s\n", res.Policy, res.Description)
	}
	b.WriteString("\n## Results\n\n")
	r.resultsTable().Render(&b)
	b.WriteString("\nSLO % counts every request of the horizon; availability % is the share of 30 s ticks with at least the policy's own target READY; norm. cost is spot h + 3 × on-demand h (SpotHedge's); TTFT percentiles are over served requests.\n")

	if t := r.targets(); len(t.Rows) > 0 {
		b.WriteString("\n## Issue targets\n\n")
		t.Render(&b)
	}
	if r.Elapsed != "" {
		fmt.Fprintf(&b, "\nSimulated in %s.\n", r.Elapsed)
	}
	return b.String()
}

func (r *Report) resultsTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"policy", "SLO %", "avail %", "spot h", "on-demand h", "cost $", "÷ ondemand",
		"norm. cost", "preempt", "ups/downs", "TTFT p50 s", "TTFT p99 s", "TPOT p99 ms", "failed", "rejected"}}
	for _, res := range r.Results {
		rel := "–"
		if res.CostVsOnDemand > 0 {
			rel = fmt.Sprintf("%.3f", res.CostVsOnDemand)
		}
		t.Rows = append(t.Rows, []string{
			res.Policy,
			fmt.Sprintf("%.2f", 100*res.SLOAttainment),
			fmt.Sprintf("%.2f", 100*res.Availability),
			fmt.Sprintf("%.1f", res.SpotHours),
			fmt.Sprintf("%.1f", res.OnDemandHours),
			fmt.Sprintf("%.0f", res.Cost),
			rel,
			fmt.Sprintf("%.0f", res.NormalizedCost),
			fmt.Sprint(res.Preemptions),
			fmt.Sprintf("%d/%d", res.ScaleUps, res.ScaleDowns),
			fmt.Sprintf("%.2f", res.TTFTp50),
			fmt.Sprintf("%.2f", res.TTFTp99),
			fmt.Sprintf("%.0f", 1000*res.TPOTp99),
			fmt.Sprint(res.Failed),
			fmt.Sprint(res.Rejected + res.Unservable),
		})
	}
	return t
}

// targets checks the bar for the ferry policy: ≥ 99% SLO attainment and availability,
// no dearer than skyserve-spothedge, and at least 50% cheaper than all on-demand.
func (r *Report) targets() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"target", "this run", "limit", "met"}}
	get := func(name string) *Result {
		for _, res := range r.Results {
			if res.Policy == name {
				return res
			}
		}
		return nil
	}
	ferry := get("ferry")
	if ferry == nil {
		return t
	}
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "no"
	}
	t.Rows = append(t.Rows,
		[]string{"ferry SLO attainment %", fmt.Sprintf("%.2f", 100*ferry.SLOAttainment), "≥ 99", yes(ferry.SLOAttainment >= 0.99)},
		[]string{"ferry availability %", fmt.Sprintf("%.2f", 100*ferry.Availability), "≥ 99", yes(ferry.Availability >= 0.99)})
	if sky := get("skyserve-spothedge"); sky != nil && sky.Cost > 0 {
		ratio := ferry.Cost / sky.Cost
		t.Rows = append(t.Rows, []string{"ferry cost ÷ skyserve-spothedge", fmt.Sprintf("%.3f", ratio), "≤ 1", yes(ratio <= 1)})
	}
	if ferry.CostVsOnDemand > 0 {
		t.Rows = append(t.Rows, []string{"ferry cost ÷ ondemand", fmt.Sprintf("%.3f", ferry.CostVsOnDemand), "≤ 0.5", yes(ferry.CostVsOnDemand <= 0.5)})
	}
	return t
}

// capacityShare is the share of the simulated time (warm-up excluded) a zone had spot capacity.
func capacityShare(tr *SpotTrace, o Options) float64 {
	from := (o.SpotOffset + o.Warmup).Seconds()
	to := from + o.Duration.Seconds()
	up, n := 0, 0
	step := min(tr.Gap, time.Minute.Seconds())
	for t := from; t < to; t += step {
		n++
		if tr.Available(t) {
			up++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(up) / float64(n)
}
