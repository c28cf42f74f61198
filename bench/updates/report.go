package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/loadgen"
)

// maxFailuresKept is how many failures a scenario lists with their reasons.
const maxFailuresKept = 5

// Load phases, by when a request started: before the update command, while the rollout ran,
// after it ended.
const (
	phaseBefore = "before"
	phaseDuring = "during"
	phaseAfter  = "after"
)

// phaseStats is the load of one phase.
type phaseStats struct {
	Requests int `json:"requests"`
	Failed   int `json:"failed"`
	// Models counts successful requests by the model (version) that answered.
	Models map[string]int `json:"models"`
	// Latencies of successful requests, to the end of the body or stream.
	Plain  loadgen.Summary `json:"plain_latency"`
	Stream loadgen.Summary `json:"stream_latency"`
}

// failure is one failed request.
type failure struct {
	// AtS is when it started, in seconds since the update command started.
	AtS    float64 `json:"at_s"`
	Phase  string  `json:"phase"`
	Stream bool    `json:"stream"`
	Model  string  `json:"model,omitempty"`
	Err    string  `json:"error"`
}

// stray is a request answered by the wrong version after the rollout ended.
type stray struct {
	// AfterEndMs is how long after the rollout was seen to end it started.
	AfterEndMs float64 `json:"after_end_ms"`
	Model      string  `json:"model"`
	Stream     bool    `json:"stream"`
}

// recordJSON is a request as results.json keeps it.
type recordJSON struct {
	// StartS is in seconds since the update command started (negative before it).
	StartS    float64 `json:"start_s"`
	LatencyMs float64 `json:"latency_ms"`
	Stream    bool    `json:"stream"`
	Model     string  `json:"model,omitempty"`
	Err       string  `json:"error,omitempty"`
}

// scenarioResult is everything one scenario measured, and its verdict.
type scenarioResult struct {
	Key    string `json:"key"`
	Title  string `json:"title"`
	Target string `json:"target"`
	// Error is what kept the driver from completing the scenario.
	Error  string   `json:"error,omitempty"`
	Passed bool     `json:"passed"`
	Why    []string `json:"why_failed,omitempty"`
	// Notes are further findings that do not decide the verdict.
	Notes []string `json:"notes,omitempty"`

	WantState     string `json:"want_state"`
	State         string `json:"state"`
	RolloutReason string `json:"rollout_reason,omitempty"`
	WantModel     string `json:"want_model_after"`
	// UpdateExit is `ferry serve update`'s exit status (-1: it did not exit or never ran).
	UpdateExit   int    `json:"update_exit"`
	UpdateOutput string `json:"update_output,omitempty"`
	// RolloutWallS runs from starting `ferry serve update` to seeing the rollout end;
	// ControllerRolloutS is the controller's own started_at to finished_at.
	RolloutWallS       float64 `json:"rollout_wall_s"`
	ControllerRolloutS float64 `json:"controller_rollout_s"`
	// KillAtS is when the controller was SIGKILLed, since the update started, and
	// ControllerDownS how long until its successor answered.
	KillAtS         float64 `json:"controller_killed_at_s,omitempty"`
	ControllerDownS float64 `json:"controller_down_s,omitempty"`

	Requests int        `json:"requests"`
	Failed   int        `json:"failed"`
	Before   phaseStats `json:"before"`
	During   phaseStats `json:"during"`
	After    phaseStats `json:"after"`
	// FirstNewAtS is when the first request the new version answered started, since the
	// update started; OldAfterFirstNew counts requests the old version answered that started
	// later (blue-green should have few: only those racing the switch).
	FirstNewAtS      *float64 `json:"first_new_version_at_s"`
	OldAfterFirstNew int      `json:"old_version_after_first_new"`
	// Strays are the successful requests that started after the rollout was seen to end and
	// were answered by another version than WantModel. Those within SettleMs of the end are
	// reported; later ones fail the scenario.
	Strays   []stray   `json:"strays"`
	SettleMs float64   `json:"settle_ms"`
	Failures []failure `json:"first_failures"`
	// NewLaunchedAtS and NewReadyAtS are when the driver first saw a replica of the new version
	// (any state) and a READY one, since the update started; 0 if never.
	NewLaunchedAtS float64 `json:"new_replica_seen_at_s"`
	NewReadyAtS    float64 `json:"new_replica_ready_at_s"`
	// ReadyAtEnd counts READY replicas by Ferry version after the scenario; ProcessesAtEnd
	// the live replica processes by the version they were launched as.
	ReadyAtEnd     map[int]int  `json:"ready_at_end"`
	ProcessesAtEnd map[int]int  `json:"processes_at_end"`
	Records        []recordJSON `json:"records"`
}

// aggregate fills the load figures from records. A request belongs to the phase in which it
// started: before updateStart, up to rolloutEnd, or after. oldModel and newModel are the
// versions the update goes from and to; r.WantModel the one that may answer after it.
func (r *scenarioResult) aggregate(records []record, updateStart, rolloutEnd time.Time, oldModel, newModel string) {
	records = slices.Clone(records)
	sort.SliceStable(records, func(i, j int) bool { return records[i].Start.Before(records[j].Start) })
	type hists struct{ plain, stream loadgen.Histogram }
	var h [3]hists
	phases := [3]*phaseStats{&r.Before, &r.During, &r.After}
	for _, p := range phases {
		p.Models = map[string]int{}
	}
	r.Requests, r.Failed, r.Failures, r.Strays, r.Records = 0, 0, nil, nil, make([]recordJSON, 0, len(records))
	var firstNew time.Time
	for _, rec := range records {
		i := 1
		switch {
		case rec.Start.Before(updateStart):
			i = 0
		case rec.Start.After(rolloutEnd):
			i = 2
		}
		p := phases[i]
		at := rec.Start.Sub(updateStart).Seconds()
		r.Records = append(r.Records, recordJSON{StartS: at, LatencyMs: loadgen.Ms(rec.Latency), Stream: rec.Stream, Model: rec.Model, Err: rec.Err})
		r.Requests++
		p.Requests++
		if rec.Err != "" {
			r.Failed++
			p.Failed++
			if len(r.Failures) < maxFailuresKept {
				r.Failures = append(r.Failures, failure{AtS: at, Phase: phaseName(i), Stream: rec.Stream, Model: rec.Model, Err: rec.Err})
			}
			continue
		}
		p.Models[rec.Model]++
		if i == 2 && rec.Model != r.WantModel {
			r.Strays = append(r.Strays, stray{AfterEndMs: loadgen.Ms(rec.Start.Sub(rolloutEnd)), Model: rec.Model, Stream: rec.Stream})
		}
		if rec.Stream {
			h[i].stream.Record(rec.Latency)
		} else {
			h[i].plain.Record(rec.Latency)
		}
		switch {
		case rec.Model == newModel && firstNew.IsZero():
			firstNew = rec.Start
			v := at
			r.FirstNewAtS = &v
		case rec.Model == oldModel && !firstNew.IsZero() && rec.Start.After(firstNew):
			r.OldAfterFirstNew++
		}
	}
	for i, p := range phases {
		p.Plain, p.Stream = h[i].plain.Summarize(), h[i].stream.Summarize()
	}
}

func phaseName(i int) string { return [3]string{phaseBefore, phaseDuring, phaseAfter}[i] }

// judge sets the verdict: no failed request, the rollout ended as wanted, and after it only the
// wanted version answered (and something did).
func (r *scenarioResult) judge() {
	r.Why = nil
	if r.Error != "" {
		r.Why = append(r.Why, "not completed: "+r.Error)
	}
	if r.Failed > 0 {
		r.Why = append(r.Why, fmt.Sprintf("%d of %d requests failed", r.Failed, r.Requests))
	}
	if r.State != r.WantState {
		r.Why = append(r.Why, fmt.Sprintf("rollout ended %s, want %s", orDash(r.State), r.WantState))
	}
	if r.Error == "" {
		if ok := r.After.Requests - r.After.Failed; ok == 0 {
			r.Why = append(r.Why, "no request succeeded after the rollout ended")
		}
		late, settling := map[string]int{}, map[string]int{}
		var lastSettling float64
		for _, s := range r.Strays {
			if s.AfterEndMs >= r.SettleMs {
				late[s.Model]++
				continue
			}
			settling[s.Model]++
			lastSettling = max(lastSettling, s.AfterEndMs)
		}
		for _, m := range sortedKeys(late) {
			r.Why = append(r.Why, fmt.Sprintf("%s answered %d requests started %.0f ms or more after the rollout ended (only %s may)",
				orDash(m), late[m], r.SettleMs, r.WantModel))
		}
		if len(settling) > 0 {
			r.Notes = append(r.Notes, fmt.Sprintf("%s answered requests that started after the rollout was seen to end, the last %.1f ms after (within the %.0f ms allowed for the data plane to follow)",
				modelsCell(settling), lastSettling, r.SettleMs))
		}
	}
	r.Passed = len(r.Why) == 0
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// modelsCell renders model counts as "upd-v1 ×120, upd-v2 ×3".
func modelsCell(m map[string]int) string {
	if len(m) == 0 {
		return "—"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s ×%d", orDash(k), m[k]))
	}
	return strings.Join(parts, ", ")
}

// versionsCell renders counts by Ferry version as "4 × v2".
func versionsCell(m map[int]int) string {
	if len(m) == 0 {
		return "—"
	}
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d × v%d", m[v], v))
	}
	return strings.Join(parts, ", ")
}

// report is the whole run.
type report struct {
	Started  time.Time         `json:"started"`
	Settings map[string]any    `json:"settings"`
	Host     map[string]any    `json:"host"`
	Results  []*scenarioResult `json:"scenarios"`
	Teardown []string          `json:"teardown_problems"`
	Proxy    string            `json:"attached_proxy"`
	opts     options
}

// failed lists the scenarios that did not pass.
func (r *report) failed() []string {
	var out []string
	for _, s := range r.Results {
		if !s.Passed {
			out = append(out, s.Key)
		}
	}
	return out
}

func yesNo(b bool) string {
	if b {
		return "PASS"
	}
	return "FAIL"
}

func ms(v float64) string { return fmt.Sprintf("%.0f", v) }

func secs(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}

func (r *report) render(w io.Writer) {
	o := r.opts
	fmt.Fprintf(w, "# updates: %s\n\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "Service %q: %d local replica-sim replicas (startup delay %v, TTFT %v, ITL %v), service.update max_parallel %d, min_healthy_seconds %d. "+
		"Load: %d closed-loop workers (%d non-streamed with max_tokens %d, %d streamed with max_tokens %d), %v before each update and %v after it; "+
		"the old version may answer requests started up to %v after a rollout ends. "+
		"Host: %v CPUs, load average %v at start, %v at end.\n\n",
		serviceName, o.replicas, o.startupDelay, o.ttft, o.itl, o.maxParallel, o.minHealthy,
		o.workers, (o.workers+1)/2, o.plainTokens, o.workers/2, o.streamTokens, o.before, o.after, o.settle,
		r.Host["cpus"], r.Host["loadavg_start"], r.Host["loadavg_end"])
	fmt.Fprintf(w, "Attached proxy (`ferry proxy --attach`): %s.\n\n", r.Proxy)

	fmt.Fprintf(w, "## Scenarios\n\n")
	t := &benchkit.Table{Header: []string{"scenario", "load via", "requests", "failed", "rollout s", "state (want)",
		"served before", "served after (want)", "READY at end", "result"}}
	for _, s := range r.Results {
		t.Rows = append(t.Rows, []string{s.Key + ": " + s.Title, s.Target, fmt.Sprint(s.Requests), fmt.Sprint(s.Failed),
			secs(s.RolloutWallS), fmt.Sprintf("%s (%s)", orDash(s.State), s.WantState), modelsCell(s.Before.Models),
			fmt.Sprintf("%s (%s)", modelsCell(s.After.Models), s.WantModel), versionsCell(s.ReadyAtEnd), yesNo(s.Passed)})
	}
	t.Render(w)

	fmt.Fprintf(w, "\n## Latency of successful requests, ms, by when they started\n\n")
	t = &benchkit.Table{Header: []string{"scenario", "kind", "before n", "before p50", "before p99", "during n", "during p50", "during p99",
		"after n", "after p50", "after p99"}}
	for _, s := range r.Results {
		for _, kind := range []string{"plain", "stream"} {
			sum := func(p phaseStats) loadgen.Summary {
				if kind == "stream" {
					return p.Stream
				}
				return p.Plain
			}
			row := []string{s.Key, kind}
			for _, p := range []phaseStats{s.Before, s.During, s.After} {
				l := sum(p)
				if l.Count == 0 {
					row = append(row, "0", "—", "—")
					continue
				}
				row = append(row, fmt.Sprint(l.Count), ms(l.P50Ms), ms(l.P99Ms))
			}
			t.Rows = append(t.Rows, row)
		}
	}
	t.Render(w)

	fmt.Fprintf(w, "\n## The rollouts\n\n")
	t = &benchkit.Table{Header: []string{"scenario", "served during the update", "new replica seen / READY, s", "first new-version answer, s", "old-version answers after it",
		"controller's rollout s", "controller killed at s", "controller back after s", "`serve update` exit", "rollout reason"}}
	for _, s := range r.Results {
		first := "—"
		if s.FirstNewAtS != nil {
			first = fmt.Sprintf("%.1f", *s.FirstNewAtS)
		}
		exit := "—"
		if s.UpdateExit >= 0 {
			exit = fmt.Sprint(s.UpdateExit)
		}
		t.Rows = append(t.Rows, []string{s.Key, modelsCell(s.During.Models), secs(s.NewLaunchedAtS) + " / " + secs(s.NewReadyAtS), first, fmt.Sprint(s.OldAfterFirstNew),
			secs(s.ControllerRolloutS), secs(s.KillAtS), secs(s.ControllerDownS), exit, orDash(s.RolloutReason)})
	}
	t.Render(w)
	fmt.Fprintf(w, "\nTimes in seconds since `ferry serve update` started. Rollout s: until the driver saw the rollout end (polling every %v).\n", pollEvery)

	var fails []string
	for _, s := range r.Results {
		for _, f := range s.Failures {
			kind := "plain"
			if f.Stream {
				kind = "stream"
			}
			fails = append(fails, fmt.Sprintf("- %s: %s request started %.2f s (%s): %s", s.Key, kind, f.AtS, f.Phase, f.Err))
		}
		if s.Failed > len(s.Failures) {
			fails = append(fails, fmt.Sprintf("- %s: … %d more (results.json has every request)", s.Key, s.Failed-len(s.Failures)))
		}
	}
	if len(fails) > 0 {
		fmt.Fprintf(w, "\n## Failed requests (first %d per scenario)\n\n%s\n", maxFailuresKept, strings.Join(fails, "\n"))
	}

	var verdicts []string
	for _, s := range r.Results {
		for _, why := range s.Why {
			verdicts = append(verdicts, fmt.Sprintf("- %s FAILED: %s", s.Key, why))
		}
		for _, n := range s.Notes {
			verdicts = append(verdicts, fmt.Sprintf("- %s note: %s", s.Key, n))
		}
	}
	for _, p := range r.Teardown {
		verdicts = append(verdicts, "- teardown: "+p)
	}
	if len(verdicts) > 0 {
		fmt.Fprintf(w, "\n## Findings\n\n%s\n", strings.Join(verdicts, "\n"))
	}
	if failed := r.failed(); len(failed) > 0 {
		fmt.Fprintf(w, "\n**%d of %d scenarios failed: %s.**\n", len(failed), len(r.Results), strings.Join(failed, ", "))
	} else {
		fmt.Fprintf(w, "\n**All %d scenarios passed.**\n", len(r.Results))
	}
}

// write prints the report and saves summary.md and results.json under dir.
func (r *report) write(stdout io.Writer, dir string) error {
	r.Host["loadavg_end"] = benchkit.LoadAvg()
	var md strings.Builder
	r.render(&md)
	return benchkit.WriteReport(stdout, dir, md.String(), r)
}
