// Command proxyload measures what a reverse proxy costs on loopback: a fast backend reached
// directly, through `ferry proxy`, through nginx (the reference peer) and through a bare
// fasthttp pass-through of the same build (passthrough.go: the floor of any proxy on fasthttp
// and Go's runtime, against which Ferry's own work shows) and through a pass-through on one
// epoll loop (epoll.go: the floor of a Go proxy not built on goroutines), with non-streamed
// requests at concurrency 64 and SSE streams at concurrency 32, then 5,000 concurrent streams
// through one Ferry process for its memory. The proxies are pinned to one core, the load
// generator (this process) and the backend to the other. On two cores the load generator, not
// the proxy, caps req/s, so the proxy's CPU time per request (from /proc) is the figure that
// compares proxies. See bench/README.md.
//
//	go run ./bench/proxyload                     # defaults: 10 s per measurement, one repetition
//	go run ./bench/proxyload --duration 3s --streams5k 1000   # a quick check
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/loadgen"
)

// Target and scenario names.
const (
	targetDirect = "direct"
	targetFerry  = "ferry"
	targetNginx  = "nginx"
	targetPass   = "passthrough"
	targetEpoll  = "epoll"
	// targetFerryOTLP is `ferry proxy` exporting a span tree per request to a collector
	// stand-in in this process (collector.go); measured only when named in --targets.
	targetFerryOTLP = "ferry-otlp"

	scenarioNonStream = "nonstream"
	scenarioStream    = "stream"
)

var (
	allTargets   = []string{targetDirect, targetFerry, targetNginx, targetPass, targetEpoll}
	allScenarios = []string{scenarioNonStream, scenarioStream}
	// knownTargets are allTargets and those measured only on request.
	knownTargets = append(slices.Clone(allTargets), targetFerryOTLP)
)

// options are the driver's flags.
type options struct {
	duration          time.Duration
	warmup            time.Duration
	requests          int64
	concurrency       int
	streamConcurrency int
	scenarios         []string
	targets           []string
	reps              int
	chunks            int
	chunkGap          time.Duration
	timeout           time.Duration

	backends int

	streams5k         int
	streams5kBackends int
	streams5kGap      time.Duration
	streams5kRamp     time.Duration
	streams5kTargets  []string

	proxyCPU    int
	loadCPU     int
	ferryBin    string
	ferryPolicy string
	out         string
	installDeps bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "backend" {
		if err := runBackend(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "proxyload backend:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == targetEpoll {
		epollMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == targetPass {
		if err := runPassThrough(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "proxyload passthrough:", err)
			os.Exit(1)
		}
		return
	}
	benchkit.Main("proxyload", os.Args[1:], parseFlags, run)
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("proxyload", pflag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measurement")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each measurement")
	fs.Int64Var(&o.requests, "requests", 2_000_000, "cap on requests (or streams) per measurement; the run ends at the duration or the cap")
	fs.IntVar(&o.concurrency, "concurrency", 64, "concurrent non-streamed requests")
	fs.IntVar(&o.streamConcurrency, "stream-concurrency", 32, "concurrent streams")
	fs.StringSliceVar(&o.scenarios, "scenarios", allScenarios, "workloads to run: nonstream, stream")
	fs.StringSliceVar(&o.targets, "targets", allTargets, "paths to measure: direct, ferry, nginx, passthrough (a bare fasthttp proxy: what any proxy on fasthttp costs), epoll (a bare pass-through on one epoll loop: what a Go proxy not built on goroutines costs), ferry-otlp (ferry with every request traced to a collector stand-in; not by default)")
	fs.IntVar(&o.reps, "reps", 1, "repetitions; the target order rotates each one and the tables show medians")
	fs.IntVar(&o.chunks, "chunks", 32, "SSE chunks per stream")
	fs.DurationVar(&o.chunkGap, "chunk-gap", 5*time.Millisecond, "pause between SSE chunks")
	fs.DurationVar(&o.timeout, "request-timeout", 30*time.Second, "bound on one request or stream")
	fs.IntVar(&o.backends, "backends", 1, "backend ports (replicas) behind the proxies")
	fs.IntVar(&o.streams5k, "streams5k", 5000, "concurrent SSE streams in the memory test; 0 skips it")
	fs.IntVar(&o.streams5kBackends, "streams5k-backends", 8, "backend ports (replicas) in the memory test: a real replica serves hundreds of streams, not thousands")
	fs.DurationVar(&o.streams5kGap, "streams5k-gap", 500*time.Millisecond, "pause between chunks in the memory test (32 chunks per stream)")
	fs.DurationVar(&o.streams5kRamp, "streams5k-ramp", 5*time.Second, "time over which the memory test opens its streams")
	fs.StringSliceVar(&o.streams5kTargets, "streams5k-targets", []string{targetFerry, targetNginx}, "proxies in the memory test")
	fs.IntVar(&o.proxyCPU, "proxy-cpu", 0, "CPU the proxies are pinned to; -1 disables all pinning")
	fs.IntVar(&o.loadCPU, "load-cpu", 1, "CPU of the load generator and backend; -1 disables all pinning")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary to measure (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.ferryPolicy, "ferry-policy", "", "--policy for ferry proxy (default: ferry's default)")
	fs.StringVar(&o.out, "out", "", "directory for results and logs (default .cache/bench/proxyload-TIMESTAMP in the repo)")
	fs.BoolVar(&o.installDeps, "install-deps", false, "run scripts/bench-deps.sh when nginx or taskset is missing")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go run ./bench/proxyload [flags]\n\n%s", fs.FlagUsages())
	}
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
	if o.duration <= 0 || o.duration > 10*time.Minute {
		bad("duration", o.duration, "must be positive and at most 10m")
	}
	if o.warmup < 0 || o.warmup > time.Minute {
		bad("warmup", o.warmup, "must be between 0 and 1m")
	}
	if o.requests < 1 {
		bad("requests", o.requests, "must be at least 1")
	}
	if o.concurrency < 1 || o.concurrency > 4096 {
		bad("concurrency", o.concurrency, "must be between 1 and 4096")
	}
	if o.streamConcurrency < 1 || o.streamConcurrency > 4096 {
		bad("stream-concurrency", o.streamConcurrency, "must be between 1 and 4096")
	}
	for _, s := range o.scenarios {
		if !slices.Contains(allScenarios, s) {
			bad("scenarios", s, "want nonstream or stream")
		}
	}
	for _, t := range append(slices.Clone(o.targets), o.streams5kTargets...) {
		if !slices.Contains(knownTargets, t) {
			bad("targets", t, "want direct, ferry, nginx, passthrough, epoll or ferry-otlp")
		}
	}
	if slices.Contains(o.streams5kTargets, targetDirect) {
		bad("streams5k-targets", targetDirect, "the memory test measures proxies only")
	}
	if o.reps < 1 || o.reps > 20 {
		bad("reps", o.reps, "must be between 1 and 20")
	}
	if o.chunks < 1 || o.chunks > maxChunks {
		bad("chunks", o.chunks, fmt.Sprintf("must be between 1 and %d", maxChunks))
	}
	if o.chunkGap < 0 || o.chunkGap > time.Second {
		bad("chunk-gap", o.chunkGap, "must be between 0 and 1s")
	}
	if o.timeout <= 0 || o.timeout > 10*time.Minute {
		bad("request-timeout", o.timeout, "must be positive and at most 10m")
	}
	if o.backends < 1 || o.backends > 64 {
		bad("backends", o.backends, "must be between 1 and 64")
	}
	if o.streams5kBackends < 1 || o.streams5kBackends > 64 {
		bad("streams5k-backends", o.streams5kBackends, "must be between 1 and 64")
	}
	if o.streams5k < 0 || o.streams5k > loadgen.MaxConcurrency {
		bad("streams5k", o.streams5k, fmt.Sprintf("must be between 0 and %d", loadgen.MaxConcurrency))
	}
	if o.streams5kGap < 0 || o.streams5kGap > 5*time.Second {
		bad("streams5k-gap", o.streams5kGap, "must be between 0 and 5s")
	}
	if o.streams5kRamp < 0 || o.streams5kRamp > 2*time.Minute {
		bad("streams5k-ramp", o.streams5kRamp, "must be between 0 and 2m")
	}
	if (o.proxyCPU < 0) != (o.loadCPU < 0) {
		bad("proxy-cpu", o.proxyCPU, "and --load-cpu must both be -1 (no pinning) or both CPUs")
	} else if o.proxyCPU >= 0 {
		if o.proxyCPU == o.loadCPU {
			bad("proxy-cpu", o.proxyCPU, "must differ from --load-cpu")
		}
		if n := runtime.NumCPU(); o.proxyCPU >= n || o.loadCPU >= n {
			bad("proxy-cpu", o.proxyCPU, fmt.Sprintf("and --load-cpu=%d must be below the CPU count %d", o.loadCPU, n))
		}
	}
	return errors.Join(errs...)
}

func (o options) pinned() bool { return o.proxyCPU >= 0 }

// needs reports whether the run starts the given target at all.
func (o options) needs(target string) bool {
	return slices.Contains(o.targets, target) || o.streams5k > 0 && slices.Contains(o.streams5kTargets, target)
}

func run(opts options) error {
	root, err := benchkit.RepoRoot()
	if err != nil {
		return err
	}
	if err := ensureDeps(opts, root); err != nil {
		return err
	}
	if opts.out, err = benchkit.OutDir(root, "proxyload", opts.out); err != nil {
		return err
	}
	if (opts.needs(targetFerry) || opts.needs(targetFerryOTLP)) && opts.ferryBin == "" {
		if opts.ferryBin, err = benchkit.BuildFerry(root, opts.out); err != nil {
			return err
		}
	}
	// Pin after building, so the build has both cores.
	if opts.pinned() {
		if err := pinSelf(opts.loadCPU); err != nil {
			return fmt.Errorf("pinning the load generator: %w", err)
		}
	}

	group, err := childproc.NewGroup(filepath.Join(opts.out, "logs"))
	if err != nil {
		return err
	}
	defer group.Close()
	defer group.StopOnSignal()()
	ctx := context.Background()

	b := &bench{opts: opts, group: group, ctx: ctx, report: newReport(opts)}
	if err := b.startBackend(); err != nil {
		return err
	}
	for _, name := range []string{targetFerry, targetNginx, targetPass, targetEpoll, targetFerryOTLP} {
		if slices.Contains(opts.targets, name) {
			if err := b.startTarget(name, b.backends[:opts.backends]); err != nil {
				return err
			}
		}
	}
	if err := b.measureAll(); err != nil {
		return err
	}
	if opts.streams5k > 0 {
		for _, name := range opts.streams5kTargets {
			if err := b.measureManyStreams(name); err != nil {
				return err
			}
		}
	}
	return b.report.write(os.Stdout, opts.out)
}

// ensureDeps checks for nginx and taskset, running scripts/bench-deps.sh when asked to.
func ensureDeps(opts options, root string) error {
	var missing []string
	if opts.needs(targetNginx) {
		if _, err := nginxBinary(); err != nil {
			missing = append(missing, "nginx")
		}
	}
	if opts.pinned() {
		if _, err := exec.LookPath("taskset"); err != nil {
			missing = append(missing, "taskset")
		}
	}
	if len(missing) == 0 {
		return nil
	}
	script := filepath.Join(root, "scripts", "bench-deps.sh")
	if !opts.installDeps {
		return fmt.Errorf("missing %s: run %s (or pass --install-deps)", strings.Join(missing, " and "), script)
	}
	cmd := exec.Command(script)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", script, err)
	}
	return nil
}
