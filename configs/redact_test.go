package configs

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const secretYAML = `name: chat
run: serve --token $HF_TOKEN
envs:
  MODEL: m
secrets:
  HF_TOKEN:
  WANDB_KEY: wandb-literal-value-42
resources:
  use_spot: true
  ports: 8000
  any_of: [{infra: aws}, {infra: gcp, accelerators: L4}]
service:
  readiness_probe:
    path: /health
    headers:
      Authorization: Bearer probe-credential-7
      X-Api-Key: probe-api-key-9
      X-Trace: keep-me
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    target_qps_per_replica: 2.5
    base_ondemand_fallback_replicas: 1
  tls: {keyfile: /k.pem, certfile: /c.pem}
`

var secretValues = []string{"hf_very_secret_token", "wandb-literal-value-42", "probe-credential-7", "probe-api-key-9"}

func parseSecretTask(t *testing.T) *Task {
	t.Helper()
	task, err := Parse("chat.yaml", []byte(secretYAML), Overrides{Secrets: map[string]string{"HF_TOKEN": "hf_very_secret_token"}})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return task
}

func TestRedacted(t *testing.T) {
	task := parseSecretTask(t)
	red := task.Redacted()

	want := map[string]string{"HF_TOKEN": RedactedValue, "WANDB_KEY": RedactedValue}
	if diff := cmp.Diff(want, red.Secrets); diff != "" {
		t.Errorf("redacted secrets (-want +got):\n%s", diff)
	}
	wantHeaders := map[string]string{"Authorization": RedactedValue, "X-Api-Key": RedactedValue, "X-Trace": "keep-me"}
	if diff := cmp.Diff(wantHeaders, red.Service.ReadinessProbe.Headers); diff != "" {
		t.Errorf("redacted headers (-want +got):\n%s", diff)
	}
	dump := strings.Join([]string{cmp.Diff(nil, red), red.Resources.String()}, "\n")
	for _, v := range secretValues {
		if strings.Contains(dump, v) {
			t.Errorf("Redacted() still contains %q", v)
		}
	}
	// The original is untouched, and the copy shares nothing with it.
	if task.Secrets["HF_TOKEN"] != "hf_very_secret_token" || task.Service.ReadinessProbe.Headers["Authorization"] != "Bearer probe-credential-7" {
		t.Errorf("Redacted modified the original task")
	}
	red.Envs["MODEL"] = "changed"
	red.Resources.AnyOf[0].Infra = "changed"
	red.Service.TLS.KeyFile = "changed"
	if task.Envs["MODEL"] != "m" || task.Resources.AnyOf[0].Infra != "aws" || task.Service.TLS.KeyFile != "/k.pem" {
		t.Errorf("Redacted shares memory with the original")
	}
	if (*Task)(nil).Redacted() != nil {
		t.Errorf("nil.Redacted() should be nil")
	}
}

// TestRedactedHidesKeysKeptInEnvs: a task stored before keys_from_env refused the envs may
// hold an API key there; whatever shows the task (status, --dry-run, serve update) redacts it.
func TestRedactedHidesKeysKeptInEnvs(t *testing.T) {
	const key = "sk-stored-before-the-rule-0123456789"
	task := &Task{Run: "serve", Envs: map[string]string{"CHAT_KEY": key, "MODEL": "m"},
		Service: &Service{Port: 8080, Auth: &Auth{KeysFromEnv: []string{"CHAT_KEY"}}}}
	red := task.Redacted()
	if diff := cmp.Diff(map[string]string{"CHAT_KEY": RedactedValue, "MODEL": "m"}, red.Envs); diff != "" {
		t.Errorf("redacted envs (-want +got):\n%s", diff)
	}
	shown, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(shown), key) {
		t.Errorf("resolved YAML shows the key:\n%s", shown)
	}
	if task.Envs["CHAT_KEY"] != key {
		t.Error("Redacted modified the original task")
	}
	if diff := cmp.Diff([]string{"CHAT_KEY"}, task.KeyEnvs()); diff != "" {
		t.Errorf("KeyEnvs (-want +got):\n%s", diff)
	}
}

func TestResolvedYAML(t *testing.T) {
	task := parseSecretTask(t)
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatalf("ResolvedYAML: %v", err)
	}
	for _, v := range secretValues {
		if strings.Contains(string(out), v) {
			t.Errorf("ResolvedYAML contains secret %q:\n%s", v, out)
		}
	}
	for _, want := range []string{"initial_delay_seconds: 1200", "timeout_seconds: 15", "upscale_delay_seconds: 300",
		"downscale_delay_seconds: 1200", "load_balancing_policy: least_ttft", "HF_TOKEN: <redacted>", "infra: aws"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ResolvedYAML lacks %q:\n%s", want, out)
		}
	}
	assertRoundTrip(t, task, out)
}

// assertRoundTrip checks that resolved YAML parses back to the redacted task.
func assertRoundTrip(t *testing.T, task *Task, resolved []byte) {
	t.Helper()
	again, err := Parse("resolved.yaml", resolved, Overrides{})
	if err != nil {
		t.Fatalf("resolved YAML does not parse: %v\n%s", err, resolved)
	}
	if diff := cmp.Diff(task.Redacted(), again, cmpopts.IgnoreFields(Task{}, "Source", "Notes"), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("resolved YAML does not parse back to the task (-want +got):\n%s\n%s", diff, resolved)
	}
}

func TestResolvedYAMLFixedReplicas(t *testing.T) {
	task, err := Parse("q.yaml", []byte("run: x\nservice:\n  ports: 8080\n  replicas: 3\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "replicas: 3") || strings.Contains(string(out), "replica_policy") {
		t.Errorf("fixed replicas should render as replicas: 3:\n%s", out)
	}
	assertRoundTrip(t, task, out)
}

// TestResolvedYAMLRendersEveryPolicyAndLimitsField guards against a new replica_policy or
// limits field that parses but is dropped by ResolvedYAML: between a request_rate and an llm
// service, every key is set and must be written, and each file must parse back unchanged.
func TestResolvedYAMLRendersEveryPolicyAndLimitsField(t *testing.T) {
	const requestRate = `run: serve
resources: {use_spot: true, ports: 8000}
service:
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    autoscaler: request_rate
    target_qps_per_replica: 2
    num_overprovision: 1
    upscale_delay_seconds: 10
    downscale_delay_seconds: 20
    base_ondemand_fallback_replicas: 1
    dynamic_ondemand_fallback: true
    spot_placer: dynamic_fallback
  limits:
    max_request_body_mb: 8
    max_concurrent_requests: 100
    idle_timeout_seconds: 60
    max_queued_requests: -1
    max_queue_wait_seconds: 30
`
	const llm = `run: serve
service:
  ports: 8000
  replica_policy:
    min_replicas: 0
    max_replicas: 4
    autoscaler: llm
    target_inflight_per_replica: 4
    stable_window_seconds: 30
    panic_window_seconds: 3
    panic_threshold: 2.5
    max_scale_up_rate: 10
    max_scale_down_rate: 1.5
    scale_to_zero_grace_seconds: 15
    target_waiting_per_replica: 0.5
    target_kv_cache_usage: 0.75
  limits:
    max_queued_requests: 10
    rate_limit_per_key: {requests_per_second: 5}
    max_concurrent_streams: 16
    max_in_flight_per_replica: 8
`
	var rendered string
	for _, src := range []string{requestRate, llm} {
		task, err := Parse("svc.yaml", []byte(src), Overrides{})
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		out, err := task.ResolvedYAML()
		if err != nil {
			t.Fatal(err)
		}
		assertRoundTrip(t, task, out)
		rendered += string(out)
	}
	for _, key := range slices.Concat(policyKeys, limitsKeys, rateLimitKeys) {
		if !strings.Contains(rendered, " "+key+":") {
			t.Errorf("ResolvedYAML never writes %s:\n%s", key, rendered)
		}
	}
}

func TestCredentialEnv(t *testing.T) {
	for name, want := range map[string]bool{
		"HF_TOKEN": true, "hf_token": true, "HUGGING_FACE_HUB_TOKEN": true, "AWS_SECRET_ACCESS_KEY": true,
		"AWS_SESSION_TOKEN": true, "OPENAI_API_KEY": true, "WANDB_API_KEY": true, "DB_PASSWORD": true,
		"PGPASSWORD": true, "MYSQL_ROOT_PASSWD": true, "CLIENT_SECRET": true, "SECRET": true,
		"GITHUB_PAT": true, "GOOGLE_APPLICATION_CREDENTIALS": true, "SSH_PRIVATE_KEY_PEM": true,
		"TOKEN": true, "API_KEY": true, "ANTHROPIC_APIKEY": true,
		"MODEL": false, "MAX_TOKENS": false, "TOKENIZER": false, "KEYS_DIR": false, "PORT": false,
		"AWS_ACCESS_KEY_ID": false, "HF_HOME": false, "MONKEY": false,
	} {
		if got := CredentialEnv(name); got != want {
			t.Errorf("CredentialEnv(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestRedactedHidesCredentialEnvs: an env named like a credential is shown nowhere (Redacted,
// hence serve status --json and the job API, and ResolvedYAML, hence --dry-run), also where
// `$NAME` substitution copied it, while the task keeps it for the replica.
func TestRedactedHidesCredentialEnvs(t *testing.T) {
	const src = `name: chat
run: serve
envs:
  MODEL: m
  HF_TOKEN: hf_env_token_31337
  AWS_SECRET_ACCESS_KEY: aws/secret+key/0042
  DB_PASSWORD: hunter2-pw
  CACHE_KEY: "1"
file_mounts:
  /data: https://example.com/d?token=$HF_TOKEN
`
	task, err := Parse("chat.yaml", []byte(src), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	red := task.Redacted()
	want := map[string]string{"MODEL": "m", "HF_TOKEN": RedactedValue, "AWS_SECRET_ACCESS_KEY": RedactedValue,
		"DB_PASSWORD": RedactedValue, "CACHE_KEY": RedactedValue}
	if diff := cmp.Diff(want, red.Envs); diff != "" {
		t.Errorf("redacted envs (-want +got):\n%s", diff)
	}
	shown, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	dump := cmp.Diff(nil, red) + string(shown)
	for _, v := range []string{"hf_env_token_31337", "aws/secret+key/0042", "hunter2-pw"} {
		if strings.Contains(dump, v) {
			t.Errorf("the redacted task or resolved YAML shows %q:\n%s", v, shown)
		}
	}
	if task.Envs["HF_TOKEN"] != "hf_env_token_31337" || !strings.Contains(task.FileMounts["/data"], "hf_env_token_31337") {
		t.Errorf("Redacted changed the task the replica gets: %v %v", task.Envs, task.FileMounts)
	}
	wantNames := []string{"AWS_SECRET_ACCESS_KEY", "CACHE_KEY", "DB_PASSWORD", "HF_TOKEN"}
	if diff := cmp.Diff(wantNames, task.SecretEnvNames()); diff != "" {
		t.Errorf("SecretEnvNames (-want +got):\n%s", diff)
	}
}
