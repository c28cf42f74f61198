package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
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
		"3 left on aws, gcp until it answers",
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
