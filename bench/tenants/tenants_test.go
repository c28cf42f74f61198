package main

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/configs"
)

// TestTenantsShort runs every phase briefly (the budget phase at its full 30,000 tokens: what
// one proxy overshoots is about the requests in flight when the limit is reached times their
// answers, whatever the limit, so a small limit would show it as a large share): two attached proxies in front of a service that
// takes managed keys only. A key's daily token limit holds within 5 % across both proxies, its
// refusals carry Retry-After and OpenAI's headers; batch requests are shed and interactive ones
// are not; `ferry usage` equals the tokens the replicas reported; and a light tenant under its
// own key waits less behind a saturating tenant than under that tenant's key. (The 1.5× TTFT bar
// is judged by the full run, `make bench-tenants`: a 2-core CI host saturated by the load itself
// makes a short run's p99 the host's; so is the CPU phase's ratio.)
func TestTenantsShort(t *testing.T) {
	bin, out := servicekit.ShortRunEnv(t)
	root, err := benchkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(root, "..", "shared", "data", "traces", "AzureLLMInferenceTrace_conv.csv")
	opts, err := parseFlags([]string{"--phase", "10s", "--trace", trace, "--cpu-rounds", "2", "--cpu-requests", "2000",
		"--ferry-bin", bin, "--out", out})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := execute(ctx, &opts, func(format string, args ...any) { t.Logf(format, args...) })
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	t.Logf("run took %v; summary:\n%s", time.Since(start).Round(time.Second), rep.markdown())
	if !rep.Budget.Pass {
		t.Errorf("budget: %+v", rep.Budget)
	}
	if !rep.Shed.Pass {
		t.Errorf("shedding: %+v", rep.Shed)
	}
	if !rep.Usage.Pass {
		t.Errorf("usage: answers %v, ferry usage %v", rep.Usage.Reported, rep.Usage.Recorded)
	}
	// The CPU phase's ratio is judged by the full run: a short one on a busy host is noise. Here
	// its requests all succeed, its managed key's answers carry their headers, and it measures.
	if c := rep.CPU; len(c.Rounds) != 2 || len(c.Pairs) != 1 || c.Median <= 0 || c.Rounds[0].Own <= 0 || c.Rounds[1].ManagedProxy != 1 || c.Headers["X-Ratelimit-Limit-Tokens"] == "" {
		t.Errorf("cpu: %+v", c)
	}
	f := rep.Fair
	if f.Loaded.Failed > 0 || f.Unloaded.Failed > 0 || f.Loaded.N == 0 || f.SameKey.N == 0 || f.Loaded.P50 >= f.SameKey.P50 {
		t.Errorf("fair share: the light tenant's own key (%+v) did not beat the heavy tenant's line (%+v)", f.Loaded, f.SameKey)
	}
	if t.Failed() {
		t.Logf("controller.log, warnings and errors:\n%s", servicekit.LogLevels(filepath.Join(out, "home", "controller.log"), "warn", "error"))
	}
}

func TestFlagsAndTheServiceTheyWrite(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	task, err := configs.Parse("tenants.yaml", []byte(o.yaml()), configs.Overrides{})
	if err != nil {
		t.Fatalf("the driver's service does not parse: %v\n%s", err, o.yaml())
	}
	if a := task.Service.Auth; a == nil || !a.ManagedKeys || task.Service.Limits.MaxInFlightPerReplica != o.maxNumSeqs {
		t.Fatalf("auth %+v, limits %+v", task.Service.Auth, task.Service.Limits)
	}
	t.Setenv(cpuKeyEnv, "sk-bench-0123456789abcdef0123456789abcdef")
	cpu, err := configs.Parse("tenants-cpu.yaml", []byte(o.cpuYAML()), configs.Overrides{})
	if err != nil {
		t.Fatalf("the CPU phase's service does not parse: %v\n%s", err, o.cpuYAML())
	}
	if a := cpu.Service.Auth; a == nil || !a.ManagedKeys || len(a.KeysFromEnv) != 1 {
		t.Fatalf("the CPU phase's auth %+v: managed keys and the service's own", a)
	}
	for _, args := range [][]string{{"--cpu-rounds", "0"}, {"--phases", "fair,nap"}, {"--phase", "1s"}, {"--replicas", "9"}, {"--light-rate", "0"}, {"--budget-tokens", "10"}, {"extra"}} {
		if _, err := parseFlags(args); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("%v: error %v", args, err)
		}
	}
}

// The CPU phase's verdict takes each pair of rounds (both proxies in both roles) as the geometric
// mean of its ratios, so that a proxy that is costlier in itself weighs on both keys alike, and
// then the median of the pairs.
func TestCPUJudgePairsRounds(t *testing.T) {
	var res cpuResult
	for _, r := range []float64{1.21, 0.90, 1.00, 1.00, 1.44, 0.81, 1.30} {
		res.Rounds = append(res.Rounds, cpuRound{Ratio: r})
	}
	res.judge()
	want := []float64{math.Sqrt(1.21 * 0.90), 1, math.Sqrt(1.44 * 0.81), 1.30}
	if len(res.Pairs) != len(want) {
		t.Fatalf("pairs %v, want %v", res.Pairs, want)
	}
	for i := range want {
		if math.Abs(res.Pairs[i]-want[i]) > 1e-9 {
			t.Fatalf("pairs %v, want %v", res.Pairs, want)
		}
	}
	if m := (want[0] + want[2]) / 2; math.Abs(res.Median-m) > 1e-9 || !res.Pass {
		t.Errorf("median %.4f pass %v, want %.4f (the middle two of 1.00, 1.04, 1.08, 1.30: 1.04 and 1.08) and pass", res.Median, res.Pass, m)
	}
}
