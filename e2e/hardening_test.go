package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/testhttp"
	"github.com/ferryserve/ferry/launcher/privnet"
)

// Attacks a local user without the controller token, or a client of a service, could mount on
// the controller and on local replicas, each reproduced against the real binary on loopback.

// startController runs `ferry controller ARGS` for e's home in the background, with at most
// nofile open files unless it is 0 (soft and hard, so the Go runtime cannot raise it), and
// waits until the CLI reaches it.
func (e *env) startController(t *testing.T, nofile int, args ...string) {
	t.Helper()
	logPath := filepath.Join(e.home, "controller.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	script := `exec "$0" "$@"`
	if nofile > 0 {
		script = fmt.Sprintf(`ulimit -Sn %d && ulimit -Hn %d && exec "$0" "$@"`, nofile, nofile)
	}
	c := exec.Command("bash", append([]string{"-c", script, ferryBin, "controller", "--log-file", logPath}, args...)...)
	c.Env = append(e.cmd().Env, "FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=off")
	c.Stdout, c.Stderr = logf, logf
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = c.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = c.Process.Kill()
			<-exited
		}
	})
	eventually(t, 20*time.Second, "controller answers", func() (bool, string) {
		out, errOut, err := e.run("controller", "status")
		return err == nil && strings.Contains(out, "Controller: running"), out + errOut
	})
}

// TestControllerAPIOutlastsIdleConnections: a local user without the token opens 240
// connections to the controller's TCP API and leaves them idle, half of them after one request
// that got 401. The controller runs with 256 open files, a common limit (macOS's default, many
// containers'): before the API capped and timed out unauthenticated connections they took every
// descriptor, and authorised calls, the CLI's included, waited for as long as the attacker
// pleased. Now each authorised call answers within a second.
func TestControllerAPIOutlastsIdleConnections(t *testing.T) {
	e := newEnv(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.startController(t, 256, "--listen", addr)
	tokenBytes, err := os.ReadFile(filepath.Join(e.home, "controller.token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenBytes))

	// A fresh connection for every authorised call: a kept-alive one would dodge the attack.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	authorised := func() (time.Duration, error) {
		start := time.Now()
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/services", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return time.Since(start), err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return time.Since(start), fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return time.Since(start), nil
	}
	// A service running, as on any machine that uses Ferry: its endpoint, replica logs and
	// connections hold descriptors too.
	e.mustRun("serve", "up", filepath.Join(repoRoot(), "configs/examples/quickstart.yaml"), "-y")
	if _, err := authorised(); err != nil {
		t.Fatalf("authorised call before the attack: %v", err)
	}

	const idle = 240
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	// The whole attack gets 5 s, whatever the controller does with the connections.
	attackDeadline := time.Now().Add(5 * time.Second)
	for i := range idle {
		c, err := net.DialTimeout("tcp", addr, time.Until(attackDeadline))
		if err != nil {
			break // refused: the attacker holds fewer
		}
		conns = append(conns, c)
		if i%2 == 1 {
			continue // connected, never says a word
		}
		_ = c.SetDeadline(attackDeadline)
		if _, err := io.WriteString(c, "GET /v1/services HTTP/1.1\r\nHost: ferry\r\n\r\n"); err == nil {
			_, _ = c.Read(make([]byte, 4096)) // the 401, then idle
		}
		_ = c.SetDeadline(time.Time{})
	}
	t.Logf("attacker holds %d connections", len(conns))

	for round := range 3 {
		took, err := authorised()
		if err != nil || took > time.Second {
			t.Errorf("round %d: authorised API call under %d idle connections: %v after %v, want an answer within 1s", round, len(conns), err, took)
		}
		start := time.Now()
		out, errOut, err := e.run("serve", "status")
		if took := time.Since(start); err != nil || took > time.Second {
			t.Errorf("round %d: ferry serve status under %d idle connections: %v after %v, want an answer within 1s\n%s%s", round, len(conns), err, took, out, errOut)
		}
	}
}

// TestControllerAPIOffLoopbackNeedsTLS: asked to serve the API on every interface without TLS,
// the controller refuses to start (it used to serve plain HTTP there, the token in every
// request readable on the network). With a certificate it serves HTTPS there, pinned by clients
// through the home's controller.crt, and plain HTTP gets no answer from the API.
func TestControllerAPIOffLoopbackNeedsTLS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	port := freePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := e.cmd("controller", "--listen", fmt.Sprintf("0.0.0.0:%d", port))
	c.Env = append(c.Env, "FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=off")
	var out strings.Builder
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { <-ctx.Done(); _ = c.Process.Kill() }()
	err := c.Wait()
	if ctx.Err() != nil || err == nil || !strings.Contains(out.String(), "TLS") {
		t.Fatalf("controller on 0.0.0.0 without TLS: %v (still running after 20s: %v); want it refused for want of TLS\n%s", err, ctx.Err() != nil, out.String())
	}

	certFile, keyFile := testhttp.WriteSelfSigned(t, t.TempDir())
	e.startController(t, 0, "--listen", fmt.Sprintf("0.0.0.0:%d", port), "--api-tls-cert", certFile, "--api-tls-key", keyFile)
	token, err := os.ReadFile(filepath.Join(e.home, "controller.token"))
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := os.ReadFile(filepath.Join(e.home, "controller.crt"))
	if err != nil {
		t.Fatalf("the controller published no certificate: %v", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pinned) {
		t.Fatalf("controller.crt holds no certificate:\n%s", pinned)
	}
	get := func(client *http.Client, url string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	https := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	if code, err := get(https, fmt.Sprintf("https://127.0.0.1:%d/v1/services", port)); err != nil || code != http.StatusOK {
		t.Fatalf("HTTPS with the published certificate: HTTP %d, %v", code, err)
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if code, err := get(plain, fmt.Sprintf("http://127.0.0.1:%d/v1/services", port)); err == nil && code == http.StatusOK {
		t.Fatal("plain HTTP to the controller's TLS address was served")
	}
	e.mustRun("serve", "status") // the CLI, on the socket
}

// TestAttachedProxyElsewhereHoldsOnlyTheAttachToken: an attached proxy on "another machine",
// whose FERRY_HOME holds only what an attached proxy needs (controller.json, proxy.token and
// controller.crt), follows the service over the controller's HTTPS address and serves it. Its
// token, all that breaking into the proxy yields, is refused when it tries to create a service
// (whose `run` would execute anything on the controller's machines), list services or read
// the controller's log.
func TestAttachedProxyElsewhereHoldsOnlyTheAttachToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	certFile, keyFile := testhttp.WriteSelfSigned(t, t.TempDir())
	e.startController(t, 0, "--listen", apiAddr, "--api-tls-cert", certFile, "--api-tls-key", keyFile)
	file := filepath.Join(t.TempDir(), "attached.yaml")
	writeFile(t, file, attachYAML)
	e.mustRun("serve", "up", file, "-y")

	// The other machine's home: controller.json without the socket it cannot reach, and the
	// two files an operator copies.
	remote := &env{t: t, home: t.TempDir()}
	var info map[string]any
	raw, err := os.ReadFile(filepath.Join(e.home, "controller.json"))
	if err == nil {
		err = json.Unmarshal(raw, &info)
	}
	if err != nil {
		t.Fatal(err)
	}
	delete(info, "socket")
	raw, _ = json.Marshal(info)
	writeFile(t, filepath.Join(remote.home, "controller.json"), string(raw))
	for _, name := range []string{"proxy.token", "controller.crt"} {
		b, err := os.ReadFile(filepath.Join(e.home, name))
		if err != nil {
			t.Fatalf("the controller's home has no %s: %v", name, err)
		}
		writeFile(t, filepath.Join(remote.home, name), string(b))
	}
	// The local replicas listen in the controller's private network, which only a proxy of its
	// FERRY_HOME reaches (another machine could not reach a local replica at all): the stand-in
	// for another machine is lent the network's socket, nothing else of the home.
	if err := os.Mkdir(filepath.Join(remote.home, "local"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(e.home, "local", privnet.SocketName), filepath.Join(remote.home, "local", privnet.SocketName)); err != nil {
		t.Fatal(err)
	}

	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	proxyLog := remote.startProxyProcess(t, "proxy", "--attach", "attached", "--listen", listen)
	client := &http.Client{Timeout: 30 * time.Second}
	eventually(t, 30*time.Second, "the attached proxy serves", func() (bool, string) {
		if err := completion(client, "http://"+listen); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if b, _ := os.ReadFile(proxyLog); !strings.Contains(string(b), "https://"+apiAddr) {
		t.Errorf("the proxy did not follow the controller at https://%s:\n%s", apiAddr, grepLines(string(b), "controller"))
	}

	token, err := os.ReadFile(filepath.Join(remote.home, "proxy.token"))
	if err != nil {
		t.Fatal(err)
	}
	pinned := x509.NewCertPool()
	pinned.AppendCertsFromPEM(mustRead(t, filepath.Join(remote.home, "controller.crt")))
	api := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pinned}}}
	for _, call := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/services", `{"name":"evil","task":{"run":"touch /tmp/ferry-e2e-evil","service":{"port":8080}}}`},
		{http.MethodGet, "/v1/services", ""},
		{http.MethodGet, "/v1/controller/logs", ""},
	} {
		req, _ := http.NewRequest(call.method, "https://"+apiAddr+call.path, strings.NewReader(call.body))
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := api.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s %s with the attached proxy's token: HTTP %d, want 403", call.method, call.path, resp.StatusCode)
		}
	}
	if out := e.mustRun("serve", "status"); strings.Contains(out, "evil") {
		t.Errorf("a service was created with the attached proxy's token:\n%s", out)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCLIEnvironmentStaysOutOfReplicas: the documented way to give a service its API key is
// `CHAT_KEY=... ferry serve up` with keys_from_env: [CHAT_KEY]; a shell holds other secrets
// too. None of them may reach a local replica, of this service or any later one: not through
// the controller the CLI starts, which keeps only what it needs of the CLI's environment (its
// cloud credentials among them), nor from the controller's own environment.
func TestCLIEnvironmentStaysOutOfReplicas(t *testing.T) {
	t.Parallel()
	const key = "sk-ferry-e2e-chat-key-0123456789"
	e := newEnv(t)
	e.extraEnv = []string{"CHAT_KEY=" + key, "SHELL_SECRET=from-the-users-shell", "AWS_SECRET_ACCESS_KEY=ferry-e2e-cloud-secret",
		"FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=off"}
	dump := t.TempDir()
	file := filepath.Join(t.TempDir(), "envdump.yaml")
	writeFile(t, file, `name: envdump
envs:
  MODEL: ferry-sim-1b
run: env > "$DUMP_DIR/replica-$FERRY_REPLICA_ID.env"; exec ferry replica-sim --port $FERRY_PORT --model $MODEL
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
  auth:
    keys_from_env: [CHAT_KEY]
`)
	e.mustRun("serve", "up", file, "-y", "--env", "DUMP_DIR="+dump)
	replicaEnv := string(mustRead(t, filepath.Join(dump, "replica-1.env")))
	controllerEnv := strings.ReplaceAll(string(mustRead(t, fmt.Sprintf("/proc/%d/environ", e.controllerPID()))), "\x00", "\n")
	for _, name := range []string{"CHAT_KEY", "SHELL_SECRET", "AWS_SECRET_ACCESS_KEY", "FERRY_HOME"} {
		if strings.Contains(replicaEnv, "\n"+name+"=") || strings.HasPrefix(replicaEnv, name+"=") {
			t.Errorf("the replica's environment holds %s", name)
		}
	}
	for _, name := range []string{"CHAT_KEY", "SHELL_SECRET"} {
		if strings.Contains(controllerEnv, name+"=") {
			t.Errorf("the controller's environment holds %s", name)
		}
	}
	if !strings.Contains(controllerEnv, "AWS_SECRET_ACCESS_KEY=") {
		t.Errorf("the controller lost the cloud credentials it launches with")
	}
	for _, want := range []string{"MODEL=ferry-sim-1b", "FERRY_SERVICE=envdump", "FERRY_PORT="} {
		if !strings.Contains(replicaEnv, want) {
			t.Errorf("the replica's environment lacks %s:\n%s", want, replicaEnv)
		}
	}
}

// TestKeyInEnvsIsRefused: keys_from_env used to read a task's envs too, so a key written there
// (or given with --env) was printed by serve up --dry-run, stored as written and returned by
// serve status --json. Now serve up refuses it, pointing at the line, and shows the key
// nowhere; a key given as a secret or in the environment still works.
func TestKeyInEnvsIsRefused(t *testing.T) {
	t.Parallel()
	const key = "sk-ferry-e2e-key-in-envs-0123456789"
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "keyed.yaml")
	yaml := `name: keyed
envs:
  CHAT_KEY: ` + key + `
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
  auth:
    keys_from_env: [CHAT_KEY]
`
	writeFile(t, file, yaml)
	inCLI := filepath.Join(t.TempDir(), "keyed-cli.yaml")
	writeFile(t, inCLI, strings.Replace(yaml, "envs:\n  CHAT_KEY: "+key+"\n", "", 1))
	for _, args := range [][]string{
		{"serve", "up", file, "--dry-run"},
		{"serve", "up", file, "-y"},
		{"serve", "up", inCLI, "--dry-run", "--env", "CHAT_KEY=" + key},
	} {
		out, errOut, err := e.run(args...)
		if err == nil {
			t.Errorf("ferry %s: accepted a key among the envs", strings.Join(args, " "))
		}
		if strings.Contains(out+errOut, key) {
			t.Errorf("ferry %s shows the key:\n%s%s", strings.Join(args, " "), out, errOut)
		}
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(filepath.Dir(args[2])) + `/keyed(-cli)?\.yaml:(10|8):21: service\.auth\.keys_from_env\[0\]: CHAT_KEY is one of the task's envs`).MatchString(errOut) {
			t.Errorf("ferry %s: want a file:line error naming the rule, got:\n%s", strings.Join(args, " "), errOut)
		}
	}
	if _, err := os.Stat(filepath.Join(e.home, "controller.json")); err == nil {
		t.Error("a controller was started for a refused task")
	}
	e.extraEnv = []string{"CHAT_KEY=" + key}
	out := e.mustRun("serve", "up", inCLI, "-y")
	if strings.Contains(out, key) || strings.Contains(e.mustRun("serve", "status", "--json"), key) {
		t.Error("serve up or status shows the key given in the environment")
	}
}

// TestLocalReplicaWorksOutsideFerryHome: a local replica used to run in its instance directory
// under FERRY_HOME, two levels below controller.token and ferry.db, where a program that
// serves or writes its working directory, or follows a relative path it was handed, reached
// them. Now it works in a directory of its own outside FERRY_HOME, and none of the
// controller's state is in or above it.
func TestLocalReplicaWorksOutsideFerryHome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extraEnv = []string{"FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=off"}
	dump := t.TempDir()
	file := filepath.Join(t.TempDir(), "cwd.yaml")
	writeFile(t, file, `name: cwd
run: |
  pwd > "$DUMP_DIR/pwd"
  ls -a . .. ../.. > "$DUMP_DIR/around"
  exec ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
`)
	e.mustRun("serve", "up", file, "-y", "--env", "DUMP_DIR="+dump)
	cwd := strings.TrimSpace(string(mustRead(t, filepath.Join(dump, "pwd"))))
	if rel, err := filepath.Rel(e.home, cwd); err != nil || !strings.HasPrefix(rel, "..") {
		t.Errorf("the replica works in %s, inside FERRY_HOME %s", cwd, e.home)
	}
	around := string(mustRead(t, filepath.Join(dump, "around")))
	// Whole names (and SQLite's ferry.db-wal, -shm): the directories above are the host's
	// temporary directory, where another program's ferry.dbg is no finding.
	for _, entry := range strings.Split(around, "\n") {
		for _, name := range []string{"controller.token", "proxy.token", "ferry.db", "controller.sock"} {
			if entry == name || strings.HasPrefix(entry, name+"-") {
				t.Errorf("%s is in or above the replica's working directory %s:\n%s", entry, cwd, around)
			}
		}
	}
	e.mustRun("serve", "down", "cwd", "-y")
	if _, err := os.Stat(cwd); !os.IsNotExist(err) {
		t.Errorf("the replica's working directory outlived it: %v", err)
	}
}
