package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fixedPortYAML is SkyPilot's serving shape: the run names its port itself rather than taking
// $FERRY_PORT, and binds the replica's own address.
const fixedPortYAML = `name: fixed
resources:
  infra: local
  ports: %d
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 30
  replicas: 2
  load_balancing_policy: round_robin
run: ferry replica-sim --host $FERRY_HOST --port %d --model ferry-sim-1b
`

// TestLocalReplicasOnFixedPort: two local replicas of a service whose run listens on a fixed
// port both become READY, each on a loopback address of its own with that port, the proxy
// reaches each (counted by each replica's own /metrics), and a restarted controller adopts them
// at the same addresses.
func TestLocalReplicasOnFixedPort(t *testing.T) {
	port := freeTCPPort(t)
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "fixed.yaml")
	writeFile(t, file, fmt.Sprintf(fixedPortYAML, port, port))
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
		n := successCount(t, ep)
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
}

// freeTCPPort is a port nothing listens on, on any address, right now.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// successCount reads vllm:request_success_total from a replica-sim's /metrics.
func successCount(t *testing.T, endpoint string) int {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + endpoint + "/metrics")
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
