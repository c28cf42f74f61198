package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLoRAAdaptersThroughTheController serves one base model with adapters the two ways
// service.adapters allows: registered by every replica at start (the run command passes
// $FERRY_LORA_MODULES and $FERRY_MAX_LORAS to the engine, as to vLLM's --lora-modules and
// --max-loras), and loaded by the proxy on a replica at an adapter's first request there
// (vLLM's /v1/load_lora_adapter, which Ferry's VLLM_ALLOW_RUNTIME_LORA_UPDATING turns on).
// Every adapter answers under its own name, one nobody declared gets the engine's 404, and the
// endpoint lists the adapters beside the base model.
func TestLoRAAdaptersThroughTheController(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extraEnv = []string{"FERRY_GATEWAY_ADDR=off"}
	for _, load := range []string{"at_start", "on_demand"} {
		name := "lora-" + strings.ReplaceAll(load, "_", "-")
		spec := filepath.Join(t.TempDir(), name+".yaml")
		writeFile(t, spec, `name: `+name+`
run: ferry replica-sim --host $FERRY_HOST --port $FERRY_PORT --model acme/base-8b --lora-load-time 20ms
service:
  readiness_probe: /health
  replicas: 2
  ports: 8080
  adapters:
    load: `+load+`
    max_loras: 2
    modules:
      sql: /adapters/sql
      support: /adapters/support
      legal: /adapters/legal
`)
		e.mustRun("serve", "up", spec, "-y")
		ep := strings.TrimSpace(e.mustRun("serve", "status", name, "--endpoint"))
		client := &http.Client{Timeout: time.Minute}
		post := func(model string) (int, string) {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`, model)
			resp, err := client.Post(ep+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		for round := range 3 {
			for _, adapter := range []string{"sql", "support", "legal", "acme/base-8b"} {
				if code, body := post(adapter); code != http.StatusOK || !strings.Contains(body, `"model":"`+adapter+`"`) {
					t.Fatalf("%s round %d, %s: %d %s", load, round, adapter, code, body)
				}
			}
		}
		if code, body := post("nobody"); code != http.StatusNotFound {
			t.Fatalf("%s: an undeclared adapter: %d %s", load, code, body)
		}
		if load == "at_start" {
			resp, err := client.Get(ep + "/v1/models")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{`"id":"sql"`, `"id":"legal"`, `"parent":"acme/base-8b"`} {
				if !strings.Contains(string(b), want) {
					t.Errorf("/v1/models lacks %s: %s", want, b)
				}
			}
		}
	}
}
