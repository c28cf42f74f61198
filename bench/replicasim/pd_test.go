package replicasim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The NixlConnector flow: the prefill side answers one token and the params, the decode side
// takes them and generates the rest without computing the prompt; without the params the
// decode side refuses, and a replica without --kv-transfer ignores them.
func TestKVTransferFlow(t *testing.T) {
	cfg := fastConfig()
	cfg.KVTransfer = true
	cfg.PrefillPerToken = time.Millisecond // a 400-token prompt: 0.4 s to prefill, 0.8 ms to pull
	cfg.KVTransferPerToken = 2 * time.Microsecond
	_, prefill := startServer(t, cfg)
	_, decode := startServer(t, cfg)
	prompt := strings.Repeat("tell me about ferries ", 80)
	body := func(extra string) string {
		return `{"model":"ferry-sim","max_tokens":6,"messages":[{"role":"user","content":"` + prompt + `"}]` + extra + `}`
	}
	r := mustPost(t, prefill+"/v1/chat/completions", body(`,"kv_transfer_params":{"do_remote_decode":true},"max_tokens":1,"stream":false`))
	var answer struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(r.body, &answer); err != nil || r.status != 200 {
		t.Fatalf("prefill: %d %s (%v)", r.status, r.body, err)
	}
	if answer.Usage.CompletionTokens != 1 || !strings.Contains(string(answer.Params), `"do_remote_prefill":true`) ||
		!strings.Contains(string(answer.Params), `"remote_engine_id":"replicasim-`) {
		t.Fatalf("prefill answer: %s", r.body)
	}
	start := time.Now()
	r = mustPost(t, decode+"/v1/chat/completions", body(`,"kv_transfer_params":`+string(answer.Params)))
	if took := time.Since(start); r.status != 200 || !strings.Contains(string(r.body), `"completion_tokens":6`) || took > 300*time.Millisecond {
		t.Fatalf("decode: %d in %v: %s", r.status, took, r.body)
	}
	if r := mustPost(t, decode+"/v1/chat/completions", body(`,"kv_transfer_params":{"do_remote_prefill":true}`)); r.status != 400 {
		t.Fatalf("decode without an engine to pull from: %d %s", r.status, r.body)
	}
	plain := fastConfig()
	_, combined := startServer(t, plain)
	if r := mustPost(t, combined+"/v1/chat/completions", body(`,"kv_transfer_params":{"do_remote_decode":true}`)); r.status != 200 ||
		strings.Contains(string(r.body), "kv_transfer_params") || !strings.Contains(string(r.body), `"completion_tokens":6`) {
		t.Fatalf("a replica without --kv-transfer: %d %s", r.status, r.body)
	}
}

// A prompt prefilled beside decoding sequences slows their steps, by PrefillInterference of
// the chunk's prefill time.
func TestPrefillInterferenceSlowsDecode(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillPerToken, cfg.PrefillInterference, cfg.ITL = 10*time.Microsecond, 0.5, time.Millisecond
	s := NewServer(cfg)
	if got := s.itl(); got != time.Millisecond {
		t.Fatalf("idle itl %v", got)
	}
	s.prefilling.Add(5000) // beyond a chunk: one chunk's worth counts
	if got, want := s.itl(), time.Millisecond+time.Duration(0.5*2048*10)*time.Microsecond; got != want {
		t.Fatalf("itl while prefilling %v, want %v", got, want)
	}
}
