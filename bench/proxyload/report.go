package main

import (
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/loadgen"
	"github.com/ferryserve/ferry/bench/procstat"
)

// measurement is one scenario on one target in one repetition.
type measurement struct {
	Scenario   string          `json:"scenario"`
	Target     string          `json:"target"`
	Rep        int             `json:"rep"`
	Requests   int64           `json:"requests"`
	Errors     int64           `json:"errors"`
	FirstError string          `json:"first_error,omitempty"`
	ElapsedS   float64         `json:"elapsed_s"`
	RPS        float64         `json:"rps"`
	Latency    loadgen.Summary `json:"latency"`
	TTFB       loadgen.Summary `json:"ttfb"`
	// ProxyCPUUs is the proxy's CPU time per request in µs; zero for direct.
	ProxyCPUUs float64 `json:"proxy_cpu_us_per_req"`
	// ProxyCPUPct is the proxy's CPU time over wall time: near 100 means it was the bottleneck.
	ProxyCPUPct float64 `json:"proxy_cpu_pct"`
	// ProxyCoreBusy and LoadCoreBusy are whole-core busy shares from /proc/stat; a proxy core
	// much busier than ProxyCPUPct had foreign work on it.
	ProxyCoreBusy float64 `json:"proxy_core_busy_pct"`
	LoadCoreBusy  float64 `json:"load_core_busy_pct"`
}

func newMeasurement(scenario, target string, rep int, res *loadgen.Result, before, after cpuSnapshot, opts options) measurement {
	m := measurement{
		Scenario: scenario, Target: target, Rep: rep,
		Requests: res.Requests, Errors: res.Errors, FirstError: res.FirstError,
		ElapsedS: res.Elapsed.Seconds(), RPS: res.RequestsPerSecond(),
		Latency: res.Latency.Summarize(), TTFB: res.TTFB.Summarize(),
	}
	cpu := after.proxy - before.proxy
	wall := after.at.Sub(before.at)
	if res.Requests > 0 && target != targetDirect {
		m.ProxyCPUUs = float64(cpu) / float64(time.Microsecond) / float64(res.Requests)
	}
	if wall > 0 {
		m.ProxyCPUPct = 100 * float64(cpu) / float64(wall)
	}
	if opts.pinned() {
		m.ProxyCoreBusy = procstat.BusyPercent(before.cores[opts.proxyCPU], after.cores[opts.proxyCPU])
		m.LoadCoreBusy = procstat.BusyPercent(before.cores[opts.loadCPU], after.cores[opts.loadCPU])
	}
	return m
}

func (m measurement) oneLine() string {
	s := fmt.Sprintf("%8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d", m.RPS, m.Latency.P50Ms, m.Latency.P99Ms, m.Errors)
	if m.Target != targetDirect {
		s += fmt.Sprintf("  proxy %.1f µs/req (%.0f%% of a core)", m.ProxyCPUUs, m.ProxyCPUPct)
	}
	if m.FirstError != "" {
		s += "  first error: " + m.FirstError
	}
	return s
}

// manyStreams is the outcome of the memory test on one proxy.
type manyStreams struct {
	Target         string          `json:"target"`
	Streams        int             `json:"streams"`
	OK             int64           `json:"ok"`
	Errors         int64           `json:"errors"`
	FirstError     string          `json:"first_error,omitempty"`
	PeakInFlight   int64           `json:"peak_in_flight"`
	ElapsedS       float64         `json:"elapsed_s"`
	IdleRSSMiB     float64         `json:"idle_rss_mib"`
	PeakRSSMiB     float64         `json:"peak_rss_mib"`
	HWMMiB         float64         `json:"vm_hwm_mib"`
	CPUSeconds     float64         `json:"cpu_s"`
	CPUPerStreamUs float64         `json:"cpu_us_per_stream"`
	TTFB           loadgen.Summary `json:"ttfb"`
	Total          loadgen.Summary `json:"total"`
}

// report accumulates measurements and renders them.
type report struct {
	Started      time.Time      `json:"started"`
	Host         hostInfo       `json:"host"`
	Options      map[string]any `json:"options"`
	Measurements []measurement  `json:"measurements"`
	ManyStreams  []manyStreams  `json:"many_streams,omitempty"`
	opts         options
}

type hostInfo struct {
	CPUs         int    `json:"cpus"`
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end,omitempty"`
	GoVersion    string `json:"go_version"`
}

func newReport(opts options) *report {
	return &report{
		Started: time.Now(),
		Host:    hostInfo{CPUs: runtime.NumCPU(), LoadAvgStart: benchkit.LoadAvg(), GoVersion: runtime.Version()},
		Options: map[string]any{
			"duration": opts.duration.String(), "warmup": opts.warmup.String(), "requests_cap": opts.requests,
			"concurrency": opts.concurrency, "stream_concurrency": opts.streamConcurrency,
			"scenarios": opts.scenarios, "targets": opts.targets, "reps": opts.reps,
			"chunks": opts.chunks, "chunk_gap": opts.chunkGap.String(),
			"backends": opts.backends, "streams5k_backends": opts.streams5kBackends, "streams5k": opts.streams5k, "streams5k_gap": opts.streams5kGap.String(), "streams5k_ramp": opts.streams5kRamp.String(),
			"proxy_cpu": opts.proxyCPU, "load_cpu": opts.loadCPU, "ferry_policy": opts.ferryPolicy,
		},
		opts: opts,
	}
}

func (r *report) add(m measurement)            { r.Measurements = append(r.Measurements, m) }
func (r *report) addManyStreams(m manyStreams) { r.ManyStreams = append(r.ManyStreams, m) }

// median of xs; NaN when empty.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pick returns f of the measurements of scenario and target, in repetition order.
func (r *report) pick(scenario, target string, f func(measurement) float64) []float64 {
	var out []float64
	for _, m := range r.Measurements {
		if m.Scenario == scenario && m.Target == target {
			out = append(out, f(m))
		}
	}
	return out
}

// pairedRatio is the median over repetitions of f(target)/f(base) taken within each
// repetition: host speed drifts over minutes, and measurements of one repetition drift
// together, so the paired ratio is steadier than a ratio of medians. NaN when not measurable.
func (r *report) pairedRatio(scenario, target, base string, f func(measurement) float64) float64 {
	num, den := r.pick(scenario, target, f), r.pick(scenario, base, f)
	var ratios []float64
	for i := range min(len(num), len(den)) {
		if den[i] != 0 {
			ratios = append(ratios, num[i]/den[i])
		}
	}
	return median(ratios)
}

// pairedDiff is pairedRatio's difference: the median of f(target)-f(base) per repetition.
func (r *report) pairedDiff(scenario, target, base string, f func(measurement) float64) float64 {
	a, b := r.pick(scenario, target, f), r.pick(scenario, base, f)
	var diffs []float64
	for i := range min(len(a), len(b)) {
		diffs = append(diffs, a[i]-b[i])
	}
	return median(diffs)
}

var (
	fRPS      = func(m measurement) float64 { return m.RPS }
	fP50      = func(m measurement) float64 { return m.Latency.P50Ms }
	fP99      = func(m measurement) float64 { return m.Latency.P99Ms }
	fTTFB50   = func(m measurement) float64 { return m.TTFB.P50Ms }
	fTTFB99   = func(m measurement) float64 { return m.TTFB.P99Ms }
	fCPU      = func(m measurement) float64 { return m.ProxyCPUUs }
	fCPUPct   = func(m measurement) float64 { return m.ProxyCPUPct }
	fErrors   = func(m measurement) float64 { return float64(m.Errors) }
	fProxyBsy = func(m measurement) float64 { return m.ProxyCoreBusy }
	fLoadBsy  = func(m measurement) float64 { return m.LoadCoreBusy }
)

func num(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func (r *report) has(scenario, target string) bool {
	return len(r.pick(scenario, target, fRPS)) > 0
}

func (r *report) nonStreamTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"target", "req/s", "p50 ms", "p99 ms", "errors", "proxy CPU µs/req",
		"req/s ÷nginx", "p99 ÷nginx", "CPU/req ÷nginx", "proxy CPU % of core", "proxy core busy %", "load core busy %"}}
	for _, name := range r.opts.targets {
		if !r.has(scenarioNonStream, name) {
			continue
		}
		med := func(f func(measurement) float64) float64 { return median(r.pick(scenarioNonStream, name, f)) }
		cpu, cpuPct, vsRPS, vsP99, vsCPU := "—", "—", "—", "—", "—"
		if name != targetDirect {
			cpu, cpuPct = num(med(fCPU), 1), num(med(fCPUPct), 0)
			if r.has(scenarioNonStream, targetNginx) {
				vsRPS = num(r.pairedRatio(scenarioNonStream, name, targetNginx, fRPS), 2)
				vsP99 = num(r.pairedRatio(scenarioNonStream, name, targetNginx, fP99), 2)
				vsCPU = num(r.pairedRatio(scenarioNonStream, name, targetNginx, fCPU), 2)
			}
		}
		t.Rows = append(t.Rows, []string{name, num(med(fRPS), 0), num(med(fP50), 2), num(med(fP99), 2),
			num(med(fErrors), 0), cpu, vsRPS, vsP99, vsCPU, cpuPct, num(med(fProxyBsy), 0), num(med(fLoadBsy), 0)})
	}
	return t
}

func (r *report) streamTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"target", "streams/s", "TTFB p50 ms", "TTFB p99 ms", "TTFB p50 −direct ms",
		"total p50 ms", "total p99 ms", "errors", "proxy CPU µs/stream", "CPU/stream ÷nginx", "proxy CPU % of core",
		"proxy core busy %", "load core busy %"}}
	for _, name := range r.opts.targets {
		if !r.has(scenarioStream, name) {
			continue
		}
		med := func(f func(measurement) float64) float64 { return median(r.pick(scenarioStream, name, f)) }
		cpu, cpuPct, vsDirect, vsCPU := "—", "—", "—", "—"
		if name != targetDirect {
			cpu, cpuPct = num(med(fCPU), 1), num(med(fCPUPct), 0)
			if r.has(scenarioStream, targetDirect) {
				vsDirect = num(r.pairedDiff(scenarioStream, name, targetDirect, fTTFB50), 3)
			}
			if r.has(scenarioStream, targetNginx) {
				vsCPU = num(r.pairedRatio(scenarioStream, name, targetNginx, fCPU), 2)
			}
		}
		t.Rows = append(t.Rows, []string{name, num(med(fRPS), 0), num(med(fTTFB50), 3), num(med(fTTFB99), 3), vsDirect,
			num(med(fP50), 2), num(med(fP99), 2), num(med(fErrors), 0), cpu, vsCPU, cpuPct,
			num(med(fProxyBsy), 0), num(med(fLoadBsy), 0)})
	}
	return t
}

func (r *report) manyStreamsTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"target", "streams", "ok", "errors", "peak in flight", "idle RSS MiB",
		"peak RSS MiB", "VmHWM MiB", "CPU µs/stream", "TTFB p50 ms", "TTFB p99 ms"}}
	for _, m := range r.ManyStreams {
		t.Rows = append(t.Rows, []string{m.Target, fmt.Sprint(m.Streams), fmt.Sprint(m.OK), fmt.Sprint(m.Errors),
			fmt.Sprint(m.PeakInFlight), num(m.IdleRSSMiB, 1), num(m.PeakRSSMiB, 1), num(m.HWMMiB, 1),
			num(m.CPUPerStreamUs, 1), num(m.TTFB.P50Ms, 2), num(m.TTFB.P99Ms, 2)})
	}
	return t
}

// check is one of the targets, evaluated on this run.
type check struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit string  `json:"limit"`
	Pass  bool    `json:"pass"`
}

// checks evaluates the targets the issue sets for Ferry, skipping those the run has no data for.
func (r *report) checks() []check {
	var out []check
	add := func(name string, v float64, limit string, pass bool) {
		if !math.IsNaN(v) {
			out = append(out, check{Name: name, Value: v, Limit: limit, Pass: pass})
		}
	}
	if r.has(scenarioNonStream, targetFerry) && r.has(scenarioNonStream, targetNginx) {
		v := r.pairedRatio(scenarioNonStream, targetFerry, targetNginx, fCPU)
		add("non-streamed: ferry CPU/req ÷ nginx", v, "≤ 0.75", v <= 0.75)
		v = r.pairedRatio(scenarioNonStream, targetFerry, targetNginx, fRPS)
		add("non-streamed: ferry req/s ÷ nginx", v, "≥ 1.00", v >= 1)
		v = r.pairedRatio(scenarioNonStream, targetFerry, targetNginx, fP99)
		add("non-streamed: ferry p99 ÷ nginx", v, "≤ 1.00", v <= 1)
	}
	if r.has(scenarioNonStream, targetPass) && r.has(scenarioNonStream, targetNginx) {
		// Not targets: where Ferry's cost goes. The first is fasthttp's and Go's floor, the
		// second Ferry's own work on top of it.
		v := r.pairedRatio(scenarioNonStream, targetPass, targetNginx, fCPU)
		add("non-streamed: passthrough CPU/req ÷ nginx (fasthttp's floor; informational)", v, noLimit, true)
	}
	if r.has(scenarioNonStream, targetEpoll) && r.has(scenarioNonStream, targetNginx) {
		v := r.pairedRatio(scenarioNonStream, targetEpoll, targetNginx, fCPU)
		add("non-streamed: epoll CPU/req ÷ nginx (an event loop's floor in Go; informational)", v, noLimit, true)
	}
	if r.has(scenarioNonStream, targetFerry) && r.has(scenarioNonStream, targetPass) {
		v := r.pairedRatio(scenarioNonStream, targetFerry, targetPass, fCPU)
		add("non-streamed: ferry CPU/req ÷ passthrough (Ferry's own work; informational)", v, noLimit, true)
	}
	if r.has(scenarioStream, targetFerry) && r.has(scenarioStream, targetDirect) {
		v := r.pairedDiff(scenarioStream, targetFerry, targetDirect, fTTFB50)
		add("streams: ferry TTFB p50 − direct (ms)", v, "≤ 0.100", v <= 0.1)
	}
	if r.has(scenarioStream, targetFerry) && r.has(scenarioStream, targetNginx) {
		v := r.pairedRatio(scenarioStream, targetFerry, targetNginx, fCPU)
		add("streams: ferry CPU/stream ÷ nginx", v, "≤ 0.80", v <= 0.8)
	}
	for _, scenario := range allScenarios {
		if r.has(scenario, targetFerryOTLP) && r.has(scenario, targetFerry) {
			v := r.pairedDiff(scenario, targetFerryOTLP, targetFerry, fCPU)
			add(scenario+": ferry-otlp CPU µs/req − ferry (every request traced)", v, noLimit, true)
		}
	}
	for _, m := range r.ManyStreams {
		if m.Target != targetFerry {
			continue
		}
		peak := max(m.PeakRSSMiB, m.HWMMiB)
		ok := m.Errors == 0 && m.PeakInFlight >= int64(m.Streams)
		add(fmt.Sprintf("%d streams: ferry peak RSS MiB (all open at once, no errors: %v)", m.Streams, ok), peak, "≤ 250", ok && peak <= 250)
	}
	return out
}

// noLimit is the limit of a check that only informs.
const noLimit = "—"

func (r *report) checksTable() *benchkit.Table {
	t := &benchkit.Table{Header: []string{"target", "this run", "limit", "met"}}
	for _, c := range r.checks() {
		met := "no"
		switch {
		case c.Limit == noLimit:
			met = noLimit // a figure to read beside the targets, not one
		case c.Pass:
			met = "yes"
		}
		t.Rows = append(t.Rows, []string{c.Name, num(c.Value, 3), c.Limit, met})
	}
	return t
}

// render writes the whole report as markdown.
func (r *report) render(w io.Writer) {
	fmt.Fprintf(w, "# proxyload: %s\n\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "Host: %d CPUs, load average %s at start, %s at end; %s. Proxies pinned to CPU %d, load generator and backend to CPU %d (-1: unpinned).\n",
		r.Host.CPUs, r.Host.LoadAvgStart, r.Host.LoadAvgEnd, r.Host.GoVersion, r.opts.proxyCPU, r.opts.loadCPU)
	fmt.Fprintf(w, "Each measurement: %v after %v warm-up (cap %d requests), %d repetition(s); medians, ratios paired within a repetition. Proxies balance over %d backend port(s); direct uses the first.\n\n",
		r.opts.duration, r.opts.warmup, r.opts.requests, r.opts.reps, r.opts.backends)
	if slices.Contains(r.opts.scenarios, scenarioNonStream) {
		fmt.Fprintf(w, "## Non-streamed POST /v1/chat/completions, concurrency %d (~%d-byte reply)\n\n", r.opts.concurrency, len(completionReply))
		r.nonStreamTable().Render(w)
		fmt.Fprintln(w)
	}
	if slices.Contains(r.opts.scenarios, scenarioStream) {
		fmt.Fprintf(w, "## SSE streams, concurrency %d (%d chunks, %v apart)\n\n", r.opts.streamConcurrency, r.opts.chunks, r.opts.chunkGap)
		r.streamTable().Render(w)
		fmt.Fprintln(w)
	}
	if len(r.ManyStreams) > 0 {
		fmt.Fprintf(w, "## %d concurrent SSE streams over %d backend port(s) (%d chunks, %v apart, opened over %v)\n\n",
			r.opts.streams5k, r.opts.streams5kBackends, manyStreamsChunks, r.opts.streams5kGap, r.opts.streams5kRamp)
		r.manyStreamsTable().Render(w)
		fmt.Fprintln(w)
	}
	if t := r.checksTable(); len(t.Rows) > 0 {
		fmt.Fprintf(w, "## Issue targets (one run on a shared machine: indicative)\n\n")
		t.Render(w)
		fmt.Fprintln(w)
	}
	var errs []string
	for _, m := range r.Measurements {
		if m.FirstError != "" {
			errs = append(errs, fmt.Sprintf("- %s/%s rep %d: %d errors, first: %s", m.Scenario, m.Target, m.Rep+1, m.Errors, m.FirstError))
		}
	}
	for _, m := range r.ManyStreams {
		if m.FirstError != "" {
			errs = append(errs, fmt.Sprintf("- %d streams/%s: %d errors, first: %s", m.Streams, m.Target, m.Errors, m.FirstError))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "## Errors\n\n%s\n", strings.Join(errs, "\n"))
	}
}

// write prints the report to stdout and saves summary.md and results.json under dir.
func (r *report) write(stdout io.Writer, dir string) error {
	r.Host.LoadAvgEnd = benchkit.LoadAvg()
	var md strings.Builder
	r.render(&md)
	return benchkit.WriteReport(stdout, dir, md.String(), struct {
		*report
		Checks []check `json:"checks"`
	}{r, r.checks()})
}
