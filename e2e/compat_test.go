package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"io/fs"
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

	"github.com/ferryserve/ferry/internal/testhttp"
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
	t.Parallel()
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
	t.Parallel()
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

// updateExampleTable rewrites configs/testdata/skypilot/examples/TABLE.md from a run of
// TestSkyPilotExampleTable: go test ./e2e -run TestSkyPilotExampleTable -update-example-table
var updateExampleTable = flag.Bool("update-example-table", false, "rewrite configs/testdata/skypilot/examples/TABLE.md")

// exampleCase is one of SkyPilot's own example files, kept unchanged (but for a first line naming
// its source) under configs/testdata/skypilot/examples in SkyPilot's repository layout, and what
// Ferry makes of it.
type exampleCase struct {
	file string
	// dir is where the CLI runs, relative to the repository's root, when the file's usage runs it
	// from its own directory (its workdir and file_mounts are relative to that).
	dir string
	// args are the --env and --secret values the file's usage passes.
	args []string
	// refused, when set, is part of the refusal (file:line:col: field: message); else the file
	// must be called valid with a plan.
	refused string
	// notes are parts of the notes the plan must print.
	notes []string
	// resolvedBy says what would make Ferry accept a refused file: another helper's feature of
	// issue 34, a cloud Ferry does not launch on, or what the file itself leaves to fill in.
	resolvedBy string
}

// skypilotExamples are the files TestSkyPilotExampleTable validates. Every YAML under
// configs/testdata/skypilot/examples is one of them or a file one of them needs
// (exampleSupportFiles).
var skypilotExamples = []exampleCase{
	// Services: vLLM, SGLang, TGI, Llama 3, Mixtral, Qwen, Gemma and friends.
	{file: "llm/vllm/service.yaml"},
	{file: "llm/vllm/service-with-auth.yaml", args: []string{"--secret", "HF_TOKEN=hf_x", "--secret", "AUTH_TOKEN=tok"}},
	{file: "llm/vllm/mixtral-service.yaml"},
	{file: "llm/vllm/vllm.sky.yaml", args: []string{"--secret", "HF_TOKEN=hf_x"}},
	{file: "llm/sglang/sglang.yaml"},
	{file: "llm/sglang/llama2.yaml", args: []string{"--env", "HF_TOKEN=hf_x"}},
	{file: "examples/serve/huggingface-tgi.yaml"},
	{file: "examples/serve/tgi_coder.yaml"},
	{file: "examples/serve/vllm.yaml"},
	{file: "llm/llama-3/llama3.yaml"},
	{file: "llm/llama-3_1/llama-3_1.yaml", args: []string{"--secret", "HF_TOKEN=hf_x"}},
	{file: "llm/llama-3_2/llama3_2.yaml", args: []string{"--env", "HF_TOKEN=hf_x"}},
	{file: "llm/mixtral/serve.yaml"},
	{file: "llm/qwen/qwen25-7b.yaml"},
	{file: "llm/qwen/serve-72b.yaml"},
	{file: "llm/qwen/qwen3-235b.yaml"},
	{file: "llm/gemma/serve.yaml"},
	{file: "llm/gemma3/gemma3.yaml", args: []string{"--env", "HF_TOKEN=hf_x"}},
	{file: "llm/codellama/endpoint.yaml"},
	{file: "llm/dbrx/dbrx.yaml"},
	{file: "examples/serve/http_server/task.yaml"},
	{file: "examples/serve/https/service.yaml"},
	{file: "examples/serve/min_replicas_zero.yaml"},
	{file: "examples/serve/load_balancing_policies_example.yaml"},
	{file: "examples/serve/policy/spot_hedge.yaml"},
	{file: "examples/serve/multi_node/multi_node.yaml"},
	{file: "llm/gpt-oss/gpt-oss-vllm.sky.yaml", refused: "resources.infra: Ferry does not launch on nebius",
		resolvedBy: "none: nebius is a cloud Ferry does not launch on"},
	// Jobs: single-node, distributed PyTorch, torchtitan, fine-tuning, managed jobs.
	{file: "llm/vllm/serve.yaml"},
	{file: "llm/deepseek-r1-distilled/deepseek-r1-vllm.yaml"},
	{file: "llm/llama-4/llama4.yaml", args: []string{"--env", "HF_TOKEN=hf_x"}},
	{file: "examples/managed_job.yaml"},
	{file: "examples/custom_image.yaml"},
	{file: "examples/distributed-pytorch/train.yaml", notes: []string{`name: "minGPT-ddp" is used as "mingpt-ddp"`}},
	{file: "examples/distributed-pytorch/train-rdzv.yaml", notes: []string{`name: "minGPT-ddp-rdzv" is used as "mingpt-ddp-rdzv"`}},
	{file: "examples/training/torchtitan/torchtitan.yaml"},
	{file: "llm/axolotl/axolotl.yaml", dir: "llm/axolotl", args: []string{"--env", "HF_TOKEN=hf_x"}},
	{file: "examples/spot/resnet.yaml"},
	{file: "examples/spot/bert_qa.yaml", refused: "file_mounts./checkpoint: a storage mapping without source or name",
		resolvedBy: "the file leaves the bucket's name for you to fill in (SkyPilot refuses it too); with a name it mounts"},
	{file: "examples/spot/lightning_cifar10.yaml", refused: "file_mounts./checkpoint: a storage mapping without source or name",
		resolvedBy: "the file leaves the bucket's name for you to fill in (SkyPilot refuses it too); with a name it mounts"},
	{file: "llm/llama-3_1-finetuning/lora.yaml", dir: "llm/llama-3_1-finetuning", args: []string{"--env", "HF_TOKEN=hf_x"}},
	{file: "llm/gpt-oss-finetuning/gpt-oss-20b-lora.yaml", dir: "llm/gpt-oss-finetuning"},
	{file: "examples/aws_efa/efa_vm.yaml"},
	{file: "examples/aws_efa/nccl_efa.yaml", refused: "no Kubernetes context is enabled",
		resolvedBy: "a Kubernetes cluster with A100:8 nodes (infra: kubernetes; this machine enables local, AWS and GCP): TestPodConfigJobOnTheCluster runs its config: (pod_config) on the test cluster, adapted to its T4 nodes"},
	{file: "examples/elastic_training/job.yaml", refused: "a SkyPilot job group",
		resolvedBy: "job groups, not built yet; each of its tasks in a file of its own is accepted (elastic recovery, git workdir: TestElasticJobOnTheCluster)"},
	{file: "examples/deepspeed-multinode/sky.yaml", refused: "sky-key does not exist",
		resolvedBy: "none: it copies SkyPilot's own SSH key (~/.ssh/sky-key) for DeepSpeed's pdsh"},
	{file: "examples/disk_size.yaml", refused: "resources.infra: Ferry does not launch on azure",
		resolvedBy: "none: azure is a cloud Ferry does not launch on"},
}

// exampleSupportFiles are files the examples read (a workdir's or a file mount's contents).
var exampleSupportFiles = []string{"llm/axolotl/mistral/qlora.yaml", "llm/llama-3_1-finetuning/configs/70B-lora.yaml", "llm/gpt-oss-finetuning/sft/fsdp2.yaml"}

// TestSkyPilotExampleTable validates SkyPilot's own example files, as they are, with --dry-run
// on a home with local, AWS and GCP (the fake clouds) enabled, run from a copy of SkyPilot's
// repository layout as their usage says, and checks each outcome against the table
// configs/testdata/skypilot/examples/TABLE.md (rewritten by -update-example-table), which
// docs/yaml.md shows ("SkyPilot's own examples").
func TestSkyPilotExampleTable(t *testing.T) {
	t.Parallel()
	src := filepath.Join(repoRoot(), "configs/testdata/skypilot/examples")
	checkExampleCoverage(t, src)
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	// SkyPilot's HTTPS example names a key and certificate in its directory; they are made here
	// rather than kept in the repository.
	testhttp.WriteSelfSigned(t, filepath.Join(root, "examples/serve/https"))
	e, home := newExampleEnv(t)

	var table strings.Builder
	table.WriteString("| file | kind | result | the plan's first row, or the refusal | notes, or what would resolve it |\n|---|---|---|---|---|\n")
	for _, tc := range skypilotExamples {
		t.Run(tc.file, func(t *testing.T) {
			table.WriteString(runExample(t, e, root, home, tc))
		})
	}
	golden := filepath.Join(src, "TABLE.md")
	got := "<!-- Written by go test ./e2e -run TestSkyPilotExampleTable -update-example-table; do not edit. -->\n" + table.String()
	if *updateExampleTable {
		writeFile(t, golden, got)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("the examples' table changed; if the change is right, rerun with -update-example-table (it rewrites configs/testdata/skypilot/examples/TABLE.md) and update the table in docs/yaml.md (SkyPilot's own examples):\n%s", got)
	}
}

// checkExampleCoverage fails when a YAML under src is neither an example nor a support file,
// or an example is missing: the table covers exactly what is kept.
func checkExampleCoverage(t *testing.T, src string) {
	t.Helper()
	listed := map[string]bool{}
	for _, tc := range skypilotExamples {
		listed[tc.file] = true
	}
	for _, f := range exampleSupportFiles {
		listed[f] = true
	}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if !listed[rel] {
			t.Errorf("%s is kept under configs/testdata/skypilot/examples but no case reads it: give it a case or remove it", rel)
		}
		delete(listed, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for rel := range listed {
		t.Errorf("%s has a case but no file", rel)
	}
}

// newExampleEnv is a Ferry home with local and both fake clouds enabled in the regions
// SkyPilot's examples name, no Kubernetes, and a HOME of its own (returned).
func newExampleEnv(t *testing.T) (*env, string) {
	clouds := startFakeClouds(t)
	e := newEnv(t)
	home := t.TempDir()
	e.extraEnv = append(slices.Clone(awsEnv), "HOME="+home, "KUBECONFIG="+filepath.Join(home, "no-kubeconfig"))
	writeFile(t, filepath.Join(e.home, "config.yaml"), fmt.Sprintf(`aws:
  regions: [us-east-1, us-east-2, us-west-2]
  endpoint: %s
  amis: {us-east-1: ami-0fe771, us-east-2: ami-0fe771, us-west-2: ami-0fe771}
gcp:
  project: ferry-e2e
  regions: [us-central1, us-east1]
  endpoint: %s
`, clouds.ec2.URL(), clouds.url))
	return e, home
}

// runExample runs the example's dry run, checks its outcome and returns its table row.
func runExample(t *testing.T, e *env, root, home string, tc exampleCase) string {
	data, err := os.ReadFile(filepath.Join(root, tc.file))
	if err != nil {
		t.Fatal(err)
	}
	kind, verb := "job", []string{"jobs", "launch"}
	if regexp.MustCompile(`(?m)^service:`).Match(data) {
		kind, verb = "service", []string{"serve", "up"}
	}
	file := tc.file
	if tc.dir != "" {
		file, _ = filepath.Rel(tc.dir, tc.file)
	}
	c := e.cmd(append(append(verb, file, "--dry-run"), tc.args...)...)
	c.Dir = filepath.Join(root, tc.dir)
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	runErr := c.Run()
	out := stdout.String()
	clean := func(s string) string {
		return strings.NewReplacer(root+"/", "", home+"/", "~/").Replace(oneCell(s))
	}
	if tc.refused != "" {
		if runErr == nil || !strings.Contains(stderr.String(), tc.refused) {
			t.Fatalf("want a refusal with %q; err %v\nstdout:\n%s\nstderr:\n%s", tc.refused, runErr, out, stderr.String())
		}
		first, _, _ := strings.Cut(stderr.String(), "\n")
		return fmt.Sprintf("| `%s` | %s | refused | %s | %s |\n", tc.file, kind, clean(first), tc.resolvedBy)
	}
	if runErr != nil || !strings.Contains(out, "is valid; nothing was launched") {
		t.Fatalf("not called valid: %v\nstdout:\n%s\nstderr:\n%s", runErr, out, stderr.String())
	}
	var notes []string
	for _, line := range strings.Split(out, "\n") {
		if n, ok := strings.CutPrefix(line, "Note: "); ok {
			_, msg, _ := strings.Cut(n, ": ") // drop file:line:col
			notes = append(notes, msg)
		}
	}
	for _, want := range tc.notes {
		if !strings.Contains(strings.Join(notes, "\n"), want) {
			t.Errorf("no note %q among %q", want, notes)
		}
	}
	return fmt.Sprintf("| `%s` | %s | accepted | %s | %s |\n", tc.file, kind, clean(firstPlanRow(t, out)), clean(strings.Join(notes, "; ")))
}

// firstPlanRow is the plan's first row with its columns joined by single spaces.
func firstPlanRow(t *testing.T, out string) string {
	_, table, ok := strings.Cut(out, "\nINFRA ")
	if !ok {
		t.Fatalf("no plan table:\n%s", out)
	}
	lines := strings.SplitN(table, "\n", 3)
	if len(lines) < 2 {
		t.Fatalf("no plan row:\n%s", out)
	}
	return strings.Join(strings.Fields(lines[1]), " ")
}

// oneCell makes s fit a Markdown table cell.
func oneCell(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "|", `\|`)
}

// TestServeSkyPilotHTTPSExample serves SkyPilot's HTTPS example as its usage says (`serve up
// examples/serve/https/service.yaml` from the repository's root): the controller, whose working
// directory is /, must get the key and certificate the file names relative to where the CLI
// ran, and the endpoint must answer over TLS with that certificate.
func TestServeSkyPilotHTTPSExample(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("python3 is needed to serve SkyPilot's HTTPS example (scripts/test-deps.sh installs it): %v", err)
	}
	root := t.TempDir()
	const example = "examples/serve/https/service.yaml"
	data, err := os.ReadFile(filepath.Join(repoRoot(), "configs/testdata/skypilot/examples", example))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "examples/serve/https")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "service.yaml"), string(data))
	certFile, _ := testhttp.WriteSelfSigned(t, dir)
	pemCert, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCert)

	e := newEnv(t)
	up := e.cmd("serve", "up", example, "-n", "https", "-y")
	up.Dir = root
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("serve up from %s: %v\n%s", root, err, out)
	}
	ep := strings.TrimSpace(e.mustRun("serve", "status", "https", "--endpoint"))
	if !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoint %q, want https://127.0.0.1:PORT", ep)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}} // only the example's own certificate
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := client.Get(ep + "/")
	if err != nil {
		t.Fatalf("GET %s/: %v", ep, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Directory listing") {
		t.Fatalf("GET %s/: %d %q, want python's directory listing", ep, resp.StatusCode, body)
	}
	e.mustRun("serve", "down", "https", "-y")
}
