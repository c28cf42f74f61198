package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/controller"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/replicas"
)

func TestPrintStatusCostZonesAndKinds(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	st := api.ServiceStatus{Name: "chat", Version: 1, CreatedAt: now.Add(-time.Hour), Status: "READY", ReadyReplicas: 2, TargetReplicas: 2,
		Replicas: []replicas.Record{
			{ID: 1, Status: replicas.StatusReady, InstanceID: "aws/us-east-1/i-1", Infra: "aws", Zone: "use1-az4", Spot: true, Price: 0.4265},
			{ID: 2, Status: replicas.StatusReady, InstanceID: "gcp/us-central1-a/chat-2", Infra: "gcp", Zone: "us-central1-a", Price: 1.2},
			{ID: 3, Status: replicas.StatusPreempted, InstanceID: "aws/us-east-1/i-3", Infra: "aws", Spot: true, Price: 0.43},
			{ID: 4, Status: replicas.StatusProvisioning, Infra: "", Price: 0},
		}}
	if got := serviceCost(st.Replicas); got != 0.4265+1.2 {
		t.Errorf("serviceCost = %v, want the two live instances' prices", got)
	}
	var b bytes.Buffer
	printStatus(&b, []api.ServiceStatus{st}, false, now)
	out := b.String()
	for _, want := range []string{"COST ($/hr)", "1.63", "use1-az4", "spot", "on-demand", "0.43", "1.20"} {
		if !strings.Contains(out, want) {
			t.Errorf("status -v lacks %q:\n%s", want, out)
		}
	}
}

// TestPrintStatusShowsInfraHealth: when the service's last listing could not read an infra,
// `serve status` says which replicas are kept as last seen; -v also marks them in the table
// and shows the breakers of the infras its replicas are on.
func TestPrintStatusShowsInfraHealth(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	down := now.Add(-2 * time.Minute)
	st := api.ServiceStatus{Name: "chat", Version: 1, CreatedAt: now.Add(-time.Hour), Status: "READY", ReadyReplicas: 2, TargetReplicas: 2,
		Replicas: []replicas.Record{
			{ID: 1, Status: replicas.StatusReady, InstanceID: "local-1", Infra: "local"},
			{ID: 2, Status: replicas.StatusReady, InstanceID: "gcp/us-central1-a/chat-2", Infra: "gcp", Zone: "us-central1-a"},
			{ID: 3, Status: replicas.StatusFailed, InstanceID: "gcp/us-central1-a/chat-3", Infra: "gcp", Zone: "us-central1-a"},
		},
		Unknown: []api.UnknownPart{{Infra: "gcp", Reason: "gcp down since 11:58:00 after 3 failure(s): connection refused"}},
		Infras: []launcher.InfraState{
			{Infra: "gcp", State: launcher.InfraDown, Since: down, RetryAt: now.Add(4 * time.Second), Failures: 3, LastClass: "unavailable", LastError: "infra unavailable: connection refused"},
			{Infra: "local", State: launcher.InfraUp, Since: now.Add(-time.Hour)},
		}}

	var b bytes.Buffer
	printStatus(&b, []api.ServiceStatus{st}, false, now)
	out := b.String()
	if want := "chat: gcp did not answer the last listing (gcp down since 11:58:00 after 3 failure(s): connection refused): replica 2 there is kept as last seen; its instance is unknown, not gone."; !strings.Contains(out, want) {
		t.Errorf("status lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "Infras of the replicas") || strings.Contains(out, "instance unknown") {
		t.Errorf("status without -v shows the infras' health:\n%s", out)
	}

	b.Reset()
	printStatus(&b, []api.ServiceStatus{st}, true, now)
	out = b.String()
	for _, want := range []string{
		"instance unknown: gcp did not answer",
		"Infras of the replicas",
		"down for 2m 0s after 3 failures; next probe in 4s",
		"infra unavailable: connection refused",
		"up for 1h 0m",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status -v lacks %q:\n%s", want, out)
		}
	}
	// Replica 1 is on local, which answered; replica 3 ended: neither is unknown.
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "chat" && (f[1] == "1" || f[1] == "3") && strings.Contains(line, "instance unknown") {
			t.Errorf("replica %s marked unknown: %s", f[1], line)
		}
	}
}

// TestWriteInfraHealth: `ferry check`'s view of a running controller says each breaker's
// state, since when, its last error, the errors counted and what is left behind.
func TestWriteInfraHealth(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	h := api.InfraHealth{
		States: []launcher.InfraState{
			{Infra: "aws", State: launcher.InfraThrottled, Since: now.Add(-3 * time.Second), RetryAt: now.Add(time.Second), LastClass: "throttled", LastError: "throttled: RequestLimitExceeded"},
			{Infra: "gcp", State: launcher.InfraDown, Since: now.Add(-12 * time.Second), RetryAt: now.Add(4 * time.Second), Failures: 3, LastClass: "unavailable", LastError: "infra unavailable: connection refused"},
			{Infra: "gcp", Zone: "us-central1-f", State: launcher.InfraDown, Since: now.Add(-time.Minute), Failures: 1, LastClass: "not_found", LastError: "zone not found"},
			{Infra: "local", State: launcher.InfraUp, Since: now.Add(-time.Hour), Failures: 1, LastClass: "other", LastError: "spawn failed"},
		},
		Errors: []api.InfraErrors{{Infra: "aws", Class: "throttled", Count: 1}, {Infra: "gcp", Class: "not_found", Count: 3}, {Infra: "gcp", Class: "unavailable", Count: 12}},
		Leftovers: []launcher.Leftover{
			{Infra: "gcp", InstanceID: "gcp/us-central1-a/chat-2", Owner: "service chat", Since: now.Add(-5 * time.Minute)},
			{Infra: "gcp", Selector: map[string]string{"ferry-service": "chat"}, Before: now.Add(-5 * time.Minute), Owner: "service chat", Since: now.Add(-5 * time.Minute)},
		},
	}
	var b bytes.Buffer
	writeInfraHealth(&b, h, now)
	want := `  aws: throttled for 3s; next try in 1s
    last error (throttled): throttled: RequestLimitExceeded
  gcp: down for 12s after 3 failures; next probe in 4s
    last error (unavailable): infra unavailable: connection refused
  gcp/us-central1-f: down for 1m 0s after 1 failure
    last error (not_found): zone not found
  local: up for 1h 0m (1 failure in a row)
    last error (other): spawn failed
  errors counted: aws: throttled 1; gcp: not_found 3, unavailable 12
  left behind, stopped once their infra answers again:
    gcp: gcp/us-central1-a/chat-2 (service chat, for 5m 0s)
    gcp: any other instance on gcp labelled ferry-service=chat launched before 2026-11-26T11:55:00Z (service chat, for 5m 0s)
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("check's view (-want +got):\n%s", diff)
	}

	b.Reset()
	writeInfraHealth(&b, api.InfraHealth{States: []launcher.InfraState{{Infra: "local", State: launcher.InfraUp, Since: now.Add(-time.Minute)}}}, now)
	if want := "  local: up for 1m 0s\n  nothing left behind\n"; b.String() != want {
		t.Errorf("healthy view = %q, want %q", b.String(), want)
	}
}

// TestPrintLeftBehindAndQueue: what a teardown left is listed by infra with the promise that
// Ferry finishes it; `jobs queue` adds a line per infra that does not take calls, and a job's
// leftovers in its details.
func TestPrintLeftBehindAndQueue(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	left := []launcher.Leftover{
		{Infra: "gcp", InstanceID: "gcp/us-central1-a/train-3-0", Owner: "job 3", Reason: "gcp down since 11:59:00 after 3 failure(s): connection refused"},
		{Infra: "aws", InstanceID: "aws/us-east-1/i-0abc", Owner: "job 3", Reason: "throttled"},
		{Infra: "gcp", InstanceID: "gcp/us-central1-a/train-3-1", Owner: "job 3"},
	}
	var b bytes.Buffer
	printLeftBehind(&b, left)
	want := `  Left on aws, which did not answer (throttled):
    aws/us-east-1/i-0abc
  Left on gcp, which did not answer (gcp down since 11:59:00 after 3 failure(s): connection refused):
    gcp/us-central1-a/train-3-0
    gcp/us-central1-a/train-3-1
  Ferry stops them when aws or gcp answers again, after a controller restart too; 'ferry check' shows what is still left.
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("left behind (-want +got):\n%s", diff)
	}
	b.Reset()
	printLeftBehind(&b, nil)
	if b.Len() != 0 {
		t.Errorf("nothing left printed %q", b.String())
	}

	b.Reset()
	cancelled := api.JobStatus{Job: jobs.Job{ID: 3, Name: "train", State: jobs.Cancelled, SubmittedAt: now.Add(-time.Hour), Reason: "cancelled by the user",
		LeftBehind: left}}
	printJobs(&b, []api.JobStatus{cancelled}, now)
	printInfrasNotUp(&b, api.InfraHealth{States: []launcher.InfraState{
		{Infra: "gcp", State: launcher.InfraDown, Since: now.Add(-time.Minute), Failures: 3, LastError: "infra unavailable: connection refused"},
		{Infra: "local", State: launcher.InfraUp},
		{Infra: "aws", Zone: "us-east-2", State: launcher.InfraThrottled, Since: now.Add(-time.Second), RetryAt: now.Add(time.Second), LastError: "throttled"},
	}}, now)
	out := b.String()
	for _, want := range []string{
		"3 left behind on aws, gcp, stopped once each infra answers again",
		"gcp is down for 1m 0s after 3 failures: infra unavailable: connection refused; launches skip it, and jobs with nodes there are kept as last seen until it answers.",
		"aws/us-east-2 is throttled for 1s; next try in 1s: throttled; Ferry calls it less often until it stops asking.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("queue lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "local is") {
		t.Errorf("queue mentions an infra that is up:\n%s", out)
	}
}

// ferryRun runs the CLI in this process, as a user would type it, and returns its output.
func ferryRun(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	t.Logf("$ ferry %s\n%s", strings.Join(args, " "), out.String())
	return out.String(), err
}

// eventually polls cond every 100 ms until it holds, failing the test after timeout with
// what cond last said.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s; last: %s", what, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestCLIWhileGCPRefusesEveryCall runs a controller in this process with GCP enabled at an
// endpoint that refuses every connection (a regional outage as Ferry's calls see it), a
// local service whose replicas may go anywhere, and a local job, and drives the CLI against
// it: check, serve status -v, jobs queue and /metrics show GCP down; serve down succeeds and
// says what is left on GCP and that Ferry finishes it; check then lists the leftover; jobs
// cancel waits for the local job to end.
func TestCLIWhileGCPRefusesEveryCall(t *testing.T) {
	dir := t.TempDir()
	h := home.Home{Dir: filepath.Join(dir, "home")}
	t.Setenv(home.Env, h.Dir)
	t.Setenv("KUBECONFIG", filepath.Join(dir, "no-kubeconfig")) // no cluster from the machine running the test
	if err := h.Ensure(); err != nil {
		t.Fatal(err)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := closed.Addr().String()
	closed.Close()
	cfg := "gcp:\n  project: ferry-test\n  regions: [us-central1]\n  endpoint: http://" + refusing + "\n"
	if err := os.WriteFile(infra.ConfigPath(h), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	core, logs := observer.New(zap.InfoLevel)
	ctl := controller.New(controller.Options{Home: h, GatewayAddr: controller.ListenerOff, MetricsAddr: "127.0.0.1:0",
		ProbeInterval: 200 * time.Millisecond, JobWatchInterval: 200 * time.Millisecond, Logger: zap.New(core)})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ctlCtx, stopCtl := context.WithCancel(context.Background()) // not ctx: its deferred cancel runs before the cleanup takes the replicas down
	stopped := make(chan error, 1)
	go func() { stopped <- ctl.Start(ctlCtx) }()
	var c *api.Client
	t.Cleanup(func() {
		if c != nil { // whatever the test left, so that no replica outlives it
			cleanCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, _ = c.DeleteService(cleanCtx, "cpu-chat")
			_, _ = c.CancelJob(cleanCtx, "sleeper")
			cancel()
		}
		stopCtl()
		select {
		case <-stopped:
		case <-time.After(time.Minute):
			t.Error("the controller did not stop within a minute")
		}
		if t.Failed() {
			for _, e := range logs.All() {
				t.Logf("controller: %s %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
	})
	eventually(t, time.Minute, "the controller answers", func() (bool, string) {
		var err error
		c, _, err = connect(ctx, h)
		return err == nil, fmt.Sprint(err)
	})

	// A service that may run anywhere: its replica goes to local, its listing asks GCP too.
	svcFile := filepath.Join(dir, "cpu-chat.yaml")
	if err := os.WriteFile(svcFile, []byte("name: cpu-chat\nrun: exec sleep 300\nservice:\n  replicas: 1\n  ports: 8080\n  readiness_probe: /health\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	task, err := configs.Load(svcFile, configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateService(ctx, api.CreateServiceRequest{Name: "cpu-chat", Task: task}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "gcp's breaker opens and the replica runs on local", func() (bool, string) {
		health, err := c.Infras(ctx)
		if err != nil {
			return false, err.Error()
		}
		list, err := c.Services(ctx, "cpu-chat")
		if err != nil {
			return false, err.Error()
		}
		gcpDown := slices.ContainsFunc(health.States, func(s launcher.InfraState) bool {
			return s.Infra == "gcp" && s.Zone == "" && s.State == launcher.InfraDown
		})
		onLocal := slices.ContainsFunc(list[0].Replicas, func(r replicas.Record) bool { return r.Infra == "local" && r.InstanceID != "" })
		return gcpDown && onLocal && len(list[0].Unknown) > 0, fmt.Sprintf("states %+v; replicas %+v; unknown %+v", health.States, list[0].Replicas, list[0].Unknown)
	})

	out, err := ferryRun(ctx, t, "check")
	if err != nil {
		t.Fatalf("ferry check: %v\n%s", err, out)
	}
	for _, want := range []string{"The controller's view (pid ", "  local: up for ", "  gcp: down for ", "    last error (", "errors counted: gcp: ", "  nothing left behind"} {
		if !strings.Contains(out, want) {
			t.Errorf("ferry check lacks %q:\n%s", want, out)
		}
	}
	// Three failures open the breaker; each failed probe since adds one.
	if !regexp.MustCompile(`(?m)^  gcp: down for .* after [3-9]\d* failures`).MatchString(out) {
		t.Errorf("ferry check does not say how many failures opened gcp's breaker:\n%s", out)
	}

	began := time.Now()
	out, err = ferryRun(ctx, t, "serve", "status", "-v", "cpu-chat")
	took := time.Since(began)
	if err != nil {
		t.Fatalf("serve status -v: %v\n%s", err, out)
	}
	for _, want := range []string{"cpu-chat: gcp did not answer the last listing (", "none of its replicas is there", "Infras of the replicas", "gcp", "down for "} {
		if !strings.Contains(out, want) {
			t.Errorf("serve status -v lacks %q:\n%s", want, out)
		}
	}
	// It reads the controller's memory: GCP's outage costs it nothing. (The issue asks for
	// under 1 s; the bound is loose for a loaded machine running the race detector.)
	if took > 3*time.Second {
		t.Errorf("serve status -v took %s while GCP was down", took)
	}

	out, err = ferryRun(ctx, t, "jobs", "queue")
	if err != nil || !strings.Contains(out, "gcp is down for ") || !strings.Contains(out, "launches skip it") {
		t.Errorf("jobs queue: %v\n%s", err, out)
	}

	// The optimizer table skips what the controller finds down, says why, and does not wait
	// on it.
	began = time.Now()
	out, err = ferryRun(ctx, t, "serve", "up", svcFile, "--dry-run")
	if err != nil || !strings.Contains(out, "Skipped gcp, down for ") || regexp.MustCompile(`(?m)^gcp\s`).MatchString(out) {
		t.Errorf("serve up --dry-run with gcp down: %v\n%s", err, out)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("the plan took %s with gcp down", took)
	}

	st, err := c.ControllerStatus(ctx)
	if err != nil || st.Metrics == "" {
		t.Fatalf("controller status: %+v, %v", st, err)
	}
	metrics := scrape(ctx, t, st.Metrics)
	for _, want := range []string{`ferry_infra_up{infra="gcp",zone=""} 0`, `ferry_infra_up{infra="local",zone=""} 1`, `ferry_infra_leftovers{infra="gcp"} 0`, `ferry_infra_errors_total{class=`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// A local job, cancelled: the command waits until it has ended.
	jobFile := filepath.Join(dir, "sleeper.yaml")
	if err := os.WriteFile(jobFile, []byte("name: sleeper\nresources:\n  infra: local\nrun: exec sleep 300\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jobTask, err := configs.Load(jobFile, configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	job, err := c.LaunchJob(ctx, jobTask)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the job runs", func() (bool, string) {
		j, err := c.Job(ctx, "sleeper")
		return err == nil && j.State == jobs.Running, fmt.Sprintf("%s %s %v", j.State, j.Reason, err)
	})
	out, err = ferryRun(ctx, t, "jobs", "cancel", "sleeper", "-y", "--wait-timeout", "2m")
	if want := fmt.Sprintf("Job %d (sleeper): CANCELLED", job.ID); err != nil || !strings.Contains(out, want) {
		t.Errorf("jobs cancel: %v; want %q in:\n%s", err, want, out)
	}
	if j, err := c.Job(ctx, "sleeper"); err != nil || !j.State.Terminal() {
		t.Errorf("after jobs cancel returned the job is %s (%v)", j.State, err)
	}

	out, err = ferryRun(ctx, t, "serve", "down", "cpu-chat", "-y")
	if err != nil {
		t.Fatalf("serve down while gcp is down: %v\n%s", err, out)
	}
	for _, want := range []string{
		`✓ Service "cpu-chat" is down, except what could not be reached:`,
		"  Left on gcp, which did not answer (",
		"    any other instance on gcp labelled ",
		"  Ferry stops it when gcp answers again, after a controller restart too",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("serve down lacks %q:\n%s", want, out)
		}
	}
	if list, err := c.Services(ctx); err != nil || len(list) != 0 {
		t.Errorf("after serve down: services %v, %v; want none", list, err)
	}

	out, err = ferryRun(ctx, t, "check")
	if err != nil || !strings.Contains(out, "left behind, stopped once their infra answers again:\n    gcp: any other instance on gcp labelled ") ||
		!strings.Contains(out, "(service cpu-chat, for ") {
		t.Errorf("ferry check after serve down: %v\n%s", err, out)
	}
	if metrics := scrape(ctx, t, st.Metrics); !strings.Contains(metrics, `ferry_infra_leftovers{infra="gcp"} 1`) {
		t.Errorf("/metrics after serve down lacks the leftover on gcp:\n%s", metrics)
	}
}

// scrape GETs a metrics URL.
func scrape(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
	}
	return string(body)
}

// scriptedJobs answers the jobs routes with a job that is CANCELLING for its first looks and
// then ended with what it left; "stuck" never ends.
type scriptedJobs struct {
	looks  atomic.Int32
	ending int32
	final  jobs.Job
}

func (s *scriptedJobs) Find(ref string) (jobs.Job, error) {
	if ref == "stuck" || ref == "8" {
		return jobs.Job{ID: 8, Name: "stuck", State: jobs.Cancelling}, nil
	}
	if s.looks.Add(1) <= s.ending {
		return jobs.Job{ID: s.final.ID, Name: s.final.Name, State: jobs.Cancelling}, nil
	}
	return s.final, nil
}
func (s *scriptedJobs) Submit(*configs.Task) (jobs.Job, error) { return jobs.Job{}, jobs.ErrInvalid }
func (s *scriptedJobs) SubmitPipeline(*configs.Pipeline) (jobs.Job, error) {
	return jobs.Job{}, jobs.ErrInvalid
}
func (s *scriptedJobs) List() []jobs.Job               { return nil }
func (s *scriptedJobs) Cancel(int64) (jobs.Job, error) { return jobs.Job{}, jobs.ErrInvalid }
func (s *scriptedJobs) Logs(context.Context, string, int, bool, io.Writer) error {
	return jobs.ErrInvalid
}

// TestWaitCancelled: jobs cancel waits until a job has ended and prints what it left and that
// Ferry finishes it; a job still stopping when the wait is over is said to go on, and that is
// no failure.
func TestWaitCancelled(t *testing.T) {
	left := []launcher.Leftover{{Infra: "gcp", InstanceID: "gcp/us-central1-a/train-3-0", Owner: "job 3", Reason: "gcp down"}}
	js := &scriptedJobs{ending: 3, final: jobs.Job{ID: 3, Name: "train", State: jobs.Cancelled,
		Reason: "cancelled by the user; 1 node(s) left on gcp, stopped when gcp answers again", LeftBehind: left}}
	const token = "wait-cancelled-test-token-0123456789"
	srv := httptest.NewServer(api.NewHandler(nil, api.Tokens{Full: token}, zap.NewNop(), api.JobRoutes(js, zap.NewNop())...))
	defer srv.Close()
	c := api.NewClient(srv.URL, token)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var b bytes.Buffer
	if err := waitCancelled(ctx, c, []api.JobStatus{{Job: jobs.Job{ID: 3, Name: "train", State: jobs.Cancelling}}}, 30*time.Second, &b); err != nil {
		t.Fatal(err)
	}
	want := `Job 3 (train): CANCELLED: cancelled by the user; 1 node(s) left on gcp, stopped when gcp answers again
  Left on gcp, which did not answer (gcp down):
    gcp/us-central1-a/train-3-0
  Ferry stops it when gcp answers again, after a controller restart too; 'ferry check' shows what is still left.
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("waited (-want +got):\n%s", diff)
	}
	if n := js.looks.Load(); n != 4 {
		t.Errorf("looked %d times, want until the job ended (4)", n)
	}

	b.Reset()
	began := time.Now()
	if err := waitCancelled(ctx, c, []api.JobStatus{{Job: jobs.Job{ID: 8, Name: "stuck", State: jobs.Cancelling}}}, time.Second, &b); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("a wait of 1s took %s", took)
	}
	if want := "Job 8 (stuck) is still CANCELLING; Ferry goes on stopping it (follow it with ferry jobs queue).\n"; b.String() != want {
		t.Errorf("stuck job: %q, want %q", b.String(), want)
	}
}

// TestPrintStatusShowsSpotLosses: -v says what the controller believes of a service's spot
// losses: how many, where, and whether they hold its on-demand fallback, and until when.
func TestPrintStatusShowsSpotLosses(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 10, 0, 0, time.UTC)
	last := time.Date(2026, 11, 26, 12, 3, 4, 0, time.UTC)
	var l policy.Losses
	for i, zone := range []string{"us-east-1a", "us-east-1b", "us-east-1a", "us-east-1a", "us-east-1b"} {
		l.Lost(last.Add(time.Duration(i-4)*30*time.Minute), zone)
	}
	st := api.ServiceStatus{Name: "chat", Version: 1, CreatedAt: now.Add(-3 * time.Hour), Status: "READY",
		SpotLosses: &api.SpotLosses{Losses: l, Hold: 30 * time.Minute, RecentGaps: 4, HeldUntil: last.Add(30 * time.Minute)}}

	var b bytes.Buffer
	printStatus(&b, []api.ServiceStatus{st}, false, now)
	if strings.Contains(b.String(), "spot losses") {
		t.Errorf("status without -v shows spot losses:\n%s", b.String())
	}
	b.Reset()
	printStatus(&b, []api.ServiceStatus{st}, true, now)
	for _, want := range []string{
		"chat: spot losses: 5 (last 12:03:04, 4 recent gaps, hold 30m 0s: on-demand fallback held until 12:33:04)",
		"  us-east-1a: 3 lost, last 11:33:04\n  us-east-1b: 2 lost, last 12:03:04\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status -v lacks %q:\n%s", want, b.String())
		}
	}

	st.SpotLosses.HeldUntil = time.Time{}
	b.Reset()
	printStatus(&b, []api.ServiceStatus{st}, true, now.Add(2*time.Hour))
	if want := "chat: spot losses: 5 (last 12:03:04, 4 recent gaps, hold 30m 0s: ended 12:33:04)"; !strings.Contains(b.String(), want) {
		t.Errorf("status -v after the hold lacks %q:\n%s", want, b.String())
	}
	st.SpotLosses.Hold, st.SpotLosses.RecentGaps = 0, 1
	b.Reset()
	printStatus(&b, []api.ServiceStatus{st}, true, now.Add(48*time.Hour))
	if want := "chat: spot losses: 5 (last 2026-11-26 12:03:04, 1 recent gap: not a run, nothing held)"; !strings.Contains(b.String(), want) {
		t.Errorf("status -v without a hold lacks %q:\n%s", want, b.String())
	}

	// A zone that refused a launch with 2 of the service's spot replicas in it, no loss yet:
	// its ceiling and the spare it asks for show.
	var capped policy.Losses
	capped.Capped(last, "us-east-1c", 2)
	st.SpotLosses = &api.SpotLosses{Losses: capped, Spare: 1}
	b.Reset()
	printStatus(&b, []api.ServiceStatus{st}, true, now)
	for _, want := range []string{
		"chat: spot losses: none\n",
		"  us-east-1c: 0 lost; held at most 2 spot replicas at 12:03:04\n",
		"chat: spare: 1 spot replica beyond the target, while a zone holds as many as its ceiling\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status -v with a ceiling lacks %q:\n%s", want, b.String())
		}
	}
}
