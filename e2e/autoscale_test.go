package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// autoscaleYAML is a scale-to-zero service with short windows, so the whole cycle fits in a
// test: replicas take 2 s to start and hold at most 2 sequences each.
const autoscaleYAML = `name: elastic
resources:
  infra: local
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  replica_policy:
    min_replicas: 0
    max_replicas: 4
    autoscaler: concurrency
    target_inflight_per_replica: 2
    stable_window_seconds: 10
    panic_window_seconds: 2
    scale_to_zero_grace_seconds: 2
  limits:
    max_queue_wait_seconds: 90
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b --max-num-seqs 2 --startup-delay 2s --itl 20ms
`

// TestAutoscaleUpDownAndFromZero drives a local service through a burst, a quiet spell and a
// request at zero: replicas are added while the burst is on, drain and go when it ends (no
// request fails on the way), and at zero a request is held and served, not refused.
func TestAutoscaleUpDownAndFromZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "elastic.yaml")
	writeFile(t, file, autoscaleYAML)
	out := e.mustRun("serve", "up", file, "-y")
	if !strings.Contains(out, "1/1 READY") {
		t.Fatalf("serve up: a scale-to-zero service starts with one replica:\n%s", out)
	}
	endpoint := strings.TrimSpace(e.mustRun("serve", "status", "elastic", "--endpoint"))

	// Eight clients streaming ~1 s completions: 8 in flight against a target of 2 per replica
	// wants 4 replicas, four times the one READY — panic.
	var ld streamLoad
	stopBurst, stopTail := make(chan struct{}), make(chan struct{})
	endBurst := sync.OnceFunc(func() { close(stopBurst) })
	endTail := sync.OnceFunc(func() { close(stopTail) })
	defer func() { endBurst(); endTail() }() // on failure, end every client too
	loadStart := time.Now()
	ld.start(endpoint, 6, 50, stopBurst)
	ld.start(endpoint, 2, 50, stopTail)
	status := func() (serviceStatus, string) {
		st, err := e.status("elastic")
		if err != nil {
			return st, err.Error()
		}
		return st, fmt.Sprintf("target %d, replicas %+v", st.TargetReplicas, st.Replicas)
	}

	var scaledAfter time.Duration
	eventually(t, 20*time.Second, "the target grows under the burst", func() (bool, string) {
		st, state := status()
		scaledAfter = time.Since(loadStart)
		return st.TargetReplicas >= 3, state
	})
	t.Logf("target ≥ 3 replicas %v after the burst began", scaledAfter.Round(100*time.Millisecond))
	if table := e.mustRun("serve", "status", "-v"); !strings.Contains(table, "concurrency") || !strings.Contains(table, "elastic: target") {
		t.Errorf("serve status -v does not show the autoscaler and its reason:\n%s", table)
	}
	eventually(t, 60*time.Second, "the added replicas become READY", func() (bool, string) {
		st, state := status()
		return len(st.ready()) >= 3, state
	})

	// The burst ends; two clients keep streaming while replicas drain and go, so streams on
	// the replicas that leave must finish, not be cut.
	endBurst()
	eventually(t, 60*time.Second, "replicas leave after the burst", func() (bool, string) {
		st, state := status()
		return st.TargetReplicas <= 2 && len(st.Replicas) <= 2, state
	})
	endTail()
	ld.wait(t, "while scaling up and down")

	// Quiet: a stable window plus grace later the service is at zero, every replica gone.
	eventually(t, 60*time.Second, "the service scales to zero", func() (bool, string) {
		st, state := status()
		return st.TargetReplicas == 0 && len(st.Replicas) == 0 && len(e.replicaPIDs()) == 0, state
	})

	// At zero: the request waits for a cold start (2 s here) and is served.
	start := time.Now()
	if err := streamCompletion(endpoint, 5); err != nil {
		t.Fatalf("request at zero replicas: %v", err)
	}
	if waited := time.Since(start); waited < 2*time.Second {
		t.Fatalf("request at zero served in %v: faster than the replica's 2 s start-up, so it was not held", waited)
	} else {
		t.Logf("request at zero held and served in %v", waited.Round(100*time.Millisecond))
	}
}

// streamCompletion streams a chat completion of n tokens and checks it ends with [DONE].
// streamLoad is bounded client load for the scaling tests: goroutines that stream completions
// until told to stop, counting what they sent and what failed.
type streamLoad struct {
	sent, failed atomic.Int64
	firstErr     atomic.Value
	wg           sync.WaitGroup
}

// start adds n clients streaming completions of tokens tokens until stop closes (at most 500
// each, so a test that never closes stop still ends).
func (l *streamLoad) start(endpoint string, n, tokens int, stop <-chan struct{}) {
	l.startFunc(n, stop, func(int, int) error { return streamCompletion(endpoint, tokens) })
}

// startFunc adds n clients, each calling do(its number, the request's) until stop closes (at
// most 500 times each).
func (l *streamLoad) startFunc(n int, stop <-chan struct{}, do func(client, request int) error) {
	for i := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for j := range 500 {
				select {
				case <-stop:
					return
				default:
				}
				l.sent.Add(1)
				if err := do(i, j); err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
}

// wait waits for every client and fails the test if any request failed.
func (l *streamLoad) wait(t *testing.T, during string) {
	t.Helper()
	l.wg.Wait()
	if n := l.failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed %s; first: %v", n, l.sent.Load(), during, l.firstErr.Load())
	}
	t.Logf("%d streamed requests %s, none failed", l.sent.Load(), during)
}

func streamCompletion(endpoint string, n int) error {
	body := fmt.Sprintf(`{"model":"ferry-sim-1b","messages":[{"role":"user","content":"scale me"}],"max_tokens":%d,"stream":true}`, n)
	client := &http.Client{Timeout: 2 * time.Minute}
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	sc := bufio.NewScanner(resp.Body)
	last := ""
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			last = line
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if last != "[DONE]" {
		return fmt.Errorf("stream ended without [DONE] (last event %q)", last)
	}
	return nil
}
