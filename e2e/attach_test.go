package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

const attachYAML = `name: attached
resources:
  infra: local
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 30
  replicas: 2
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

// TestAttachedProxySurvivesControllerRestart runs `ferry proxy --attach` in front of a local
// service: requests through it keep succeeding while the controller is SIGKILLed and restarted
// on a new API address, and afterwards the proxy follows the restarted controller's replica
// set (a killed replica's replacement gets traffic).
func TestAttachedProxySurvivesControllerRestart(t *testing.T) {
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "attached.yaml")
	writeFile(t, file, attachYAML)
	if out := e.mustRun("serve", "up", file, "-y"); !strings.Contains(out, "2/2 READY") {
		t.Fatalf("serve up:\n%s", out)
	}
	st, err := e.status("attached")
	if err != nil {
		t.Fatal(err)
	}
	oldIDs := st.ready()

	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	proxyLog := e.startProxyProcess(t, "proxy", "--attach", "attached", "--listen", listen, "--metrics-listen", metrics)
	endpoint := "http://" + listen
	client := &http.Client{Timeout: 30 * time.Second}
	eventually(t, 20*time.Second, "the attached proxy serves", func() (bool, string) {
		if err := completion(client, endpoint); err != nil {
			return false, err.Error()
		}
		return true, ""
	})

	// Load from two clients for the whole controller outage.
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := completion(client, endpoint); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	ctrl := e.controllerPID()
	if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(ctrl), "alive" })
	// Requests while no controller runs: at least 100 more, bounded in time.
	down := ok.Load()
	eventually(t, 60*time.Second, "100 requests served with the controller down", func() (bool, string) {
		return ok.Load()-down >= 100, fmt.Sprintf("%d served, %d failed", ok.Load()-down, failed.Load())
	})
	if failed.Load() > 0 {
		t.Fatalf("%d requests failed with the controller down; first: %v", failed.Load(), firstErr.Load())
	}

	// Any CLI command restarts the controller, on a new API address.
	eventually(t, 60*time.Second, "service READY after the controller restart", func() (bool, string) {
		st, err := e.status("attached")
		if err != nil {
			return false, err.Error()
		}
		return len(st.ready()) == 2, fmt.Sprintf("%+v", st)
	})
	if e.controllerPID() == ctrl {
		t.Fatal("controller pid unchanged")
	}
	after := ok.Load()
	eventually(t, 30*time.Second, "traffic after the restart", func() (bool, string) {
		return ok.Load()-after >= 20, fmt.Sprintf("%d served", ok.Load()-after)
	})
	stopLoad()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed across the controller restart; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	t.Logf("%d requests served across the controller restart, none failed", ok.Load())

	// The restarted controller's changes reach the proxy: a killed replica is replaced and
	// its replacement serves traffic through the attached proxy.
	pids := e.replicaPIDs()
	if len(pids) != 2 {
		t.Fatalf("want 2 replica processes, got %v", pids)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		break
	}
	newID := 0
	eventually(t, 90*time.Second, "a replacement replica READY", func() (bool, string) {
		st, err := e.status("attached")
		if err != nil {
			return false, err.Error()
		}
		ready := st.ready()
		for id := range ready {
			if _, old := oldIDs[id]; !old {
				newID = id
			}
		}
		return len(ready) == 2 && newID != 0, fmt.Sprintf("%+v", st.Replicas)
	})
	served := regexp.MustCompile(`ferry_requests_total\{code="200",replica="` + strconv.Itoa(newID) + `",service="attached"\} [1-9]`)
	eventually(t, 30*time.Second, "the replacement serving through the attached proxy", func() (bool, string) {
		for range 4 {
			_ = completion(client, endpoint)
		}
		body, err := get(client, "http://"+metrics+"/metrics")
		if err != nil {
			return false, err.Error()
		}
		return served.MatchString(body), grepLines(body, "ferry_requests_total")
	})

	b, err := os.ReadFile(proxyLog)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"load report rejected", "\terror\t"} {
		if strings.Contains(string(b), bad) {
			t.Errorf("the attached proxy logged %q:\n%s", bad, grepLines(string(b), bad))
		}
	}
	if n := strings.Count(string(b), "connected to the controller"); n != 2 {
		t.Errorf("the attached proxy connected %d times, want 2 (start, restart):\n%s", n, grepLines(string(b), "controller"))
	}

	e.mustRun("serve", "down", "attached", "-y")
}

// completion sends one small chat completion and checks it succeeded.
func completion(client *http.Client, endpoint string) error {
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"chat.completion"`) {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return nil
}

func get(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return string(raw), err
}

// startProxyProcess runs ferry with the env's FERRY_HOME until the test ends, then stops it with
// SIGTERM (SIGKILL after 20 s) and shows its output if the test failed. It returns the file
// the process logs to.
func (e *env) startProxyProcess(t *testing.T, args ...string) string {
	t.Helper()
	c := e.cmd(args...)
	out, err := os.CreateTemp(t.TempDir(), "proxy-*.log")
	if err != nil {
		t.Fatal(err)
	}
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	t.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = c.Process.Kill()
			<-done
			t.Errorf("ferry %s did not stop on SIGTERM", strings.Join(args, " "))
		}
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("ferry %s:\n%s", strings.Join(args, " "), lastLines(string(b), 60))
		}
	})
	return out.Name()
}
