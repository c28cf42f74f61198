// Command routing measures routing quality: N `ferry replica-sim` replicas with batching and
// prefix caching behind `ferry proxy --policy P`, replaying a workload and reporting TTFT,
// end-to-end latency, throughput, per-replica load and prefix-cache hit rate for each policy.
// Two workloads: a window of the Azure LLM inference conversation trace, its arrivals and
// lengths, dressed as conversations (--workload azure, the default), or synthesized multi-turn
// chat sessions with long shared prefixes, growing histories and think time (--workload
// multiturn). Replicas are restarted between policies so every policy starts with cold caches.
// A policy the proxy does not know is reported as such and the run goes on. See
// bench/README.md.
//
//	go run ./bench/routing                              # 1,000 requests, every policy
//	go run ./bench/routing --requests 300 --policies round_robin,least_load
//	go run ./bench/routing --policies round_robin@off,least_load,least_load@batch  # @N: late binding
//	go run ./bench/routing --workload multiturn --policies default,round_robin@off,least_load
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
)

// defaultPolicy is the pseudo-policy that starts the proxy without --policy, measuring whatever
// Ferry's default is at the time; the targets are stated for it.
const defaultPolicy = "default"

// simConfig is the replica-sim settings; see bench/README.md for how they were chosen.
type simConfig struct {
	ttft            time.Duration
	prefillPerToken time.Duration
	itl             time.Duration
	itlPerSeq       time.Duration
	maxNumSeqs      int
	maxWaiting      int
	kvBlocks        int
	signals         string
	// LoRA: with adapters > 0 every replica registers lora-0 … lora-(adapters-1) at start.
	adapters               int
	maxLoRAs               int
	loraLoad, loraActivate time.Duration
	prefillInterference    float64
}

func (s simConfig) args() []string {
	args := []string{
		"--ttft", s.ttft.String(), "--prefill-per-token", s.prefillPerToken.String(),
		"--itl", s.itl.String(), "--itl-per-seq", s.itlPerSeq.String(),
		"--max-num-seqs", fmt.Sprint(s.maxNumSeqs), "--max-waiting", fmt.Sprint(s.maxWaiting),
		"--kv-blocks", fmt.Sprint(s.kvBlocks), "--signals", s.signals,
		"--prefill-interference", fmt.Sprint(s.prefillInterference),
	}
	if s.adapters == 0 {
		return args
	}
	modules := make([]string, s.adapters)
	for i := range modules {
		modules[i] = adapterName(i) + "=/adapters/" + adapterName(i)
	}
	return append(args, "--lora-modules", strings.Join(modules, ","), "--max-loras", fmt.Sprint(s.maxLoRAs),
		"--lora-load-time", s.loraLoad.String(), "--lora-activate-time", s.loraActivate.String())
}

type options struct {
	// workloadName is --workload; multiTurn its multi-turn settings.
	workloadName string
	multiTurn    multiTurnConfig
	tracePath    string
	start        int
	requests     int
	replicas     int
	policies     []string
	workload     workloadConfig
	sim          simConfig
	timeout      time.Duration
	maxInFlight  int
	// cpuHogs is how many busy-looping processes share the host with the run, to measure
	// routing while the proxy's own CPU is contended.
	cpuHogs int
	// adapterZipf is the exponent of the adapters' popularity, with sim.adapters.
	adapterZipf float64
	// pdPrefill is how many replicas prefill in a NAME@pd run.
	pdPrefill int
	ferryBin  string
	out       string
}

func main() {
	benchkit.Main("routing", os.Args[1:], parseFlags, run)
}

func parseFlags(args []string) (options, error) {
	var o options
	var seed int64
	fs := pflag.NewFlagSet("routing", pflag.ContinueOnError)
	fs.StringVar(&o.workloadName, "workload", workloadAzure, "azure: replay a window of the Azure conversation trace; multiturn: synthesized chat sessions with long shared prefixes (sets --sim-* defaults like issue 23's benchmark)")
	fs.IntVar(&o.multiTurn.Conversations, "conversations", 700, "multiturn: conversations started")
	fs.Float64Var(&o.multiTurn.MeanTurns, "turns", 3.9, "multiturn: mean turns per conversation (geometric)")
	fs.Float64Var(&o.multiTurn.Sharing, "sharing", 0.7, "multiturn: share of conversations opening on a shared system prompt")
	fs.Float64Var(&o.multiTurn.Rate, "rate", 47, "multiturn: offered requests per second (open loop)")
	fs.Float64Var(&o.multiTurn.Burst, "burst", 1, "multiturn: conversation start rate in a burst ÷ the mean (bursts 20 % of the time, 5 s on average; 1 = plain Poisson, at most 5)")
	fs.DurationVar(&o.multiTurn.ThinkTime, "think-time", 5*time.Second, "multiturn: mean time between a conversation's turns (exponential)")
	fs.IntVar(&o.multiTurn.UserTokens, "user-tokens", 120, "multiturn: median user message, tokens (log-normal)")
	fs.IntVar(&o.multiTurn.AnswerTokens, "answer-tokens", 40, "multiturn: median answer and max_tokens, tokens (log-normal)")
	fs.Float64Var(&o.multiTurn.Sigma, "length-sigma", 1, "multiturn: sigma of the log-normal message lengths (heavier tail when larger)")
	fs.IntVar(&o.multiTurn.MaxPromptTokens, "max-prompt-tokens", 16000, "multiturn: a conversation ends before a longer prompt")
	fs.StringVar(&o.tracePath, "trace", "", "Azure conversation trace CSV (default ../shared/data/traces/AzureLLMInferenceTrace_conv.csv beside the repo)")
	fs.IntVar(&o.start, "start", 0, "index of the first trace record replayed")
	fs.IntVar(&o.requests, "requests", 1000, "trace records replayed per policy")
	fs.Float64Var(&o.workload.Speedup, "speedup", 3, "divide the trace's inter-arrival times by this")
	fs.IntVar(&o.replicas, "replicas", 4, "replica-sim processes")
	fs.StringSliceVar(&o.policies, "policies", []string{defaultPolicy, roundRobinBaseline, "least_load", "least_load@" + lateBindingOff, "power_of_two", "session_affinity", "prefix_affinity", "llm_aware", "least_load@" + batchLimit},
		`policies to compare; "default" runs the proxy without --policy; NAME@N, NAME@batch and NAME@off set --max-in-flight-per-replica; NAME@events has the replicas publish vLLM's KV-cache events to the proxy (--kv-events-listen); NAME@blind routes as if requests named no adapter (--ignore-adapters); NAME@pd prefills on --pd-prefill replicas and decodes on the rest`)
	fs.Int64Var(&seed, "seed", 1, "seed of the synthesized prompts and conversations")
	fs.IntSliceVar(&o.workload.SystemPromptTokens, "system-prompts", []int{300, 900, 1300, 3900}, "lengths in tokens of the shared system prompts")
	fs.Float64Var(&o.workload.FollowUp, "follow-up", 0.6, "probability that a request continues an open conversation")
	fs.DurationVar(&o.workload.MinTurnGap, "min-turn-gap", 20*time.Second, "least trace time between turns of a conversation")
	fs.DurationVar(&o.workload.MaxIdle, "max-idle", 10*time.Minute, "trace time after which an idle conversation is closed")
	fs.IntVar(&o.workload.MinUserTokens, "min-user-tokens", 16, "smallest new user message, in tokens")
	fs.DurationVar(&o.sim.ttft, "sim-ttft", 15*time.Millisecond, "replica-sim --ttft")
	fs.DurationVar(&o.sim.prefillPerToken, "sim-prefill-per-token", 80*time.Microsecond, "replica-sim --prefill-per-token")
	fs.DurationVar(&o.sim.itl, "sim-itl", 10*time.Millisecond, "replica-sim --itl")
	fs.DurationVar(&o.sim.itlPerSeq, "sim-itl-per-seq", 200*time.Microsecond, "replica-sim --itl-per-seq")
	fs.IntVar(&o.sim.maxNumSeqs, "sim-max-num-seqs", 16, "replica-sim --max-num-seqs")
	fs.IntVar(&o.sim.maxWaiting, "sim-max-waiting", 4096, "replica-sim --max-waiting")
	fs.IntVar(&o.sim.kvBlocks, "sim-kv-blocks", 3000, "replica-sim --kv-blocks (prefix cache capacity, 16-token blocks)")
	fs.StringVar(&o.sim.signals, "sim-signals", "full", "replica-sim --signals: full (the cache's size, prefix-cache counters, cached tokens per answer) or basic (running, waiting and KV usage only)")
	fs.IntVar(&o.sim.adapters, "adapters", 0, "LoRA adapters: each request names one, drawn with Zipf popularity (--adapter-zipf), and every replica registers them all (0: none, the base model only)")
	fs.Float64Var(&o.adapterZipf, "adapter-zipf", 1, "with --adapters: the Zipf exponent of the adapters' popularity (the i-th has weight 1/i^s)")
	fs.IntVar(&o.sim.maxLoRAs, "sim-max-loras", 4, "replica-sim --max-loras: adapters active at once per replica")
	fs.DurationVar(&o.sim.loraLoad, "sim-lora-load-time", 100*time.Millisecond, "replica-sim --lora-load-time")
	fs.DurationVar(&o.sim.loraActivate, "sim-lora-activate-time", 2*time.Millisecond, "replica-sim --lora-activate-time")
	fs.Float64Var(&o.sim.prefillInterference, "sim-prefill-interference", 0, "replica-sim --prefill-interference: share of a prompt chunk's prefill time every decoding sequence of the replica stalls for (what disaggregation removes)")
	fs.IntVar(&o.pdPrefill, "pd-prefill", 2, "with NAME@pd: how many of --replicas prefill (the rest decode)")
	fs.IntVar(&o.cpuHogs, "cpu-hog", 0, "busy-looping processes beside the run (one per core makes the host 100 % busy)")
	fs.DurationVar(&o.timeout, "request-timeout", 2*time.Minute, "bound on one request")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 4096, "bound on outstanding requests; past it arrivals slip")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results and logs (default .cache/bench/routing-TIMESTAMP in the repo)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go run ./bench/routing [flags]\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.workload.Seed = uint64(seed)
	o.workload.Model = "ferry-sim"
	o.multiTurn.Seed, o.multiTurn.Model = uint64(seed), o.workload.Model
	if o.workloadName == workloadMultiTurn {
		applyMultiTurnDefaults(fs, &o)
	}
	return o, o.validate()
}

// applyMultiTurnDefaults gives the multi-turn workload the replicas it is meant for, where a
// flag was not set: like the vLLM simulator of issue 23's benchmark, 4 replicas whose prefill
// costs time per uncached token, at most 8 running sequences each, and a KV cache of 6,000
// 16-token blocks (96k tokens), small enough against the conversations' histories that LRU
// eviction decides what stays cached. Its own system prompts are longer than the Azure
// workload's: the few that many conversations open on are 800 to 4,000 tokens.
func applyMultiTurnDefaults(fs *pflag.FlagSet, o *options) {
	set := func(flag string, apply func()) {
		if !fs.Changed(flag) {
			apply()
		}
	}
	set("sim-max-num-seqs", func() { o.sim.maxNumSeqs = 8 })
	set("sim-kv-blocks", func() { o.sim.kvBlocks = 6000 })
	set("sim-prefill-per-token", func() { o.sim.prefillPerToken = 40 * time.Microsecond })
	set("sim-itl", func() { o.sim.itl = 5 * time.Millisecond })
	o.multiTurn.SystemPromptTokens = o.workload.SystemPromptTokens
	set("system-prompts", func() { o.multiTurn.SystemPromptTokens = []int{2000, 1200, 3000, 800, 4000, 1600} })
}

func (o options) validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	switch o.workloadName {
	case workloadAzure:
		if err := o.workload.validate(); err != nil {
			errs = append(errs, err)
		}
	case workloadMultiTurn:
		if err := o.multiTurn.validate(); err != nil {
			errs = append(errs, err)
		}
	default:
		bad("workload", o.workloadName, "must be "+workloadAzure+" or "+workloadMultiTurn)
	}
	if o.start < 0 {
		bad("start", o.start, "must not be negative")
	}
	if o.requests < 1 || o.requests > 20000 {
		bad("requests", o.requests, "must be between 1 and 20000")
	}
	if !(o.workload.Speedup >= 0.1 && o.workload.Speedup <= 1000) {
		bad("speedup", o.workload.Speedup, "must be between 0.1 and 1000")
	}
	if o.replicas < 1 || o.replicas > 64 {
		bad("replicas", o.replicas, "must be between 1 and 64")
	}
	if len(o.policies) == 0 {
		bad("policies", `""`, "name at least one")
	}
	seen := map[string]bool{}
	for _, p := range o.policies {
		if p == "" || strings.ContainsAny(p, " \t") || seen[p] {
			bad("policies", p, "names must be non-empty, without spaces, and listed once")
		}
		if _, limit := splitPolicy(p); limit != "" && limit != batchLimit && limit != lateBindingOff && limit != kvEventsMode && limit != adapterBlind && limit != pdMode {
			if n, err := strconv.Atoi(limit); err != nil || n < 1 {
				bad("policies", p, "NAME@N wants a positive N (the proxy's --max-in-flight-per-replica), batch (--sim-max-num-seqs), off (no late binding) or events (the replicas publish KV-cache events to the proxy)")
			}
		}
		seen[p] = true
	}
	if o.sim.maxNumSeqs < 1 || o.sim.kvBlocks < 1 || o.sim.maxWaiting < 0 {
		bad("sim-max-num-seqs", o.sim.maxNumSeqs, "with --sim-kv-blocks must be positive and --sim-max-waiting not negative")
	}
	for _, d := range []time.Duration{o.sim.ttft, o.sim.prefillPerToken, o.sim.itl, o.sim.itlPerSeq} {
		if d < 0 {
			bad("sim-*", d, "durations must not be negative")
		}
	}
	if o.sim.signals != "full" && o.sim.signals != "basic" {
		bad("sim-signals", o.sim.signals, "must be full or basic")
	}
	if o.sim.adapters < 0 || o.sim.adapters > 1000 || o.sim.maxLoRAs < 1 || !(o.adapterZipf >= 0 && o.adapterZipf <= 5) {
		bad("adapters", o.sim.adapters, "must be 0 to 1000, with --sim-max-loras at least 1 and --adapter-zipf 0 to 5")
	}
	if o.pdPrefill < 1 || o.pdPrefill >= o.replicas || !(o.sim.prefillInterference >= 0 && o.sim.prefillInterference <= 1) {
		bad("pd-prefill", o.pdPrefill, "must leave at least one of --replicas to decode, and --sim-prefill-interference be 0 to 1")
	}
	if o.cpuHogs < 0 || o.cpuHogs > 16 {
		bad("cpu-hog", o.cpuHogs, "must be between 0 and 16")
	}
	if o.timeout <= 0 || o.timeout > 30*time.Minute {
		bad("request-timeout", o.timeout, "must be positive and at most 30m")
	}
	if o.maxInFlight < 1 || o.maxInFlight > 16384 {
		bad("max-in-flight", o.maxInFlight, "must be between 1 and 16384")
	}
	return errors.Join(errs...)
}

func run(opts options) error {
	root, err := benchkit.RepoRoot()
	if err != nil {
		return err
	}
	wl, err := buildWorkload(root, &opts)
	if err != nil {
		return err
	}
	if opts.out, err = benchkit.OutDir(root, "routing", opts.out); err != nil {
		return err
	}
	if opts.ferryBin == "" {
		if opts.ferryBin, err = benchkit.BuildFerry(root, opts.out); err != nil {
			return err
		}
	}
	st := wl.stats
	fmt.Fprintf(os.Stderr, "workload: %d requests in %.0f s (%.1f req/s), %d conversations, %d follow-ups, %.0f%% of prompt tokens reusable\n",
		st.Requests, st.DurationS, float64(st.Requests)/max(st.DurationS, 1e-9), st.Conversations, st.FollowUps, 100*st.ReusableShare)

	group, err := childproc.NewGroup(filepath.Join(opts.out, "logs"))
	if err != nil {
		return err
	}
	defer group.Close()
	defer group.StopOnSignal()()

	if err := startHogs(group, opts.cpuHogs); err != nil {
		return err
	}
	rep := newReport(opts, wl)
	for _, policy := range opts.policies {
		res, err := runPolicy(context.Background(), group, opts, policy, wl)
		if err != nil {
			return fmt.Errorf("policy %s: %w", policy, err)
		}
		fmt.Fprintf(os.Stderr, "%s\n", res.oneLine())
		rep.add(res)
	}
	return rep.write(os.Stdout, opts.out)
}

// startHogs starts n processes that spin until the group stops them, making the host's CPU as
// contended as a busy build does: the proxy then competes for a core with them.
func startHogs(group *childproc.Group, n int) error {
	for i := range n {
		spec := childproc.Spec{Name: fmt.Sprintf("cpu-hog%d", i+1), Argv: []string{"sh", "-c", "while :; do :; done"}, CPU: -1}
		if _, err := group.Start(spec); err != nil {
			return fmt.Errorf("cpu hog: %w", err)
		}
	}
	if n > 0 {
		fmt.Fprintf(os.Stderr, "%d CPU hogs running beside every policy\n", n)
	}
	return nil
}

// buildWorkload synthesizes the workload --workload names, its requests naming adapters with
// --adapters.
func buildWorkload(root string, opts *options) (*workload, error) {
	wl, err := buildBaseWorkload(root, opts)
	if err != nil || opts.sim.adapters == 0 {
		return wl, err
	}
	assignAdapters(wl, opts.workload.Model, opts.sim.adapters, opts.adapterZipf, opts.workload.Seed)
	return wl, nil
}

func buildBaseWorkload(root string, opts *options) (*workload, error) {
	if opts.workloadName == workloadMultiTurn {
		return synthesizeMultiTurn(opts.multiTurn)
	}
	if opts.tracePath == "" {
		opts.tracePath = filepath.Join(root, "..", "shared", "data", "traces", "AzureLLMInferenceTrace_conv.csv")
	}
	recs, err := readTrace(opts.tracePath)
	if err != nil {
		return nil, err
	}
	win, err := window(recs, opts.start, opts.requests)
	if err != nil {
		return nil, err
	}
	return synthesize(win, opts.workload)
}
