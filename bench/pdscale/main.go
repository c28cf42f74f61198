// Command pdscale shows a disaggregated service's two pools scaling apart as its workload's mix
// shifts. One controller serves a service of local `ferry replica-sim` replicas with
// service.pools.prefill; the driver replays two Azure LLM inference traces in turn, open loop,
// at the same request rate: the code trace (long prompts, short answers), then the conversation
// trace (shorter prompts, answers ten times longer). It samples both pools' targets every second
// and times every request's first token. See bench/README.md.
//
//	go run ./bench/pdscale                 # about 4 minutes
//	go run ./bench/pdscale --phase 30s     # shorter phases
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/azuretrace"
	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/servicekit"
)

const serviceName = "pd"

// options are the driver's flags.
type options struct {
	phases        []string
	phase         time.Duration
	rate          float64
	maxReplicas   int
	targetTokens  int
	maxTokens     int
	prefillPerTok time.Duration
	itl           time.Duration
	ferryBin      string
	out           string
}

func main() { benchkit.Main("pdscale", os.Args[1:], parseFlags, run) }

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("pdscale", pflag.ContinueOnError)
	traces := filepath.Join("..", "shared", "data", "traces")
	fs.StringSliceVar(&o.phases, "trace", []string{filepath.Join(traces, "AzureLLMInferenceTrace_code.csv"), filepath.Join(traces, "AzureLLMInferenceTrace_conv.csv")},
		"traces replayed one after the other, one phase each (their prompt and answer lengths; arrivals at --rate)")
	fs.DurationVar(&o.phase, "phase", 75*time.Second, "how long each trace is replayed")
	fs.Float64Var(&o.rate, "rate", 3, "requests per second, Poisson arrivals, in every phase")
	fs.IntVar(&o.maxReplicas, "max-replicas", 4, "max_replicas of each pool")
	fs.IntVar(&o.targetTokens, "target-queued-prompt-tokens", 2000, "the prefill pool's target_queued_prompt_tokens (sized to the simulated engine: 0.4 s of its prefill at 200 µs a token)")
	fs.IntVar(&o.maxTokens, "max-tokens", 600, "cap on a request's answer length (the trace's GeneratedTokens)")
	fs.DurationVar(&o.prefillPerTok, "sim-prefill-per-token", 200*time.Microsecond, "replica-sim --prefill-per-token")
	fs.DurationVar(&o.itl, "sim-itl", 20*time.Millisecond, "replica-sim --itl")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results, logs and FERRY_HOME (default .cache/bench/pdscale-TIMESTAMP in the repo)")
	fs.Usage = func() { fmt.Fprintf(os.Stderr, "Usage: go run ./bench/pdscale [flags]\n\n%s", fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, o.validate()
}

func (o options) validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	if len(o.phases) == 0 || len(o.phases) > 8 {
		bad("trace", o.phases, "name 1 to 8 traces")
	}
	if o.phase < 5*time.Second || o.phase > time.Hour {
		bad("phase", o.phase, "must be between 5s and 1h")
	}
	if o.rate <= 0 || o.rate > 50 {
		bad("rate", o.rate, "must be positive and at most 50")
	}
	if o.maxReplicas < 1 || o.maxReplicas > 8 {
		bad("max-replicas", o.maxReplicas, "must be between 1 and 8 (each pool; this machine runs them all)")
	}
	if o.targetTokens < 1 || o.maxTokens < 1 || o.maxTokens > 4096 {
		bad("target-queued-prompt-tokens/--max-tokens", fmt.Sprintf("%d/%d", o.targetTokens, o.maxTokens), "must be positive, max-tokens at most 4096")
	}
	return errors.Join(errs...)
}

// yaml is the service: both pools scale between 1 and --max-replicas with short windows.
func (o options) yaml() string {
	return fmt.Sprintf(`name: %s
resources:
  infra: local
service:
  readiness_probe: /health
  ports: 8080
  replica_policy:
    min_replicas: 1
    max_replicas: %d
    autoscaler: llm
    target_inflight_per_replica: 4
    stable_window_seconds: 15
    panic_window_seconds: 3
    num_overprovision: 0
  pools:
    prefill:
      replica_policy: {min_replicas: 1, max_replicas: %d, stable_window_seconds: 15, panic_window_seconds: 3, num_overprovision: 0}
      target_queued_prompt_tokens: %d
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b --kv-transfer --max-num-seqs 4 --prefill-per-token %s --itl %s
`, serviceName, o.maxReplicas, o.maxReplicas, o.targetTokens, o.prefillPerTok, o.itl)
}

func run(opts options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer servicekit.OnSignal(cancel)()
	rep, err := execute(ctx, &opts, benchkit.Progress)
	if err != nil {
		return err
	}
	return benchkit.WriteReport(os.Stdout, opts.out, rep.markdown(), rep)
}

// execute brings the service up, replays each phase and takes the service down.
// opts.out and opts.ferryBin are resolved in place (benchkit.Prepare).
func execute(ctx context.Context, opts *options, progress func(string, ...any)) (*report, error) {
	var phases [][]azuretrace.Record
	for _, path := range opts.phases {
		recs, err := azuretrace.Read(path)
		if err != nil {
			return nil, err
		}
		phases = append(phases, recs)
	}
	var err error
	if opts.out, opts.ferryBin, err = benchkit.Prepare("pdscale", opts.out, opts.ferryBin); err != nil {
		return nil, err
	}
	group, err := childproc.NewGroup(filepath.Join(opts.out, "logs"))
	if err != nil {
		return nil, err
	}
	defer group.Close()
	f, err := servicekit.NewFerry(opts.ferryBin, filepath.Join(opts.out, "home"), serviceName, "off", group)
	if err != nil {
		return nil, err
	}
	task := filepath.Join(opts.out, "pd.yaml")
	if err := os.WriteFile(task, []byte(opts.yaml()), 0o644); err != nil {
		return nil, err
	}
	progress("serve up %s", task)
	if out, err := f.Run(ctx, "serve-up", 3*time.Minute, "serve", "up", task, "-y"); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, servicekit.LastLines(out, 20))
	}
	defer func() {
		// serve up started the controller as a daemon of its own: it goes too.
		progress("teardown: ferry serve down, ferry controller stop")
		_, _ = f.Run(context.WithoutCancel(ctx), "serve-down", 2*time.Minute, "serve", "down", serviceName, "-y")
		if out, err := f.Run(context.WithoutCancel(ctx), "controller-stop", time.Minute, "controller", "stop"); err != nil {
			progress("ferry controller stop: %v\n%s", err, servicekit.LastLines(out, 5))
		}
	}()
	st, err := f.Status(ctx)
	if err != nil {
		return nil, err
	}
	rep := &report{Started: time.Now(), Rate: opts.rate, YAML: opts.yaml(),
		Host: map[string]any{"cpus": runtime.NumCPU(), "loadavg_start": benchkit.LoadAvg(), "go": runtime.Version()}}
	rng := rand.New(rand.NewPCG(1, 2))
	for i, recs := range phases {
		ph := phaseResult{Trace: filepath.Base(opts.phases[i])}
		progress("phase %d: %s at %.1f requests/s for %v", i+1, ph.Trace, opts.rate, opts.phase)
		reqs := workload(recs, opts.rate, opts.phase, opts.maxTokens, rng)
		ph.Requests, ph.Samples = replay(ctx, st.Endpoint, reqs, i, f)
		rep.Phases = append(rep.Phases, ph)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	rep.Host["loadavg_end"] = benchkit.LoadAvg()
	return rep, nil
}

// request is one request of a phase: when it is sent, and its prompt and answer lengths.
type request struct {
	At                   time.Duration
	PromptTokens, Answer int
}

// workload draws a phase's requests: Poisson arrivals at rate for d, each taking the prompt and
// answer lengths of a random record of the trace (answers capped at maxTokens).
func workload(recs []azuretrace.Record, rate float64, d time.Duration, maxTokens int, rng *rand.Rand) []request {
	var out []request
	for at := time.Duration(0); ; {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= d || len(recs) == 0 {
			return out
		}
		r := recs[rng.IntN(len(recs))]
		out = append(out, request{At: at, PromptTokens: max(r.ContextTokens, 1), Answer: min(max(r.GeneratedTokens, 1), maxTokens)})
	}
}

// result is one request's outcome.
type result struct {
	PromptTokens, Answer int
	TTFT, Total          time.Duration
	Err                  string `json:",omitempty"`
}

// sample is both pools' targets and READY replicas at one moment.
type sample struct {
	At                          time.Duration
	DecodeTarget, DecodeReady   int
	PrefillTarget, PrefillReady int
	// PrefillScaling is the prefill pool's autoscaler's reason.
	PrefillScaling string `json:",omitempty"`
}

// replay sends reqs open loop (each at its time, however many are in flight) and samples the
// pools every second until the last answer.
func replay(ctx context.Context, endpoint string, reqs []request, phase int, f *servicekit.Ferry) ([]result, []sample) {
	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	results := make([]result, len(reqs))
	start := time.Now()
	stop, sampled := make(chan struct{}), make(chan []sample)
	go func() { sampled <- samplePools(ctx, f, start, stop) }()
	var wg sync.WaitGroup
	for i, r := range reqs {
		if servicekit.SleepCtx(ctx, time.Until(start.Add(r.At))) != nil {
			results = results[:i]
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = send(ctx, client, endpoint, r, fmt.Sprintf("%d-%d", phase, i))
		}()
	}
	wg.Wait()
	close(stop)
	return results, <-sampled
}

// samplePools reads both pools' targets every second until stop closes.
func samplePools(ctx context.Context, f *servicekit.Ferry, start time.Time, stop <-chan struct{}) []sample {
	var out []sample
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if st, err := f.Status(ctx); err == nil && st.Prefill != nil {
			out = append(out, sample{At: time.Since(start).Round(time.Second), DecodeTarget: st.TargetReplicas, DecodeReady: st.ReadyReplicas,
				PrefillTarget: st.Prefill.TargetReplicas, PrefillReady: st.Prefill.ReadyReplicas, PrefillScaling: st.Prefill.Scaling})
		}
		select {
		case <-stop:
			return out
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

// send streams one chat completion whose prompt is r.PromptTokens tokens (the simulator counts
// four bytes a token) and starts with id, so that no two share a cached prefix beyond chance.
func send(ctx context.Context, client *http.Client, endpoint string, r request, id string) result {
	res := result{PromptTokens: r.PromptTokens, Answer: r.Answer}
	prompt := id + " " + strings.Repeat("tok ", r.PromptTokens)
	body := fmt.Sprintf(`{"model":"ferry-sim-1b","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, r.Answer, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		res.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	finished := false
	for sc.Scan() {
		line := sc.Text()
		if res.TTFT == 0 && strings.Contains(line, `"content"`) {
			res.TTFT = time.Since(start)
		}
		if line == "data: [DONE]" {
			finished = true
		}
	}
	res.Total = time.Since(start)
	if !finished {
		res.Err = fmt.Sprintf("stream ended without [DONE]: %v", sc.Err())
	}
	return res
}

// report is the run's results.
type report struct {
	Started time.Time
	Rate    float64
	YAML    string
	Host    map[string]any
	Phases  []phaseResult
}

// phaseResult is one trace's replay.
type phaseResult struct {
	Trace    string
	Requests []result
	Samples  []sample
}

// summary reads a phase: the mix, both pools over its second half (once they had a stable
// window to follow the shift), first-token latency and failures.
func (p phaseResult) summary() (prompt, answer, decode, prefill float64, decodeMax, prefillMax int, ttft50, ttft99 time.Duration, failed int) {
	var ttfts []time.Duration
	for _, r := range p.Requests {
		prompt += float64(r.PromptTokens)
		answer += float64(r.Answer)
		if r.Err != "" {
			failed++
		} else if r.TTFT > 0 {
			ttfts = append(ttfts, r.TTFT)
		}
	}
	if n := float64(len(p.Requests)); n > 0 {
		prompt, answer = prompt/n, answer/n
	}
	half := p.Samples[len(p.Samples)/2:]
	for _, s := range half {
		decode += float64(s.DecodeTarget)
		prefill += float64(s.PrefillTarget)
	}
	if len(half) > 0 {
		decode, prefill = decode/float64(len(half)), prefill/float64(len(half))
	}
	for _, s := range p.Samples {
		decodeMax, prefillMax = max(decodeMax, s.DecodeTarget), max(prefillMax, s.PrefillTarget)
	}
	slices.Sort(ttfts)
	if len(ttfts) > 0 {
		ttft50, ttft99 = ttfts[len(ttfts)/2], ttfts[min(len(ttfts)-1, len(ttfts)*99/100)]
	}
	return prompt, answer, decode, prefill, decodeMax, prefillMax, ttft50, ttft99, failed
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# pdscale, %s\n\nOne disaggregated service on local replica-sim replicas, %.1f requests/s in every phase; host load %v.\n\n",
		r.Started.Format(time.RFC3339), r.Rate, r.Host["loadavg_start"])
	t := benchkit.Table{Header: []string{"phase", "trace", "requests", "prompt tokens (mean)", "answer tokens (mean)",
		"decode target (2nd half mean / max)", "prefill target (2nd half mean / max)", "TTFT p50 ms", "TTFT p99 ms", "failed"}}
	for i, p := range r.Phases {
		prompt, answer, dec, pre, decMax, preMax, t50, t99, failed := p.summary()
		t.Rows = append(t.Rows, []string{fmt.Sprint(i + 1), p.Trace, fmt.Sprint(len(p.Requests)), fmt.Sprintf("%.0f", prompt), fmt.Sprintf("%.0f", answer),
			fmt.Sprintf("%.1f / %d", dec, decMax), fmt.Sprintf("%.1f / %d", pre, preMax),
			fmt.Sprint(t50.Milliseconds()), fmt.Sprint(t99.Milliseconds()), fmt.Sprint(failed)})
	}
	t.Render(&b)
	b.WriteString("\n## Pools over time (targets, READY in brackets), every 10 s\n\n")
	tl := benchkit.Table{Header: []string{"phase", "t", "decode", "prefill"}}
	for i, p := range r.Phases {
		for _, s := range p.Samples {
			if s.At%(10*time.Second) == 0 {
				tl.Rows = append(tl.Rows, []string{fmt.Sprint(i + 1), s.At.String(), fmt.Sprintf("%d (%d)", s.DecodeTarget, s.DecodeReady),
					fmt.Sprintf("%d (%d)", s.PrefillTarget, s.PrefillReady)})
			}
		}
	}
	tl.Render(&b)
	return b.String()
}
