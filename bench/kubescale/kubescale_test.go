package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/bench/servicekit"
)

// TestKubeScaleShort is issue 36's scale scenario at 4 services × 3 replicas, judged on the same
// checks as the full run: every replica READY, the leader's RSS and reconcile p99, a takeover
// after kill -9 that publishes every service, relaunches no pod and fails no request, and serve
// down -a removing every pod.
func TestKubeScaleShort(t *testing.T) {
	bin, out := servicekit.ShortRunEnv(t)
	opts, err := parseFlags([]string{"--services", "4", "--replicas", "3", "--ferry-bin", bin, "--out", out})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var summary bytes.Buffer
	start := time.Now()
	rep, err := execute(ctx, opts, &summary, func(format string, args ...any) { t.Logf(format, args...) })
	t.Logf("run took %v; summary:\n%s", time.Since(start).Round(time.Second), summary.String())
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	for _, m := range rep.missed() {
		t.Errorf("not met: %s", m)
	}
	if rep.RequestsAfterTakeover == 0 {
		t.Errorf("no request completed after the takeover")
	}
	if t.Failed() {
		logs, _ := filepath.Glob(filepath.Join(out, "logs", "*-ctl-*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", filepath.Base(l), servicekit.LastLines(string(b), 40))
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil || o.services != 100 || o.replicas != 10 || o.nodes() != 125 {
		t.Fatalf("defaults: %+v, %v; want 100 × 10 on 125 nodes", o, err)
	}
	for _, args := range [][]string{{"--services", "0"}, {"--load-services", "5", "--services", "4"}, {"--ready-target", "0s"}, {"extra"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%s accepted", strings.Join(args, " "))
		}
	}
}
