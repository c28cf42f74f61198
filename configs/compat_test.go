package configs

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// compatOverrides supplies what SkyPilot's examples leave for --secret.
var compatOverrides = Overrides{Secrets: map[string]string{"HF_TOKEN": "hf_compat_secret"}}

// TestSkyPilotExamplesParse reads every YAML in testdata/skypilot (written in the shape of
// SkyPilot's published serving and jobs examples) and checks that what Ferry understood survives
// its own resolved form.
func TestSkyPilotExamplesParse(t *testing.T) {
	paths, err := filepath.Glob("testdata/skypilot/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 8 {
		t.Fatalf("found %d compatibility YAMLs, want at least 8", len(paths))
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			task, err := Load(path, compatOverrides)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(out), "hf_compat_secret") {
				t.Fatalf("resolved YAML shows a secret:\n%s", out)
			}
			assertRoundTrip(t, task, out)
		})
	}
}

// TestSkyPilotExamplesMeaning pins what the compatibility YAMLs mean in Ferry.
func TestSkyPilotExamplesMeaning(t *testing.T) {
	load := func(name string, ov Overrides) *Task {
		t.Helper()
		task, err := Load(filepath.Join("testdata/skypilot", name), ov)
		if err != nil {
			t.Fatalf("Load %s: %v", name, err)
		}
		return task
	}
	vllm := load("vllm.yaml", compatOverrides)
	wantSet := []Accelerator{{"L4", 1}, {"A10G", 1}, {"A10", 1}, {"A100", 1}, {"A100-80GB", 1}}
	if diff := cmp.Diff(wantSet, vllm.Resources.Accelerators); diff != "" {
		t.Errorf("vllm accelerators (-want +got):\n%s", diff)
	}
	if len(vllm.Resources.Ordered) != 0 || len(vllm.Resources.AnyOf) != 0 {
		t.Errorf("a set must stay one resources block with alternatives priced together, got %s", vllm.Resources)
	}
	const wantBody = `{"model":"meta-llama/Meta-Llama-3.1-8B-Instruct","messages":[{"role":"user","content":"Hello! What is your name?"}],"max_tokens":1}`
	if got := vllm.Service.ReadinessProbe.PostData; got != wantBody {
		t.Errorf("probe body\n got %s\nwant %s", got, wantBody)
	}
	// --env overrides the YAML's envs before substitution, as in SkyPilot.
	other := load("vllm.yaml", Overrides{Secrets: compatOverrides.Secrets, Envs: map[string]string{"MODEL_NAME": "Qwen/Qwen2.5-7B"}})
	if got := other.Service.ReadinessProbe.PostData; !strings.Contains(got, `"model":"Qwen/Qwen2.5-7B"`) {
		t.Errorf("--env MODEL_NAME not substituted into the probe: %s", got)
	}

	tgi := load("tgi.yaml", Overrides{})
	var order []string
	for _, alt := range tgi.Resources.Ordered {
		for _, a := range alt.Accelerators {
			order = append(order, a.Spec())
		}
	}
	if diff := cmp.Diff([]string{"L4:1", "A10G:1", "A100:1"}, order); diff != "" {
		t.Errorf("tgi list is an order of preference (-want +got):\n%s", diff)
	}

	gemma := load("gemma-kubernetes.yaml", compatOverrides)
	if got := gemma.Service.ReadinessProbe.Headers["X-Model"]; got != "google/gemma-2b-it" {
		t.Errorf("${MODEL_NAME} in a header: got %q", got)
	}
	if diff := cmp.Diff(map[string]string{"team": "research", "model": "gemma-2b-it"}, gemma.Resources.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}

	torchrun := load("torchrun.yaml", Overrides{})
	if diff := cmp.Diff(map[string]string{"/checkpoints/run-1": "s3://my-checkpoints/run-1"}, torchrun.FileMounts); diff != "" {
		t.Errorf("file_mounts keys and values substituted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&Autostop{IdleMinutes: 10, Down: true}, torchrun.Resources.Autostop); diff != "" {
		t.Errorf("autostop (-want +got):\n%s", diff)
	}

	batch := load("batch.yaml", Overrides{})
	r := batch.Resources
	if r.InstanceType != "n1-standard-8" || r.DiskTier != DiskTierHigh || r.Autostop == nil || r.Autostop.IdleMinutes != 30 {
		t.Errorf("batch resources: instance_type %q disk_tier %q autostop %+v", r.InstanceType, r.DiskTier, r.Autostop)
	}
	if http := load("http-server.yaml", Overrides{}); http.Workdir != "." {
		t.Errorf("workdir: $WORKDIR not substituted: %q", http.Workdir)
	}
}

func TestAcceleratorSpellings(t *testing.T) {
	tests := map[string]struct {
		yaml        string
		wantAccs    []Accelerator
		wantOrdered []string
		wantAnyOf   []string
	}{
		"flow set of NAME:COUNT keys": {
			yaml:     "accelerators: {L4:1, A100:2, H100:0.5}",
			wantAccs: []Accelerator{{"L4", 1}, {"A100", 2}, {"H100", 0.5}},
		},
		"flow set of bare names": {
			yaml:     "accelerators: {L4, A100}",
			wantAccs: []Accelerator{{"L4", 1}, {"A100", 1}},
		},
		"name to count": {
			yaml:     "accelerators: {L4: 1, A10G: 4}",
			wantAccs: []Accelerator{{"L4", 1}, {"A10G", 4}},
		},
		"one string": {
			yaml:     "accelerators: A100:8",
			wantAccs: []Accelerator{{"A100", 8}},
		},
		"list of one is plain": {
			yaml:     "accelerators: [A100:8]",
			wantAccs: []Accelerator{{"A100", 8}},
		},
		"list is ordered": {
			yaml:        "accelerators: [L4:1, A100:1]",
			wantAccs:    []Accelerator{{"L4", 1}, {"A100", 1}},
			wantOrdered: []string{"1x L4", "1x A100"},
		},
		"set is inherited by any_of": {
			yaml:      "accelerators: {L4:1, A100:1}\n  any_of:\n    - infra: aws\n    - infra: gcp",
			wantAccs:  []Accelerator{{"L4", 1}, {"A100", 1}},
			wantAnyOf: []string{"1x L4|1x A100 (aws)", "1x L4|1x A100 (gcp)"},
		},
		"list inside ordered expands in place": {
			yaml:        "ordered:\n    - {infra: aws, accelerators: [L4:1, A10G:1]}\n    - {infra: gcp, accelerators: A100:1}",
			wantOrdered: []string{"1x L4 (aws)", "1x A10G (aws)", "1x A100 (gcp)"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte("run: x\nresources:\n  infra: '*'\n  "+tc.yaml+"\n"), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			r := task.Resources
			if diff := cmp.Diff(tc.wantAccs, r.Accelerators); diff != "" {
				t.Errorf("accelerators (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantOrdered, strs(r.Ordered)); diff != "" {
				t.Errorf("ordered (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAnyOf, strs(r.AnyOf)); diff != "" {
				t.Errorf("any_of (-want +got):\n%s", diff)
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, task, out)
		})
	}
}

func strs(rs []Resources) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.String())
	}
	return out
}

func TestCompatFieldErrors(t *testing.T) {
	const svc = "run: x\nservice:\n  ports: 8000\n"
	tests := map[string]struct {
		yaml string
		want []wantErr
	}{
		"list with any_of": {
			yaml: "run: x\nresources:\n  accelerators: [L4:1, A100:1]\n  any_of: [{infra: aws}]\n",
			want: []wantErr{{3, 17, "resources.accelerators", "write a set {L4: 1, A100: 1}"}},
		},
		"set with ordered": {
			yaml: "run: x\nresources:\n  accelerators: {L4:1, A100:1}\n  ordered: [{infra: aws}]\n",
			want: []wantErr{{3, 17, "resources.accelerators", "several accelerators with ordered"}},
		},
		"count twice": {
			yaml: "run: x\nresources:\n  accelerators: {L4:1: 2}\n",
			want: []wantErr{{3, 24, "resources.accelerators.L4:1", "the count is given twice"}},
		},
		"qps key not among a set": {
			yaml: svc + "  replica_policy: {min_replicas: 1, max_replicas: 2, target_qps_per_replica: {H100: 3}}\n  load_balancing_policy: instance_aware_least_load\nresources:\n  accelerators: {L4:1, A100:1}\n",
			want: []wantErr{{4, 79, "service.replica_policy.target_qps_per_replica.H100", "accelerators: L4, A100"}},
		},
		"instance_type on kubernetes": {
			yaml: "run: x\nresources:\n  infra: kubernetes\n  instance_type: p3.2xlarge\n",
			want: []wantErr{{4, 18, "resources.instance_type", "describe the node with cpus, memory and accelerators"}},
		},
		"instance_type shape": {
			yaml: "run: x\nresources:\n  instance_type: 'P3 2XL'\n",
			want: []wantErr{{3, 18, "resources.instance_type", "is not an instance type name"}},
		},
		"bad label key and value": {
			yaml: "run: x\nresources:\n  labels:\n    -bad: ok\n    good: 'not ok!'\n    ferry.service: x\n    kubernetes.io/x: y\n    Team: a\n    long: " + strings.Repeat("A", 30) + "\n",
			want: []wantErr{
				{4, 5, "resources.labels.-bad", "the rule of Kubernetes labels"},
				{5, 11, "resources.labels.good", "label value"},
				{6, 5, "resources.labels.ferry.service", "Ferry's own"},
				{7, 5, "resources.labels.kubernetes.io/x", "reserved by Kubernetes"},
				{8, 5, "resources.labels.Team", "start with a lowercase letter"},
				{9, 11, "resources.labels.long", "is 90 characters as a GCP label"},
			},
		},
		"disk_tier unknown and on local": {
			yaml: "run: x\nresources:\n  disk_tier: fast\n  any_of:\n    - {infra: local, disk_tier: high}\n",
			want: []wantErr{
				{3, 14, "resources.disk_tier", "unknown disk tier \"fast\""},
				{5, 22, "resources.any_of[0].disk_tier", "set it once, at the top of resources"},
				{5, 33, "resources.any_of[0].disk_tier", "disk_tier: best"},
			},
		},
		"labels in an alternative": {
			yaml: "run: x\nresources:\n  ordered:\n    - {infra: aws, labels: {a: b}}\n",
			want: []wantErr{{4, 20, "resources.ordered[0].labels", "set it once"}},
		},
		"autostop spellings": {
			yaml: "run: x\nresources:\n  autostop: {idle_minutes: 5m, down: maybe, wait_for: ssh, after: 1}\n",
			want: []wantErr{
				{3, 38, "resources.autostop.down", "expected a boolean"},
				{3, 55, "resources.autostop.wait_for", "unknown wait_for"},
				{3, 60, "resources.autostop.after", "unknown field"},
			},
		},
		"autostop on a service": {
			yaml: svc + "resources:\n  autostop: 10\n",
			want: []wantErr{{5, 3, "resources.autostop", "min_replicas: 0"}},
		},
		"autostop in an alternative": {
			yaml: "run: x\nresources:\n  any_of:\n    - {infra: aws, autostop: true}\n",
			want: []wantErr{{4, 20, "resources.any_of[0].autostop", "set it once"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err == nil {
				t.Fatal("want errors, got none")
			}
			if diff := cmp.Diff(tc.want, project(Errors(err), tc.want)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}

func TestAutostopSpellings(t *testing.T) {
	tests := map[string]*Autostop{
		"true":                              {IdleMinutes: DefaultAutostopMinutes},
		"false":                             nil,
		"10":                                {IdleMinutes: 10},
		"'2h'":                              {IdleMinutes: 120},
		"1d":                                {IdleMinutes: 1440},
		"1w":                                {IdleMinutes: 10080},
		"{idle_minutes: 15}":                {IdleMinutes: 15},
		"{down: true}":                      {IdleMinutes: DefaultAutostopMinutes, Down: true},
		"{idle_minutes: 0, down: true}":     {Down: true},
		"{idle_minutes: 3, wait_for: none}": {IdleMinutes: 3},
	}
	for spelling, want := range tests {
		t.Run(spelling, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte("run: x\nresources:\n  autostop: "+spelling+"\n"), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, task.Resources.Autostop); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestEnvSubstitution(t *testing.T) {
	const yaml = `run: x
envs:
  MODEL: m1
  ROOT: /data
  EMPTY: ""
secrets:
  TOKEN: s3cr3t-value
workdir: ${ROOT}/src
file_mounts:
  $ROOT/in: gs://bucket/$MODEL
service:
  ports: 8000
  readiness_probe:
    path: /v1/$MODEL/health
    post_data: {model: $MODEL, note: "$UNSET stays, ${MODEL}x, $MODELx, [$EMPTY]", n: 1}
    headers:
      Authorization: Bearer $TOKEN
      X-Plain: $MODEL
`
	task, err := Parse("task.yaml", []byte(yaml), Overrides{Envs: map[string]string{"MODEL": "m2"}})
	if err != nil {
		t.Fatal(err)
	}
	if task.Workdir != "/data/src" {
		t.Errorf("workdir %q", task.Workdir)
	}
	if diff := cmp.Diff(map[string]string{"/data/in": "gs://bucket/m2"}, task.FileMounts); diff != "" {
		t.Errorf("file_mounts (-want +got):\n%s", diff)
	}
	p := task.Service.ReadinessProbe
	if p.Path != "/v1/m2/health" {
		t.Errorf("path %q", p.Path)
	}
	// SkyPilot's pattern: unknown names stay as written, ${NAME}x is NAME then x, $MODELx is the
	// unknown name MODELx.
	const wantBody = `{"model":"m2","note":"$UNSET stays, m2x, $MODELx, []","n":1}`
	if p.PostData != wantBody {
		t.Errorf("post_data\n got %s\nwant %s", p.PostData, wantBody)
	}
	if p.Headers["Authorization"] != "Bearer s3cr3t-value" || p.Headers["X-Plain"] != "m2" {
		t.Errorf("headers %v", p.Headers)
	}
	if task.Run != "x" {
		t.Errorf("run changed: %q", task.Run)
	}
	// A secret that substitution put into the service never shows.
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cr3t-value") {
		t.Fatalf("resolved YAML shows a substituted secret:\n%s", out)
	}
}

// TestEnvSubstitutionKeepsAliasesApart: a node shared through an alias with a section that is
// not substituted keeps its text there.
func TestEnvSubstitutionKeepsAliasesApart(t *testing.T) {
	const yaml = "envs:\n  M: m1\nrun: &cmd echo $M\nsetup: *cmd\nservice:\n  ports: 1\n  readiness_probe:\n    path: /x\n    post_data: {cmd: *cmd}\n"
	task, err := Parse("task.yaml", []byte(yaml), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if task.Run != "echo $M" || task.Setup != "echo $M" {
		t.Errorf("run %q setup %q: the shell expands these, not Ferry", task.Run, task.Setup)
	}
	if task.Service.ReadinessProbe.PostData != `{"cmd":"echo m1"}` {
		t.Errorf("post_data %s", task.Service.ReadinessProbe.PostData)
	}
}

// TestImageIDMatchesInfra: an image a named infra cannot boot fails at parse time (and so at
// --dry-run), not at launch.
func TestImageIDMatchesInfra(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want []wantErr
	}{
		"kubernetes needs a container": {
			yaml: "run: x\nresources:\n  infra: kubernetes\n  image_id: ubuntu:22.04\n",
			want: []wantErr{{4, 13, "resources.image_id", "write image_id: docker:IMAGE"}},
		},
		"aws takes an AMI": {
			yaml: "run: x\nresources:\n  infra: aws\n  image_id: projects/p/global/images/i\n",
			want: []wantErr{{4, 13, "resources.image_id", "an AMI (ami-...)"}},
		},
		"gcp is not given an AMI, per alternative": {
			yaml: "run: x\nresources:\n  ordered:\n    - {infra: aws, image_id: ami-123}\n    - {infra: gcp, image_id: ami-123}\n",
			want: []wantErr{{5, 30, "resources.ordered[1].image_id", "is an AWS AMI"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err == nil {
				t.Fatal("want errors, got none")
			}
			if diff := cmp.Diff(tc.want, project(Errors(err), tc.want)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
	for _, ok := range []string{"infra: kubernetes\n  image_id: docker:vllm/vllm-openai", "infra: aws\n  image_id: ami-0abc", "infra: aws\n  image_id: docker:vllm/vllm-openai", "infra: gcp\n  image_id: projects/p/global/images/i"} {
		if _, err := Parse("task.yaml", []byte("run: x\nresources:\n  "+ok+"\n"), Overrides{}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// TestSkyPilotFieldsNotSupported: a SkyPilot field Ferry does not act on is an error that says
// what to write instead, wherever a resources mapping may hold it.
func TestSkyPilotFieldsNotSupported(t *testing.T) {
	const yaml = "run: x\nvolumes: {}\nevent_callback: cb.sh\nresources:\n  local_disk: nvme\n  any_of:\n    - {infra: aws, container_image: vllm/vllm-openai}\n  _docker_login_config: {}\n"
	_, err := Parse("task.yaml", []byte(yaml), Overrides{})
	want := []wantErr{
		{2, 1, "volumes", "use file_mounts"},
		{3, 1, "event_callback", "ferry serve status --json"},
		{5, 3, "resources.local_disk", "SkyPilot's local_disk is not supported by Ferry"},
		{7, 20, "resources.any_of[0].container_image", "write image_id: docker:IMAGE"},
		{8, 3, "resources._docker_login_config", "internal fields"},
	}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
	}
}

// TestAWSLimitsAtParseTime: a task that can only go to AWS and that AWS refuses (user-data
// over 16 KiB, a gang over 16 nodes) fails at parse time, so --dry-run says so.
func TestAWSLimitsAtParseTime(t *testing.T) {
	big := strings.Repeat("echo padding\n", 1400)
	_, err := Parse("task.yaml", []byte("num_nodes: 17\nresources:\n  infra: aws\nrun: |\n"+indentLines(big)), Overrides{})
	want := []wantErr{
		{1, 12, "num_nodes", "at most 16 nodes"},
		{4, 6, "run", "EC2 user-data, at most 16384 bytes"},
	}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
	}
	// The same task with another infra allowed is left to the optimizer.
	if _, err := Parse("task.yaml", []byte("num_nodes: 17\nresources:\n  any_of: [{infra: aws}, {infra: gcp}]\nrun: |\n"+indentLines(big)), Overrides{}); err != nil {
		t.Errorf("any_of with gcp: %v", err)
	}
}

func indentLines(s string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if line != "" {
			b.WriteString("  " + line)
		}
	}
	return b.String()
}
