package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pdYAML is a disaggregated service on local replica-sim replicas: the service's own replicas
// decode (llm autoscaler, 4 sequences each), a prefill pool scales on the prompt tokens it holds
// (4,000 per replica). A 4,000-token prompt takes 0.85 s to prefill, an output token 20 ms.
const pdYAML = `name: pd
resources:
  infra: local
service:
  readiness_probe: /health
  ports: 8080
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    autoscaler: llm
    target_inflight_per_replica: 4
    stable_window_seconds: 8
    panic_window_seconds: 2
    num_overprovision: 0
  pools:
    prefill:
      replica_policy: {min_replicas: 1, max_replicas: 3, stable_window_seconds: 8, panic_window_seconds: 2, num_overprovision: 0}
      target_queued_prompt_tokens: 4000
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b --kv-transfer --prefill-per-token 200us --itl 20ms --max-num-seqs 4
`

type pdStatus struct {
	TargetReplicas int `json:"target_replicas"`
	ReadyReplicas  int `json:"ready_replicas"`
	Prefill        *struct {
		TargetReplicas int    `json:"target_replicas"`
		ReadyReplicas  int    `json:"ready_replicas"`
		Scaling        string `json:"scaling"`
		Replicas       []struct {
			ID       int    `json:"id"`
			Status   string `json:"status"`
			Endpoint string `json:"endpoint"`
		} `json:"replicas"`
	} `json:"prefill"`
}

// TestDisaggregatedPoolsScaleApart serves a prefill/decode service and shifts its mix: long
// prompts with short answers grow the prefill pool and leave the decode pool alone; short
// prompts with long answers grow the decode pool while the prefill pool shrinks back. No request
// fails on the way, and the prefill replicas did the prefills.
func TestDisaggregatedPoolsScaleApart(t *testing.T) {
	// Not parallel: it restarts its controller, whose service must get its endpoint port back
	// (e2e_test.go, "Which tests run in parallel").
	e := newEnv(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	const metricsToken = "ferry-e2e-metrics-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "metrics.token")
	writeFile(t, tokenFile, metricsToken+"\n")
	e.extraEnv = []string{"FERRY_GATEWAY_ADDR=off", "FERRY_METRICS_ADDR=" + metricsAddr, "FERRY_METRICS_TOKEN_FILE=" + tokenFile}
	file := filepath.Join(t.TempDir(), "pd.yaml")
	writeFile(t, file, pdYAML)
	e.mustRun("serve", "up", file, "-y")
	endpoint := strings.TrimSpace(e.mustRun("serve", "status", "pd", "--endpoint"))
	status := func() (pdStatus, string) {
		out, errOut, err := e.run("serve", "status", "pd", "--json")
		var list []pdStatus
		if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Prefill == nil {
			return pdStatus{}, fmt.Sprintf("status: %v %s %s", err, errOut, out)
		}
		st := list[0]
		return st, fmt.Sprintf("decode %d/%d, prefill %d/%d (%s)", st.ReadyReplicas, st.TargetReplicas,
			st.Prefill.ReadyReplicas, st.Prefill.TargetReplicas, st.Prefill.Scaling)
	}
	eventually(t, 30*time.Second, "both pools READY", func() (bool, string) {
		st, s := status()
		return st.ReadyReplicas >= 1 && st.Prefill != nil && st.Prefill.ReadyReplicas >= 1, s
	})
	if table := e.mustRun("serve", "status", "-v"); !strings.Contains(table, "pd: prefill pool") || !strings.Contains(table, "pd/prefill") {
		t.Errorf("serve status -v does not show the prefill pool and its replicas:\n%s", table)
	}

	var ld streamLoad
	// Long prompts, short answers: 6 clients hold about 24,000 prompt tokens in prefill, six
	// replicas' worth, and under one decode replica's in-flight target.
	long := strings.Repeat("word ", 3200)
	stopLong := make(chan struct{})
	endLong := sync.OnceFunc(func() { close(stopLong) })
	defer endLong()
	chatLoad(&ld, endpoint, 6, long, 4, stopLong)
	eventually(t, 40*time.Second, "the prefill pool grows under long prompts", func() (bool, string) {
		st, s := status()
		if st.TargetReplicas > 1 {
			t.Fatalf("the decode pool grew under long prompts with short answers: %s", s)
		}
		return st.Prefill != nil && st.Prefill.TargetReplicas >= 2, s
	})
	_, s := status()
	t.Logf("long prompts: %s", s)
	endLong()
	ld.wait(t, "with long prompts")

	// Short prompts, long answers: 16 clients decoding 100 tokens each.
	stopShort := make(chan struct{})
	endShort := sync.OnceFunc(func() { close(stopShort) })
	defer endShort()
	chatLoad(&ld, endpoint, 16, "hi", 100, stopShort)
	eventually(t, 60*time.Second, "the decode pool grows and the prefill pool shrinks under long answers", func() (bool, string) {
		st, s := status()
		return st.TargetReplicas >= 2 && st.Prefill != nil && st.Prefill.TargetReplicas == 1, s
	})
	_, s = status()
	t.Logf("long answers: %s", s)
	endShort()
	ld.wait(t, "with long answers")
	// Every completion went through a prefill step on the pool once it had a replica.
	metrics := scrapeMetrics(t, "http://"+metricsAddr+"/metrics", metricsToken)
	ok := sumSeries(metrics, "ferry_prefill_duration_seconds_count", `result="ok"`, `service="pd"`)
	failed := sumSeries(metrics, "ferry_prefill_duration_seconds_count", `result="failed"`, `service="pd"`)
	if sent := float64(ld.sent.Load()); ok < 0.9*sent || failed > 0 {
		t.Fatalf("%v prefill steps ok and %v failed for %v requests:\n%s", ok, failed, sent, grepLines(metrics, "ferry_prefill"))
	}

	// An update of the service section rolls both pools without relaunching them.
	pidsBefore := e.replicaPIDs()
	e.mustRun("serve", "update", "pd", writeVersion2(t, file), "-y")
	eventually(t, 60*time.Second, "the update to version 2 succeeds", func() (bool, string) {
		st, err := e.status("pd")
		return err == nil && st.Version == 2 && st.Update != nil && st.Update.State == "SUCCEEDED", fmt.Sprintf("%+v %v", st.Update, err)
	})
	// The load has ended, so the decode pool may shrink meanwhile: no replica may be new.
	for id, pid := range e.replicaPIDs() {
		if pidsBefore[id] != pid {
			t.Fatalf("an update of the service section launched replica %s (pid %d): before %v", id, pid, pidsBefore)
		}
	}

	// A restarted controller adopts both pools as they are, and prefills on the pool again. First
	// the pools settle at their minimum, so that no replica is leaving across the restart.
	eventually(t, 90*time.Second, "both pools back at one replica each", func() (bool, string) {
		st, s := status()
		return st.TargetReplicas == 1 && st.ReadyReplicas == 1 && st.Prefill != nil && st.Prefill.TargetReplicas == 1 &&
			st.Prefill.ReadyReplicas == 1 && len(e.replicaPIDs()) == 2, s
	})
	st, _ := status()
	pids := e.replicaPIDs()
	ctrl := e.controllerPID()
	if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(ctrl), "alive" })
	eventually(t, 60*time.Second, "both pools READY again after the restart", func() (bool, string) {
		again, s := status()
		return again.Prefill != nil && again.ReadyReplicas == st.ReadyReplicas && again.Prefill.ReadyReplicas == st.Prefill.ReadyReplicas, s
	})
	if after := e.replicaPIDs(); fmt.Sprint(after) != fmt.Sprint(pids) {
		t.Fatalf("replicas not adopted as the same processes: before %v, after %v", pids, after)
	}
	// The adopted pool reaches the proxy once its replica passes a probe of the new controller:
	// until then requests are prefilled on the decode side, and none may fail meanwhile.
	eventually(t, 30*time.Second, "a prefill step on the adopted pool", func() (bool, string) {
		if err := postStream(&http.Client{Timeout: time.Minute}, endpoint, `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"after the restart"}],"max_tokens":3,"stream":true}`); err != nil {
			t.Fatal(err)
		}
		metrics := scrapeMetrics(t, "http://"+metricsAddr+"/metrics", metricsToken)
		return sumSeries(metrics, "ferry_prefill_duration_seconds_count", `result="ok"`, `service="pd"`) >= 1, grepLines(metrics, "ferry_prefill")
	})
	e.mustRun("serve", "down", "pd", "-y")
	if left := e.replicaPIDs(); len(left) != 0 {
		t.Fatalf("replicas left after serve down: %v", left)
	}
}

// chatLoad sends chat completions of prompt (made unique per request, so that no prefix
// cache makes its prefill short) and answers of tokens tokens, streamed.
func chatLoad(l *streamLoad, endpoint string, n int, prompt string, tokens int, stop <-chan struct{}) {
	client := &http.Client{Timeout: time.Minute}
	l.startFunc(n, stop, func(i, j int) error {
		body := fmt.Sprintf(`{"model":"ferry-sim-1b","messages":[{"role":"user","content":"%d %d %s"}],"max_tokens":%d,"stream":true}`, i, j, prompt, tokens)
		return postStream(client, endpoint, body)
	})
}

func postStream(client *http.Client, endpoint, body string) error {
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "data: [DONE]") {
		return fmt.Errorf("%d %.300s", resp.StatusCode, b)
	}
	return nil
}

// scrapeMetrics reads the controller's /metrics with its bearer token.
func scrapeMetrics(t *testing.T, url, token string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// writeVersion2 writes the service with a new prefill token target: only service: changes.
func writeVersion2(t *testing.T, file string) string {
	t.Helper()
	v2 := filepath.Join(filepath.Dir(file), "pd-v2.yaml")
	writeFile(t, v2, strings.Replace(pdYAML, "target_queued_prompt_tokens: 4000", "target_queued_prompt_tokens: 3000", 1))
	return v2
}
