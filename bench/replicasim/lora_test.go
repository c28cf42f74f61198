package replicasim

import (
	"context"
	"strings"
	"testing"
	"time"
)

func loraConfig() Config {
	cfg := fastConfig()
	cfg.LoRAModules = []string{"sql=/adapters/sql", "chat=/adapters/chat"}
	cfg.MaxLoRAs = 1
	cfg.LoRALoadTime = time.Millisecond
	cfg.LoRAActivateTime = 0
	return cfg
}

func adapterBody(model string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"hello there"}],"max_tokens":4}`
}

// A request names an adapter as its model: the answer names it too, a name nobody registered
// is vLLM's 404, and the base model needs no adapter.
func TestLoRARequestsNameTheirAdapter(t *testing.T) {
	s, base := startServer(t, loraConfig())
	for _, model := range []string{"ferry-sim", "sql", "chat"} {
		r := mustPost(t, base+"/v1/chat/completions", adapterBody(model))
		if r.status != 200 || !strings.Contains(string(r.body), `"model":"`+model+`"`) {
			t.Fatalf("model %s: %d %s", model, r.status, r.body)
		}
	}
	if r := mustPost(t, base+"/v1/chat/completions", adapterBody("nope")); r.status != 404 {
		t.Fatalf("unknown adapter: %d %s", r.status, r.body)
	}
	if got := s.Loads(); got != 2 {
		t.Fatalf("loads = %d, want 2 (each adapter once)", got)
	}
	models := get(t, base+"/v1/models")
	for _, want := range []string{`"id":"sql"`, `"root":"/adapters/sql"`, `"parent":"ferry-sim"`, `"id":"ferry-sim"`} {
		if !strings.Contains(string(models.body), want) {
			t.Fatalf("/v1/models lacks %s: %s", want, models.body)
		}
	}
}

// With one GPU slot, a request for another adapter waits until the slot's requests have ended,
// and shows as waiting in vllm:lora_requests_info meanwhile.
func TestLoRAWaitsForAFreeSlot(t *testing.T) {
	cfg := loraConfig()
	cfg.ITL = 20 * time.Millisecond
	_, base := startServer(t, cfg)
	long := `{"model":"sql","messages":[{"role":"user","content":"x"}],"max_tokens":30}`
	firstDone := make(chan time.Time, 1)
	go func() {
		_, _ = post(t, context.Background(), base+"/v1/chat/completions", long)
		firstDone <- time.Now()
	}()
	waitFor(t, "sql running", func() bool {
		return strings.Contains(string(get(t, base+"/metrics").body), `running_lora_adapters="sql"`)
	})
	secondDone := make(chan time.Time, 1)
	go func() {
		_, _ = post(t, context.Background(), base+"/v1/chat/completions", adapterBody("chat"))
		secondDone <- time.Now()
	}()
	waitFor(t, "chat waiting", func() bool {
		return strings.Contains(string(get(t, base+"/metrics").body), `waiting_lora_adapters="chat"`)
	})
	first, second := <-firstDone, <-secondDone
	if second.Before(first) {
		t.Fatalf("the chat request ended %v before the sql one holding the only slot", first.Sub(second))
	}
	m := string(get(t, base+"/metrics").body)
	if !strings.Contains(m, `max_lora="1"`) {
		t.Fatalf("lora_requests_info lacks max_lora: %s", m)
	}
}

// The run-time endpoints are served only when allowed, with vLLM's answers.
func TestLoRARuntimeLoadAndUnload(t *testing.T) {
	_, off := startServer(t, loraConfig())
	if r := mustPost(t, off+"/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`); r.status != 404 {
		t.Fatalf("load without runtime updating: %d", r.status)
	}
	cfg := loraConfig()
	cfg.RuntimeLoRA = true
	s, base := startServer(t, cfg)
	steps := []struct {
		path, body string
		status     int
		says       string
	}{
		{"/v1/load_lora_adapter", `{"lora_name":"new"}`, 400, "must be provided"},
		{"/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/adapters/new"}`, 200, "added successfully"},
		{"/v1/load_lora_adapter", `{"lora_name":"new","lora_path":"/adapters/new"}`, 400, "already been loaded"},
		{"/v1/chat/completions", adapterBody("new"), 200, `"model":"new"`},
		{"/v1/unload_lora_adapter", `{"lora_name":"new"}`, 200, "removed successfully"},
		{"/v1/chat/completions", adapterBody("new"), 404, "does not exist"},
		{"/v1/unload_lora_adapter", `{"lora_name":"new"}`, 404, "cannot be found"},
	}
	for i, st := range steps {
		r := mustPost(t, base+st.path, st.body)
		if r.status != st.status || !strings.Contains(string(r.body), st.says) {
			t.Fatalf("step %d %s: %d %s, want %d with %q", i, st.path, r.status, r.body, st.status, st.says)
		}
	}
	if got := s.Loads(); got != 1 {
		t.Fatalf("loads = %d, want 1: the request after the load found it in CPU memory", got)
	}
}

func TestLoRAConfigErrors(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LoRAModules = []string{"a=/a", "a=/b", "ferry-sim=/c", "bad"}
	cfg.MaxLoRAs = 0
	err := cfg.Validate()
	for _, want := range []string{`--max-loras=0`, `"a=/b": the name "a" is taken`, `"ferry-sim=/c"`, `"bad": want name=path`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Validate() = %v, want it to contain %s", err, want)
		}
	}
}
