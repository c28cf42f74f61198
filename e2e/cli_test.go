package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBadYAMLThroughCLI checks that the CLI prints each validation error as
// file:line:col: field: message, exits non-zero, launches nothing and never panics.
func TestBadYAMLThroughCLI(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		yaml string
		want string // a line of the output, as a regexp after "FILE:"
	}{
		"wrong type":                {"run: x\nservice:\n  ports: 8080\n  replicas: two\n", `4:13: service\.replicas: expected an integer`},
		"unknown key":               {"run: x\nservice:\n  ports: 8080\n  readiness_prob: /\n", `4:3: service\.readiness_prob: unknown field .*did you mean "readiness_probe"`},
		"min greater than max":      {"run: x\nservice:\n  ports: 8080\n  replica_policy:\n    min_replicas: 3\n    max_replicas: 1\n", `6:19: service\.replica_policy\.max_replicas: must be at least min_replicas`},
		"bad probe path":            {"run: x\nservice:\n  ports: 8080\n  readiness_probe: health\n", `4:20: service\.readiness_probe: must start with "/"`},
		"spot field without spot":   {"run: x\nservice:\n  ports: 8080\n  replica_policy:\n    min_replicas: 1\n    base_ondemand_fallback_replicas: 1\n", `6:38: service\.replica_policy\.base_ondemand_fallback_replicas: spot-only field without use_spot`},
		"replicas and policy":       {"run: x\nservice:\n  ports: 8080\n  replicas: 2\n  replica_policy:\n    min_replicas: 1\n", `5:3: service\.replica_policy: replicas and replica_policy are exclusive`},
		"bad accelerator":           {"run: x\nresources:\n  accelerators: A100:1:2\nservice:\n  ports: 8080\n", `3:17: resources\.accelerators: bad accelerator string`},
		"empty run":                 {"run: \"\"\nservice:\n  ports: 8080\n", `1:6: run: required`},
		"syntax error":              {"run: x\nservice:\n  ports: [8080\n", `\d+(:\d+)?: .*`},
		"infra this build can't do": {"run: x\nresources:\n  infra: aws\nservice:\n  ports: 8080\n", ``},
	}
	dir := t.TempDir()
	e := &env{t: t, home: filepath.Join(dir, "home")}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".yaml")
			if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			out, errOut, err := e.run("serve", "up", file, "-y")
			if err == nil {
				t.Fatalf("serve up of bad YAML succeeded:\n%s", out)
			}
			if strings.Contains(errOut, "panic") || strings.Contains(out, "Launching service") {
				t.Fatalf("panicked or launched:\nstdout:\n%s\nstderr:\n%s", out, errOut)
			}
			if tc.want == "" {
				if !strings.Contains(errOut, "no place to run this task") || !strings.Contains(errOut, "aws is not enabled") {
					t.Fatalf("want a clear 'aws is not enabled' error, got:\n%s", errOut)
				}
				return
			}
			re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(file) + `:` + tc.want)
			if !re.MatchString(errOut) {
				t.Fatalf("stderr lacks %q:\n%s", re, errOut)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(e.home, "controller.json")); err == nil {
		t.Errorf("a controller was started for invalid input")
	}
}

// TestSecretsNeverShown launches a service with a secret and checks every output a user or an
// operator reads: serve up, status (table and JSON), the controller log and the replica log.
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const secret = "hf_SuperSecretValue_1234567890"
	yaml := `name: secretive
envs:
  MODEL: ferry-sim-1b
secrets:
  HF_TOKEN: null
run: ferry replica-sim --port $FERRY_PORT --model $MODEL
service:
  readiness_probe:
    path: /health
    headers:
      Authorization: Bearer ` + secret + `
  replicas: 1
  ports: 8080
`
	file := filepath.Join(t.TempDir(), "secretive.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	show := func(args ...string) string {
		t.Helper()
		out, errOut, err := e.run(args...)
		if err != nil {
			t.Fatalf("ferry %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
		}
		seen.WriteString(out)
		seen.WriteString(errOut) // progress and warnings go to stderr: they must not show it either
		return out
	}
	show("serve", "up", file, "--secret", "HF_TOKEN="+secret, "-y")
	show("serve", "status")
	show("serve", "status", "-v")
	show("serve", "status", "--json")
	show("serve", "logs", "secretive", "1")
	// A new version with another secret value: serve update prints the new spec and follows
	// the rollout.
	const secret2 = "hf_AnotherSecretValue_0987654321"
	show("serve", "update", "secretive", file, "--secret", "HF_TOKEN="+secret2, "-y")
	show("serve", "status", "-v", "secretive")
	show("serve", "logs", "secretive", "--controller")
	ctlLog, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	seen.Write(ctlLog)
	for _, s := range []string{secret, secret2} {
		if strings.Contains(seen.String(), s) {
			t.Fatalf("the secret value %s reached user-visible output or the controller log:\n%s", s, seen.String())
		}
	}
	if !strings.Contains(seen.String(), "<redacted>") {
		t.Errorf("expected the secret to be shown as <redacted> in the resolved spec")
	}
	// The replica did get it: the secret is for the program, not for eyes.
	for _, f := range mustGlob(t, filepath.Join(e.home, "local", "*", "run.sh")) {
		b, _ := os.ReadFile(f)
		if strings.Contains(string(b), secret) {
			t.Errorf("%s holds the secret on disk", f)
		}
	}
	assertOwnerOnly(t, e.home)
}

// assertOwnerOnly checks that everything under a FERRY_HOME is its owner's alone: directories
// 0700, files (the store and its journal, the token, logs, replica scripts and output) and
// sockets 0600. The store holds secrets, the token grants control of the controller, and
// replica output may hold whatever the program printed.
func assertOwnerOnly(t *testing.T, dir string) {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if mode.Perm() != 0o700 {
				t.Errorf("%s/ is mode %o, want 700", rel, mode.Perm())
			}
		case mode&os.ModeSymlink != 0:
			t.Errorf("%s is a symlink", rel)
		default:
			files = append(files, rel)
			if mode.Perm() != 0o600 {
				t.Errorf("%s is %v, want -rw-------", rel, mode)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk saw what matters: the store, the token and a replica's output.
	for _, want := range []string{"ferry.db", "controller.token", "controller.log"} {
		if !slices.Contains(files, want) {
			t.Errorf("no %s under FERRY_HOME: %v", want, files)
		}
	}
	if !slices.ContainsFunc(files, func(f string) bool { return strings.HasSuffix(f, "output.log") }) {
		t.Errorf("no replica output.log under FERRY_HOME: %v", files)
	}
}

// TestControllerAPIRequiresToken: the controller listens on its Unix socket alone, 0600, and
// refuses a request there without its token.
func TestControllerAPIRequiresToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustRun("serve", "status")
	b, err := os.ReadFile(filepath.Join(e.home, "controller.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Socket string `json:"socket"`
		Addr   string `json:"addr"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	if info.Socket != filepath.Join(e.home, "controller.sock") || info.Addr != "" {
		t.Fatalf("controller.json: socket %q, addr %q; want the home's socket and no TCP address", info.Socket, info.Addr)
	}
	fi, err := os.Stat(info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s is %v, want a socket, srw-------", info.Socket, fi.Mode())
	}
	client := unixClient(info.Socket)
	for _, auth := range []string{"", "Bearer wrong"} {
		req, _ := http.NewRequest("GET", "http://ferry/v1/services", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization %q: HTTP %d, want 401", auth, resp.StatusCode)
		}
	}
}

// unixClient sends every request to the Unix socket at path.
func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// TestStandaloneProxy fronts two replica-sim processes with `ferry proxy` and no controller.
func TestStandaloneProxy(t *testing.T) {
	t.Parallel()
	var replicaURLs []string
	for range 2 {
		port := freePort(t)
		startProcess(t, "replica-sim", "--port", strconv.Itoa(port), "--model", "ferry-sim-1b")
		replicaURLs = append(replicaURLs, fmt.Sprintf("http://127.0.0.1:%d", port))
	}
	// The replicas first: a replica that refuses the proxy's first health check is out of
	// rotation until the next one, half a second later, and round robin would skip it.
	waitUp := func(u string) {
		eventually(t, 20*time.Second, u+" up", func() (bool, string) {
			return listening(strings.TrimPrefix(u, "http://")), "not listening"
		})
	}
	for _, u := range replicaURLs {
		waitUp(u)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args := []string{"proxy", "--listen", listen, "--policy", "round_robin"}
	for _, u := range replicaURLs {
		args = append(args, "--replica", u)
	}
	startProcess(t, args...)
	waitUp("http://" + listen)
	endpoint := "http://" + listen
	for range 4 {
		resp, err := http.Post(endpoint+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"ferry-sim-1b","prompt":"hi","max_tokens":3}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"text_completion"`) {
			t.Fatalf("HTTP %d: %s", resp.StatusCode, body)
		}
	}
	// Both replicas served: round robin over two replicas for four requests.
	for _, u := range replicaURLs {
		resp, err := http.Get(u + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !regexp.MustCompile(`vllm:request_success_total\{[^}]*\} 2`).Match(b) {
			t.Errorf("%s did not serve 2 requests:\n%s", u, grepLines(string(b), "request_success"))
		}
	}
	chatStream(t, endpoint)
}

func startProcess(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := exec.CommandContext(ctx, ferryBin, args...)
	out, err := os.CreateTemp(t.TempDir(), "proc-*.log")
	if err != nil {
		t.Fatal(err)
	}
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = c.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("ferry %s:\n%s", strings.Join(args, " "), lastLines(string(b), 30))
		}
	})
}

func grepLines(s, sub string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}

func mustGlob(t *testing.T, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
