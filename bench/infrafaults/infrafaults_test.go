package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/bench/servicekit"
)

// TestInfraFaultsShort is issue 32's fault table, --short, against a ferry built from the
// working tree: every infra fault must leave local and healthy-infra work unaffected, keep
// `serve status` under a second, tear down what it can and name what it cannot, and clean the
// failing infra once it answers again.
func TestInfraFaultsShort(t *testing.T) {
	bin, out := servicekit.ShortRunEnv(t)
	opts, err := parseFlags([]string{"--short", "--ferry-bin", bin, "--out", out})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var summary bytes.Buffer
	start := time.Now()
	rep, err := execute(ctx, opts, &summary, func(format string, args ...any) { t.Logf(format, args...) })
	t.Logf("run took %v; summary:\n%s", time.Since(start).Round(time.Second), summary.String())
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	if got, want := len(rep.Results), len(scenarios()); got != want {
		t.Fatalf("%d scenarios ran, want %d", got, want)
	}
	for _, s := range rep.Results {
		if !s.Passed {
			t.Errorf("scenario %s (%s) failed: %s", s.Key, s.Title, strings.Join(s.Why, "; "))
		}
		if s.FailingRequests == 0 || s.LocalRequests == 0 || s.StatusCalls == 0 {
			t.Errorf("scenario %s measured nothing: %d local requests, %d to the failing infra's service, %d status calls",
				s.Key, s.LocalRequests, s.FailingRequests, s.StatusCalls)
		}
		if !s.Passed || s.Key == "gcp-503" {
			t.Logf("%s: serve down printed:\n%s", s.Key, strings.Join(s.DownOutput, "\n"))
		}
	}
	for _, p := range rep.Teardown {
		t.Errorf("teardown: %s", p)
	}
	if t.Failed() {
		t.Logf("controller.log, warnings and errors:\n%s", servicekit.LogLevels(filepath.Join(out, "home", "controller.log"), "warn", "error"))
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--short"})
	if err != nil || o.outage != 20*time.Second {
		t.Fatalf("--short: %+v, %v; want a 20s outage", o, err)
	}
	if _, err := parseFlags([]string{"--only", "nope"}); err == nil || !strings.Contains(err.Error(), "not a scenario") {
		t.Fatalf("--only nope: %v", err)
	}
	if _, err := parseFlags([]string{"--outage", "0s"}); err == nil {
		t.Fatal("--outage 0s accepted")
	}
}
