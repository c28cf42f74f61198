package configs

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// wantErr is one expected problem; Msg is a substring of the real message.
type wantErr struct {
	Line, Col int
	Field     string
	Msg       string
}

// project turns real errors into wantErrs, keeping want's Msg where it is a substring of the
// real one, so cmp.Diff shows the whole message only where it does not match.
func project(got []*Error, want []wantErr) []wantErr {
	out := make([]wantErr, len(got))
	for i, e := range got {
		out[i] = wantErr{e.Line, e.Col, e.Field, e.Msg}
		if i < len(want) && want[i].Msg != "" && strings.Contains(e.Msg, want[i].Msg) {
			out[i].Msg = want[i].Msg
		}
	}
	return out
}

func TestParseErrors(t *testing.T) {
	const svc = "run: serve\nservice:\n  ports: 8080\n"
	tests := map[string]struct {
		yaml string
		ov   Overrides
		want []wantErr
	}{
		"wrong type: string for integer": {
			yaml: svc + "  replicas: two\n",
			want: []wantErr{{4, 13, "service.replicas", `expected an integer, got string "two"`}},
		},
		"wrong type: float for integer": {
			yaml: svc + "  replicas: 2.5\n",
			want: []wantErr{{4, 13, "service.replicas", `expected an integer, got number 2.5`}},
		},
		"wrong type: quoted string for boolean": {
			yaml: "run: serve\nresources:\n  use_spot: \"maybe\"\n",
			want: []wantErr{{3, 13, "resources.use_spot", `expected a boolean (true or false), got string "maybe"`}},
		},
		"wrong type: mapping for scalar": {
			yaml: "run: serve\nnum_nodes: {a: 1}\n",
			want: []wantErr{{2, 12, "num_nodes", "expected an integer, got a mapping"}},
		},
		"wrong type: list for string": {
			yaml: "run: [a, b]\n",
			want: []wantErr{{1, 6, "run", "expected a string, got a list"}},
		},
		"wrong type: resources is a string": {
			yaml: "run: serve\nresources: big\n",
			want: []wantErr{{2, 12, "resources", `expected a mapping, got string "big"`}},
		},
		"unknown key with did-you-mean": {
			yaml: svc + "  replica: 2\n",
			want: []wantErr{{4, 3, "service.replica", `unknown field "replica"; did you mean "replicas"?`}},
		},
		"unknown key by prefix": {
			yaml: svc + "  readiness: /health\n",
			want: []wantErr{{4, 3, "service.readiness", `did you mean "readiness_probe"?`}},
		},
		"unknown key case-insensitive": {
			yaml: "Run: serve\n",
			want: []wantErr{
				{1, 1, "Run", `unknown field "Run"; did you mean "run"?`},
				{1, 1, "run", "required"},
			},
		},
		"unknown key lists valid keys": {
			yaml: "run: serve\ncolour: blue\n",
			want: []wantErr{{2, 1, "colour", `unknown field "colour" (valid fields: name, workdir, num_nodes, resources, envs, secrets, file_mounts, setup, run, service, job, config)`}},
		},
		"unknown key deep inside": {
			yaml: svc + "  replica_policy:\n    min_replicas: 1\n    max_replica: 2\n",
			want: []wantErr{{6, 5, "service.replica_policy.max_replica", `did you mean "max_replicas"?`}},
		},
		"min greater than max": {
			yaml: svc + "  replica_policy:\n    min_replicas: 3\n    max_replicas: 1\n    target_qps_per_replica: 2\n",
			want: []wantErr{{6, 19, "service.replica_policy.max_replicas", "must be at least min_replicas (3), got 1"}},
		},
		"min_replicas missing": {
			yaml: svc + "  replica_policy:\n    max_replicas: 2\n",
			want: []wantErr{{4, 3, "service.replica_policy.min_replicas", "required"}},
		},
		"negative min_replicas": {
			yaml: svc + "  replica_policy:\n    min_replicas: -1\n",
			want: []wantErr{{5, 19, "service.replica_policy.min_replicas", "must be at least 0, got -1"}},
		},
		"probe path without leading slash": {
			yaml: svc + "  readiness_probe: health\n",
			want: []wantErr{{4, 20, "service.readiness_probe", `must start with "/", got "health"`}},
		},
		"probe path in mapping without leading slash": {
			yaml: svc + "  readiness_probe:\n    path: v1/models\n",
			want: []wantErr{{5, 11, "service.readiness_probe.path", `must start with "/"`}},
		},
		"probe timeout zero and negative delay": {
			yaml: svc + "  readiness_probe:\n    timeout_seconds: 0\n    initial_delay_seconds: -5\n",
			want: []wantErr{
				{5, 22, "service.readiness_probe.timeout_seconds", "must be at least 1, got 0"},
				{6, 28, "service.readiness_probe.initial_delay_seconds", "must be at least 0, got -5"},
			},
		},
		"spot-only field without use_spot": {
			yaml: svc + "  replica_policy:\n    min_replicas: 1\n    base_ondemand_fallback_replicas: 1\n",
			want: []wantErr{{6, 38, "service.replica_policy.base_ondemand_fallback_replicas", "spot-only field without use_spot"}},
		},
		"dynamic fallback and spot placer without use_spot": {
			yaml: svc + "  replica_policy:\n    min_replicas: 1\n    dynamic_ondemand_fallback: true\n    spot_placer: dynamic_fallback\n",
			want: []wantErr{
				{6, 32, "service.replica_policy.dynamic_ondemand_fallback", "spot-only field without use_spot"},
				{7, 18, "service.replica_policy.spot_placer", "spot-only field without use_spot"},
			},
		},
		"unknown spot placer": {
			yaml: "run: serve\nresources:\n  use_spot: true\n  ports: 8080\nservice:\n  replica_policy:\n    min_replicas: 1\n    spot_placer: dynamic\n",
			want: []wantErr{{8, 18, "service.replica_policy.spot_placer", `unknown spot placer "dynamic"; did you mean "dynamic_fallback"?`}},
		},
		"both replicas and replica_policy": {
			yaml: svc + "  replicas: 2\n  replica_policy:\n    min_replicas: 1\n",
			want: []wantErr{{5, 3, "service.replica_policy", "replicas and replica_policy are exclusive"}},
		},
		"bad accelerator string: count not a number": {
			yaml: "run: serve\nresources:\n  accelerators: A100:x\n",
			want: []wantErr{{3, 17, "resources.accelerators", `bad accelerator string "A100:x"`}},
		},
		"bad accelerator strings in a list": {
			yaml: "run: serve\nresources:\n  accelerators: [\"A100:1:2\", \":1\", \"H100:0\", \"L4:1.5\"]\n",
			want: []wantErr{
				{3, 18, "resources.accelerators[0]", `bad accelerator string "A100:1:2"`},
				{3, 30, "resources.accelerators[1]", `bad accelerator string ":1"`},
				{3, 36, "resources.accelerators[2]", `bad accelerator string "H100:0"`},
				{3, 46, "resources.accelerators[3]", "a fractional count must be below 1"},
			},
		},
		"bad accelerator: a bare number": {
			yaml: "run: serve\nresources:\n  accelerators: 4\n",
			want: []wantErr{{3, 17, "resources.accelerators", `bad accelerator string "4"`}},
		},
		"bad accelerator map": {
			yaml: "run: serve\nresources:\n  accelerators: {A100: 0, \"8x\": 1, L4: many}\n",
			want: []wantErr{
				{3, 24, "resources.accelerators.A100", "must be greater than 0"},
				{3, 27, "resources.accelerators.8x", "bad accelerator string"},
				{3, 40, "resources.accelerators.L4", `expected a number, got string "many"`},
			},
		},
		"accelerator listed twice": {
			yaml: "run: serve\nresources:\n  accelerators: [A100:2, a100:2]\n",
			want: []wantErr{{3, 26, "resources.accelerators[1]", `accelerator "a100:2" listed twice`}},
		},
		"empty run": {
			yaml: "run: \"\"\n",
			want: []wantErr{{1, 6, "run", "required: the command the task runs (a service's starts its server)"}},
		},
		"blank run": {
			yaml: "run: |\n  \n\nname: x\n",
			want: []wantErr{{1, 6, "run", "required: the command the task runs (a service's starts its server)"}},
		},
		"missing run": {
			yaml: "name: api\n",
			want: []wantErr{{1, 1, "run", "required: the command the task runs (a service's starts its server)"}},
		},
		"null run": {
			yaml: "run:\n",
			want: []wantErr{{1, 1, "run", "required: the command the task runs (a service's starts its server)"}},
		},
		"non-positive target": {
			yaml: svc + "  replica_policy:\n    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: 0\n",
			want: []wantErr{{7, 29, "service.replica_policy.target_qps_per_replica", "must be greater than 0"}},
		},
		"map-form qps without instance-aware policy": {
			yaml: "run: serve\nresources:\n  accelerators: {A100: 1}\n  ports: 8080\nservice:\n  replica_policy:\n    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: {A100: 5}\n",
			want: []wantErr{{9, 29, "service.replica_policy.target_qps_per_replica", "needs load_balancing_policy: instance_aware_least_load (got least_ttft)"}},
		},
		"instance-aware policy without map-form qps": {
			yaml: svc + "  replica_policy:\n    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: 5\n  load_balancing_policy: instance_aware_least_load\n",
			want: []wantErr{{8, 26, "service.load_balancing_policy", "instance_aware_least_load needs replica_policy.target_qps_per_replica as a mapping"}},
		},
		"qps map names an accelerator no candidate asks for": {
			yaml: "run: serve\nresources:\n  accelerators: A100\n  ports: 8080\nservice:\n  replica_policy:\n    min_replicas: 1\n    max_replicas: 3\n    target_qps_per_replica: {A100: 5, H100: 9}\n  load_balancing_policy: instance_aware_least_load\n",
			want: []wantErr{{9, 39, "service.replica_policy.target_qps_per_replica.H100", `no resources candidate asks for accelerator "H100" (accelerators: A100)`}},
		},
		"unknown load balancing policy": {
			yaml: svc + "  load_balancing_policy: least-load\n",
			want: []wantErr{{4, 26, "service.load_balancing_policy", `unknown policy "least-load"; did you mean "least_load"?`}},
		},
		"bad update knobs": {
			yaml: svc + "  update:\n    mode: bluegreen\n    max_parallel: -1\n    progress_deadline_seconds: 0\n    canary: 1\n",
			want: []wantErr{
				{5, 11, "service.update.mode", `unknown mode "bluegreen"; did you mean "blue_green"?`},
				{6, 19, "service.update.max_parallel", "at least 0"},
				{7, 32, "service.update.progress_deadline_seconds", "at least 1"},
				{8, 5, "service.update.canary", "unknown field"},
			},
		},
		"bad health check": {
			yaml: svc + "  health_check:\n    path: health\n    interval_seconds: 0\n    timeout_seconds: 90\n    disabled: maybe\n",
			want: []wantErr{
				{5, 11, "service.health_check.path", `must start with "/"`},
				{6, 23, "service.health_check.interval_seconds", "must be greater than 0"},
				{7, 22, "service.health_check.timeout_seconds", "must be at most 60"},
				{8, 15, "service.health_check.disabled", "expected a boolean"},
			},
		},
		"bad service port": {
			yaml: "run: serve\nservice:\n  ports: 70000\n",
			want: []wantErr{{3, 10, "service.ports", "port 70000 is out of range 1-65535"}},
		},
		"bad resources ports": {
			yaml: "run: serve\nresources:\n  ports: [8080, abc, 0, \"9000-8000\"]\n",
			want: []wantErr{
				{3, 17, "resources.ports[1]", `expected a port (1-65535) or a range such as "8000-8010", got string "abc"`},
				{3, 22, "resources.ports[2]", "port 0 is out of range"},
				{3, 25, "resources.ports[3]", `port "9000-8000" is out of range`},
			},
		},
		"service port missing": {
			yaml: "run: serve\nservice:\n  replicas: 1\n",
			want: []wantErr{{2, 1, "service.ports", "required: the port each replica serves on"}},
		},
		"service port ambiguous": {
			yaml: "run: serve\nresources:\n  ports: [8000, 9000]\nservice:\n  replicas: 1\n",
			want: []wantErr{{4, 1, "service.ports", "resources.ports lists 2 ports"}},
		},
		"num_nodes zero": {
			yaml: "run: serve\nnum_nodes: 0\n",
			want: []wantErr{{2, 12, "num_nodes", "must be at least 1, got 0"}},
		},
		"bad name": {
			yaml: "name: my service!\nrun: serve\n",
			want: []wantErr{{1, 7, "name", `"my service!" is not a valid name`}},
		},
		"bad name override": {
			yaml: "run: serve\n",
			ov:   Overrides{Name: "-x"},
			want: []wantErr{{0, 0, "name", "given on the command line"}},
		},
		"name too long": {
			yaml: "name: " + strings.Repeat("a", 64) + "\nrun: serve\n",
			want: []wantErr{{1, 7, "name", "names are at most 63"}},
		},
		"env with null value": {
			yaml: "run: serve\nenvs:\n  MODEL:\n",
			want: []wantErr{{3, 9, "envs.MODEL", "no value: give one here, or pass --env MODEL=VALUE"}},
		},
		"env with mapping value and bad name": {
			yaml: "run: serve\nenvs:\n  A: {b: c}\n  1BAD: x\n",
			want: []wantErr{
				{3, 6, "envs.A", "expected a string, number or boolean, got a mapping"},
				{4, 3, "envs.1BAD", "not a valid environment variable name"},
			},
		},
		"secret without value": {
			yaml: "run: serve\nsecrets:\n  HF_TOKEN: null\n",
			want: []wantErr{{3, 13, "secrets.HF_TOKEN", "no value: give one here, or pass --secret HF_TOKEN=VALUE or set HF_TOKEN in the environment"}},
		},
		"name both env and secret": {
			yaml: "run: serve\nenvs:\n  TOKEN: a\nsecrets:\n  TOKEN: b\n",
			want: []wantErr{{5, 3, "secrets.TOKEN", "also set in envs"}},
		},
		"duplicate key": {
			yaml: "run: a\nrun: b\n",
			want: []wantErr{{2, 1, "run", "duplicate key (first given at line 1)"}},
		},
		"infra unknown cloud": {
			yaml: "run: serve\nresources:\n  infra: awz/us-east-1\n",
			want: []wantErr{{3, 10, "resources.infra", `unknown infra "awz"; did you mean "aws"?`}},
		},
		"infra unknown cloud without a close match": {
			yaml: "run: serve\nresources:\n  infra: moon\n",
			want: []wantErr{{3, 10, "resources.infra", `unknown infra "moon" (valid infra: local, kubernetes, k8s, aws, gcp, *)`}},
		},
		"infra on a cloud Ferry lacks": {
			yaml: "run: serve\nresources:\n  infra: azure\n",
			want: []wantErr{{3, 10, "resources.infra", "Ferry does not launch on azure: it launches on local, kubernetes, aws and gcp"}},
		},
		"infra zone outside region": {
			yaml: "run: serve\nresources:\n  infra: aws/us-east-1/us-west-2a\n",
			want: []wantErr{{3, 10, "resources.infra", `zone "us-west-2a" is not in region "us-east-1"`}},
		},
		"infra too many parts and local with region": {
			yaml: "run: serve\nresources:\n  any_of:\n    - infra: gcp/a/a-b/c\n    - infra: local/here\n",
			want: []wantErr{
				{4, 14, "resources.any_of[0].infra", "expected gcp[/REGION[/ZONE]]"},
				{5, 14, "resources.any_of[1].infra", "local takes no region or zone"},
			},
		},
		"infra and cloud together": {
			yaml: "run: serve\nresources:\n  infra: aws\n  cloud: gcp\n",
			want: []wantErr{{4, 3, "resources.cloud", "cannot be combined with infra"}},
		},
		"region without cloud": {
			yaml: "run: serve\nresources:\n  region: us-east-1\n",
			want: []wantErr{{3, 3, "resources.region", "needs cloud"}},
		},
		"any_of and ordered together": {
			yaml: "run: serve\nresources:\n  any_of: [{infra: aws}]\n  ordered: [{infra: gcp}]\n",
			want: []wantErr{{4, 3, "resources.ordered", "any_of and ordered are exclusive"}},
		},
		"nested alternatives": {
			yaml: "run: serve\nresources:\n  any_of:\n    - ordered: [{infra: aws}]\n",
			want: []wantErr{{4, 7, "resources.any_of[0].ordered", "alternatives cannot be nested"}},
		},
		"any_of is not a list": {
			yaml: "run: serve\nresources:\n  any_of: {infra: aws}\n",
			want: []wantErr{{3, 11, "resources.any_of", "expected a list of resource mappings, got a mapping"}},
		},
		"candidates disagree on use_spot": {
			yaml: "run: serve\nresources:\n  use_spot: true\n  ports: 8080\n  any_of:\n    - infra: aws\n    - infra: gcp\n      use_spot: false\nservice:\n  replicas: 1\n",
			want: []wantErr{{8, 17, "resources.any_of[1].use_spot", "all candidates of a service must agree on use_spot (any_of[0] is spot, any_of[1] is on-demand)"}},
		},
		"bad cpus and memory and disk": {
			yaml: "run: serve\nresources:\n  cpus: 4++\n  memory: -2\n  disk_size: 0\n",
			want: []wantErr{
				{3, 9, "resources.cpus", `expected a positive number, optionally with a trailing + (e.g. 4 or 4+), got "4++"`},
				{4, 11, "resources.memory", "must be greater than 0, got -2"},
				{5, 14, "resources.disk_size", "must be at least 1, got 0"},
			},
		},
		"tls without certfile": {
			yaml: svc + "  tls:\n    keyfile: /k.pem\n",
			want: []wantErr{{5, 5, "service.tls.certfile", "required: TLS needs both keyfile and certfile"}},
		},
		"post_data with NaN": {
			yaml: svc + "  readiness_probe:\n    post_data: {x: .nan}\n",
			want: []wantErr{{5, 20, "service.readiness_probe.post_data.x", "expected a finite number"}},
		},
		"bad header": {
			yaml: svc + "  readiness_probe:\n    headers: {\"bad header\": x, X-Ok: [1]}\n",
			want: []wantErr{
				{5, 15, "service.readiness_probe.headers.bad header", "not a valid HTTP header name"},
				{5, 38, "service.readiness_probe.headers.X-Ok", "expected a string, number or boolean, got a list"},
			},
		},
		"yaml syntax error": {
			yaml: "run: serve\nservice:\n  ports: 8080\n bad: [\n",
			// yaml.v3 names the line of the mapping it was reading, not the stray one.
			want: []wantErr{{3, 0, "", "invalid YAML: did not find expected key"}},
		},
		"tab indentation": {
			yaml: "run: serve\nservice:\n\tports: 8080\n",
			want: []wantErr{{3, 0, "", "invalid YAML: found character that cannot start any token"}},
		},
		"empty document": {
			yaml: "",
			want: []wantErr{{1, 1, "", "empty document"}},
		},
		"only comments": {
			yaml: "# nothing here\n",
			want: []wantErr{{1, 1, "", "empty document"}},
		},
		"explicit empty document": {
			yaml: "---\n",
			want: []wantErr{{1, 1, "", "empty document"}},
		},
		"top level is a list": {
			yaml: "- run: serve\n",
			want: []wantErr{{1, 1, "", "expected a mapping of task fields at the top level, got a list"}},
		},
		"two documents": {
			yaml: "run: a\n---\nrun: b\n",
			want: []wantErr{{2, 1, "", "a second YAML document"}},
		},
		// SkyPilot's examples/elastic_training/job.yaml opens with a job group's header.
		"a job group": {
			yaml: "---\nname: elastic-train\nexecution: parallel\nprimary_tasks:\n  - controller\n\n---\nname: controller\nrun: x\n",
			want: []wantErr{{7, 1, "", "a SkyPilot job group (several tasks launched together), which Ferry does not run"}},
		},
		"merge key with a scalar": {
			yaml: "run: serve\n<<: 5\n",
			want: []wantErr{{2, 5, "", "a merge key (<<) takes a mapping or a list of mappings"}},
		},
		"cyclic alias": {
			yaml: "run: serve\nservice: &s\n  <<: *s\n  ports: 8080\n",
			want: []wantErr{{2, 10, "service", "merge keys (<<) nested more than 32 deep"}},
		},
		"multiple errors collected in one file": {
			yaml: `name: Bad Name
resources:
  accelerators: A100:x
  use_spot: perhaps
  infra: mars
envs:
  OK: fine
service:
  ports: 8080
  replicas: 2
  replica_policy:
    min_replicas: 4
    max_replicas: 2
    base_ondemand_fallback_replicas: 1
  readiness_probe: health
  tls: {keyfile: k}
  extra: 1
`,
			want: []wantErr{
				{1, 1, "run", "required"}, // the whole file is where run is missing
				{1, 7, "name", "not a valid name"},
				{3, 17, "resources.accelerators", "bad accelerator string"},
				{4, 13, "resources.use_spot", "expected a boolean"},
				{5, 10, "resources.infra", `unknown infra "mars"`},
				{11, 3, "service.replica_policy", "exclusive"},
				{13, 19, "service.replica_policy.max_replicas", "must be at least min_replicas (4), got 2"},
				{14, 38, "service.replica_policy.base_ondemand_fallback_replicas", "spot-only field without use_spot"},
				{15, 20, "service.readiness_probe", `must start with "/"`},
				{16, 8, "service.tls.certfile", "required"},
				{17, 3, "service.extra", "unknown field"},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tc.yaml), tc.ov)
			if err == nil {
				t.Fatalf("Parse succeeded, want errors; got %+v", task)
			}
			if task != nil {
				t.Errorf("Parse returned a task with an error")
			}
			got := Errors(err)
			if diff := cmp.Diff(tc.want, project(got, tc.want)); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
			for _, e := range got {
				if e.File != "task.yaml" {
					t.Errorf("error %q has File %q, want task.yaml", e, e.File)
				}
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	tests := map[string]struct {
		err  Error
		want string
	}{
		"full":        {Error{File: "a.yaml", Line: 3, Col: 5, Field: "service.replicas", Msg: "bad"}, "a.yaml:3:5: service.replicas: bad"},
		"no column":   {Error{File: "a.yaml", Line: 3, Msg: "invalid YAML"}, "a.yaml:3: invalid YAML"},
		"no position": {Error{File: "a.yaml", Field: "name", Msg: "bad"}, "a.yaml: name: bad"},
		"no file":     {Error{Line: 1, Col: 2, Msg: "bad"}, "1:2: bad"},
		"only msg":    {Error{Msg: "bad"}, "bad"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestErrorsUnwrapsJoinedAndWrapped(t *testing.T) {
	_, err := Parse("t.yaml", []byte("run: serve\nnum_nodes: x\nname: X!\n"), Overrides{})
	wrapped := fmt.Errorf("serve up: %w", err)
	got := Errors(wrapped)
	if len(got) != 2 {
		t.Fatalf("Errors(wrapped) = %v, want 2 errors", got)
	}
	var first *Error
	if !errors.As(wrapped, &first) || first != got[0] {
		t.Errorf("errors.As found %v, want the first error %v", first, got[0])
	}
	if want := "t.yaml:2:12: num_nodes: expected an integer, got string \"x\""; got[0].Error() != want {
		t.Errorf("first error = %q, want %q", got[0].Error(), want)
	}
	if Errors(errors.New("plain")) != nil || Errors(nil) != nil {
		t.Errorf("Errors of a non-config error should be nil")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/svc.yaml"
	if err := writeFile(path, "run: serve\nsecrets:\n  HF_TOKEN:\n  OTHER: given\nservice:\n  ports: 8080\n"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HF_TOKEN", "hf_from_env")
	t.Setenv("OTHER", "from_env_but_yaml_wins")
	task, err := Load(path, Overrides{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	want := map[string]string{"HF_TOKEN": "hf_from_env", "OTHER": "given"}
	if diff := cmp.Diff(want, task.Secrets); diff != "" {
		t.Errorf("secrets (-want +got):\n%s", diff)
	}
	if task.Source != path {
		t.Errorf("Source = %q, want %q", task.Source, path)
	}

	// Overrides beat the environment.
	task, err = Load(path, Overrides{Secrets: map[string]string{"HF_TOKEN": "hf_flag"}})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if task.Secrets["HF_TOKEN"] != "hf_flag" {
		t.Errorf("HF_TOKEN = %q, want the --secret value", task.Secrets["HF_TOKEN"])
	}

	// Parse never reads the environment.
	data := []byte("run: serve\nsecrets:\n  HF_TOKEN:\n")
	if _, err := Parse(path, data, Overrides{}); err == nil {
		t.Errorf("Parse took a secret from the environment")
	}

	_, err = Load(dir+"/missing.yaml", Overrides{})
	if err == nil || Errors(err) != nil {
		t.Errorf("Load(missing) = %v, want a read error that is not a validation error", err)
	}
}
