package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const dashboardServiceYAML = `name: dash
resources:
  use_spot: true
  infra: aws
  accelerators: A10G:1
envs:
  MODEL: ferry-sim-1b
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replicas: 1
  ports: 8080
run: ferry replica-sim --model $MODEL
`

const dashboardJobYAML = `name: dash-train
resources:
  infra: aws
  accelerators: A10G:1
run: sleep 600
`

// TestDashboardMetrics runs a spot service and a job on the fake EC2, streams through the
// controller's proxy and an attached one, and scrapes both: the fleet gauges say what `serve
// status` and `jobs queue` say (status, kind, zone, target, catalog price), TPOT is observed,
// and every metric deploy/grafana/ferry.json queries is one that Ferry exports.
func TestDashboardMetrics(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	e := newEnv(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	gatewayAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.extraEnv = append(slices.Clone(awsEnv), "FERRY_METRICS_ADDR="+metricsAddr, "FERRY_GATEWAY_ADDR="+gatewayAddr)
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), dashboardServiceYAML)
	writeFile(t, filepath.Join(dir, "job.yaml"), dashboardJobYAML)

	e.mustRun("serve", "up", filepath.Join(dir, "svc.yaml"), "-y")
	defer e.stopJobs()
	jobID := e.launchDetached(filepath.Join(dir, "job.yaml"))
	var st serviceStatus
	eventually(t, 2*time.Minute, "the spot replica READY", func() (bool, string) {
		var err error
		st, err = e.status("dash")
		return err == nil && st.ReadyReplicas == 1, fmt.Sprintf("%+v %v", st.Replicas, err)
	})
	e.waitJob(jobID, 2*time.Minute, "the job RUNNING", func(j jobView) bool { return j.State == "RUNNING" })
	chatStream(t, st.Endpoint)

	proxyListen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	proxyMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.startProxyProcess(t, "proxy", "--attach", "dash", "--listen", proxyListen, "--metrics-listen", proxyMetrics)
	eventually(t, 20*time.Second, "the attached proxy streams", func() (bool, string) {
		return streamOnce("http://"+proxyListen) == nil, fmt.Sprint(streamOnce("http://" + proxyListen))
	})

	// A model nobody serves: the gateway's own errors are a panel too.
	resp, err := http.Post("http://"+gatewayAddr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"nope"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("gateway answered an unknown model with %d, want 404", resp.StatusCode)
	}

	ctl := scrape(t, "http://"+metricsAddr+"/metrics")
	rep := st.Replicas[0]
	for _, r := range st.Replicas {
		if r.Status == "READY" {
			rep = r
		}
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ferry_replicas", map[string]string{"service": "dash", "status": "READY", "kind": "spot", "infra": "aws", "zone": rep.Zone}, 1},
		{"ferry_autoscaler_target_replicas", map[string]string{"service": "dash"}, 1},
		{"ferry_jobs", map[string]string{"state": "RUNNING"}, 1},
		{"ferry_cost_dollars_per_hour", map[string]string{"workload": "service", "name": "dash", "kind": "spot"}, rep.Price},
		{"ferry_time_per_output_token_seconds_count", map[string]string{"service": "dash"}, 1},
	}
	for _, c := range checks {
		if got, ok := ctl.value(c.name, c.labels); !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("controller %s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if rep.Price <= 0 {
		t.Errorf("the spot replica has no catalog price: %+v", rep)
	}
	// The control plane's own series: a single controller on SQLite leads at term 0, has
	// timed its store writes and reconcile passes, and exports the client throttling and
	// queue series (with nothing waited or queued) without a Kubernetes client or queue.
	controlPlane := []struct {
		name    string
		labels  map[string]string
		atLeast float64
	}{
		{"ferry_controller_leader", nil, 1},
		{"ferry_controller_leader_term", nil, 0},
		{"ferry_store_write_duration_seconds_count", map[string]string{"store": "sqlite", "op": "SaveReplica"}, 1},
		{"ferry_reconcile_duration_seconds_count", map[string]string{"loop": "replicas"}, 1},
		{"ferry_kube_client_rate_limiter_wait_seconds_count", nil, 0},
		{"ferry_kube_client_request_duration_seconds_count", nil, 0},
		{"ferry_workqueue_depth", map[string]string{"queue": "ferryservices"}, 0},
	}
	for _, c := range controlPlane {
		if got, ok := ctl.value(c.name, c.labels); !ok || got < c.atLeast {
			t.Errorf("controller %s%v = %v (found %v), want at least %v", c.name, c.labels, got, ok, c.atLeast)
		}
	}
	if got, ok := ctl.value("ferry_cost_dollars_per_hour", map[string]string{"workload": "job", "kind": "on_demand"}); !ok || got <= 0 {
		t.Errorf("no cost for the running job's node: %v %v", got, ok)
	}
	px := scrape(t, "http://"+proxyMetrics+"/metrics")
	if got, _ := px.value("ferry_time_per_output_token_seconds_count", map[string]string{"service": "dash"}); got < 1 {
		t.Errorf("the attached proxy observed no TPOT: %v", got)
	}
	checkDashboard(t, ctl, px)
}

// streamOnce sends one streamed chat completion and reads it to the end.
func streamOnce(endpoint string) error {
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"Stream please"}],"max_tokens":5,"stream":true}`
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || err != nil {
		return fmt.Errorf("HTTP %d %v: %s", resp.StatusCode, err, raw)
	}
	return nil
}

// checkDashboard parses the dashboard and checks that every PromQL expression names at least
// one ferry_ series and only series that one of the scraped processes exports.
func checkDashboard(t *testing.T, scraped ...exposition) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "grafana", "ferry.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/ferry.json: %v", err)
	}
	exported := map[string]bool{}
	for _, s := range scraped {
		for name := range s {
			exported[name] = true
		}
	}
	metricName := regexp.MustCompile(`\bferry_[a-z0-9_]+`)
	exprs := 0
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			exprs++
			names := metricName.FindAllString(target.Expr, -1)
			for _, n := range names {
				queried[n] = true
			}
			if len(names) == 0 {
				t.Errorf("panel %q: %q queries no Ferry metric", p.Title, target.Expr)
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("panel %q queries %s, which neither the controller nor the proxy exports", p.Title, n)
				}
			}
		}
	}
	if exprs < 20 {
		t.Errorf("the dashboard has %d queries; want the full set (requests, TTFT, TPOT, fleet, jobs, cost)", exprs)
	}
	for _, name := range []string{"ferry_controller_leader", "ferry_controller_leader_term", "ferry_store_write_duration_seconds_bucket",
		"ferry_reconcile_duration_seconds_bucket", "ferry_kube_client_rate_limiter_wait_seconds_bucket",
		"ferry_kube_client_request_duration_seconds_bucket", "ferry_workqueue_depth"} {
		if !queried[name] {
			t.Errorf("no panel queries %s: the control plane's panels are missing", name)
		}
	}
}

// exposition is a scrape: series by sample name, each with its labels and value.
type exposition map[string][]sample

type sample struct {
	labels map[string]string
	value  float64
}

// value is the sum of the samples named name whose labels include want.
func (e exposition) value(name string, want map[string]string) (float64, bool) {
	var sum float64
	found := false
	for _, s := range e[name] {
		match := true
		for k, v := range want {
			match = match && s.labels[k] == v
		}
		if match {
			sum += s.value
			found = true
		}
	}
	return sum, found
}

var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrape reads a Prometheus text exposition.
func scrape(t *testing.T, url string) exposition {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	out := exposition{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := map[string]string{}
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			name, rest = line[:i], strings.TrimSpace(line[j+1:])
			for _, m := range labelPair.FindAllStringSubmatch(line[i+1:j], -1) {
				labels[m[1]] = m[2]
			}
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", url, line, err)
		}
		out[name] = append(out[name], sample{labels, v})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
