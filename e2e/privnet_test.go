package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher/privnet"
)

// privnetYAML is a keyed service whose run waits for its own server on localhost, as a run's
// `curl localhost:8000` loop or SGLang's warm-up does, before it says it is up.
const privnetYAML = `name: private
run: |
  ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b &
  for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/$FERRY_PORT) 2>/dev/null && break; sleep 0.1; done
  echo "reached localhost:$FERRY_PORT after $i tries" > "$DUMP_DIR/warm"
  wait
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
  auth:
    keys_from_env: [CHAT_KEY]
`

// TestLocalReplicaOnlyFerryReaches: a local replica used to listen on loopback, where every
// user of the host got 200 from it past the service's API keys. Now its serving port is in
// Ferry's private network: the endpoint answers 200 with the key and 401 without, while a
// connect to the replica's address, from this process or from another user's, is refused; the
// replica's own wait loop on localhost still reaches it; and after the controller is killed,
// its successor adopts the replica and serves it again.
func TestLocalReplicaOnlyFerryReaches(t *testing.T) {
	const key = "sk-ferry-e2e-private-0123456789"
	e := newEnv(t)
	e.extraEnv = []string{"CHAT_KEY=" + key, "FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=off"}
	dump := t.TempDir()
	file := filepath.Join(t.TempDir(), "private.yaml")
	writeFile(t, file, privnetYAML)
	if out := e.mustRun("serve", "up", file, "-y", "--env", "DUMP_DIR="+dump); strings.Contains(out, "listens on loopback") {
		t.Errorf("serve up says a replica is on loopback:\n%s", out)
	}
	var st serviceStatus
	eventually(t, 90*time.Second, "1 READY replica", func() (bool, string) {
		var err error
		if st, err = e.status("private"); err != nil {
			return false, err.Error()
		}
		return len(st.ready()) == 1, fmt.Sprintf("%+v", st.Replicas)
	})
	ready := st.ready()
	for _, ep := range ready {
		if !privnet.Private(ep) {
			t.Fatalf("replica at %s, want an address in the private network %s", ep, privnet.Range)
		}
		if c, err := net.DialTimeout("tcp", ep, 2*time.Second); err == nil {
			c.Close()
			t.Errorf("a plain connect to the replica at %s succeeded", ep)
		}
		host, port, _ := net.SplitHostPort(ep)
		nobody := exec.Command("bash", "-c", "exec 3<>/dev/tcp/"+host+"/"+port+" && echo connected || echo refused")
		nobody.Dir = "/"
		nobody.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := nobody.CombinedOutput()
		if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "\nrefused") || !strings.Contains(string(out), "Connection refused") {
			t.Errorf("another user's connect to the replica at %s: %v\n%s", ep, err, out)
		}
		if m := successCount(t, e, ep); m != 0 {
			t.Errorf("replica served %d requests before any was sent", m)
		}
	}
	if warm := string(mustRead(t, filepath.Join(dump, "warm"))); !strings.HasPrefix(warm, "reached localhost:") {
		t.Errorf("the replica's wait loop: %q", warm)
	}
	keyed(t, st.Endpoint, key, http.StatusOK)
	keyed(t, st.Endpoint, "", http.StatusUnauthorized)

	ctrl := e.controllerPID()
	if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(ctrl), "alive" })
	eventually(t, 60*time.Second, "the same replica READY after restart", func() (bool, string) {
		after, err := e.status("private")
		if err != nil {
			return false, err.Error()
		}
		return fmt.Sprint(after.ready()) == fmt.Sprint(ready), fmt.Sprintf("%v, before %v", after.ready(), ready)
	})
	keyed(t, st.Endpoint, key, http.StatusOK)
}

// keyed sends a chat completion to endpoint with key (none if "") and fails unless it gets want.
func keyed(t *testing.T, endpoint, key string, want int) {
	t.Helper()
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	req, err := http.NewRequest(http.MethodPost, endpoint+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("chat completion (key %v): HTTP %d, want %d", key != "", resp.StatusCode, want)
	}
}

// replicaClient is an HTTP client that reaches e's local replicas, in the private network,
// through the helper of e's FERRY_HOME, as the controller does.
func replicaClient(e *env) *http.Client {
	c := privnet.NewClient(filepath.Join(e.home, "local", privnet.SocketName))
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return c.DialContext(ctx, addr)
		},
	}}
}

// replicaListening reports whether a local replica's address accepts connections: in the private
// network through e's helper (which must answer: a helper that is gone says nothing about the
// port), else on the host's loopback.
func replicaListening(t *testing.T, e *env, addr string) bool {
	t.Helper()
	if !privnet.Private(addr) {
		return listening(addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := privnet.NewClient(filepath.Join(e.home, "local", privnet.SocketName)).DialContext(ctx, addr)
	switch {
	case err == nil:
		c.Close()
		return true
	case errors.Is(err, syscall.ECONNREFUSED):
		return false
	}
	t.Fatalf("ask the private network whether %s listens: %v", addr, err)
	return false
}
