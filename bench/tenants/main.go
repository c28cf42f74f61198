// Command tenants measures Ferry as a gateway for many tenants: managed API keys through two
// attached proxies in front of one service of local `ferry replica-sim` replicas. It runs five
// phases (--phases) and judges each against issue 41's bars:
//
//   - fair share: a light interactive tenant's time to first token, alone and while a heavy
//     tenant saturates the fleet (bar: p99 within 1.5× of unloaded), and the same light load
//     sent under the heavy tenant's own key, so that it waits in the heavy tenant's line (what a
//     gateway without per-tenant queues gives);
//
//   - budget: a key with a daily token limit hammered through both proxies until it is spent
//     (bar: what was admitted within 5% of the limit; every refusal a 429 with Retry-After and
//     OpenAI's x-ratelimit-*-tokens headers);
//
//   - shedding: batch and interactive keys flooding a full queue (bar: batch shed first);
//
//   - usage: `ferry usage` against the tokens the replicas reported in their answers (bar: equal);
//
//   - cpu: two more attached proxies' CPU per request, one under a managed key and one under the
//     service's own key at the same time, roles swapped each round (cpu.go; bar: at most 1.10×).
//
//     go run ./bench/tenants                 # about 5 minutes
//     go run ./bench/tenants --phase 20s     # shorter
//     go run ./bench/tenants --phases cpu    # the CPU phase alone
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/azuretrace"
	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/servicekit"
)

const (
	serviceName = "tenants"
	model       = "ferry-sim-1b"
)

// Phases (--phases).
const (
	phaseFair   = "fair"
	phaseBudget = "budget"
	phaseShed   = "shed"
	phaseCPU    = "cpu"
)

var allPhases = []string{phaseFair, phaseBudget, phaseShed, phaseCPU}

func (o options) runs(phase string) bool { return slices.Contains(o.phases, phase) }

// options are the driver's flags.
type options struct {
	phase        time.Duration
	replicas     int
	maxNumSeqs   int
	heavyWorkers int
	lightRate    float64
	// lightPriority is the light tenant's class: standard shows fair share alone.
	lightPriority string
	budgetTokens  int64
	answerTokens  int
	trace         string
	ttft, itl     time.Duration
	// phases are the phases to run (usage always runs, over what the others sent).
	phases []string
	// cpuRounds and cpuRequests size the CPU phase (cpu.go).
	cpuRounds, cpuRequests int
	cpuPin                 int
	ferryBin               string
	out                    string
}

func main() { benchkit.Main("tenants", os.Args[1:], parseFlags, run) }

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("tenants", pflag.ContinueOnError)
	fs.DurationVar(&o.phase, "phase", 40*time.Second, "how long the saturated fair-share phase runs (the unloaded one runs a quarter of it)")
	fs.IntVar(&o.replicas, "replicas", 2, "replicas of the service")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 16, "each replica's batch (replica-sim --max-num-seqs): the proxies hold what exceeds it")
	fs.IntVar(&o.heavyWorkers, "heavy-workers", 48, "the heavy tenant's closed-loop streams, across both proxies")
	fs.Float64Var(&o.lightRate, "light-rate", 4, "the light tenant's requests per second")
	fs.StringVar(&o.lightPriority, "light-priority", "standard", "the light tenant's class (standard: fair share alone does it; interactive: its class goes first too)")
	fs.Int64Var(&o.budgetTokens, "budget-tokens", 30000, "the budget phase's key: total tokens per day")
	fs.IntVar(&o.answerTokens, "answer-tokens", 64, "cap on a request's answer length, drawn from --trace's (the budget phase's answers are this long)")
	fs.StringVar(&o.trace, "trace", filepath.Join("..", "shared", "data", "traces", "AzureLLMInferenceTrace_conv.csv"),
		"Azure LLM inference trace whose GeneratedTokens the answers' lengths are drawn from: equal lengths would end the heavy tenant's streams in cohorts")
	fs.DurationVar(&o.ttft, "sim-ttft", 200*time.Millisecond, "replica-sim --ttft: the unloaded time to first token")
	fs.DurationVar(&o.itl, "sim-itl", 20*time.Millisecond, "replica-sim --itl")
	fs.StringSliceVar(&o.phases, "phases", allPhases, "phases to run: fair, budget, shed, cpu (the usage check always runs, over what the others sent)")
	fs.IntVar(&o.cpuRounds, "cpu-rounds", 10, "rounds of the CPU phase (a managed key against the service's own key through two proxies at once, roles swapped each round; judged by pairs of rounds)")
	fs.IntVar(&o.cpuRequests, "cpu-requests", 20000, "requests a key in each round of the CPU phase, at most (a round ends when either key has sent this many)")
	fs.IntVar(&o.cpuPin, "cpu-pin", -1, "CPU the CPU phase's proxies are pinned to (taskset; a Go program pinned to one CPU runs GOMAXPROCS=1); -1 leaves it free")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results, logs and FERRY_HOME (default .cache/bench/tenants-TIMESTAMP in the repo)")
	fs.Usage = func() { fmt.Fprintf(os.Stderr, "Usage: go run ./bench/tenants [flags]\n\n%s", fs.FlagUsages()) }
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
	if o.phase < 5*time.Second || o.phase > time.Hour {
		bad("phase", o.phase, "must be between 5s and 1h")
	}
	if o.replicas < 1 || o.replicas > 8 {
		bad("replicas", o.replicas, "must be between 1 and 8 (this machine runs them all)")
	}
	if o.maxNumSeqs < 1 || o.heavyWorkers < 1 || o.heavyWorkers > 512 {
		bad("max-num-seqs/--heavy-workers", fmt.Sprintf("%d/%d", o.maxNumSeqs, o.heavyWorkers), "must be positive, workers at most 512")
	}
	if o.lightRate <= 0 || o.lightRate > 50 {
		bad("light-rate", o.lightRate, "must be positive and at most 50")
	}
	if o.budgetTokens < 1000 || o.answerTokens < 1 || o.answerTokens > 4096 {
		bad("budget-tokens/--answer-tokens", fmt.Sprintf("%d/%d", o.budgetTokens, o.answerTokens), "budget at least 1000, answers 1 to 4096 tokens")
	}
	if o.cpuRounds < 1 || o.cpuRounds > 50 || o.cpuRequests < 100 || o.cpuRequests > 1_000_000 {
		bad("cpu-rounds/--cpu-requests", fmt.Sprintf("%d/%d", o.cpuRounds, o.cpuRequests), "rounds 1 to 50, requests 100 to 1,000,000")
	}
	for _, p := range o.phases {
		if !slices.Contains(allPhases, p) {
			bad("phases", p, "want fair, budget, shed or cpu")
		}
	}
	return errors.Join(errs...)
}

// yaml is the service: fixed replicas that take managed keys only, a queue that sheds beyond
// 32 waiting requests, and late binding at each replica's batch.
func (o options) yaml() string {
	return fmt.Sprintf(`name: %s
resources:
  infra: local
service:
  readiness_probe: /health
  ports: 8080
  replicas: %d
  auth:
    managed_keys: true
  limits:
    max_in_flight_per_replica: %d
    max_queued_requests: 32
    max_queue_wait_seconds: 60
run: ferry replica-sim --port $FERRY_PORT --model %s --max-num-seqs %d --ttft %s --itl %s
`, serviceName, o.replicas, o.maxNumSeqs, model, o.maxNumSeqs, o.ttft, o.itl)
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

// execute brings the service and two attached proxies up, runs the phases and takes it all
// down. opts.out and opts.ferryBin are resolved in place (benchkit.Prepare).
func execute(ctx context.Context, opts *options, progress func(string, ...any)) (*report, error) {
	recs, err := azuretrace.Read(opts.trace) // before anything starts: a wrong path fails at once
	if err != nil {
		return nil, err
	}
	if opts.out, opts.ferryBin, err = benchkit.Prepare("tenants", opts.out, opts.ferryBin); err != nil {
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
	task := filepath.Join(opts.out, "tenants.yaml")
	if err := os.WriteFile(task, []byte(opts.yaml()), 0o644); err != nil {
		return nil, err
	}
	progress("serve up %s", task)
	if out, err := f.Run(ctx, "serve-up", 3*time.Minute, "serve", "up", task, "-y"); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, servicekit.LastLines(out, 20))
	}
	defer func() {
		progress("teardown: ferry serve down, ferry controller stop")
		_, _ = f.Run(context.WithoutCancel(ctx), "serve-down", 2*time.Minute, "serve", "down", serviceName, "-y")
		if out, err := f.Run(context.WithoutCancel(ctx), "controller-stop", time.Minute, "controller", "stop"); err != nil {
			progress("ferry controller stop: %v\n%s", err, servicekit.LastLines(out, 5))
		}
	}()
	b, err := setUp(ctx, f, *opts, progress)
	if err != nil {
		return nil, err
	}
	defer b.stopProxies()
	for _, r := range recs {
		b.answers = append(b.answers, min(max(r.GeneratedTokens, 1), opts.answerTokens))
	}
	rep := &report{Started: time.Now(), YAML: opts.yaml(), Options: fmt.Sprintf("%+v", *opts),
		Host: map[string]any{"cpus": runtime.NumCPU(), "loadavg_start": benchkit.LoadAvg(), "go": runtime.Version()}}
	if err := b.runPhases(ctx, rep, progress); err != nil {
		return nil, err
	}
	rep.Host["loadavg_end"] = benchkit.LoadAvg()
	return rep, nil
}
