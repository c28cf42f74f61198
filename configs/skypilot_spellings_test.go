package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/internal/testhttp"
)

// The spellings SkyPilot accepts that Ferry refused before issue 34, each in SkyPilot's own
// words: the YAML snippets are copied from SkyPilot's examples and documentation (the source is
// named above each).

// parseOK parses yaml, fails the test on any error, and checks the resolved form parses back.
func parseOK(t *testing.T, yaml string, ov Overrides) *Task {
	t.Helper()
	task, err := Parse("task.yaml", []byte(yaml), ov)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	assertRoundTrip(t, task, out)
	return task
}

// parseErrs parses yaml and compares its errors with want (messages as substrings).
// reparse parses task's resolved YAML (what --dry-run shows) back, and returns it with the YAML.
func reparse(t *testing.T, task *Task) (*Task, []byte) {
	t.Helper()
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("resolved.yaml", out, Overrides{})
	if err != nil {
		t.Fatalf("resolved YAML does not parse: %v\n%s", err, out)
	}
	return again, out
}

func parseErrs(t *testing.T, yaml string, ov Overrides, want []wantErr) {
	t.Helper()
	_, err := Parse("task.yaml", []byte(yaml), ov)
	if err == nil {
		t.Fatal("want errors, got none")
	}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
	}
}

// noteMsgs is each note as "field: message" with message cut to its first clause.
func noteFields(notes []Note) []string {
	var out []string
	for _, n := range notes {
		out = append(out, n.Field)
	}
	return out
}

func TestSkyPilotAcceleratorSetSameGPUSeveralCounts(t *testing.T) {
	tests := map[string]struct {
		yaml        string
		wantAccs    []string
		wantOrdered []string
	}{
		// llm/llama-3/llama3.yaml and llm/llama-3_1/llama-3_1.yaml
		"llama 3": {
			yaml:     "accelerators: {L4:8, A10g:8, A10:8, A100:4, A100:8, A100-80GB:2, A100-80GB:4, A100-80GB:8}",
			wantAccs: []string{"L4:8", "A10g:8", "A10:8", "A100:4", "A100:8", "A100-80GB:2", "A100-80GB:4", "A100-80GB:8"},
		},
		// llm/mixtral/serve.yaml
		"mixtral": {
			yaml:     "accelerators: {A100:4, A100:8, A100-80GB:2, A100-80GB:4, A100-80GB:8}",
			wantAccs: []string{"A100:4", "A100:8", "A100-80GB:2", "A100-80GB:4", "A100-80GB:8"},
		},
		// llm/gemma3/gemma3.yaml
		"gemma 3": {
			yaml:     "accelerators:  {L4:1, L4:4, A100:1, A100-80GB:1}",
			wantAccs: []string{"L4:1", "L4:4", "A100:1", "A100-80GB:1"},
		},
		// llm/llama-4/llama4.yaml
		"llama 4, spaces inside the braces": {
			yaml:     "accelerators: { H100:8, H100:12, H200:8, GH200:8, B100:8, B200:8, GB200:8 }",
			wantAccs: []string{"H100:8", "H100:12", "H200:8", "GH200:8", "B100:8", "B200:8", "GB200:8"},
		},
		// The list form: SkyPilot's order of preference.
		"list": {
			yaml:        "accelerators: [A100:4, A100:8]",
			wantAccs:    []string{"A100:4", "A100:8"},
			wantOrdered: []string{"4x A100", "8x A100"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task := parseOK(t, "run: x\nresources:\n  "+tc.yaml+"\n", Overrides{})
			var got []string
			for _, a := range task.Resources.Accelerators {
				got = append(got, a.Spec())
			}
			if diff := cmp.Diff(tc.wantAccs, got); diff != "" {
				t.Errorf("accelerators (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantOrdered, strs(task.Resources.Ordered)); diff != "" {
				t.Errorf("ordered (-want +got):\n%s", diff)
			}
		})
	}
	// One NAME:COUNT twice is still a mistake.
	parseErrs(t, "run: x\nresources:\n  accelerators: [A100:8, a100:8]\n", Overrides{},
		[]wantErr{{3, 26, "resources.accelerators[1]", `accelerator "a100:8" listed twice`}})
}

func TestSkyPilotAnyOfInheritsCloud(t *testing.T) {
	// examples/serve/policy/spot_hedge.yaml
	const spotHedge = `service:
  readiness_probe:
    path: /health
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    target_qps_per_replica: 1

resources:
  any_of:
  - zone: us-central1-a
  - region: us-east1
  ports: 8081
  cloud: gcp
  cpus: 2+

run: python3 server.py
`
	task := parseOK(t, spotHedge, Overrides{})
	var infras []string
	for _, c := range task.Resources.Candidates() {
		infras = append(infras, c.Infra)
	}
	if diff := cmp.Diff([]string{"gcp/us-central1/us-central1-a", "gcp/us-east1"}, infras); diff != "" {
		t.Errorf("candidates (-want +got):\n%s", diff)
	}
	// With infra: at the top, the alternative inherits its cloud too.
	task = parseOK(t, "run: x\nresources:\n  infra: aws\n  any_of:\n  - zone: us-east-1a\n  - region: us-west-2\n", Overrides{})
	infras = nil
	for _, c := range task.Resources.Candidates() {
		infras = append(infras, c.Infra)
	}
	if diff := cmp.Diff([]string{"aws/us-east-1/us-east-1a", "aws/us-west-2"}, infras); diff != "" {
		t.Errorf("candidates under infra: aws (-want +got):\n%s", diff)
	}
	// No cloud anywhere: the zone names no cloud, as before.
	parseErrs(t, "run: x\nresources:\n  any_of:\n  - zone: us-central1-a\n", Overrides{},
		[]wantErr{{4, 5, "resources.any_of[0].zone", "needs cloud"}})
}

func TestSkyPilotInfraWildcards(t *testing.T) {
	tests := map[string]struct{ infra, want string }{
		"zone in any region of gcp (issue 34)":  {"gcp/*/us-central1-a", "gcp/us-central1/us-central1-a"},
		"region on any cloud (issue 34)":        {"*/us-east-1", "aws/us-east-1"},
		"gcp region on any cloud":               {"*/us-central1", "gcp/us-central1"},
		"SkyPilot's documented example":         {"aws/*/us-east-1a", "aws/us-east-1/us-east-1a"},
		"agent/skills/.../advanced-patterns.md": {"*/us-east-1/us-east-1a", "aws/us-east-1/us-east-1a"},
		"zone on any cloud":                     {"*/*/us-central1-b", "gcp/us-central1/us-central1-b"},
		"any region":                            {"aws/*", "aws"},
		"any zone":                              {"gcp/us-central1/*", "gcp/us-central1"},
		"any context":                           {"k8s/*", "kubernetes"},
		"anything":                              {"*/*/*", "*"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task := parseOK(t, "run: x\nresources:\n  infra: '"+tc.infra+"'\n", Overrides{})
			if task.Resources.Infra != tc.want {
				t.Errorf("infra %q read as %q, want %q", tc.infra, task.Resources.Infra, tc.want)
			}
		})
	}
	// The old message was `unknown infra "*"; did you mean "*"?`.
	_, err := Parse("task.yaml", []byte("run: x\nresources:\n  infra: '*/mars-1'\n"), Overrides{})
	if err == nil || !strings.Contains(err.Error(), `no cloud Ferry launches on has a region named "mars-1"`) || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("*/mars-1: got %v", err)
	}
	parseErrs(t, "run: x\nresources:\n  infra: 'gcp/*/us-central1-a/x'\n", Overrides{},
		[]wantErr{{3, 10, "resources.infra", "expected gcp[/REGION[/ZONE]]"}})
}

func TestSkyPilotDiskSizeWithUnits(t *testing.T) {
	tests := map[string]struct {
		value string
		want  int
	}{
		"examples/training/torchtitan/torchtitan.yaml": {"1024GB", 1024},
		"docs: disk_size: 256GB":                       {"256GB", 256},
		"terabytes, in powers of two":                  {"1TB", 1024},
		"gibibytes":                                    {"512Gi", 512},
		"lower case":                                   {"100gb", 100},
		"rounded down, as SkyPilot's docs say":         {"1500MB", 1},
		"a plain number as a string":                   {"'256'", 256},
		"an integer, as ever":                          {"256", 256},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task := parseOK(t, "run: x\nresources:\n  disk_size: "+tc.value+"\n", Overrides{})
			if task.Resources.DiskSize != tc.want {
				t.Errorf("disk_size %s read as %d, want %d", tc.value, task.Resources.DiskSize, tc.want)
			}
		})
	}
	parseErrs(t, "run: x\nresources:\n  disk_size: 1024XB\n  any_of:\n  - disk_size: 100MB\n", Overrides{}, []wantErr{
		{3, 14, "resources.disk_size", `a size with a unit such as "1024GB"`},
		{5, 16, "resources.any_of[0].disk_size", "out of range"},
	})
	// memory takes SkyPilot's units too (docs: memory: 64GB).
	task := parseOK(t, "run: x\nresources:\n  memory: 64GB\n  any_of:\n  - memory: 32GB+\n", Overrides{})
	if task.Resources.Memory != "64" || task.Resources.AnyOf[0].Memory != "32+" {
		t.Errorf("memory read as %q and %q, want 64 and 32+", task.Resources.Memory, task.Resources.AnyOf[0].Memory)
	}
}

func TestSkyPilotTaskNames(t *testing.T) {
	tests := map[string]struct{ yaml, want string }{
		"examples/distributed-pytorch/train.yaml": {"name: minGPT-ddp", "mingpt-ddp"},
		"examples/spot/bert_qa.yaml":              {"name: bert_qa", "bert-qa"},
		"dots and double separators":              {"name: Llama3.1__SFT", "llama3-1-sft"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task := parseOK(t, tc.yaml+"\nrun: x\n", Overrides{})
			if task.Name != tc.want {
				t.Errorf("name read as %q, want %q", task.Name, tc.want)
			}
			if diff := cmp.Diff([]string{"name"}, noteFields(task.Notes)); diff != "" || !strings.Contains(task.Notes[0].Msg, "is used as \""+tc.want+"\"") {
				t.Errorf("notes %v, want one on name saying what it is used as", task.Notes)
			}
		})
	}
	// -n wins whatever the file says, even a name SkyPilot refuses too.
	task := parseOK(t, "name: not a name!\nrun: x\n", Overrides{Name: "chat"})
	if task.Name != "chat" || len(task.Notes) != 0 {
		t.Errorf("-n chat: name %q, notes %v", task.Name, task.Notes)
	}
	// A name SkyPilot refuses is still an error without -n, and so is a bad -n.
	parseErrs(t, "name: not a name!\nrun: x\n", Overrides{}, []wantErr{{1, 7, "name", "is not a valid name"}})
	parseErrs(t, "name: ok\nrun: x\n", Overrides{Name: "Chat_1"}, []wantErr{{0, 0, "name", "given on the command line"}})
}

func TestSkyPilotPerRegionImageID(t *testing.T) {
	// docs/source/reference/yaml-spec.rst, resources.image_id
	const perRegion = `
  image_id:
    us-east-1: ami-0729d913a335efca7
    us-west-2: ami-050814f384259894c
`
	type cand struct{ Infra, ImageID string }
	candidates := func(task *Task) []cand {
		var out []cand
		for _, c := range task.Resources.Candidates() {
			out = append(out, cand{c.Infra, c.ImageID})
		}
		return out
	}
	tests := map[string]struct {
		yaml string
		want []cand
	}{
		"no cloud: the regions name it": {
			yaml: "run: x\nresources:" + perRegion,
			want: []cand{{"aws/us-east-1", "ami-0729d913a335efca7"}, {"aws/us-west-2", "ami-050814f384259894c"}},
		},
		"infra: aws": {
			yaml: "run: x\nresources:\n  infra: aws" + perRegion,
			want: []cand{{"aws/us-east-1", "ami-0729d913a335efca7"}, {"aws/us-west-2", "ami-050814f384259894c"}},
		},
		"a region narrows to its image": {
			yaml: "run: x\nresources:\n  infra: aws/us-west-2" + perRegion,
			want: []cand{{"aws/us-west-2", "ami-050814f384259894c"}},
		},
		"inherited by alternatives, split in order": {
			yaml: "run: x\nresources:" + perRegion + "  ordered:\n  - {accelerators: A10G:1}\n  - {accelerators: L4:1, infra: aws/us-east-1}\n",
			want: []cand{{"aws/us-east-1", "ami-0729d913a335efca7"}, {"aws/us-west-2", "ami-050814f384259894c"}, {"aws/us-east-1", "ami-0729d913a335efca7"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task := parseOK(t, tc.yaml, Overrides{})
			if diff := cmp.Diff(tc.want, candidates(task)); diff != "" {
				t.Errorf("candidates (-want +got):\n%s", diff)
			}
		})
	}
	parseErrs(t, "run: x\nresources:\n  infra: aws/eu-west-1"+perRegion, Overrides{},
		[]wantErr{{5, 5, "resources.image_id", `no image for region "eu-west-1"`}})
	parseErrs(t, "run: x\nresources:\n  infra: gcp"+perRegion, Overrides{}, []wantErr{
		{5, 16, "resources.image_id.us-east-1", "is an AWS AMI"},
		{6, 16, "resources.image_id.us-west-2", "is an AWS AMI"},
	})
	parseErrs(t, "run: x\nresources:\n  infra: kubernetes"+perRegion, Overrides{},
		[]wantErr{{5, 5, "resources.image_id", "a per-region image_id is for VMs"}})
}

func TestSkyPilotAlternativesOnCloudsFerryLacks(t *testing.T) {
	// agent/skills/skypilot/references/advanced-patterns.md, "mixed-gpus.yaml"
	const mixed = `# mixed-gpus.yaml
name: mixed-gpu-training

resources:
  any_of:
    - infra: aws
      accelerators: A10g:4
    - infra: gcp
      accelerators: L4:4
    - infra: azure
      accelerators: A100:1
    - infra: lambda
      accelerators: A100:1

run: |
  python train.py
`
	task := parseOK(t, mixed, Overrides{})
	if diff := cmp.Diff([]string{"4x A10g (aws)", "4x L4 (gcp)"}, strs(task.Resources.AnyOf)); diff != "" {
		t.Errorf("mixed-gpus.yaml: kept alternatives (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"resources.any_of[2]", "resources.any_of[3]"}, noteFields(task.Notes)); diff != "" {
		t.Errorf("mixed-gpus.yaml: notes (-want +got):\n%s", diff)
	}

	const yaml = `run: x
resources:
  accelerators: A100:8
  any_of:
    - infra: lambda
    - cloud: azure
      region: eastus
    - infra: aws
    - infra: fluidstack
      accelerators: H100:8
`
	task = parseOK(t, yaml, Overrides{})
	if diff := cmp.Diff([]string{"8x A100 (aws)"}, strs(task.Resources.AnyOf)); diff != "" {
		t.Errorf("kept alternatives (-want +got):\n%s", diff)
	}
	var at []string
	for _, n := range task.Notes {
		if !strings.Contains(n.Msg, "dropped from the plan: Ferry does not launch on") {
			t.Errorf("note %v", n)
		}
		at = append(at, n.String()[:strings.Index(n.String(), ": d")])
	}
	want := []string{"task.yaml:5:14: resources.any_of[0]", "task.yaml:6:14: resources.any_of[1]", "task.yaml:9:14: resources.any_of[3]"}
	if diff := cmp.Diff(want, at); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
	// An inherited cloud Ferry lacks drops the alternatives that inherit it.
	task = parseOK(t, "run: x\nresources:\n  cloud: lambda\n  ordered:\n  - region: us-east-1\n  - infra: gcp\n", Overrides{})
	if diff := cmp.Diff([]string{"gcp"}, strs(task.Resources.Ordered)); diff != "" {
		t.Errorf("ordered (-want +got):\n%s", diff)
	}
	parseErrs(t, "run: x\nresources:\n  any_of:\n  - infra: lambda\n  - infra: azure\n", Overrides{},
		[]wantErr{{4, 3, "resources.any_of", "every alternative runs on a cloud Ferry does not launch on (azure, lambda)"}})
	parseErrs(t, "run: x\nresources:\n  cloud: fluidstack\n", Overrides{},
		[]wantErr{{3, 10, "resources.cloud", "Ferry does not launch on fluidstack"}})
}

func TestSkyPilotNamedBucket(t *testing.T) {
	// The spelling, and docs/source/reference/yaml-spec.rst's `name: ${MY_BUCKET}`.
	const yaml = `envs:
  BUCKET: my-datasets
file_mounts:
  /data:
    name: $BUCKET
    store: s3
    mode: COPY
  /models:
    name: ${BUCKET}-models
    store: gcs
    mode: COPY
run: x
`
	task := parseOK(t, yaml, Overrides{})
	want := map[string]string{"/data": "s3://my-datasets", "/models": "gs://my-datasets-models"}
	if diff := cmp.Diff(want, task.FileMounts); diff != "" {
		t.Errorf("file_mounts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"file_mounts./data", "file_mounts./models"}, noteFields(task.Notes)); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
	// No store: the task's one cloud gives it, as SkyPilot picks the cloud's own.
	task = parseOK(t, "resources:\n  cloud: aws\nfile_mounts:\n  /checkpoint:\n    name: checkpoint-bucket-resnet\n    mode: COPY\nrun: x\n", Overrides{})
	if got := task.FileMounts["/checkpoint"]; got != "s3://checkpoint-bucket-resnet" || !strings.Contains(task.Notes[0].Msg, "store s3: the task runs on aws only") {
		t.Errorf("store from cloud: %q, notes %v", got, task.Notes)
	}
	// No store and several clouds: S3, one bucket wherever a recovery lands.
	task = parseOK(t, "file_mounts:\n  /c:\n    name: b\n    mode: COPY\nrun: x\n", Overrides{})
	if got := task.FileMounts["/c"]; got != "s3://b" || !strings.Contains(task.Notes[0].Msg, "no store given: S3") {
		t.Errorf("store for several clouds: %q, notes %v", got, task.Notes)
	}
	parseErrs(t, "file_mounts:\n  /d:\n    name: b\n    store: azure\n    mode: COPY\nrun: x\n", Overrides{}, []wantErr{
		{4, 12, "file_mounts./d.store", `store "azure" is not supported by Ferry`},
	})
}

func TestSkyPilotSpotRecovery(t *testing.T) {
	// examples/spot/bert_qa.yaml's resources.
	task := parseOK(t, "resources:\n    accelerators: V100:1\n    cloud: aws\n    use_spot: true\n    spot_recovery: FAILOVER\nrun: x\n", Overrides{})
	if task.Job.Recovery.Strategy != RecoveryFailover {
		t.Errorf("strategy %q, want FAILOVER", task.Job.Recovery.Strategy)
	}
	if len(task.Notes) != 1 || task.Notes[0].String() != "task.yaml:5:5: resources.spot_recovery: spot_recovery is deprecated: read as job_recovery (write job_recovery, as SkyPilot asks)" {
		t.Errorf("notes %v", task.Notes)
	}
	parseErrs(t, "resources:\n  spot_recovery: EAGER_NEXT_REGION\n  job_recovery: FAILOVER\n  any_of:\n  - {infra: aws, spot_recovery: FAILOVER}\nrun: x\n", Overrides{}, []wantErr{
		{2, 3, "resources.spot_recovery", "give only job_recovery"},
		{5, 18, "resources.any_of[0].spot_recovery", "set it once, at the top of resources"},
	})
	parseErrs(t, "resources:\n  spot_recovery: SOMETIMES\nrun: x\n", Overrides{},
		[]wantErr{{2, 18, "resources.spot_recovery", "SOMETIMES"}})
}

// TestSkyPilotTLSPathsResolvedWhereTheCLIRuns: SkyPilot's HTTPS example names its key and
// certificate relative to the repository's root, where `sky serve up` runs; Load resolves them
// there (not where the controller runs) and checks that they are a key and its certificate.
func TestSkyPilotTLSPathsResolvedWhereTheCLIRuns(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "examples/serve/https")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	testhttp.WriteSelfSigned(t, dir)
	// examples/serve/https/service.yaml
	service := filepath.Join(dir, "service.yaml")
	writeTestFile(t, service, `service:
  readiness_probe: /
  replicas: 1
  tls:
    keyfile: examples/serve/https/key.pem
    certfile: examples/serve/https/cert.pem

resources:
  ports: 8080
  cpus: 2+

run: python3 -m http.server 8080
`)
	t.Chdir(root)
	task, err := Load("examples/serve/https/service.yaml", Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	want := &TLS{KeyFile: filepath.Join(dir, "key.pem"), CertFile: filepath.Join(dir, "cert.pem")}
	if diff := cmp.Diff(want, task.Service.TLS); diff != "" {
		t.Errorf("tls (-want +got):\n%s", diff)
	}

	// From another directory the same file names files that are not there.
	t.Chdir(dir)
	_, err = Load("service.yaml", Overrides{})
	for _, want := range []string{
		"service.yaml:5:14: service.tls.keyfile: " + filepath.Join(dir, "examples/serve/https/key.pem") + " does not exist",
		"service.yaml:6:15: service.tls.certfile: ",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("from %s: error %v, want %q", dir, err, want)
		}
	}
	// A file that is not a PEM key and certificate is refused at load (so at --dry-run).
	writeTestFile(t, filepath.Join(dir, "examples/serve/https/key.pem"), "not a key\n")
	writeTestFile(t, filepath.Join(dir, "examples/serve/https/cert.pem"), "not a cert\n")
	_, err = Load("service.yaml", Overrides{})
	if err == nil || !strings.Contains(err.Error(), "service.yaml:5:5: service.tls: ") || !strings.Contains(err.Error(), "are not a PEM certificate and its private key") {
		t.Errorf("bad PEM: error %v", err)
	}
	// Parse (the controller's, no working directory of the user's) leaves the paths alone.
	data, _ := os.ReadFile(service)
	task, err = Parse("service.yaml", data, Overrides{})
	if err != nil || task.Service.TLS.KeyFile != "examples/serve/https/key.pem" {
		t.Errorf("Parse: tls %+v, err %v", task.Service.TLS, err)
	}
}

func writeTestFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}
