// Package replicasim is a stand-in for a vLLM replica: an OpenAI-compatible server whose latency,
// queueing, prefix cache and Prometheus metrics behave like vLLM's, without a GPU. Every Ferry
// test, demo and benchmark puts it behind the proxy, so it is deterministic for a given seed,
// cheap at a thousand concurrent requests, and can be told to fail in the ways real replicas do
// (slow start, errors, hangs, crashes).
package replicasim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Config is everything that shapes a simulated replica. The zero value is not useful; start from
// DefaultConfig so that unset knobs get vLLM-like defaults.
type Config struct {
	// Host and Port are where Run listens. They default to $FERRY_HOST and $FERRY_PORT so that
	// a launcher can start the simulator exactly like a real replica, by environment alone.
	Host string
	Port int

	// Engine is the inference server whose Prometheus series /metrics imitates: EngineVLLM
	// (vllm:*) or EngineTGI (Hugging Face TGI's tgi_*), so that what reads either, such as the
	// proxy's metric scraper, can be tested against a live replica. Only /metrics differs; the
	// OpenAI-compatible API and the simulated behaviour are the same.
	Engine string
	// Signals is how much the replica tells about its prefix cache: SignalsFull, vLLM's whole
	// set (vllm:cache_config_info, the prefix-cache counters and each answer's
	// usage.prompt_tokens_details.cached_tokens), or SignalsBasic, only the running and
	// waiting gauges and KV usage, as engines and simulators that expose less do. Routing must
	// hold up against both.
	Signals string

	// Model is the served model name: listed by /v1/models, echoed in responses, and the only
	// name completions accept (others get OpenAI's model_not_found 404, as vLLM does).
	Model string

	// MaxNumSeqs bounds the sequences decoding at once (vLLM's --max-num-seqs); the rest wait.
	MaxNumSeqs int
	// MaxWaiting bounds the FIFO waiting queue. vLLM has no such limit, but an unbounded queue
	// hides overload from the proxy; beyond it requests get 429. Zero means no queue at all.
	MaxWaiting int

	// TTFT is the time to first token of an uncached prompt on an idle replica.
	TTFT time.Duration
	// PrefillPerToken is added to TTFT for every prompt token not found in the prefix cache, so
	// that prefix-aware routing shows up as lower latency.
	PrefillPerToken time.Duration
	// ITL is the inter-token latency of a lone sequence.
	ITL time.Duration
	// ITLPerSeq is added to ITL for every running sequence, because a bigger decode batch makes
	// every step slower; this is what makes load balancing matter.
	ITLPerSeq time.Duration
	// MaxTokens is the output length of a request that does not set max_tokens.
	MaxTokens int
	// KVCacheBlocks is the number of 16-token KV blocks: the prefix cache's LRU capacity and the
	// denominator of vllm:kv_cache_usage_perc.
	KVCacheBlocks int

	// StartupDelay keeps /health (and completions) at 503 for this long after NewServer, like a
	// model still loading, so readiness probing can be tested.
	StartupDelay time.Duration
	// ErrorRate is the fraction of completions answered with a 500.
	ErrorRate float64
	// HangRate is the fraction of completions that never answer until the client goes away,
	// the failure that only timeouts catch.
	HangRate float64
	// SlowRate is the fraction of completions whose first token comes SlowDelay late.
	SlowRate  float64
	SlowDelay time.Duration
	// FlapPeriod, when positive, makes /health alternate between 200 and 503 every period.
	FlapPeriod time.Duration
	// FaultsFile, when set, is re-read while the replica runs: fault flags in it (error, hang,
	// slow and flap; see Faults) replace the command line's, and removing it restores them.
	FaultsFile string
	// ExitAfter, when positive, crashes the replica after that many completions have finished,
	// to test failover and replacement.
	ExitAfter int
	// Seed makes generated text, ids and failure injection reproducible.
	Seed int64

	// KVEvents, when set, is the ZMQ endpoint the replica publishes vLLM's KV-cache events to
	// (BlockStored and BlockRemoved for every change to its prefix cache), so that a consumer
	// of vLLM's --kv-events-config can be tested against the real wire format. vLLM's rule
	// applies: an endpoint with "*" or "::", or ipc:// or inproc://, is bound; any other is
	// connected to, as an engine connects to a router's bound subscriber.
	KVEvents string
	// KVEventsTopic is the topic frame of every message; empty means llm-d's
	// kv@HOST:PORT@MODEL, from the address the replica listens on and its model.
	KVEventsTopic string
	// KVEventsEncoding is KVEventsMap (current vLLM) or KVEventsArray (older vLLM).
	KVEventsEncoding string

	// EnableLoRA serves LoRA adapters (vLLM's --enable-lora; see lora.go); LoRAModules, in
	// vLLM's name=path form, are registered at start and turn it on too.
	EnableLoRA  bool
	LoRAModules []string
	// MaxLoRAs is how many adapters can be active at once (vLLM's --max-loras, default 1);
	// MaxCPULoRAs how many stay loaded in CPU memory (--max-cpu-loras, at least MaxLoRAs).
	MaxLoRAs, MaxCPULoRAs int
	// LoRALoadTime is what loading an adapter from disk into CPU memory costs (a request whose
	// adapter is not there pays it, once, and /v1/load_lora_adapter too); LoRAActivateTime
	// what moving a loaded adapter into a GPU slot costs.
	LoRALoadTime, LoRAActivateTime time.Duration
	// RuntimeLoRA serves /v1/load_lora_adapter and /v1/unload_lora_adapter, as vLLM does with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (the default follows that variable).
	RuntimeLoRA bool

	// KVTransfer makes the replica take part in prefill/decode disaggregation as vLLM's
	// NixlConnector does (pd.go): a request with kv_transfer_params.do_remote_decode is only
	// prefilled, and answered with the kv_transfer_params a decode replica needs; one with
	// do_remote_prefill pulls the prompt's KV instead of computing it, at KVTransferPerToken
	// per prompt token.
	KVTransfer         bool
	KVTransferPerToken time.Duration
	// PrefillInterference is the share of a prefill's time that the replica's decoding
	// sequences stall for: an engine's step that carries a prompt's chunk (up to
	// prefillChunkTokens) is that much longer for every sequence in the batch. 0 (the
	// default) keeps decode blind to prefill; 1 is an engine that overlaps nothing.
	PrefillInterference float64

	// ExitFunc is how ExitAfter crashes; tests set it to observe the crash without dying. Nil
	// means os.Exit.
	ExitFunc func(code int)
	// OnListen, if set, is called by Run with the bound address before serving, so a caller that
	// asked for port 0 learns the real port.
	OnListen func(addr net.Addr)
}

// Engines Config.Engine accepts.
const (
	EngineVLLM = "vllm"
	EngineTGI  = "tgi"
)

// Signal sets Config.Signals accepts.
const (
	SignalsFull  = "full"
	SignalsBasic = "basic"
)

// DefaultConfig returns the defaults the CLI starts from: a small, fast, vLLM-shaped replica.
func DefaultConfig() Config { return DefaultConfigFromEnv(os.Getenv) }

// DefaultConfigFromEnv is DefaultConfig with the environment read through getenv, for a host that
// runs replicas in its own process, each with the environment a process of its own would have
// (testcluster's kubelet stand-in).
func DefaultConfigFromEnv(getenv func(string) string) Config {
	port := 8000
	if v, err := strconv.Atoi(getenv("FERRY_PORT")); err == nil && v >= 0 && v <= 65535 {
		port = v
	}
	host := "127.0.0.1"
	if v := getenv("FERRY_HOST"); v != "" {
		host = v
	}
	return Config{
		Host:            host,
		Port:            port,
		Engine:          EngineVLLM,
		Signals:         SignalsFull,
		Model:           "ferry-sim",
		MaxNumSeqs:      16,
		MaxWaiting:      256,
		TTFT:            50 * time.Millisecond,
		PrefillPerToken: 20 * time.Microsecond,
		ITL:             10 * time.Millisecond,
		ITLPerSeq:       500 * time.Microsecond,
		MaxTokens:       64,
		KVCacheBlocks:   4096,
		Seed:            1,

		KVEventsEncoding: KVEventsMap,

		EnableLoRA:       getenv("FERRY_MAX_LORAS") != "",
		LoRAModules:      strings.Fields(getenv("FERRY_LORA_MODULES")),
		MaxLoRAs:         envInt(getenv, "FERRY_MAX_LORAS", 1),
		LoRALoadTime:     100 * time.Millisecond,
		LoRAActivateTime: 2 * time.Millisecond,
		RuntimeLoRA:      runtimeLoRAFromEnv(getenv),

		KVTransferPerToken: 2 * time.Microsecond,
	}
}

// RegisterFlags binds every knob to fs, with c's current values as defaults, so the command and
// any bench driver share one set of flag names.
func (c *Config) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Host, "host", c.Host, "address to listen on; defaults to $FERRY_HOST when set")
	fs.IntVar(&c.Port, "port", c.Port, "port to listen on; defaults to $FERRY_PORT when set; 0 picks a free port")
	fs.StringVar(&c.Engine, "engine", c.Engine, "engine whose Prometheus metric names /metrics uses: vllm or tgi")
	fs.StringVar(&c.Signals, "signals", c.Signals, "what the replica reports of its prefix cache: full (vllm:cache_config_info, prefix-cache counters, usage.prompt_tokens_details.cached_tokens) or basic (running, waiting and KV usage only)")
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "sequences decoding at once (continuous batching)")
	fs.IntVar(&c.MaxWaiting, "max-waiting", c.MaxWaiting, "waiting-queue limit; requests beyond it get 429")
	fs.DurationVar(&c.TTFT, "ttft", c.TTFT, "base time to first token for an uncached prompt on an idle replica")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", c.PrefillPerToken, "extra time to first token per uncached prompt token")
	fs.DurationVar(&c.ITL, "itl", c.ITL, "base inter-token latency")
	fs.DurationVar(&c.ITLPerSeq, "itl-per-seq", c.ITLPerSeq, "inter-token latency added per running sequence")
	fs.IntVar(&c.MaxTokens, "max-tokens", c.MaxTokens, "output tokens when a request sets no max_tokens")
	fs.IntVar(&c.KVCacheBlocks, "kv-blocks", c.KVCacheBlocks, "KV cache size in 16-token blocks (prefix cache capacity)")
	fs.DurationVar(&c.StartupDelay, "startup-delay", c.StartupDelay, "answer 503 on /health and completions for this long after start")
	c.registerFaultFlags(fs)
	fs.StringVar(&c.FaultsFile, "faults-file", c.FaultsFile, "file of fault flags (--error-rate, --hang-rate, --slow-rate, --slow-delay, --flap-period) re-read every 100ms while running; they override the command line's until the file is removed")
	fs.IntVar(&c.ExitAfter, "exit-after", c.ExitAfter, "crash (exit 1) after this many completions; 0 never")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "random seed for generated text, ids and failure injection")
	fs.StringVar(&c.KVEvents, "kv-events", c.KVEvents, "ZMQ endpoint to publish vLLM's KV-cache events to (BlockStored/BlockRemoved, msgpack); with * or ::, or ipc:// or inproc://, it is bound, otherwise connected to (e.g. tcp://router:5557); empty publishes none")
	fs.StringVar(&c.KVEventsTopic, "kv-events-topic", c.KVEventsTopic, "topic of the KV-event messages; empty means kv@HOST:PORT@MODEL")
	fs.BoolVar(&c.EnableLoRA, "enable-lora", c.EnableLoRA, "serve LoRA adapters named as the request's model (vLLM's --enable-lora; default: on when $FERRY_MAX_LORAS is set)")
	fs.StringSliceVar(&c.LoRAModules, "lora-modules", c.LoRAModules, "adapters registered at start, name=path (repeatable or comma-separated; default: $FERRY_LORA_MODULES, which Ferry sets from service.adapters); turns --enable-lora on")
	fs.IntVar(&c.MaxLoRAs, "max-loras", c.MaxLoRAs, "adapters active in GPU slots at once (default: $FERRY_MAX_LORAS, else 1); a request for another waits until a slot is free of requests")
	fs.IntVar(&c.MaxCPULoRAs, "max-cpu-loras", c.MaxCPULoRAs, "adapters kept loaded in CPU memory (at least --max-loras); one beyond them is loaded from disk again")
	fs.DurationVar(&c.LoRALoadTime, "lora-load-time", c.LoRALoadTime, "time to load an adapter from disk into CPU memory (one load at a time)")
	fs.DurationVar(&c.LoRAActivateTime, "lora-activate-time", c.LoRAActivateTime, "time to move a loaded adapter into a GPU slot")
	fs.BoolVar(&c.RuntimeLoRA, "runtime-lora", c.RuntimeLoRA, "serve /v1/load_lora_adapter and /v1/unload_lora_adapter (default: VLLM_ALLOW_RUNTIME_LORA_UPDATING is true)")
	fs.BoolVar(&c.KVTransfer, "kv-transfer", c.KVTransfer, "take part in prefill/decode disaggregation as vLLM's NixlConnector: kv_transfer_params.do_remote_decode prefills only and answers the params for the decode side; do_remote_prefill pulls the KV instead of prefilling")
	fs.DurationVar(&c.KVTransferPerToken, "kv-transfer-per-token", c.KVTransferPerToken, "time to pull one prompt token's KV from the prefill replica (do_remote_prefill)")
	fs.Float64Var(&c.PrefillInterference, "prefill-interference", c.PrefillInterference, "share of a prompt chunk's prefill time that every decoding sequence of the replica stalls for (0: none; 1: the engine overlaps nothing)")
	fs.StringVar(&c.KVEventsEncoding, "kv-events-encoding", c.KVEventsEncoding, "msgpack shape of the KV events: map (current vLLM) or array (older vLLM's array_like structs)")
}

// Validate reports every invalid field at once, naming the flag, the value and the rule.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) {
		errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule))
	}
	if c.Port < 0 || c.Port > 65535 {
		bad("port", c.Port, "must be between 0 and 65535")
	}
	if c.Engine != EngineVLLM && c.Engine != EngineTGI {
		bad("engine", strconv.Quote(c.Engine), "must be "+EngineVLLM+" or "+EngineTGI)
	}
	if c.Signals != SignalsFull && c.Signals != SignalsBasic {
		bad("signals", strconv.Quote(c.Signals), "must be "+SignalsFull+" or "+SignalsBasic)
	}
	if c.Model == "" {
		bad("model", `""`, "must not be empty")
	}
	if c.MaxNumSeqs < 1 {
		bad("max-num-seqs", c.MaxNumSeqs, "must be at least 1")
	}
	if c.MaxWaiting < 0 {
		bad("max-waiting", c.MaxWaiting, "must not be negative")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"ttft", c.TTFT}, {"prefill-per-token", c.PrefillPerToken}, {"itl", c.ITL},
		{"itl-per-seq", c.ITLPerSeq}, {"startup-delay", c.StartupDelay},
		{"lora-load-time", c.LoRALoadTime}, {"lora-activate-time", c.LoRAActivateTime},
		{"kv-transfer-per-token", c.KVTransferPerToken},
	} {
		if d.v < 0 {
			bad(d.flag, d.v, "must not be negative")
		}
	}
	if c.MaxTokens < 1 {
		bad("max-tokens", c.MaxTokens, "must be at least 1")
	}
	if c.KVCacheBlocks < 1 {
		bad("kv-blocks", c.KVCacheBlocks, "must be at least 1")
	}
	errs = append(errs, c.faultErrors()...)
	if c.ExitAfter < 0 {
		bad("exit-after", c.ExitAfter, "must not be negative")
	}
	if c.KVEvents != "" {
		if err := kvEndpointError(c.KVEvents); err != nil {
			bad("kv-events", strconv.Quote(c.KVEvents), err.Error())
		}
	}
	errs = append(errs, c.loraErrors()...)
	if !(c.PrefillInterference >= 0 && c.PrefillInterference <= 1) {
		bad("prefill-interference", c.PrefillInterference, "must be between 0 and 1")
	}
	if c.KVEventsEncoding != KVEventsMap && c.KVEventsEncoding != KVEventsArray {
		bad("kv-events-encoding", strconv.Quote(c.KVEventsEncoding), "must be "+KVEventsMap+" or "+KVEventsArray)
	}
	return errors.Join(errs...)
}

// loraErrors validates the LoRA knobs, in Validate's format.
func (c *Config) loraErrors() []error {
	var errs []error
	if c.MaxLoRAs < 1 {
		errs = append(errs, fmt.Errorf("--max-loras=%d: must be at least 1", c.MaxLoRAs))
	}
	if c.MaxCPULoRAs < 0 {
		errs = append(errs, fmt.Errorf("--max-cpu-loras=%d: must not be negative", c.MaxCPULoRAs))
	}
	seen := map[string]bool{c.Model: true}
	for _, spec := range c.LoRAModules {
		name, _, err := parseLoRAModule(spec)
		if err == nil && seen[name] {
			err = fmt.Errorf("--lora-modules %q: the name %q is taken", spec, name)
		}
		if err != nil {
			errs = append(errs, err)
		}
		seen[name] = true
	}
	return errs
}

// envInt reads a positive integer from the environment, or returns def.
func envInt(getenv func(string) string, name string, def int) int {
	if v, err := strconv.Atoi(getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// runtimeLoRAFromEnv is vLLM's switch for the run-time adapter endpoints.
func runtimeLoRAFromEnv(getenv func(string) string) bool {
	v := strings.ToLower(getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
	return v == "true" || v == "1"
}
