package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// result is what one scenario measured, and its verdict.
type result struct {
	Key     string `json:"key"`
	Title   string `json:"title"`
	Failing string `json:"failing"`
	Healthy string `json:"healthy"`
	// Error is what kept the driver from completing the scenario.
	Error  string   `json:"error,omitempty"`
	Passed bool     `json:"passed"`
	Why    []string `json:"why_failed,omitempty"`

	FaultS float64 `json:"fault_s"`
	// New work while the fault lasted: seconds to READY (services) and from the last node's
	// exit to SUCCEEDED (jobs); -1 when it did not happen. FailingReadyS is a new service on
	// the failing infra, for partial faults only.
	LocalReadyS    float64 `json:"local_ready_s"`
	HealthyReadyS  float64 `json:"healthy_ready_s"`
	FailingReadyS  float64 `json:"failing_ready_s,omitempty"`
	LocalJobEndS   float64 `json:"local_job_end_s"`
	HealthyJobEndS float64 `json:"healthy_job_end_s"`
	// Requests to the steady local service, and to the failing infra's service until its
	// teardown.
	LocalRequests     int    `json:"local_requests"`
	LocalFailed       int    `json:"local_failed"`
	LocalFirstError   string `json:"local_first_error,omitempty"`
	FailingRequests   int    `json:"failing_requests"`
	FailingFailed     int    `json:"failing_failed"`
	FailingFirstError string `json:"failing_first_error,omitempty"`
	// `ferry serve status` while the fault lasted.
	StatusCalls   int     `json:"status_calls"`
	StatusMaxS    float64 `json:"status_max_s"`
	StatusAPIMaxS float64 `json:"status_api_max_s"`
	StatusErrors  int     `json:"status_errors"`
	// Teardown on the failing infra under the fault: how long, and the instances the output
	// names as left behind; the job's leftovers as its status gives them.
	DownS      float64  `json:"down_s"`
	DownOutput []string `json:"down_output,omitempty"`
	DownLeft   []string `json:"down_left,omitempty"`
	CancelS    float64  `json:"cancel_s"`
	CancelLeft []string `json:"cancel_left,omitempty"`
	// Unreported are instances the failing infra still held after the teardown that neither
	// `serve down`'s output nor the job's status named.
	Unreported []string `json:"unreported,omitempty"`
	// CleanedAfterS is how long after the infra answered again it held nothing of the torn-down
	// service and job (-1: not within --cleanup-limit).
	CleanedAfterS       float64 `json:"cleaned_after_s"`
	ControllerRestarted bool    `json:"controller_restarted,omitempty"`
}

// judge sets Passed from the targets.
func (r *result) judge(b *bench) {
	why := r.Why
	if r.Error != "" {
		why = append(why, r.Error)
	}
	readyWithin := func(infra string) time.Duration {
		base := b.baselines[infra]
		return max(2*base, base+readySlack)
	}
	checkReady := func(what, infra string, got float64) {
		if got >= 0 && got > readyWithin(infra).Seconds() {
			why = append(why, fmt.Sprintf("%s READY after %.1fs, more than %v (before any fault: %v)", what, got,
				readyWithin(infra).Round(time.Second), b.baselines[infra].Round(100*time.Millisecond)))
		}
	}
	checkReady("new local service", infraLocal, r.LocalReadyS)
	checkReady("new service on "+r.Healthy, r.Healthy, r.HealthyReadyS)
	for _, j := range []struct {
		what string
		s    float64
	}{{"local job", r.LocalJobEndS}, {"job on " + r.Healthy, r.HealthyJobEndS}} {
		if j.s > jobEndTarget.Seconds() {
			why = append(why, fmt.Sprintf("%s SUCCEEDED %.1fs after its last node exited, more than %v", j.what, j.s, jobEndTarget))
		}
	}
	if r.LocalFailed > 0 {
		why = append(why, fmt.Sprintf("%d of %d requests to the local service failed (%s)", r.LocalFailed, r.LocalRequests, r.LocalFirstError))
	}
	if r.FailingFailed > 0 {
		why = append(why, fmt.Sprintf("%d of %d requests to the service on %s failed (%s)", r.FailingFailed, r.FailingRequests, r.Failing, r.FailingFirstError))
	}
	// The controller's answer is judged always; the CLI's wall time (a process start on a
	// machine the test suite keeps busy) in a full run only.
	if r.StatusAPIMaxS > statusTarget.Seconds() || (!b.opts.short && r.StatusMaxS > statusTarget.Seconds()) || r.StatusErrors > 0 {
		why = append(why, fmt.Sprintf("serve status took up to %.2fs (the API %.2fs; %d errors in %d calls), want under %v",
			r.StatusMaxS, r.StatusAPIMaxS, r.StatusErrors, r.StatusCalls, statusTarget))
	}
	if len(r.Unreported) > 0 {
		why = append(why, fmt.Sprintf("teardown left %v on %s without saying so", r.Unreported, r.Failing))
	}
	if r.CleanedAfterS < 0 || r.CleanedAfterS > cleanupTarget.Seconds() {
		why = append(why, fmt.Sprintf("%s still held the torn-down service or job %.0fs after it recovered", r.Failing, b.opts.cleanupLimit.Seconds()))
	}
	r.Why, r.Passed = why, len(why) == 0
}

// report is the whole run.
type report struct {
	Started   time.Time          `json:"started"`
	Took      float64            `json:"took_s"`
	Short     bool               `json:"short"`
	Outage    float64            `json:"outage_s"`
	LoadAvg   string             `json:"loadavg"`
	Baselines map[string]float64 `json:"ready_before_any_fault_s"`
	Results   []*result          `json:"results"`
	Teardown  []string           `json:"teardown_problems,omitempty"`
}

// problems are the missed targets and the run's own failures, one line each.
func (r *report) problems() []string {
	var out []string
	for _, s := range r.Results {
		if !s.Passed {
			out = append(out, fmt.Sprintf("%s: %s", s.Key, strings.Join(s.Why, "; ")))
		}
	}
	return append(out, r.Teardown...)
}

// markdown is the fault table and the notes under it.
func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Infra faults (%s, load %s)\n\n", r.Started.Format(time.DateTime), r.LoadAvg)
	fmt.Fprintf(&b, "READY before any fault: local %.1fs, aws %.1fs, gcp %.1fs.\n\n", r.Baselines[infraLocal], r.Baselines[infraAWS], r.Baselines[infraGCP])
	t := benchkit.Table{Header: []string{"fault", "new local svc READY", "new healthy svc READY", "jobs done after last exit (local / healthy)",
		"failed requests (local / failing infra's svc)", "serve status max (CLI / API)", "teardown on the failing infra", "cleaned after recovery", "verdict"}}
	for _, s := range r.Results {
		t.Rows = append(t.Rows, []string{
			s.Key, secs(s.LocalReadyS), fmt.Sprintf("%s (%s)", secs(s.HealthyReadyS), s.Healthy),
			secs(s.LocalJobEndS) + " / " + secs(s.HealthyJobEndS),
			fmt.Sprintf("%d/%d / %d/%d", s.LocalFailed, s.LocalRequests, s.FailingFailed, s.FailingRequests),
			fmt.Sprintf("%.2fs / %.3fs (%d calls)", s.StatusMaxS, s.StatusAPIMaxS, s.StatusCalls),
			teardownCell(s), secs(s.CleanedAfterS), verdict(s),
		})
	}
	var tb strings.Builder
	t.Render(&tb)
	b.WriteString(tb.String())
	for _, s := range r.Results {
		fmt.Fprintf(&b, "\n**%s** — %s.", s.Key, s.Title)
		if s.FailingReadyS != 0 {
			fmt.Fprintf(&b, " A new service on %s: READY in %s.", s.Failing, secs(s.FailingReadyS))
		}
		if s.ControllerRestarted {
			b.WriteString(" The controller was SIGKILLed and restarted during the outage.")
		}
		if len(s.Why) > 0 {
			fmt.Fprintf(&b, " Missed: %s.", strings.Join(s.Why, "; "))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func teardownCell(s *result) string {
	left := len(s.DownLeft) + len(s.CancelLeft)
	if left == 0 {
		return fmt.Sprintf("down %.1fs, cancel %.1fs, nothing left", s.DownS, s.CancelS)
	}
	return fmt.Sprintf("down %.1fs, cancel %.1fs, %d named as left", s.DownS, s.CancelS, left)
}

func secs(s float64) string {
	if s < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1fs", s)
}

func verdict(s *result) string {
	if s.Passed {
		return "pass"
	}
	return "FAIL"
}
