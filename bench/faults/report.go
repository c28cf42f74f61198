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
const maxFailuresKept = 6

// kindStats counts one kind of request (non-streamed or streamed) by outcome.
type kindStats struct {
	Sent         int             `json:"sent"`
	OK           int             `json:"ok"`
	Failed       int             `json:"failed"`
	Shed         int             `json:"shed"`
	CutWithEvent int             `json:"cut_with_error_event"`
	CutNoEvent   int             `json:"cut_without_error_event"`
	Latency      loadgen.Summary `json:"latency_ok"`
}

// failure is one failed request.
type failure struct {
	// AtS is when it started, in seconds since the fault began (negative before).
	AtS     float64 `json:"at_s"`
	Stream  bool    `json:"stream"`
	Outcome outcome `json:"outcome"`
	Err     string  `json:"error"`
}

// scenarioResult is everything one scenario measured, and its verdict.
type scenarioResult struct {
	Key    string    `json:"key"`
	Title  string    `json:"title"`
	Kind   faultKind `json:"kind"`
	Target string    `json:"target"`
	// Error is what kept the driver from completing the scenario; Skipped why it did not run.
	Error   string   `json:"error,omitempty"`
	Skipped string   `json:"skipped,omitempty"`
	Passed  bool     `json:"passed"`
	Why     []string `json:"why_failed,omitempty"`
	Notes   []string `json:"notes,omitempty"`

	// Replica is the replica the fault hit (0 for faults of the controller or the proxy).
	Replica int `json:"replica,omitempty"`
	// FaultS is how long the fault lasted; HealedAfterS how long after it ended every target
	// replica was READY again and neither proxy had one ejected (-1: never).
	FaultS       float64 `json:"fault_s"`
	HealedAfterS float64 `json:"healed_after_s"`
	// EjectedAfterS and ProxyEjectedAfterS are how long after SIGSTOP the controller's proxy
	// and the attached proxy took the hung replica out of rotation (-1 / 0: not seen).
	EjectedAfterS      float64 `json:"ejected_after_s"`
	ProxyEjectedAfterS float64 `json:"attached_proxy_ejected_after_s,omitempty"`
	ControllerDownS    float64 `json:"controller_down_s,omitempty"`
	// Flips counts the flapping replica's READY / not READY changes the driver saw.
	Flips               int          `json:"readiness_flips,omitempty"`
	Filled              string       `json:"disk_filled,omitempty"`
	ControllerRestarted string       `json:"controller_restarted,omitempty"`
	Flood               *floodResult `json:"flood,omitempty"`
	// Bodies is fault 8's attack, ConnFloods fault 9's per target (hostile.go).
	Bodies     *bodyAttackResult  `json:"body_attack,omitempty"`
	ConnFloods []*connFloodResult `json:"connection_floods,omitempty"`
	// Retries are the controller proxy's attempts on another replica during the scenario;
	// Ejections its health-check ejections.
	Retries         int     `json:"retries"`
	Ejections       int     `json:"ejections"`
	ejectionsBefore float64 // read before the fault

	Requests int       `json:"requests"`
	Plain    kindStats `json:"plain"`
	Stream   kindStats `json:"stream"`
	// PostFaultFailed counts the failures of requests started more than settleAfterFlood
	// after the fault ended (the flood's end); they must be none.
	PostFaultFailed int            `json:"post_fault_failed"`
	Reasons         map[string]int `json:"failure_reasons,omitempty"`
	Failures        []failure      `json:"first_failures,omitempty"`

	LeaksBefore   snapshotLeaks `json:"before"`
	LeaksAfter    snapshotLeaks `json:"after"`
	LeakWaitS     float64       `json:"leak_wait_s"`
	Orphans       []string      `json:"orphan_processes,omitempty"`
	StoreRows     int           `json:"store_replica_rows"`
	StoreMismatch []string      `json:"store_mismatches,omitempty"`
}

// aggregate counts records by kind and outcome.
func (r *scenarioResult) aggregate(records []record, faultAt, clearedAt time.Time) {
	records = slices.Clone(records)
	sort.SliceStable(records, func(i, j int) bool { return records[i].Start.Before(records[j].Start) })
	var plainH, streamH loadgen.Histogram
	r.Requests, r.Plain, r.Stream, r.Failures, r.Reasons = len(records), kindStats{}, kindStats{}, nil, map[string]int{}
	for _, rec := range records {
		k, h := &r.Plain, &plainH
		if rec.Stream {
			k, h = &r.Stream, &streamH
		}
		k.Sent++
		switch rec.Outcome {
		case outcomeOK:
			k.OK++
			h.Record(rec.Latency)
			continue
		case outcomeFailed:
			k.Failed++
		case outcomeShed:
			k.Shed++
		case outcomeCutWithEvent:
			k.CutWithEvent++
		case outcomeCutNoEvent:
			k.CutNoEvent++
		}
		if rec.Start.After(clearedAt.Add(settleAfterFlood)) {
			r.PostFaultFailed++
		}
		r.Reasons[reasonOf(rec.Err)]++
		if len(r.Failures) < maxFailuresKept || rec.Outcome == outcomeCutNoEvent && len(r.Failures) < 2*maxFailuresKept {
			r.Failures = append(r.Failures, failure{AtS: rec.Start.Sub(faultAt).Seconds(), Stream: rec.Stream, Outcome: rec.Outcome, Err: rec.Err})
		}
	}
	r.Plain.Latency, r.Stream.Latency = plainH.Summarize(), streamH.Summarize()
}

// reasonOf shortens an error to its kind: the status and OpenAI error, or the first words.
func reasonOf(err string) string {
	if i := strings.Index(err, " (not an OpenAI error"); i > 0 {
		return err[:i] + " (not OpenAI-shaped)"
	}
	if len(err) > 90 {
		return err[:90] + "…"
	}
	return err
}

// judge sets the verdict from the targets.
func (r *scenarioResult) judge(o options) {
	r.Why = nil
	fail := func(format string, args ...any) { r.Why = append(r.Why, fmt.Sprintf(format, args...)) }
	if r.Skipped != "" {
		r.Passed = true
		return
	}
	if r.Error != "" {
		fail("not completed: %s", r.Error)
	}
	overloadOK := r.Kind == faultExhaust
	// Out of descriptors, a proxy cannot reach its replicas either: only requests after the flood
	// count (PostFaultFailed, below).
	if r.Kind != faultConnFlood {
		if n := r.Plain.Failed + shedUnlessOverload(r.Plain.Shed, overloadOK); n > 0 {
			fail("%d of %d non-streamed requests failed (target: none while a healthy replica remains)", n, r.Plain.Sent)
		}
		if n := r.Stream.Failed + shedUnlessOverload(r.Stream.Shed, overloadOK); n > 0 {
			fail("%d of %d streams failed before they started (they could have been retried)", n, r.Stream.Sent)
		}
	}
	if r.Stream.CutNoEvent > 0 {
		fail("%d streams were cut without an SSE error event", r.Stream.CutNoEvent)
	}
	if r.Error == "" && r.HealedAfterS < 0 {
		fail("the service did not heal")
	}
	switch r.Kind {
	case faultHang:
		if r.EjectedAfterS < 0 || r.EjectedAfterS > maxEjectDelay.Seconds() {
			fail("the hung replica left the controller's proxy's rotation after %s (target: within %v)", secsOrNever(r.EjectedAfterS), maxEjectDelay)
		}
		if r.ProxyEjectedAfterS <= 0 || r.ProxyEjectedAfterS > maxEjectDelay.Seconds() {
			fail("the hung replica left the attached proxy's rotation after %s (target: within %v)", secsOrNever(r.ProxyEjectedAfterS), maxEjectDelay)
		}
	case faultErrors:
		if r.Ejections > 0 {
			fail("a slow but answering replica was ejected %d time(s)", r.Ejections)
		}
	case faultFlap:
		if r.Error == "" && r.Flips == 0 {
			fail("the replica's readiness never changed: the fault did not happen")
		}
	case faultDiskFull:
		if r.ControllerRestarted != "" {
			fail("the controller did not survive the full disk: %s", r.ControllerRestarted)
		}
	case faultUnauthBodies, faultConnFlood:
		r.judgeHostile(fail)
	case faultExhaust:
		if r.PostFaultFailed > 0 {
			fail("%d requests started after the flood ended failed", r.PostFaultFailed)
		}
		if f := r.Flood; f != nil {
			if f.Failed > 0 {
				fail("%d flood streams failed otherwise than with an OpenAI-shaped 503/429 with Retry-After: %v", f.Failed, f.Errors)
			}
			if f.Shed == 0 {
				fail("no flood stream was refused: the connections were never exhausted")
			}
		}
	}
	if e := r.LeaksAfter.Err; e != "" && r.Error == "" {
		fail("leak check: %s", e)
	}
	b, a := r.LeaksBefore, r.LeaksAfter
	if !within(b.Controller, a.Controller) {
		fail("controller holds %d fds and %d goroutines %.0f s after the fault, %d and %d before", a.Controller.FDs, a.Controller.Goroutines, r.LeakWaitS, b.Controller.FDs, b.Controller.Goroutines)
	}
	if !within(b.Proxy, a.Proxy) {
		fail("attached proxy holds %d fds and %d goroutines %.0f s after the fault, %d and %d before", a.Proxy.FDs, a.Proxy.Goroutines, r.LeakWaitS, b.Proxy.FDs, b.Proxy.Goroutines)
	}
	for _, o := range r.Orphans {
		fail("leftover process: %s", o)
	}
	for _, m := range r.StoreMismatch {
		fail("store: %s", m)
	}
	r.Passed = len(r.Why) == 0
}

// judgeHostile applies the targets of faults 8 and 9 (hostile.go).
func (r *scenarioResult) judgeHostile(fail func(string, ...any)) {
	if b := r.Bodies; b != nil {
		if peak := max(b.PeakRSS, b.HWM); peak > maxProxyRSS {
			fail("the proxy's RSS reached %d MiB (target: at most %d MiB)", peak>>20, maxProxyRSS>>20)
		}
		if b.Slow+b.Unanswered > 0 {
			fail("%d of %d unauthenticated requests were not refused within %v", b.Slow+b.Unanswered, b.Sent, attackAnswerWithin)
		}
		if b.Sent == 0 {
			fail("no unauthenticated request was sent: the attack did not happen")
		}
	}
	if r.Kind == faultConnFlood {
		if r.PostFaultFailed > 0 {
			fail("%d keyed requests started after the flood ended failed", r.PostFaultFailed)
		}
		if len(r.ConnFloods) == 0 && r.Error == "" {
			fail("no connection flood was recorded")
		}
	}
	for _, f := range r.ConnFloods {
		switch {
		case !f.Alive:
			fail("%s stopped during the connection flood", f.Target)
		case f.ServedAfterS < 0:
			fail("%s did not serve a new connection within %v of the flood's end (last: %s)", f.Target, servedAgainWithin, f.LastError)
		case f.Opened <= f.FDLimit:
			fail("the flood opened %d connections to %s, not past its limit of %d open files", f.Opened, f.Target, f.FDLimit)
		}
	}
}

func shedUnlessOverload(shed int, overloadOK bool) int {
	if overloadOK {
		return 0
	}
	return shed
}

func secsOrNever(s float64) string {
	if s <= 0 {
		return "never"
	}
	return fmt.Sprintf("%.2f s", s)
}

func verdict(r *scenarioResult) string {
	switch {
	case r.Skipped != "":
		return "SKIPPED"
	case r.Passed:
		return "PASS"
	}
	return "FAIL"
}

// summaryLine is the progress line of a finished scenario.
func (r *scenarioResult) summaryLine() string {
	if r.Skipped != "" {
		return r.Skipped
	}
	s := fmt.Sprintf("%d requests; non-streamed failed %d; streams failed %d, cut with event %d, without %d; shed %d; healed after %s",
		r.Requests, r.Plain.Failed, r.Stream.Failed, r.Stream.CutWithEvent, r.Stream.CutNoEvent, r.Plain.Shed+r.Stream.Shed, secsOrNever(r.HealedAfterS))
	if len(r.Why) > 0 {
		s += "; " + strings.Join(r.Why, "; ")
	}
	return s
}

// report is the whole run.
type report struct {
	Started  time.Time         `json:"started"`
	Settings map[string]any    `json:"settings"`
	Host     map[string]any    `json:"host"`
	Tmpfs    string            `json:"tmpfs"`
	Endpoint string            `json:"service_endpoint"`
	Proxy    string            `json:"attached_proxy"`
	Results  []*scenarioResult `json:"scenarios"`
	// ProcessesAfterDown and RowsAfterDown are what `serve down` left: replica processes, and
	// the service's rows per store table.
	ProcessesAfterDown int            `json:"replica_processes_after_down"`
	RowsAfterDown      map[string]int `json:"store_rows_after_down"`
	Teardown           []string       `json:"teardown_problems"`
	opts               options
}

// problems lists why the run missed a target: failed scenarios and teardown findings.
func (r *report) problems() []string {
	var out []string
	var failed []string
	for _, s := range r.Results {
		if !s.Passed {
			failed = append(failed, s.Key)
		}
	}
	if len(failed) > 0 {
		out = append(out, fmt.Sprintf("scenario(s) %s failed", strings.Join(failed, ", ")))
	}
	if len(r.Teardown) > 0 {
		out = append(out, fmt.Sprintf("teardown found %d problem(s): %s", len(r.Teardown), strings.Join(r.Teardown, "; ")))
	}
	return out
}

func ms(v float64) string { return fmt.Sprintf("%.0f", v) }

func secs(v float64) string {
	if v < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1f", v)
}

func beforeAfter(b, a int) string {
	if b == 0 && a == 0 {
		return "—"
	}
	return fmt.Sprintf("%d → %d", b, a)
}

func (r *report) render(w io.Writer) {
	o := r.opts
	fmt.Fprintf(w, "# faults: %s\n\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(w, "Service %q: %d local replica-sim replicas (startup delay %v, TTFT %v, ITL %v), readiness probe GET /health every 2s (timeout 15s), late binding off, "+
		"each replica watching its own faults file. Load: %d closed-loop workers (%d non-streamed with max_tokens %d, %d streamed with max_tokens %d), "+
		"%v before each fault and %v after the service healed. %s. Host: %v CPUs, load average %v at start, %v at end.\n\n",
		serviceName, o.replicas, o.startupDelay, o.ttft, o.itl, o.workers, (o.workers+1)/2, o.plainTokens, o.workers/2, o.streamTokens,
		o.before, o.after, r.Tmpfs, r.Host["cpus"], r.Host["loadavg_start"], r.Host["loadavg_end"])
	fmt.Fprintf(w, "Faults: (1) SIGKILL of a replica's process group; (2) SIGSTOP of one for %v, then SIGCONT; (3) its /health alternating 200/503 every %v for %v; "+
		"(4) --error-rate %v --slow-rate %v --slow-delay %v on one for %v; (5) SIGKILL of the controller, restarted by `ferry serve status`, load through `ferry proxy --attach`; "+
		"(6) FERRY_HOME's file system filled for %v; (7) %d streams (max_tokens 2000) opened over %v and held %v, beyond the proxy's %d connections per replica; "+
		"(8) against a keyed `ferry proxy --replica --max-body-mb 1024`, %d clients announcing %d MiB bodies with a wrong key and %d announcing %d MiB without one, sending nothing, each again %v after its answer, for %v; "+
		"(9) the controller restarted under a limit of %d open files with its gateway on, then %d idle connections each to the gateway and to a keyed `ferry proxy --replica --max-connections 100000` under a limit of %d, opened over %v and held %v. "+
		"Faults 8 and 9 send keyed load through that standalone proxy.\n\n",
		o.hangFor, o.flapPeriod, o.flapFor, o.errorRate, o.slowRate, o.slowDelay, o.faultFor, o.diskFullFor, o.floodStreams, o.floodRamp, o.floodHold, proxyConnsPerReplica,
		o.bodyClients, attackBody>>20, hugeAttackers, hugeAttackBody>>20, attackPause, o.bodyFor,
		controllerNofile, o.connFlood, proxyNofile, o.floodRamp, o.floodHold)

	fmt.Fprintf(w, "## What clients saw\n\n")
	t := &benchkit.Table{Header: []string{"fault", "load via", "fault s", "non-streamed sent", "non-streamed failed", "streams sent",
		"streams failed before start", "streams cut with error event", "streams cut without (defect)", "shed 503/429", "retries", "result"}}
	for _, s := range r.Results {
		if s.Skipped != "" {
			t.Rows = append(t.Rows, []string{s.Key + ": " + s.Title, "—", "—", "—", "—", "—", "—", "—", "—", "—", "—", "SKIPPED"})
			continue
		}
		t.Rows = append(t.Rows, []string{s.Key + ": " + s.Title, s.Target, fmt.Sprintf("%.1f", s.FaultS), fmt.Sprint(s.Plain.Sent), fmt.Sprint(s.Plain.Failed),
			fmt.Sprint(s.Stream.Sent), fmt.Sprint(s.Stream.Failed), fmt.Sprint(s.Stream.CutWithEvent), fmt.Sprint(s.Stream.CutNoEvent),
			fmt.Sprint(s.Plain.Shed + s.Stream.Shed), fmt.Sprint(s.Retries), verdict(s)})
	}
	t.Render(w)

	fmt.Fprintf(w, "\n## Healing and leaks\n\n")
	t = &benchkit.Table{Header: []string{"fault", "replica", "left rotation s (controller / attached proxy)", "healed after s", "controller fds", "controller goroutines",
		"attached proxy fds", "attached proxy goroutines", "stray replica processes", "store rows (mismatches)"}}
	for _, s := range r.Results {
		if s.Skipped != "" {
			continue
		}
		rot := "—"
		if s.Kind == faultHang {
			rot = secsOrNever(s.EjectedAfterS) + " / " + secsOrNever(s.ProxyEjectedAfterS)
		} else if s.Ejections > 0 {
			rot = fmt.Sprintf("%d ejection(s)", s.Ejections)
		}
		replica := "—"
		if s.Replica > 0 {
			replica = fmt.Sprint(s.Replica)
		}
		b, a := s.LeaksBefore, s.LeaksAfter
		ctlFDs, ctlG := beforeAfter(b.Controller.FDs, a.Controller.FDs), beforeAfter(b.Controller.Goroutines, a.Controller.Goroutines)
		if b.Controller.PID != a.Controller.PID && b.Controller.PID != 0 && a.Controller.PID != 0 {
			ctlFDs += " (new process)"
			ctlG += " (new process)"
		}
		t.Rows = append(t.Rows, []string{s.Key, replica, rot, secs(s.HealedAfterS), ctlFDs, ctlG,
			beforeAfter(b.Proxy.FDs, a.Proxy.FDs), beforeAfter(b.Proxy.Goroutines, a.Proxy.Goroutines),
			fmt.Sprint(len(s.Orphans)), fmt.Sprintf("%d (%d)", s.StoreRows, len(s.StoreMismatch))})
	}
	t.Render(w)
	fmt.Fprintf(w, "\nHealed: every target replica READY in `serve status` and no replica ejected by either proxy, timed from the end of the fault "+
		"(for a SIGKILL, from the kill). Descriptors from /proc/PID/fd and goroutines from go_goroutines on the metrics listener, "+
		"before the load started and once the load's connections closed (allowed: +%d fds, +%d goroutines). "+
		"Stray processes: replica process groups alive whose replica the controller does not run. Store: the replicas table of ferry.db, read-only, against the controller's records.\n",
		fdSlack, goroutineSlack)

	fmt.Fprintf(w, "\n## Latency of successful requests, ms\n\n")
	t = &benchkit.Table{Header: []string{"fault", "non-streamed n", "p50", "p99", "max", "streams n", "p50", "p99", "max"}}
	for _, s := range r.Results {
		if s.Skipped != "" {
			continue
		}
		row := []string{s.Key}
		for _, l := range []loadgen.Summary{s.Plain.Latency, s.Stream.Latency} {
			if l.Count == 0 {
				row = append(row, "0", "—", "—", "—")
				continue
			}
			row = append(row, fmt.Sprint(l.Count), ms(l.P50Ms), ms(l.P99Ms), ms(l.MaxMs))
		}
		t.Rows = append(t.Rows, row)
	}
	t.Render(w)

	r.renderHostile(w)

	var details []string
	for _, s := range r.Results {
		if s.Flood != nil {
			details = append(details, fmt.Sprintf("- %s: flood of %d streams: %d admitted (at most %d open at once), %d refused with an OpenAI-shaped 503/429 and Retry-After, %d failed otherwise%s",
				s.Key, s.Flood.Streams, s.Flood.Admitted, s.Flood.PeakOpen, s.Flood.Shed, s.Flood.Failed, errorsSuffix(s.Flood.Errors)))
		}
		if s.Flips > 0 {
			details = append(details, fmt.Sprintf("- %s: replica %d went between READY and not READY %d times", s.Key, s.Replica, s.Flips))
		}
		if s.ControllerDownS > 0 {
			details = append(details, fmt.Sprintf("- %s: the controller's API answered again %.1f s after the SIGKILL", s.Key, s.ControllerDownS))
		}
		if s.Filled != "" {
			details = append(details, fmt.Sprintf("- %s: %s", s.Key, s.Filled))
		}
		for _, n := range s.Notes {
			details = append(details, fmt.Sprintf("- %s: %s", s.Key, n))
		}
		if len(s.Reasons) > 0 {
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(s.Reasons)) {
				parts = append(parts, fmt.Sprintf("%s ×%d", k, s.Reasons[k]))
			}
			details = append(details, fmt.Sprintf("- %s: failures by reason: %s", s.Key, strings.Join(parts, "; ")))
		}
	}
	if len(details) > 0 {
		fmt.Fprintf(w, "\n## Details\n\n%s\n", strings.Join(details, "\n"))
	}

	fmt.Fprintf(w, "\n## After `serve down`\n\n%d replica processes left; store rows of the service left: %s.\n", r.ProcessesAfterDown, rowsCell(r.RowsAfterDown))

	var verdicts []string
	for _, s := range r.Results {
		for _, why := range s.Why {
			verdicts = append(verdicts, fmt.Sprintf("- %s FAILED: %s", s.Key, why))
		}
	}
	for _, p := range r.Teardown {
		verdicts = append(verdicts, "- teardown: "+p)
	}
	if len(verdicts) > 0 {
		fmt.Fprintf(w, "\n## Targets missed\n\n%s\n", strings.Join(verdicts, "\n"))
	}
	if problems := r.problems(); len(problems) > 0 {
		fmt.Fprintf(w, "\n**Targets missed: %s.**\n", strings.Join(problems, "; "))
	} else {
		ran := 0
		for _, s := range r.Results {
			if s.Skipped == "" {
				ran++
			}
		}
		fmt.Fprintf(w, "\n**All %d faults met their targets.**\n", ran)
	}
}

// renderHostile adds the tables of faults 8 and 9, when they ran.
func (r *report) renderHostile(w io.Writer) {
	bodies := &benchkit.Table{Header: []string{"fault", "unauthenticated requests", "refused (401/429) within 1 s", "later", "unanswered",
		"proxy RSS before, MiB", "peak RSS during, MiB", "VmHWM, MiB", "keyed requests failed"}}
	floods := &benchkit.Table{Header: []string{"fault", "target", "open files limit", "connections", "opened", "refused 503/429", "closed", "held",
		"alive after", "served a new connection after s"}}
	for _, s := range r.Results {
		if b := s.Bodies; b != nil {
			bodies.Rows = append(bodies.Rows, []string{s.Key, fmt.Sprint(b.Sent), fmt.Sprint(b.Refused), fmt.Sprint(b.Slow), fmt.Sprint(b.Unanswered),
				fmt.Sprint(b.BaseRSS >> 20), fmt.Sprint(b.PeakRSS >> 20), fmt.Sprint(b.HWM >> 20), fmt.Sprint(s.Plain.Failed + s.Stream.Failed)})
		}
		for _, f := range s.ConnFloods {
			floods.Rows = append(floods.Rows, []string{s.Key, f.Target, fmt.Sprint(f.FDLimit), fmt.Sprint(f.Conns), fmt.Sprint(f.Opened),
				fmt.Sprint(f.Refused), fmt.Sprint(f.Closed), fmt.Sprint(f.Held), fmt.Sprint(f.Alive), secs(f.ServedAfterS)})
		}
	}
	if len(bodies.Rows) > 0 {
		fmt.Fprintf(w, "\n## Clients announcing bodies without a valid key\n\n")
		bodies.Render(w)
		fmt.Fprintf(w, "\nTarget: every unauthenticated request refused within %v without its body being read, the proxy's RSS at most %d MiB, no keyed request failed.\n",
			attackAnswerWithin, maxProxyRSS>>20)
	}
	if len(floods.Rows) > 0 {
		fmt.Fprintf(w, "\n## Connection flood past the descriptor limit\n\n")
		floods.Render(w)
		fmt.Fprintf(w, "\nOpened: handshakes completed (the kernel's backlog takes them before the process accepts); refused: an OpenAI-shaped 503 or 429 with Retry-After, then closed; "+
			"closed: without an answer; held: open and unanswered when the flood ended. Target: both processes alive, each serving a new connection within %v of the flood's end, "+
			"and no keyed request started more than %v after it failed.\n", servedAgainWithin, settleAfterFlood)
	}
}

func errorsSuffix(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func rowsCell(m map[string]int) string {
	if m == nil {
		return "not read"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// write prints the report and saves summary.md and results.json under dir.
func (r *report) write(stdout io.Writer, dir string) error {
	r.Host["loadavg_end"] = benchkit.LoadAvg()
	var md strings.Builder
	r.render(&md)
	return benchkit.WriteReport(stdout, dir, md.String(), r)
}
