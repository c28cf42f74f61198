package replicasim

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/spf13/pflag"
)

func TestDefaultPortFromEnvironment(t *testing.T) {
	t.Setenv("FERRY_HOST", "127.0.0.7")
	if got := DefaultConfig().Host; got != "127.0.0.7" {
		t.Errorf("host with FERRY_HOST=127.0.0.7: %q", got)
	}
	t.Setenv("FERRY_PORT", "9123")
	if got := DefaultConfig().Port; got != 9123 {
		t.Errorf("port with FERRY_PORT=9123: %d", got)
	}
	t.Setenv("FERRY_PORT", "not-a-port")
	if got := DefaultConfig().Port; got != 8000 {
		t.Errorf("port with a bad FERRY_PORT: %d, want 8000", got)
	}
}

func TestRegisterFlags(t *testing.T) {
	cfg := DefaultConfig()
	fs := pflag.NewFlagSet("replica-sim", pflag.ContinueOnError)
	cfg.RegisterFlags(fs)
	err := fs.Parse([]string{
		"--host=0.0.0.0", "--port=9000", "--engine=tgi", "--model=m", "--max-num-seqs=4", "--max-waiting=2",
		"--ttft=1s", "--prefill-per-token=1ms", "--itl=20ms", "--itl-per-seq=2ms", "--max-tokens=10",
		"--kv-blocks=100", "--startup-delay=3s", "--error-rate=0.1", "--hang-rate=0.2", "--exit-after=5", "--seed=7",
		"--slow-rate=0.3", "--slow-delay=2s", "--flap-period=4s", "--faults-file=/run/faults", "--signals=basic",
		"--kv-events=tcp://router:5557", "--kv-events-topic=kv@10.0.0.1:8000@m", "--kv-events-encoding=array",
		"--enable-lora", "--lora-modules=sql=/a/sql,chat=/a/chat", "--lora-modules=x=/a/x", "--max-loras=4",
		"--max-cpu-loras=8", "--lora-load-time=300ms", "--lora-activate-time=5ms", "--runtime-lora",
		"--kv-transfer", "--kv-transfer-per-token=3us", "--prefill-interference=0.5",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Host: "0.0.0.0", Port: 9000, Engine: EngineTGI, Model: "m", MaxNumSeqs: 4, MaxWaiting: 2,
		TTFT: time.Second, PrefillPerToken: time.Millisecond, ITL: 20 * time.Millisecond, ITLPerSeq: 2 * time.Millisecond,
		MaxTokens: 10, KVCacheBlocks: 100, StartupDelay: 3 * time.Second, ErrorRate: 0.1, HangRate: 0.2, ExitAfter: 5, Seed: 7,
		SlowRate: 0.3, SlowDelay: 2 * time.Second, FlapPeriod: 4 * time.Second, FaultsFile: "/run/faults", Signals: SignalsBasic,
		KVEvents: "tcp://router:5557", KVEventsTopic: "kv@10.0.0.1:8000@m", KVEventsEncoding: KVEventsArray,
		EnableLoRA: true, LoRAModules: []string{"sql=/a/sql", "chat=/a/chat", "x=/a/x"}, MaxLoRAs: 4, MaxCPULoRAs: 8,
		LoRALoadTime: 300 * time.Millisecond, LoRAActivateTime: 5 * time.Millisecond, RuntimeLoRA: true,
		KVTransfer: true, KVTransferPerToken: 3 * time.Microsecond, PrefillInterference: 0.5,
	}
	if diff := cmp.Diff(want, cfg, cmpopts.IgnoreFields(Config{}, "ExitFunc", "OnListen")); diff != "" {
		t.Errorf("parsed config (-want +got):\n%s", diff)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestValidateCollectsEveryError(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Port, cfg.Engine, cfg.Model, cfg.MaxNumSeqs, cfg.MaxWaiting = 70000, "sglang", "", 0, -1
	cfg.TTFT, cfg.MaxTokens, cfg.KVCacheBlocks = -time.Second, 0, 0
	cfg.ErrorRate, cfg.HangRate, cfg.ExitAfter = 0.7, 0.6, -1
	cfg.SlowDelay, cfg.FlapPeriod = -time.Second, -time.Second
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted a bad config")
	}
	for _, flag := range []string{"--port", "--engine", "--model", "--max-num-seqs", "--max-waiting", "--ttft", "--max-tokens", "--kv-blocks", "--hang-rate", "--exit-after", "--slow-delay", "--flap-period"} {
		if !strings.Contains(err.Error(), flag+"=") {
			t.Errorf("error lacks %s: %v", flag, err)
		}
	}
}

func TestNewServerRepairsZeroConfig(t *testing.T) {
	_, base := startServer(t, Config{ErrorRate: 5})
	r := mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	if r.status != 500 { // ErrorRate clamped to 1
		t.Fatalf("status %d, want 500", r.status)
	}
}
