package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKVEventsThroughTheController runs a service the way a vLLM user would with KV-cache
// events: the controller binds the events endpoint ($FERRY_KV_EVENTS_ADDR), each replica's
// engine (replica-sim, speaking vLLM's wire format) publishes to it under a topic naming its
// own address, and the service's proxy asks the engines' /tokenize for each chat's token ids
// and routes by what the engines report. The controller's metrics must show both sides.
func TestKVEventsThroughTheController(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	eventsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	e.extraEnv = []string{"FERRY_KV_EVENTS_ADDR=tcp://" + eventsAddr, "FERRY_METRICS_ADDR=" + metricsAddr,
		"FERRY_GATEWAY_ADDR=off"}
	spec := filepath.Join(t.TempDir(), "chat.yaml")
	writeFile(t, spec, `name: chat
run: |
  ferry replica-sim --host $FERRY_HOST --port $FERRY_PORT --model acme/chat-8b \
    --kv-events tcp://`+eventsAddr+` --kv-events-topic "kv@$FERRY_HOST:$FERRY_PORT@acme/chat-8b"
service:
  readiness_probe: /health
  replicas: 2
  ports: 8080
`)
	e.mustRun("serve", "up", spec, "-y")
	ep := strings.TrimSpace(e.mustRun("serve", "status", "chat", "--endpoint"))

	client := &http.Client{Timeout: time.Minute}
	system := strings.Repeat("You answer questions about ferries, briefly. ", 60)
	metric := func(name, label string) float64 {
		resp, err := client.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		sum := 0.0
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, name) && strings.Contains(line, label) {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				sum += v
			}
		}
		return sum
	}
	// The engines' publishers connect in the background: requests sent before they have are
	// matched by bytes, as without events. Send conversations until both sides show.
	eventually(t, 90*time.Second, "events applied and requests tokenized", func() (bool, string) {
		for turn := range 8 {
			body := fmt.Sprintf(`{"model":"acme/chat-8b","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, system, turn)
			resp, err := client.Post(ep+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				return false, err.Error()
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("chat: %s", resp.Status)
			}
		}
		applied := metric("ferry_kv_event_batches_total", `result="applied"`)
		tokenized := metric("ferry_tokenize_duration_seconds_count", `result="ok"`)
		return applied > 0 && tokenized > 0, fmt.Sprintf("%v batches applied, %v requests tokenized", applied, tokenized)
	})
	if failed := metric("ferry_tokenize_duration_seconds_count", `result="failed"`); failed > 0 {
		t.Errorf("%v /tokenize round trips failed", failed)
	}
	if stored := metric("ferry_kv_event_blocks_total", `event="stored"`); stored < 10 {
		t.Errorf("only %v blocks stored", stored)
	}
}
