package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// planRowRE matches a row of the optimizer's table and captures its infra.
var planRowRE = regexp.MustCompile(`(?m)^(local|kubernetes/\S+|aws|gcp)\s`)

// TestSkyPilotExamplesDryRun runs `--dry-run` on every YAML of configs/testdata/skypilot
// (written in the shape of SkyPilot's published serving and jobs examples) through the real
// binary, on a home where every infra is enabled: local, the test cluster's context (with an
// L40S node) and both fake clouds. Each must be called valid with a plan, and what SkyPilot
// would have filled in must show in the resolved spec.
func TestSkyPilotExamplesDryRun(t *testing.T) {
	k := newKubeEnv(t, "NVIDIA-L40S", 1, 1, 2)
	clouds := startFakeClouds(t)
	k.extraEnv = awsEnv
	cfg, err := os.ReadFile(filepath.Join(k.home, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(k.home, "config.yaml"), string(cfg)+clouds.config())
	kube := "kubernetes/" + k.cluster.Context()

	tests := []struct {
		file string
		job  bool
		// wantInfras must each have a row in the plan; notInfras must have none (a GPU task
		// without infra never lands on this GPU-less machine).
		wantInfras, notInfras []string
		// wantShown must appear in the output (the resolved spec or the plan).
		wantShown []string
	}{
		{file: "vllm.yaml", wantInfras: []string{"gcp", "aws"}, notInfras: []string{"local"}, wantShown: []string{
			`"model":"meta-llama/Meta-Llama-3.1-8B-Instruct"`,
			"accelerators: {L4: 1, A10G: 1, A10: 1, A100: 1, A100-80GB: 1}",
			"HF_TOKEN: <redacted>",
		}},
		{file: "sglang.yaml", wantInfras: []string{"gcp", "aws"}, notInfras: []string{"local"}, wantShown: []string{"instance_aware_least_load", "disk_tier: best", "app.example.com/engine: sglang"}},
		{file: "tgi.yaml", wantInfras: []string{"gcp", "aws"}, notInfras: []string{"local"}, wantShown: []string{"accelerators: ['L4:1', 'A10G:1', 'A100:1']"}},
		{file: "gemma-kubernetes.yaml", wantInfras: []string{kube}, wantShown: []string{
			`"model":"google/gemma-2b-it"`, "X-Model: google/gemma-2b-it", "L40S",
		}},
		{file: "http-server.yaml", wantInfras: []string{"local", kube, "aws"}, wantShown: []string{"workdir: " + repoRoot()}},
		{file: "minimal.yaml"},
		{file: "torchrun.yaml", job: true, wantInfras: []string{"gcp"}, notInfras: []string{"local"}, wantShown: []string{"/checkpoints/run-1: s3://my-checkpoints/run-1", "idle_minutes: 10"}},
		{file: "batch.yaml", job: true, wantInfras: []string{"gcp"}, wantShown: []string{"instance_type: n1-standard-8", "disk_tier: high"}},
	}
	files, err := filepath.Glob(filepath.Join(repoRoot(), "configs/testdata/skypilot/*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(tests) {
		t.Fatalf("%d compatibility YAMLs but %d cases: give every YAML a case", len(files), len(tests))
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join("configs/testdata/skypilot", tc.file)
			args := []string{"serve", "up", path, "--dry-run", "--secret", "HF_TOKEN=hf_e2e_compat"}
			if tc.job {
				args = []string{"jobs", "launch", path, "--dry-run"}
			}
			out := k.mustRun(args...)
			if !strings.Contains(out, "Dry run:") || !strings.Contains(out, "is valid; nothing was launched") {
				t.Fatalf("not called valid:\n%s", out)
			}
			if strings.Contains(out, "hf_e2e_compat") {
				t.Fatalf("the dry run printed a secret:\n%s", out)
			}
			var infras []string
			for _, m := range planRowRE.FindAllStringSubmatch(out, -1) {
				if !slices.Contains(infras, m[1]) {
					infras = append(infras, m[1])
				}
			}
			if len(infras) == 0 {
				t.Fatalf("no plan rows:\n%s", out)
			}
			for _, want := range tc.wantInfras {
				if !slices.Contains(infras, want) {
					t.Errorf("plan has no %s row (infras %v):\n%s", want, infras, out)
				}
			}
			for _, not := range tc.notInfras {
				if slices.Contains(infras, not) {
					t.Errorf("plan has a %s row (infras %v):\n%s", not, infras, out)
				}
			}
			for _, want := range tc.wantShown {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			t.Logf("%s: planned on %v", tc.file, infras)
		})
	}
	// --env replaces the YAML's value before it is substituted into the probe, as in SkyPilot.
	out := k.mustRun("serve", "up", "configs/testdata/skypilot/vllm.yaml", "--dry-run", "--secret", "HF_TOKEN=x", "--env", "MODEL_NAME=Qwen/Qwen2.5-7B-Instruct")
	if !strings.Contains(out, `"model":"Qwen/Qwen2.5-7B-Instruct"`) {
		t.Errorf("--env MODEL_NAME did not reach the probe:\n%s", out)
	}
}

// TestDryRunRefusesWhatLaunchRefuses: a YAML the named infra cannot run fails --dry-run with
// the file, line and column, and nothing is launched.
func TestDryRunRefusesWhatLaunchRefuses(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	cases := map[string]struct{ yaml, want string }{
		"vm image on kubernetes": {
			yaml: "run: x\nresources:\n  infra: kubernetes\n  image_id: ami-0123\nservice:\n  ports: 8000\n",
			want: "bad.yaml:4:13: resources.image_id:",
		},
		"autostop on a service": {
			yaml: "run: x\nresources:\n  autostop: 10\nservice:\n  ports: 8000\n",
			want: "bad.yaml:3:3: resources.autostop:",
		},
		"disk tier on kubernetes": {
			yaml: "run: x\nresources:\n  infra: kubernetes\n  disk_tier: high\nservice:\n  ports: 8000\n",
			want: "bad.yaml:4:14: resources.disk_tier:",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, "bad.yaml")
			writeFile(t, file, tc.yaml)
			out, errOut, err := e.run("serve", "up", file, "--dry-run")
			if err == nil {
				t.Fatalf("--dry-run called it valid:\n%s", out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Fatalf("stderr lacks %q:\n%s", tc.want, errOut)
			}
		})
	}
}

// TestSkyPilotExamplesServed serves the compatibility YAMLs a machine without GPUs can run, as
// written: with no infra they plan on local, and their unmodified runs bind every address on a
// fixed port (python's http.server), so two replicas of one service need their own addresses
// (launcher/local's supervisor). The http-server example's workdir comes through `$WORKDIR`
// from --env, as in SkyPilot.
func TestSkyPilotExamplesServed(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("python3 is needed to serve SkyPilot's http examples (scripts/test-deps.sh installs it): %v", err)
	}
	e := newEnv(t)
	cases := []struct {
		file, name, path, want string
		replicas               int
		args                   []string
	}{
		{file: "minimal.yaml", name: "minimal", path: "/", want: "Directory listing", replicas: 1},
		{file: "http-server.yaml", name: "http-server", path: "/", want: "Hi, SkyPilot here!", replicas: 2,
			args: []string{"--env", "WORKDIR=configs/testdata/skypilot/http_server"}},
	}
	for _, tc := range cases {
		args := append([]string{"serve", "up", filepath.Join("configs/testdata/skypilot", tc.file), "-n", tc.name, "-y"}, tc.args...)
		e.mustRun(args...)
		var st serviceStatus
		eventually(t, 90*time.Second, tc.name+" READY", func() (bool, string) {
			var err error
			if st, err = e.status(tc.name); err != nil {
				return false, err.Error()
			}
			return len(st.ready()) == tc.replicas, fmt.Sprintf("%+v", st.Replicas)
		})
		for id, ep := range st.ready() {
			if _, port, _ := net.SplitHostPort(ep); port != "8080" {
				t.Errorf("%s replica %d at %s, want the task's port 8080", tc.name, id, ep)
			}
		}
		for i := range 2 * tc.replicas {
			resp, err := http.Get(st.Endpoint + tc.path)
			if err != nil {
				t.Fatalf("%s request %d: %v", tc.name, i, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) {
				t.Fatalf("%s request %d: %d %q, want 200 with %q", tc.name, i, resp.StatusCode, body, tc.want)
			}
		}
		e.mustRun("serve", "down", tc.name, "-y")
	}
}
