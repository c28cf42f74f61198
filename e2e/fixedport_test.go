package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fixedPortYAML is SkyPilot's serving shape: the run names its port itself rather than taking
// $FERRY_PORT; it binds the address given (%[2]s).
const fixedPortYAML = `name: fixed
resources:
  infra: local
  ports: %[1]d
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 30
  replicas: 2
  load_balancing_policy: round_robin
run: ferry replica-sim --host %[2]s --port %[1]d --model ferry-sim-1b
`

// TestLocalReplicasOnFixedPort: two local replicas of a service whose run listens on a fixed
// port both become READY, each on a loopback address of its own with that port, the proxy
// reaches each (counted by each replica's own /metrics), and a restarted controller adopts them
// at the same addresses.
func TestLocalReplicasOnFixedPort(t *testing.T) {
	testFixedPort(t, "$FERRY_HOST")
}

// TestLocalReplicasOnFixedPortWildcard: the same with an unmodified run that binds the port on
// every address (0.0.0.0, as vLLM and `python -m http.server` do): the replica's supervisor
// moves each bind to the replica's own address, and `serve down` stops every process.
func TestLocalReplicasOnFixedPortWildcard(t *testing.T) {
	e, port := testFixedPort(t, "0.0.0.0")
	sims := processesWith("replica-sim", "--port "+strconv.Itoa(port))
	if len(sims) != 2 {
		t.Fatalf("%d replica-sim processes on port %d, want 2", len(sims), port)
	}
	e.mustRun("serve", "down", "fixed", "-y")
	eventually(t, 30*time.Second, "every replica process gone", func() (bool, string) {
		left := processesWith("replica-sim", "--port "+strconv.Itoa(port))
		return len(left) == 0, fmt.Sprint(left)
	})
}

// processesWith lists the pids whose command line holds every one of parts.
func processesWith(parts ...string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + en.Name() + "/cmdline")
		cmdline := strings.ReplaceAll(string(b), "\x00", " ")
		if err != nil || !alive(pid) {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(cmdline, p)
		}
		if all && !strings.Contains(cmdline, "local-supervise") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// testFixedPort serves fixedPortYAML with its run binding host and checks what
// TestLocalReplicasOnFixedPort says; it returns the environment and the port.
func testFixedPort(t *testing.T, host string) (*env, int) {
	t.Helper()
	port := freePort(t)
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "fixed.yaml")
	writeFile(t, file, fmt.Sprintf(fixedPortYAML, port, host))
	e.mustRun("serve", "up", file, "-y")

	var st serviceStatus
	eventually(t, 90*time.Second, "2 READY replicas", func() (bool, string) {
		var err error
		if st, err = e.status("fixed"); err != nil {
			return false, err.Error()
		}
		return len(st.ready()) == 2, fmt.Sprintf("%+v", st.Replicas)
	})
	ready := st.ready()
	hosts := map[string]bool{}
	for id, ep := range ready {
		host, p, err := net.SplitHostPort(ep)
		if err != nil || p != strconv.Itoa(port) || !strings.HasPrefix(host, "127.") {
			t.Fatalf("replica %d at %q: want its own loopback address on port %d", id, ep, port)
		}
		hosts[host] = true
	}
	if len(hosts) != 2 {
		t.Fatalf("replicas share an address: %v", ready)
	}

	const sent = 20
	for i := range sent {
		body := fmt.Sprintf(`{"model":"ferry-sim-1b","messages":[{"role":"user","content":"request %d"}],"max_tokens":2}`, i)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Post(st.Endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: HTTP %d", i, resp.StatusCode)
		}
	}
	total := 0
	for id, ep := range ready {
		n := successCount(t, e, ep)
		t.Logf("replica %d at %s served %d", id, ep, n)
		if n == 0 {
			t.Errorf("replica %d at %s served nothing of %d requests", id, ep, sent)
		}
		total += n
	}
	if total != sent {
		t.Errorf("replicas served %d requests, sent %d", total, sent)
	}

	// A SIGKILLed controller's successor adopts both at the same addresses.
	ctrl := e.controllerPID()
	if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(ctrl), "alive" })
	eventually(t, 60*time.Second, "the same 2 replicas READY after restart", func() (bool, string) {
		after, err := e.status("fixed")
		if err != nil {
			return false, err.Error()
		}
		return fmt.Sprint(after.ready()) == fmt.Sprint(ready), fmt.Sprintf("%v, before %v", after.ready(), ready)
	})
	chatPlain(t, st.Endpoint)
	return e, port
}

// successCount reads vllm:request_success_total from a replica-sim's /metrics, in e's private
// network (privnet_test.go).
func successCount(t *testing.T, e *env, endpoint string) int {
	t.Helper()
	resp, err := replicaClient(e).Get("http://" + endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "vllm:request_success_total") {
			f := strings.Fields(sc.Text())
			n, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", sc.Text(), err)
			}
			total += int(n)
		}
	}
	return total
}
