package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// simTestdata is bench/sim's slices of the real inputs.
const simTestdata = "../../bench/sim/testdata"

func runSim(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"sim"}, args...))
	err = root.Execute()
	return out.String(), errOut.String(), err
}

func simInputs(trace string) []string {
	return []string{
		"--trace", trace,
		"--spot-traces", filepath.Join(simTestdata, "spot-real"),
		"--catalog", filepath.Join(simTestdata, "catalog"),
	}
}

func TestSimCommand(t *testing.T) {
	out := t.TempDir()
	args := append(simInputs(filepath.Join(simTestdata, "conv-400.csv")),
		"--duration", "30m", "--warmup", "5m", "--fleet", "2", "--policies", "ferry,skyserve-spothedge,ondemand", "--out", out)
	stdout, stderr, err := runSim(t, args...)
	if err != nil {
		t.Fatalf("ferry sim: %v\nstderr:\n%s", err, stderr)
	}
	for _, want := range []string{"| policy", "| ferry ", "| skyserve-spothedge ", "| ondemand ", "## Issue targets", "sim.svg"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	for _, want := range []string{"calibrated target_qps_per_replica", "ferry ", "done in"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("progress lacks %q:\n%s", want, stderr)
		}
	}
	svg, err := os.ReadFile(filepath.Join(out, "sim.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.HasSuffix(bytes.TrimSpace(svg), []byte("</svg>")) || !bytes.Contains(svg, []byte("skyserve-spothedge: replicas")) {
		t.Errorf("sim.svg is not a complete plot of the policies (%d bytes)", len(svg))
	}
	for _, f := range []string{"summary.md", "results.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("no %s: %v", f, err)
		}
	}
}

func TestSimCommandBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.csv")
	if err := os.WriteFile(bad, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0000000,many,44\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.csv")
	tests := map[string]struct {
		args []string
		want []string
	}{
		"missing trace":  {simInputs(missing), []string{missing, "no such file"}},
		"bad trace line": {simInputs(bad), []string{bad, "line 3"}},
		"bad flag value": {append(simInputs(bad), "--time-scale", "-1"), []string{"--time-scale=-1"}},
		"bad fleet":      {append(simInputs(bad), "--fleet", "0"), []string{"--fleet=0"}},
		"bad notice":     {append(simInputs(bad), "--gcp-notice", "-1s"), []string{"--gcp-notice=-1s"}},
		"unknown policy": {append(simInputs(bad), "--policies", "ferry,magic"), []string{"magic", "unknown policy"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := runSim(t, append(tc.args, "--out", t.TempDir())...)
			if err == nil {
				t.Fatal("ferry sim succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestSimCommandHelp(t *testing.T) {
	stdout, _, err := runSim(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Examples:", "ferry sim --sweep", "--fleet", "--aws-notice", "--gcp-notice", "--spot-offset", "--slo-ttft", "--cold-start", "--sets", "derived/gcp-04-30-2023-counted"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// TestSimCommandSweep runs the sweep over testdata's two spot sets (an AWS 0/1 slice and a
// GCP one) at two fleet sizes, briefly: one table, one plot.
func TestSimCommandSweep(t *testing.T) {
	out := t.TempDir()
	stdout, stderr, err := runSim(t, "--sweep", "--trace", filepath.Join(simTestdata, "conv-400.csv"), "--spot-root", simTestdata,
		"--catalog", filepath.Join(simTestdata, "catalog"), "--skyserve-target-qps", "0.25", "--fleets", "2,3",
		"--duration", "30m", "--warmup", "5m", "--policies", "ferry,skyserve-spothedge,skyserve-spothedge-0,ondemand", "--out", out)
	if err != nil {
		t.Fatalf("ferry sim --sweep: %v\nstderr:\n%s", err, stderr)
	}
	for _, want := range []string{"## Summary", "| spot-real ", "| spot-gcp ", "us-central1-a us-east1-b", "beats sky+SH", "### spot-gcp, fleet 3", "sweep.svg",
		"SLO ≥ sky+SH − 0.2", "spot holds the fleet", "≤ 1.10 × floor"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if n := strings.Count(stderr, " done in "); n != 2*2*4 {
		t.Errorf("%d simulations done, want 2 sets × 2 fleets × 4 policies:\n%s", n, stderr)
	}
	svg, err := os.ReadFile(filepath.Join(out, "sweep.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("spot-gcp")) || !bytes.HasSuffix(bytes.TrimSpace(svg), []byte("</svg>")) {
		t.Errorf("sweep.svg is not a plot of both sets (%d bytes)", len(svg))
	}
}
