package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/bench/replicasim"
)

func init() { register(newReplicaSimCmd) }

// newReplicaSimCmd is `ferry replica-sim`: the simulated vLLM replica that tests, demos and
// benchmarks put behind the proxy instead of a GPU.
func newReplicaSimCmd() *cobra.Command {
	cfg := replicasim.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "replica-sim",
		Short: "Run a simulated vLLM replica: an OpenAI-compatible server with vLLM's latency, queueing and metrics",
		Long: `replica-sim imitates a vLLM server without a GPU, so Ferry can be tested, demonstrated and
benchmarked anywhere.

It serves /v1/chat/completions and /v1/completions (streaming and not), /v1/models, /health and
/metrics with vLLM's metric names (vllm:num_requests_running, vllm:num_requests_waiting,
vllm:kv_cache_usage_perc, vllm:prefix_cache_hits_total, ...), or with --engine tgi those of
Hugging Face TGI (tgi_queue_size, tgi_batch_current_size, ...). Requests are batched like vLLM's
continuous batching: at most --max-num-seqs decode at once, the rest wait FIFO (beyond
--max-waiting they get 429). Time to first token is --ttft plus --prefill-per-token for every
prompt token missing from the prefix cache; each further token takes --itl plus --itl-per-seq
per running sequence. Output is filler text, deterministic for a --seed.

It also serves vLLM's POST /tokenize (a stand-in tokenizer: 4 prompt bytes a token) and, with
--kv-events tcp://HOST:PORT, publishes vLLM's KV-cache events over ZeroMQ, as an engine with
--kv-events-config does, for a router that routes by them (ferry proxy --kv-events-listen).

Failures can be injected: --startup-delay (503 until loaded), --error-rate (HTTP 500),
--hang-rate (never answers), --slow-rate with --slow-delay (late first token), --flap-period
(/health alternates 200/503) and --exit-after (crashes after N completions). --faults-file names
a file of such fault flags that is re-read while the replica runs, to switch faults on and off.

The port defaults to $FERRY_PORT when set, so a launcher can start it like any replica. SIGINT or
SIGTERM shuts down gracefully: in-flight requests finish at once and the exit status is 0.`,
		Example: `  # a replica like the ones in the quick start
  ferry replica-sim --port 8001 --model meta-llama/Llama-3.1-8B-Instruct

  # a slow, small replica that fills up quickly
  ferry replica-sim --max-num-seqs 4 --max-waiting 8 --ttft 200ms --itl 30ms

  # a replica whose /metrics looks like TGI's, for llm_aware routing over TGI
  ferry replica-sim --port 8002 --engine tgi

  # an engine publishing its KV-cache events to a proxy listening for them
  ferry replica-sim --port 8003 --kv-events tcp://127.0.0.1:5557

  # a flaky one: slow to start, 5% errors, crashes after 100 requests
  ferry replica-sim --startup-delay 10s --error-rate 0.05 --exit-after 100

  curl -s localhost:8000/v1/chat/completions -d '{"model":"ferry-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":8}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cfg.OnListen = func(addr net.Addr) {
				fmt.Fprintf(os.Stderr, "ferry replica-sim: serving model %q on http://%s\n", cfg.Model, addr)
			}
			return replicasim.Run(ctx, cfg)
		},
	}
	cfg.RegisterFlags(cmd.Flags())
	return cmd
}
