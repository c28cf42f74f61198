package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// report is what the phases measured, and the bars they are judged by.
type report struct {
	Started time.Time
	Options string
	YAML    string
	Host    map[string]any

	Fair   fairResult
	Budget budgetResult
	Shed   shedResult
	Usage  usageResult
	CPU    cpuResult
}

type fairResult struct {
	// Light TTFT, alone and under the heavy tenant's load with its own key, and the same light
	// load under the heavy tenant's key (one line, first come first served).
	Unloaded, Loaded, SameKey latency
	// HeavyAnswered and HeavyP50 show the heavy tenant kept the fleet saturated.
	HeavyAnswered int
	HeavyP50      time.Duration
	Ratio         float64 // Loaded.P99 / Unloaded.P99
	Pass          bool
}

type latency struct {
	N             int
	Failed        int
	P50, P90, P99 time.Duration
}

type budgetResult struct {
	Limit, Admitted   int64 // total tokens per day; tokens the answered requests used
	Answered, Refused int
	// BadRefusals are refusals without a 429, Retry-After or the token headers.
	BadRefusals int
	Sample      map[string]string
	Over        float64 // Admitted / Limit − 1
	Pass        bool
}

type shedResult struct {
	Batch, Interactive classCount
	Pass               bool
}

type classCount struct {
	Sent, OK, Shed, Other int
}

type usageResult struct {
	// Per key: what the replicas reported in answers, and what `ferry usage` says.
	Reported, Recorded map[string][2]int64
	Pass               bool
}

func (b *bench) runPhases(ctx context.Context, rep *report, progress func(string, ...any)) error {
	rng := rand.New(rand.NewPCG(7, 41))
	all := b.setup
	o := b.opts

	if o.runs(phaseFair) {
		progress("fair share: the light tenant alone, %.1f requests/s for %v", o.lightRate, o.phase/4)
		unloaded := b.openLoop(ctx, o.lightRate, o.phase/4, "light", rng)
		all = append(all, unloaded...)

		progress("fair share: %d heavy streams and the light tenant, for %v", o.heavyWorkers, o.phase)
		heavy, light := b.underLoad(ctx, o.phase, "light", rng)
		all = append(append(all, heavy...), light...)
		progress("fair share: the same light load under the heavy tenant's key, for %v", o.phase/2)
		heavy2, sameKey := b.underLoad(ctx, o.phase/2, "heavy", rng)
		all = append(append(all, heavy2...), sameKey...)
		rep.Fair = judgeFair(unloaded, light, sameKey, heavy)
	}

	if o.runs(phaseBudget) {
		progress("budget: 16 workers spend %d tokens through both proxies", o.budgetTokens)
		var refusedRun int
		capped := b.closedLoop(ctx, 3*time.Minute, 16, "capped", false, func(r result) bool {
			if r.Status == 429 {
				refusedRun++
			} else {
				refusedRun = 0
			}
			return refusedRun >= 64
		})
		all = append(all, capped...)
		rep.Budget = judgeBudget(capped, o.budgetTokens)
	}

	if o.runs(phaseShed) {
		perProxy := o.replicas*o.maxNumSeqs/2 + 32
		progress("shedding: %d batch and 8 interactive streams on a queue of 32 per proxy, for %v", 2*perProxy+16, o.phase/2)
		shed := b.flood(ctx, o.phase/2, 2*perProxy+16)
		all = append(all, shed...)
		rep.Shed = judgeShed(shed)
	}

	progress("usage: ferry usage against the answers' usage")
	time.Sleep(4 * time.Second) // a proxy sync (250 ms) and a persist (2 s)
	out, err := b.f.Run(ctx, "usage", time.Minute, "usage", "--json", "--by", "key")
	if err != nil {
		return fmt.Errorf("ferry usage: %w\n%s", err, out)
	}
	if rep.Usage, err = judgeUsage(all, out); err != nil {
		return err
	}
	if o.runs(phaseCPU) { // last: its keys' requests are not in the usage check
		rep.CPU, err = b.measureCPU(ctx, progress)
	}
	return err
}

// underLoad runs the heavy tenant's streams for d and, from a tenth of d on (once the queue is
// full), the light load at its rate under keyName.
func (b *bench) underLoad(ctx context.Context, d time.Duration, keyName string, rng *rand.Rand) (heavy, light []result) {
	done := make(chan []result)
	go func() { done <- b.closedLoop(ctx, d, b.opts.heavyWorkers, "heavy", true, nil) }()
	time.Sleep(d / 10)
	light = b.openLoop(ctx, b.opts.lightRate, d-d/5, keyName, rng)
	return <-done, light
}

// flood runs batch and interactive streams together.
func (b *bench) flood(ctx context.Context, d time.Duration, batchWorkers int) []result {
	done := make(chan []result)
	go func() { done <- b.closedLoop(ctx, d, batchWorkers, "bulk", true, nil) }()
	interactive := b.closedLoop(ctx, d, 8, "urgent", true, nil)
	return append(<-done, interactive...)
}

func latencyOf(rs []result) latency {
	var ds []time.Duration
	l := latency{}
	for _, r := range rs {
		if r.Status != 200 || r.Err != "" {
			l.Failed++
			continue
		}
		ds = append(ds, r.TTFT)
	}
	slices.Sort(ds)
	l.N = len(ds)
	q := func(p float64) time.Duration {
		if len(ds) == 0 {
			return 0
		}
		return ds[min(len(ds)-1, int(p*float64(len(ds))))]
	}
	l.P50, l.P90, l.P99 = q(0.5), q(0.9), q(0.99)
	return l
}

func judgeFair(unloaded, loaded, sameKey, heavy []result) fairResult {
	f := fairResult{Unloaded: latencyOf(unloaded), Loaded: latencyOf(loaded), SameKey: latencyOf(sameKey)}
	h := latencyOf(heavy)
	f.HeavyAnswered, f.HeavyP50 = h.N, h.P50
	if f.Unloaded.P99 > 0 {
		f.Ratio = float64(f.Loaded.P99) / float64(f.Unloaded.P99)
	}
	f.Pass = f.Ratio > 0 && f.Ratio <= 1.5 && f.Loaded.Failed == 0 && f.Unloaded.Failed == 0
	return f
}

func judgeBudget(rs []result, limit int64) budgetResult {
	b := budgetResult{Limit: limit}
	for _, r := range rs {
		switch {
		case r.Status == 200:
			b.Answered++
			b.Admitted += r.In + r.Out
		case r.Status == 429:
			b.Refused++
			h := r.Headers
			if h["Retry-After"] == "" || h["X-Ratelimit-Limit-Tokens"] != fmt.Sprint(limit) || h["X-Ratelimit-Remaining-Tokens"] == "" || h["X-Ratelimit-Reset-Tokens"] == "" {
				b.BadRefusals++
			}
			if b.Sample == nil {
				b.Sample = h
			}
		default:
			b.BadRefusals++
		}
	}
	b.Over = float64(b.Admitted)/float64(limit) - 1
	b.Pass = b.Over <= 0.05 && b.Over >= -0.05 && b.Refused > 0 && b.BadRefusals == 0
	return b
}

func judgeShed(rs []result) shedResult {
	var s shedResult
	for _, r := range rs {
		c := &s.Batch
		if r.Key == "urgent" {
			c = &s.Interactive
		}
		c.Sent++
		switch {
		case r.Status == 200 && r.Err == "":
			c.OK++
		case r.Status == 503:
			c.Shed++
		default:
			c.Other++
		}
	}
	s.Pass = s.Batch.Shed > 0 && s.Interactive.Shed == 0 && s.Interactive.Other == 0
	return s
}

// judgeUsage compares each key's tokens in the answers with `ferry usage --json --by key`.
func judgeUsage(rs []result, usageJSON string) (usageResult, error) {
	u := usageResult{Reported: map[string][2]int64{}, Recorded: map[string][2]int64{}}
	for _, r := range rs {
		t := u.Reported[r.Key]
		u.Reported[r.Key] = [2]int64{t[0] + r.In, t[1] + r.Out}
	}
	var rep struct {
		Lines []struct {
			KeyName      string `json:"key_name"`
			InputTokens  int64  `json:"input_tokens"`
			OutputTokens int64  `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(usageJSON[strings.Index(usageJSON, "{"):]), &rep); err != nil {
		return u, fmt.Errorf("ferry usage --json: %w", err)
	}
	for _, l := range rep.Lines {
		u.Recorded[l.KeyName] = [2]int64{l.InputTokens, l.OutputTokens}
	}
	u.Pass = len(u.Reported) > 0
	for k, v := range u.Reported {
		if u.Recorded[k] != v {
			u.Pass = false
		}
	}
	return u, nil
}

func pass(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Tenants: managed keys through two attached proxies\n\nStarted %s; host %v.\n\n", r.Started.Format(time.RFC3339), r.Host)
	if f := r.Fair; f.Unloaded.N+f.Unloaded.Failed > 0 {
		t := benchkit.Table{Header: []string{"light tenant's TTFT", "requests", "p50", "p90", "p99", "failed"}}
		for _, row := range []struct {
			name string
			l    latency
		}{{"alone", f.Unloaded}, {"heavy tenant saturating, own key", f.Loaded}, {"heavy tenant saturating, heavy's key (one line)", f.SameKey}} {
			t.Rows = append(t.Rows, []string{row.name, fmt.Sprint(row.l.N), ms(row.l.P50), ms(row.l.P90), ms(row.l.P99), fmt.Sprint(row.l.Failed)})
		}
		t.Render(&b)
		fmt.Fprintf(&b, "\nHeavy tenant: %d streams answered, TTFT p50 %s. Light p99 loaded ÷ alone: **%.2f** (bar ≤ 1.5: %s).\n\n",
			f.HeavyAnswered, ms(f.HeavyP50), f.Ratio, pass(f.Pass))
	}
	if bu := r.Budget; bu.Answered+bu.Refused > 0 {
		fmt.Fprintf(&b, "Budget: %d tokens a day; %d admitted in %d answers across both proxies (%+.1f%%; bar within 5%%: %s); %d refused with 429, %d refusals missing a header. A refusal's headers: %v\n\n",
			bu.Limit, bu.Admitted, bu.Answered, 100*bu.Over, pass(bu.Pass), bu.Refused, bu.BadRefusals, bu.Sample)
	}
	if s := r.Shed; s.Batch.Sent+s.Interactive.Sent > 0 {
		fmt.Fprintf(&b, "Shedding: batch %d sent, %d answered, %d shed (503), %d other; interactive %d sent, %d answered, %d shed, %d other (bar: batch shed first, no interactive shed: %s).\n\n",
			s.Batch.Sent, s.Batch.OK, s.Batch.Shed, s.Batch.Other, s.Interactive.Sent, s.Interactive.OK, s.Interactive.Shed, s.Interactive.Other, pass(s.Pass))
	}
	fmt.Fprintf(&b, "Usage: input/output tokens per key, from the answers → from `ferry usage`: ")
	keys := make([]string, 0, len(r.Usage.Reported))
	for k := range r.Usage.Reported {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %v → %v; ", k, r.Usage.Reported[k], r.Usage.Recorded[k])
	}
	fmt.Fprintf(&b, "(bar: equal: %s).\n", pass(r.Usage.Pass))
	if c := r.CPU; len(c.Rounds) > 0 {
		fmt.Fprintf(&b, "\nThe proxy's CPU per request (two attached proxies at once, one under each key, roles swapped each round; at most %d requests a key a round, %d at a time each):\n\n", c.Requests, cpuWorkers)
		t := benchkit.Table{Header: []string{"round", "managed on", "own key", "managed key", "ratio", "own key req/s", "managed key req/s"}}
		for i, rd := range c.Rounds {
			t.Rows = append(t.Rows, []string{fmt.Sprint(i + 1), fmt.Sprintf("proxy %d", rd.ManagedProxy), us(rd.Own), us(rd.Managed),
				fmt.Sprintf("%.3f", rd.Ratio), fmt.Sprintf("%.0f", rd.OwnRate), fmt.Sprintf("%.0f", rd.ManagedRate)})
		}
		t.Render(&b)
		pairs := make([]string, len(c.Pairs))
		for i, p := range c.Pairs {
			pairs[i] = fmt.Sprintf("%.3f", p)
		}
		fmt.Fprintf(&b, "\nPairs of rounds (geometric means): %s. Median **%.3f** (bar ≤ %.2f: %s). A managed key's answer carries %v.\n",
			strings.Join(pairs, ", "), c.Median, cpuBar, pass(c.Pass), c.Headers)
	}
	return b.String()
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
