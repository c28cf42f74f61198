package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tests that need ferry as a process of its own re-execute this test binary with asFerryEnv
// set: it then runs the ferry command line in os.Args, under the descriptor limit in nofileEnv.
const (
	asFerryEnv = "FERRY_TEST_AS_FERRY"
	nofileEnv  = "FERRY_TEST_NOFILE"
)

func TestMain(m *testing.M) {
	if os.Getenv(asFerryEnv) == "1" {
		os.Exit(runAsFerry())
	}
	os.Exit(m.Run())
}

// runAsFerry lowers RLIMIT_NOFILE (soft and hard, so nothing can raise it again) and runs the
// command line as the ferry binary would.
func runAsFerry() int {
	if v := os.Getenv(nofileEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err == nil {
			err = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: n, Max: n})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ferry test: RLIMIT_NOFILE:", err)
			return 2
		}
	}
	root := newRootCmd()
	root.SetArgs(os.Args[1:])
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "ferry:", err)
		return 1
	}
	return 0
}

// TestProxySurvivesDescriptorFlood floods `ferry proxy --replica`, running with a limit of 256
// file descriptors, with 700 idle connections: more than it can hold. It used to exit on the
// first EMFILE from accept, cutting every stream; it must keep running, and serve keyed
// requests again once the flood is gone.
func TestProxySurvivesDescriptorFlood(t *testing.T) {
	const key = "sk-ferry-flood-0123456789"
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(replica.Close)
	tests := map[string][]string{
		// The default connection cap, half the descriptor limit, refuses the flood's excess.
		"default caps": nil,
		// A cap above the limit lets the flood reach EMFILE: accepting must wait and go on.
		"cap above the descriptor limit": {"--max-connections", "100000"},
	}
	for name, extra := range tests {
		t.Run(name, func(t *testing.T) {
			addr, logs, exited := startLimitedProxy(t, replica.Listener.Addr().String(), key, extra...)
			alive := func(when string) {
				t.Helper()
				select {
				case err := <-exited:
					exited <- err
					t.Fatalf("ferry proxy exited %s: %v\n%s", when, err, lastLines(logs.String(), 8))
				default:
				}
			}

			keyed := func() error { return keyedRequest("http://"+addr, key) }
			if err := pollFor(10*time.Second, keyed); err != nil {
				t.Fatalf("ferry proxy never served: %v\n%s", err, lastLines(logs.String(), 8))
			}
			flood := openIdle(t, addr, 700, 3*time.Second)
			time.Sleep(time.Second) // let it accept what it can
			alive("during the flood")
			for _, c := range flood {
				_ = c.Close()
			}
			if err := pollFor(10*time.Second, keyed); err != nil {
				alive("after the flood")
				t.Fatalf("keyed requests after the flood: %v\n%s", err, lastLines(logs.String(), 8))
			}
			alive("after the flood")
		})
	}
}

// startLimitedProxy starts `ferry proxy --replica replica` with a limit of 256 file
// descriptors, keyed by key, and extra flags. It returns its address, its output, and a
// channel that receives its exit (put back by whoever reads it).
func startLimitedProxy(t *testing.T, replica, key string, extra ...string) (string, *syncBuffer, chan error) {
	t.Helper()
	addr := freeAddr(t)
	args := append([]string{"proxy", "--listen", addr, "--replica", replica, "--api-key-env", "FERRY_LIMITED_KEY"}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asFerryEnv+"=1", nofileEnv+"=256", "FERRY_LIMITED_KEY="+key)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return addr, logs, exited
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// openIdle opens up to n connections to addr that send nothing, within d.
func openIdle(t *testing.T, addr string, n int, d time.Duration) []net.Conn {
	t.Helper()
	deadline := time.Now().Add(d)
	var conns []net.Conn
	for len(conns) < n && time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			continue // the backlog is full; the proxy is behind
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return conns
}

// keyedRequest sends one chat completion with key over a new connection.
func keyedRequest(base, key string) error {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}

// pollFor calls f every 50 ms until it succeeds or d has passed, and returns its last error.
func pollFor(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
