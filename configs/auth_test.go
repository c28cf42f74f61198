package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	keyA = "sk-ferry-aaaaaaaaaaaaaaaa"
	keyB = "sk-ferry-bbbbbbbbbbbbbbbb"
)

// writeTask writes a task file and, when keys is not empty, a keys.txt beside it.
func writeTask(t *testing.T, yaml, keys string) string {
	t.Helper()
	dir := t.TempDir()
	if keys != "" {
		if err := os.WriteFile(filepath.Join(dir, "keys.txt"), []byte(keys), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "svc.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadResolvesAPIKeys(t *testing.T) {
	const head = "run: serve\nservice:\n  ports: 8080\n  auth:\n"
	tests := map[string]struct {
		yaml    string
		keys    string
		env     map[string]string
		ov      Overrides
		want    []string
		wantErr []wantErr
	}{
		"from the environment": {
			yaml: head + "    keys_from_env: FERRY_KEY\n",
			env:  map[string]string{"FERRY_KEY": keyA},
			want: []string{HashAPIKey(keyA)},
		},
		"from a secret given on the command line": {
			yaml: "run: serve\nsecrets:\n  FERRY_KEY: null\nservice:\n  ports: 8080\n  auth:\n    keys_from_env: [FERRY_KEY]\n",
			ov:   Overrides{Secrets: map[string]string{"FERRY_KEY": keyB}},
			want: []string{HashAPIKey(keyB)},
		},
		"file relative to the task, comments and duplicates skipped": {
			yaml: head + "    keys_file: keys.txt\n    keys_from_env: [FERRY_KEY]\n",
			keys: "# team keys\n" + keyA + "\n\n  " + keyB + "  \n",
			env:  map[string]string{"FERRY_KEY": keyA},
			want: []string{HashAPIKey(keyA), HashAPIKey(keyB)},
		},
		"unset variable": {
			yaml:    head + "    keys_from_env: [FERRY_KEY, OTHER]\n",
			env:     map[string]string{"FERRY_KEY": keyA},
			wantErr: []wantErr{{5, 32, "service.auth.keys_from_env[1]", "environment variable OTHER is not set"}},
		},
		"short key": {
			yaml:    head + "    keys_from_env: FERRY_KEY\n",
			env:     map[string]string{"FERRY_KEY": "hunter2"},
			wantErr: []wantErr{{5, 20, "service.auth.keys_from_env", "is 7 characters; API keys must be at least 16"}},
		},
		"missing file": {
			yaml:    head + "    keys_file: nope.txt\n",
			wantErr: []wantErr{{5, 16, "service.auth.keys_file", "cannot read the keys file"}},
		},
		"empty file": {
			yaml:    head + "    keys_file: keys.txt\n",
			keys:    "# nothing yet\n",
			wantErr: []wantErr{{5, 16, "service.auth.keys_file", "holds no keys"}},
		},
		"managed keys only": {
			yaml: head + "    managed_keys: true\n",
			want: nil,
		},
		"managed_keys not a boolean": {
			yaml:    head + "    managed_keys: sometimes\n",
			wantErr: []wantErr{{5, 19, "service.auth.managed_keys", "boolean"}},
		},
		"neither source": {
			yaml:    head + "    {}\n",
			wantErr: []wantErr{{5, 5, "service.auth", "give keys_from_env"}},
		},
		"key in the task's envs": {
			yaml:    "run: serve\nenvs:\n  FERRY_KEY: " + keyA + "\nservice:\n  ports: 8080\n  auth:\n    keys_from_env: [FERRY_KEY]\n",
			wantErr: []wantErr{{7, 21, "service.auth.keys_from_env[0]", "FERRY_KEY is one of the task's envs"}},
		},
		"key given with --env": {
			yaml:    head + "    keys_from_env: [FERRY_KEY]\n",
			ov:      Overrides{Envs: map[string]string{"FERRY_KEY": keyA}},
			wantErr: []wantErr{{5, 21, "service.auth.keys_from_env[0]", "FERRY_KEY is one of the task's envs"}},
		},
		"key in the envs and the environment": {
			yaml:    "run: serve\nenvs:\n  FERRY_KEY: " + keyA + "\nservice:\n  ports: 8080\n  auth:\n    keys_from_env: [FERRY_KEY]\n",
			env:     map[string]string{"FERRY_KEY": keyB},
			wantErr: []wantErr{{7, 21, "service.auth.keys_from_env[0]", "FERRY_KEY is one of the task's envs"}},
		},
		"bad variable name": {
			yaml:    head + "    keys_from_env: [\"MY-KEY\"]\n",
			wantErr: []wantErr{{5, 21, "service.auth.keys_from_env[0]", "not an environment variable name"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			path := writeTask(t, tc.yaml, tc.keys)
			task, err := Load(path, tc.ov)
			if tc.wantErr != nil {
				if diff := cmp.Diff(tc.wantErr, project(Errors(err), tc.wantErr)); diff != "" {
					t.Fatalf("errors mismatch (-want +got):\n%s\nfull error: %v", diff, err)
				}
				for _, secret := range []string{keyA, keyB, "hunter2"} {
					if err != nil && strings.Contains(err.Error(), secret) {
						t.Errorf("error shows a key: %v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Service.Auth.KeyHashes); diff != "" {
				t.Errorf("key hashes (-want +got):\n%s", diff)
			}
			// Nothing that displays the task carries a key or its hash.
			shown, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			for _, secret := range []string{keyA, keyB, HashAPIKey(keyA), HashAPIKey(keyB)} {
				if strings.Contains(string(shown), secret) {
					t.Errorf("resolved YAML shows %q:\n%s", secret, shown)
				}
			}
			if task.Redacted().Service.Auth.KeyHashes != nil {
				t.Errorf("Redacted keeps key hashes")
			}
		})
	}
}

// TestParseRefusesKeyInEnvs: the controller, which parses without the user's environment,
// refuses a key named in the envs too.
func TestParseRefusesKeyInEnvs(t *testing.T) {
	_, err := Parse("svc.yaml", []byte("run: serve\nenvs:\n  K: "+keyA+"\nservice:\n  ports: 8080\n  auth:\n    keys_from_env: K\n"), Overrides{})
	want := []wantErr{{7, 20, "service.auth.keys_from_env", "K is one of the task's envs"}}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull: %v", diff, err)
	}
	if err != nil && strings.Contains(err.Error(), keyA) {
		t.Errorf("error shows the key: %v", err)
	}
}

// TestParseKeepsAuthDeclaration: the controller parses without the user's environment, so it
// keeps what was declared and resolves nothing.
func TestParseKeepsAuthDeclaration(t *testing.T) {
	task, err := Parse("svc.yaml", []byte("run: serve\nservice:\n  ports: 8080\n  auth:\n    keys_from_env: [K]\n    keys_file: /etc/ferry/keys\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Auth{KeysFromEnv: []string{"K"}, KeysFile: "/etc/ferry/keys"}
	if diff := cmp.Diff(want, task.Service.Auth); diff != "" {
		t.Errorf("auth (-want +got):\n%s", diff)
	}
}

func TestLimits(t *testing.T) {
	const head = "run: serve\nservice:\n  ports: 8080\n  limits:\n"
	task, err := Parse("svc.yaml", []byte(head+"    max_request_body_mb: 64\n    max_concurrent_requests: 500\n    idle_timeout_seconds: 600\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&Limits{MaxRequestBodyMB: 64, MaxConcurrentRequests: 500, IdleTimeoutSeconds: 600}, task.Service.Limits); diff != "" {
		t.Errorf("limits (-want +got):\n%s", diff)
	}
	_, err = Parse("svc.yaml", []byte(head+"    max_request_body_mb: 4096\n    max_concurrent_requests: 0\n    idle_timeout: 5\n"), Overrides{})
	want := []wantErr{
		{5, 26, "service.limits.max_request_body_mb", "at most 1024"},
		{6, 30, "service.limits.max_concurrent_requests", "at least 1"},
		{7, 5, "service.limits.idle_timeout", "unknown field"},
	}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\nfull: %v", diff, err)
	}
}

func TestLimitsQueue(t *testing.T) {
	const head = "run: serve\nservice:\n  ports: 8080\n  limits:\n"
	tests := map[string]struct {
		limits  string // limits' lines, from line 5
		want    *Limits
		wantErr []wantErr
	}{
		"queue bounds":            {limits: "    max_queued_requests: 50\n    max_queue_wait_seconds: 3600\n", want: &Limits{MaxQueuedRequests: 50, MaxQueueWaitSeconds: 3600}},
		"holding off":             {limits: "    max_queued_requests: -1\n", want: &Limits{MaxQueuedRequests: -1}},
		"zeros keep the defaults": {limits: "    max_queued_requests: 0\n    max_queue_wait_seconds: 0\n", want: &Limits{}},
		"below -1 and negative wait": {
			limits: "    max_queued_requests: -2\n    max_queue_wait_seconds: -1\n",
			wantErr: []wantErr{
				{5, 26, "service.limits.max_queued_requests", "must be at least -1, got -2"},
				{6, 29, "service.limits.max_queue_wait_seconds", "must be at least 0, got -1"},
			},
		},
		"wait above an hour": {
			limits: "    max_queue_wait_seconds: 3601\n    max_queued: 3\n",
			wantErr: []wantErr{
				{5, 29, "service.limits.max_queue_wait_seconds", "at most 3600, got 3601"},
				{6, 5, "service.limits.max_queued", `did you mean "max_queued_requests"?`},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("svc.yaml", []byte(head+tc.limits), Overrides{})
			if tc.wantErr != nil {
				if diff := cmp.Diff(tc.wantErr, project(Errors(err), tc.wantErr)); diff != "" {
					t.Errorf("errors (-want +got):\n%s\nfull: %v", diff, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Service.Limits); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, task, out)
		})
	}
}

func TestLimitsRateAndStreams(t *testing.T) {
	const head = "run: serve\nservice:\n  ports: 8080\n  limits:\n"
	tests := map[string]struct {
		limits  string // limits' lines, from line 5
		want    *Limits
		wantErr []wantErr
	}{
		"rate and burst": {
			limits: "    rate_limit_per_key: {requests_per_second: 2.5, burst: 10}\n    max_concurrent_streams: 8\n",
			want:   &Limits{RateLimitPerKey: &RateLimit{RequestsPerSecond: 2.5, Burst: 10}, MaxConcurrentStreams: 8},
		},
		"burst defaults to one second's worth": {
			limits: "    rate_limit_per_key:\n      requests_per_second: 2.5\n",
			want:   &Limits{RateLimitPerKey: &RateLimit{RequestsPerSecond: 2.5, Burst: 3}},
		},
		"slow rates get a burst of one": {
			limits: "    rate_limit_per_key: {requests_per_second: 0.01}\n",
			want:   &Limits{RateLimitPerKey: &RateLimit{RequestsPerSecond: 0.01, Burst: 1}},
		},
		"streams within the request cap": {
			limits: "    max_concurrent_requests: 10\n    max_concurrent_streams: 10\n",
			want:   &Limits{MaxConcurrentRequests: 10, MaxConcurrentStreams: 10},
		},
		"rate missing, burst zero": {
			limits: "    rate_limit_per_key:\n      burst: 0\n",
			wantErr: []wantErr{
				{5, 5, "service.limits.rate_limit_per_key.requests_per_second", "required"},
				{6, 14, "service.limits.rate_limit_per_key.burst", "must be at least 1, got 0"},
			},
		},
		"rate zero, no streams, a typo": {
			limits: "    rate_limit_per_key: {requests_per_second: 0}\n" +
				"    max_concurrent_streams: 0\n" +
				"    rate_limit_per_k: 1\n",
			wantErr: []wantErr{
				{5, 47, "service.limits.rate_limit_per_key.requests_per_second", "must be greater than 0"},
				{6, 29, "service.limits.max_concurrent_streams", "must be at least 1, got 0"},
				{7, 5, "service.limits.rate_limit_per_k", `did you mean "rate_limit_per_key"?`},
			},
		},
		"too slow": {
			limits:  "    rate_limit_per_key: {requests_per_second: 0.0001}\n",
			wantErr: []wantErr{{5, 47, "service.limits.rate_limit_per_key.requests_per_second", "must be at least 0.001"}},
		},
		"too fast and a typo": {
			limits: "    rate_limit_per_key: {requests_per_second: 2e6, brust: 3}\n",
			wantErr: []wantErr{
				{5, 47, "service.limits.rate_limit_per_key.requests_per_second", "must be at most 1e+06"},
				{5, 52, "service.limits.rate_limit_per_key.brust", `did you mean "burst"?`},
			},
		},
		"not a mapping": {
			limits:  "    rate_limit_per_key: 10\n",
			wantErr: []wantErr{{5, 25, "service.limits.rate_limit_per_key", "expected a mapping"}},
		},
		"in flight per replica": {
			limits: "    max_in_flight_per_replica: 16\n",
			want:   &Limits{MaxInFlightPerReplica: 16},
		},
		"in flight per replica off": {
			limits: "    max_in_flight_per_replica: -1\n",
			want:   &Limits{MaxInFlightPerReplica: -1},
		},
		"in flight per replica below off": {
			limits:  "    max_in_flight_per_replica: -2\n",
			wantErr: []wantErr{{5, 32, "service.limits.max_in_flight_per_replica", "must be at least -1, got -2"}},
		},
		"streams above the request cap": {
			limits:  "    max_concurrent_requests: 4\n    max_concurrent_streams: 5\n",
			wantErr: []wantErr{{6, 29, "service.limits.max_concurrent_streams", "must be at most max_concurrent_requests (4)"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("svc.yaml", []byte(head+tc.limits), Overrides{})
			if tc.wantErr != nil {
				if diff := cmp.Diff(tc.wantErr, project(Errors(err), tc.wantErr)); diff != "" {
					t.Errorf("errors (-want +got):\n%s\nfull: %v", diff, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Service.Limits); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, task, out)
			if r := task.Redacted().Service.Limits.RateLimitPerKey; r != nil {
				r.Burst = -1
				if task.Service.Limits.RateLimitPerKey.Burst == -1 {
					t.Error("Redacted shares the rate limit with the task")
				}
			}
		})
	}
}
