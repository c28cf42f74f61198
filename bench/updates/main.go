// Command updates measures what `ferry serve update` costs a service's clients: a service of
// local replica-sim replicas under steady mixed load (non-streamed and streamed chat
// completions from closed-loop workers) is taken through four updates in sequence: (a) a rolling
// update, (b) a blue-green update, (c) an update to a version whose replicas crash at start,
// which must roll back, and (d) a rolling update during which the controller is SIGKILLed and
// restarted, with the load going through a standalone `ferry proxy --attach`. Each request
// records which version answered it (the model name). A scenario passes when no request
// failed, the rollout ended as expected, and afterwards only the right version answered.
// See bench/README.md.
//
//	go run ./bench/updates              # about 2 minutes
//	go run ./bench/updates --short      # less load, shorter phases: what the tests run
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/loadgen"
	"github.com/ferryserve/ferry/bench/servicekit"
)

// options are the driver's flags.
type options struct {
	short          bool
	replicas       int
	workers        int
	before         time.Duration
	after          time.Duration
	maxParallel    int
	minHealthy     int
	startupDelay   time.Duration
	ttft           time.Duration
	itl            time.Duration
	plainTokens    int
	streamTokens   int
	rolloutTimeout time.Duration
	requestTimeout time.Duration
	settle         time.Duration
	ferryBin       string
	out            string
}

func main() {
	benchkit.Main("updates", os.Args[1:], parseFlags, run)
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("updates", pflag.ContinueOnError)
	fs.BoolVar(&o.short, "short", false, "less load and shorter phases (4 workers, 2s before, 1s after, max_parallel 2), unless set explicitly: what the tests run")
	fs.IntVar(&o.replicas, "replicas", 4, "replicas of the service")
	fs.IntVar(&o.workers, "workers", 8, "closed-loop workers: half non-streamed requests (rounded up), half streams")
	fs.DurationVar(&o.before, "before", 5*time.Second, "load before each update")
	fs.DurationVar(&o.after, "after", 3*time.Second, "load after each rollout ends")
	fs.IntVar(&o.maxParallel, "max-parallel", 1, "service.update.max_parallel")
	fs.IntVar(&o.minHealthy, "min-healthy-seconds", 1, "service.update.min_healthy_seconds")
	fs.DurationVar(&o.startupDelay, "sim-startup-delay", time.Second, "replica-sim --startup-delay (503 until loaded)")
	fs.DurationVar(&o.ttft, "sim-ttft", 50*time.Millisecond, "replica-sim --ttft")
	fs.DurationVar(&o.itl, "sim-itl", 20*time.Millisecond, "replica-sim --itl")
	fs.IntVar(&o.plainTokens, "plain-tokens", 8, "max_tokens of non-streamed requests")
	fs.IntVar(&o.streamTokens, "stream-tokens", 24, "max_tokens of streamed requests")
	fs.DurationVar(&o.rolloutTimeout, "rollout-timeout", 3*time.Minute, "give up on a rollout that has not ended after this long")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 30*time.Second, "bound on one request, stream included")
	fs.DurationVar(&o.settle, "settle", 500*time.Millisecond, "after a rollout ends, how long the old version may still answer new requests (the proxies learn of the change a moment later) before it fails the scenario")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results, logs and FERRY_HOME (default .cache/bench/updates-TIMESTAMP in the repo)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go run ./bench/updates [flags]\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.short {
		shortDefaults := []struct {
			flag string
			set  func()
		}{
			{"workers", func() { o.workers = 4 }},
			{"before", func() { o.before = 2 * time.Second }},
			{"after", func() { o.after = time.Second }},
			{"max-parallel", func() { o.maxParallel = 2 }},
		}
		for _, d := range shortDefaults {
			if !fs.Changed(d.flag) {
				d.set()
			}
		}
	}
	return o, o.validate()
}

func (o options) validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	if o.replicas < 1 || o.replicas > 16 {
		bad("replicas", o.replicas, "must be between 1 and 16")
	}
	if o.workers < 2 || o.workers > 256 {
		bad("workers", o.workers, "must be between 2 and 256 (at least one of each kind)")
	}
	for _, d := range []struct {
		flag     string
		v, limit time.Duration
	}{{"before", o.before, 10 * time.Minute}, {"after", o.after, 10 * time.Minute},
		{"rollout-timeout", o.rolloutTimeout, 20 * time.Minute}, {"request-timeout", o.requestTimeout, 5 * time.Minute}} {
		if d.v <= 0 || d.v > d.limit {
			bad(d.flag, d.v, fmt.Sprintf("must be positive and at most %v", d.limit))
		}
	}
	if o.settle < 0 || o.settle > time.Minute {
		bad("settle", o.settle, "must be between 0 and 1m")
	}
	if o.maxParallel < 1 || o.maxParallel > o.replicas {
		bad("max-parallel", o.maxParallel, "must be between 1 and --replicas")
	}
	if o.minHealthy < 0 || o.minHealthy > 600 {
		bad("min-healthy-seconds", o.minHealthy, "must be between 0 and 600")
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"sim-startup-delay", o.startupDelay}, {"sim-ttft", o.ttft}, {"sim-itl", o.itl}} {
		if d.v < 0 || d.v > time.Minute {
			bad(d.flag, d.v, "must be between 0 and 1m")
		}
	}
	if o.plainTokens < 1 || o.plainTokens > 4096 || o.streamTokens < 1 || o.streamTokens > 4096 {
		bad("plain-tokens/--stream-tokens", fmt.Sprintf("%d/%d", o.plainTokens, o.streamTokens), "must be between 1 and 4096")
	}
	return errors.Join(errs...)
}

// spec is the part of every version's YAML the flags set.
func (o options) spec() taskSpec {
	return taskSpec{Replicas: o.replicas, MaxParallel: o.maxParallel, MinHealthySeconds: o.minHealthy,
		InitialDelaySeconds: 30, StartupDelay: o.startupDelay, TTFT: o.ttft, ITL: o.itl}
}

func run(opts options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer servicekit.OnSignal(cancel)()
	rep, err := execute(ctx, opts, os.Stdout, benchkit.Progress)
	if err != nil {
		return err
	}
	var problems []string
	if failed := rep.failed(); len(failed) > 0 {
		problems = append(problems, fmt.Sprintf("scenario(s) %s failed", strings.Join(failed, ", ")))
	}
	if len(rep.Teardown) > 0 {
		problems = append(problems, fmt.Sprintf("teardown found %d problem(s)", len(rep.Teardown)))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// execute runs the benchmark: build, bring the service up, the scenarios, teardown, report.
// It returns the report whatever the verdicts; an error means the run itself could not be
// completed.
func execute(ctx context.Context, opts options, stdout io.Writer, progress func(string, ...any)) (*report, error) {
	var err error
	if opts.out, opts.ferryBin, err = benchkit.Prepare("updates", opts.out, opts.ferryBin); err != nil {
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
	taskDir := filepath.Join(opts.out, "tasks")
	if err := os.MkdirAll(taskDir, 0o755); err != nil {
		return nil, err
	}
	b := &bench{opts: opts, f: f, spec: opts.spec(), taskDir: taskDir, progress: progress}
	rep := &report{
		Started: time.Now(),
		opts:    opts,
		Host:    map[string]any{"cpus": runtime.NumCPU(), "loadavg_start": benchkit.LoadAvg(), "go": runtime.Version()},
		Settings: map[string]any{
			"replicas": opts.replicas, "workers": opts.workers, "before_s": opts.before.Seconds(), "after_s": opts.after.Seconds(),
			"max_parallel": opts.maxParallel, "min_healthy_seconds": opts.minHealthy, "startup_delay_s": opts.startupDelay.Seconds(),
			"ttft_ms": opts.ttft.Seconds() * 1e3, "itl_ms": opts.itl.Seconds() * 1e3, "plain_max_tokens": opts.plainTokens,
			"stream_max_tokens": opts.streamTokens, "short": opts.short, "ferry_home": f.Home.Dir, "settle_ms": loadgen.Ms(opts.settle),
		},
	}
	progress("output, logs and FERRY_HOME under %s", opts.out)

	setupErr := b.setup(ctx)
	if setupErr == nil {
		for _, def := range scenarios() {
			if ctx.Err() != nil {
				break
			}
			res := b.runScenario(ctx, def)
			rep.Results = append(rep.Results, res)
			progress("scenario %s: %s: %d requests, %d failed, rollout %s in %.1f s, after it %s%s",
				res.Key, yesNo(res.Passed), res.Requests, res.Failed, orDash(res.State), res.RolloutWallS,
				modelsCell(res.After.Models), errSuffix(res.Error))
		}
	}
	rep.Proxy = "serving at " + b.proxyAddr
	if b.proxyErr != nil {
		rep.Proxy = "not available: " + b.proxyErr.Error()
	}
	progress("teardown: ferry serve down, ferry controller stop")
	rep.Teardown = b.teardown()
	if setupErr != nil {
		return rep, fmt.Errorf("setup: %w (logs under %s)", setupErr, filepath.Join(opts.out, "logs"))
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	return rep, rep.write(stdout, opts.out)
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (error: " + e + ")"
}
