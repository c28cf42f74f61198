package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// report is what a run measured; results.json is it as JSON. A duration of -1 s means the
// phase did not finish within its bound.
type report struct {
	Started       time.Time `json:"started"`
	Services      int       `json:"services"`
	Replicas      int       `json:"replicas"`
	LoadAvgBefore string    `json:"load_avg_before"`
	LoadAvgAfter  string    `json:"load_avg_after"`
	Took          float64   `json:"took_seconds"`

	// UpSeconds is from the first serve up to the last one returning; ReadySeconds from then
	// until every replica was READY.
	UpSeconds    float64 `json:"serve_up_seconds"`
	ReadySeconds float64 `json:"ready_after_last_up_seconds"`
	lastUp       time.Time

	LeaderRSS          memory  `json:"leader_rss"`
	ReconcilePasses    int64   `json:"reconcile_passes"`
	ReconcileP99       float64 `json:"reconcile_p99_seconds"`
	ReconcileMean      float64 `json:"reconcile_mean_seconds"`
	RateLimiterWaitP99 float64 `json:"rate_limiter_wait_p99_seconds"`
	StoreWrites        int64   `json:"store_writes"`
	StoreWriteP99      float64 `json:"store_write_p99_seconds"`
	// StoreWriteP99ByOp is the p99 of the writes a new service's first pass makes in a row.
	StoreWriteP99ByOp map[string]float64 `json:"store_write_p99_by_op_seconds"`
	// ClientRequestP99ByVerb is the p99 of the leader's requests to the API server as its
	// client saw them.
	ClientRequestP99ByVerb map[string]float64 `json:"client_request_p99_by_verb_seconds"`
	// APIWriteP99 and APIWriteMean are the API server's own time for ConfigMap writes.
	APIWriteP99  float64 `json:"api_configmap_write_p99_seconds"`
	APIWriteMean float64 `json:"api_configmap_write_mean_seconds"`

	// LeaseTakenSeconds is from kill -9 until the follower held the Lease; PublishedSeconds
	// from then until it listed every service with the replicas it adopted, one or more READY.
	LeaseTakenSeconds    float64 `json:"lease_taken_seconds"`
	PublishedSeconds     float64 `json:"published_after_lease_seconds"`
	AllReadyAgainSeconds float64 `json:"all_ready_after_lease_seconds"`
	NewLeaderRSS         memory  `json:"new_leader_rss"`
	// NewLeaderReconcileP99 is over the new leader's passes until the load stopped.
	NewLeaderReconcileP99    float64  `json:"new_leader_reconcile_p99_seconds"`
	NewLeaderReconcilePasses int64    `json:"new_leader_reconcile_passes"`
	Requests                 int64    `json:"requests_ok"`
	FailedRequests           int64    `json:"requests_failed"`
	RequestsAfterTakeover    int64    `json:"requests_after_takeover"`
	FirstFailure             string   `json:"first_failure,omitempty"`
	PodsCompared             int      `json:"pods_compared"`
	PodsRelaunched           []string `json:"pods_relaunched"`

	DownCLISeconds float64 `json:"serve_down_cli_seconds"`
	DownSeconds    float64 `json:"serve_down_pods_gone_seconds"`

	Notes []string `json:"notes,omitempty"`
	opts  options
}

// check is one figure against its target.
type check struct {
	what, figure, target string
	met                  bool
}

// seconds formats a measured duration, "not within bound" for -1.
func seconds(v float64) string {
	if v < 0 {
		return "not within bound"
	}
	return fmt.Sprintf("%.1f s", v)
}

func (r *report) checks() []check {
	o := r.opts
	within := func(v float64, target time.Duration) bool { return v >= 0 && v <= target.Seconds() }
	return []check{
		{"all replicas READY after the last serve up", seconds(r.ReadySeconds), "≤ " + o.readyTarget.String(), within(r.ReadySeconds, o.readyTarget)},
		{"serve down -a until every pod is gone", seconds(r.DownSeconds), "≤ " + o.downTarget.String(), within(r.DownSeconds, o.downTarget)},
		{"leader RSS (peak, VmHWM)", fmt.Sprintf("%.0f MiB (sampled peak %.0f MiB)", r.LeaderRSS.HWMMiB, r.LeaderRSS.PeakSampledMiB), fmt.Sprintf("≤ %d MiB", o.rssTargetMiB), r.LeaderRSS.HWMMiB > 0 && r.LeaderRSS.HWMMiB <= float64(o.rssTargetMiB)},
		{"reconcile p99 (loop=replicas)", fmt.Sprintf("%.3f s over %d passes", r.ReconcileP99, r.ReconcilePasses), "≤ " + o.reconcileTarget.String(), r.ReconcilePasses > 0 && r.ReconcileP99 <= o.reconcileTarget.Seconds()},
		{"takeover: Lease taken → every service published", seconds(r.PublishedSeconds), "≤ " + o.takeoverTarget.String(), within(r.PublishedSeconds, o.takeoverTarget)},
		{"takeover: pods launched again", fmt.Sprintf("%d of %d", len(r.PodsRelaunched), r.PodsCompared), "0", r.PodsCompared > 0 && len(r.PodsRelaunched) == 0},
		{"takeover: failed requests", fmt.Sprintf("%d of %d", r.FailedRequests, r.FailedRequests+r.Requests), "0", r.Requests > 0 && r.FailedRequests == 0},
	}
}

// missed names the checks not met.
func (r *report) missed() []string {
	var out []string
	for _, c := range r.checks() {
		if !c.met {
			out = append(out, c.what+": "+c.figure)
		}
	}
	return out
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## kubescale: %d services × %d replicas on the test cluster\n\n", r.Services, r.Replicas)
	fmt.Fprintf(&b, "Load average (1, 5, 15 min) %s before, %s after; run took %.0f s.\n\n", r.LoadAvgBefore, r.LoadAvgAfter, r.Took)
	t := benchkit.Table{Header: []string{"figure", "measured", "target", "met"}}
	for _, c := range r.checks() {
		met := "met"
		if !c.met {
			met = "NOT MET"
		}
		t.Rows = append(t.Rows, []string{c.what, c.figure, c.target, met})
	}
	t.Render(&b)
	fmt.Fprintf(&b, "\nAlso measured: every serve up returned in %.1f s; kill -9 → the follower held the Lease %s "+
		"(Lease 8 s: bounded by its expiry); every replica READY under the new leader %s after it took the Lease; the new leader's RSS peak %.0f MiB; "+
		"reconcile mean %.3f s; the leader's %d Kubernetes store writes p99 %.3f s (the API server's ConfigMap writes p99 %.3f s, mean %.3f s); client rate-limiter wait p99 %.3f s; "+
		"the new leader's reconcile p99 %.3f s over %d passes (adoption and steady state); %d requests after the takeover; serve down -a returned in %.1f s.\n",
		r.UpSeconds, seconds(r.LeaseTakenSeconds), seconds(r.AllReadyAgainSeconds), r.NewLeaderRSS.HWMMiB,
		r.ReconcileMean, r.StoreWrites, r.StoreWriteP99, r.APIWriteP99, r.APIWriteMean, r.RateLimiterWaitP99,
		r.NewLeaderReconcileP99, r.NewLeaderReconcilePasses, r.RequestsAfterTakeover, r.DownCLISeconds)
	if len(r.StoreWriteP99ByOp) > 0 {
		fmt.Fprintf(&b, "\nStore write p99 of a first pass's writes: %s.\n", joinSeconds(r.StoreWriteP99ByOp))
	}
	if len(r.ClientRequestP99ByVerb) > 0 {
		fmt.Fprintf(&b, "\nThe leader's requests to the API server as its client saw them, p99: %s.\n", joinSeconds(r.ClientRequestP99ByVerb))
	}
	if r.FirstFailure != "" {
		fmt.Fprintf(&b, "\nFirst failed request: %s\n", r.FirstFailure)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\nNote: %s\n", n)
	}
	return b.String()
}

// joinSeconds is "key 0.123 s, ..." in key order.
func joinSeconds(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.3f s", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
