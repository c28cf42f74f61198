// Command faults measures what happens to a service's clients when something breaks: a service
// of local replica-sim replicas under steady mixed load (non-streamed and streamed chat
// completions from closed-loop workers) goes through one fault at a time, healed in between:
// a replica SIGKILLed, a replica SIGSTOPped (hung, not dead) and resumed, a replica whose
// readiness flaps, a replica answering 500s and slow responses, the controller SIGKILLed and
// restarted, the disk under FERRY_HOME full, and the proxy's upstream connections exhausted by
// a flood of slow streams. For each fault it reports requests, client-visible failures
// (streams cut without an SSE error event counted apart, as defects), how long until the
// replica set healed, and leaks afterwards (controller file descriptors and goroutines, replica
// processes, store rows). Two more faults come from hostile clients, against a keyed standalone
// proxy: clients announcing large bodies without a valid key, and a flood of idle connections
// past the descriptor limits of that proxy and of the controller, whose gateway it also hits.
// It exits non-zero when a target is missed. See bench/README.md.
//
//	go run ./bench/faults              # about 4 minutes
//	go run ./bench/faults --short      # shorter faults and phases: what the tests run
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
	"github.com/ferryserve/ferry/bench/servicekit"
)

// options are the driver's flags.
type options struct {
	short          bool
	only           []string
	replicas       int
	workers        int
	before         time.Duration
	after          time.Duration
	hangFor        time.Duration
	flapFor        time.Duration
	flapPeriod     time.Duration
	faultFor       time.Duration
	errorRate      float64
	slowRate       float64
	slowDelay      time.Duration
	diskFullFor    time.Duration
	tmpfsSize      string
	floodStreams   int
	floodRamp      time.Duration
	floodHold      time.Duration
	bodyClients    int
	bodyFor        time.Duration
	connFlood      int
	healTimeout    time.Duration
	leakWait       time.Duration
	requestTimeout time.Duration
	startupDelay   time.Duration
	ttft           time.Duration
	itl            time.Duration
	plainTokens    int
	streamTokens   int
	ferryBin       string
	out            string
}

func main() {
	benchkit.Main("faults", os.Args[1:], parseFlags, run)
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("faults", pflag.ContinueOnError)
	fs.BoolVar(&o.short, "short", false, "shorter faults and phases (4 workers, 1s before and after, 4s hang, 6s flapping, 3s of errors, of disk full and of body announcements, 2s flood), unless set explicitly: what the tests run")
	fs.StringSliceVar(&o.only, "only", nil, "run only these scenarios, by key ("+strings.Join(scenarioKeys(), ",")+")")
	fs.IntVar(&o.replicas, "replicas", 4, "replicas of the service")
	fs.IntVar(&o.workers, "workers", 8, "closed-loop workers: half non-streamed requests (rounded up), half streams")
	fs.DurationVar(&o.before, "before", 3*time.Second, "steady load before each fault")
	fs.DurationVar(&o.after, "after", 2*time.Second, "steady load after the service healed")
	fs.DurationVar(&o.hangFor, "hang-for", 10*time.Second, "how long the hung replica stays SIGSTOPped")
	fs.DurationVar(&o.flapFor, "flap-for", 12*time.Second, "how long the replica's readiness flaps")
	fs.DurationVar(&o.flapPeriod, "flap-period", 3*time.Second, "replica-sim --flap-period of the flapping replica (the controller probes every 2s)")
	fs.DurationVar(&o.faultFor, "errors-for", 8*time.Second, "how long the replica answers errors and slow responses")
	fs.Float64Var(&o.errorRate, "error-rate", 0.5, "replica-sim --error-rate of the misbehaving replica")
	fs.Float64Var(&o.slowRate, "slow-rate", 0.3, "replica-sim --slow-rate of the misbehaving replica")
	fs.DurationVar(&o.slowDelay, "slow-delay", 2*time.Second, "replica-sim --slow-delay of the misbehaving replica")
	fs.DurationVar(&o.diskFullFor, "disk-full-for", 8*time.Second, "how long the disk under FERRY_HOME stays full")
	fs.StringVar(&o.tmpfsSize, "tmpfs-size", "64m", "size of the tmpfs FERRY_HOME lives on (needs root)")
	fs.IntVar(&o.floodStreams, "flood-streams", 0, "streams of the connection-exhaustion flood (0: replicas × the proxy's 1024 connections per replica + 256)")
	fs.DurationVar(&o.floodRamp, "flood-ramp", 2*time.Second, "how long opening the flood's streams takes")
	fs.DurationVar(&o.floodHold, "flood-hold", 5*time.Second, "how long the flood's streams (and fault 9's connections) stay open after the last was opened")
	fs.IntVar(&o.bodyClients, "body-clients", 100, "clients announcing 32 MiB bodies with a wrong key in fault 8 (plus 3 announcing 1 GiB without a key)")
	fs.DurationVar(&o.bodyFor, "body-for", 8*time.Second, "how long fault 8's clients keep announcing bodies")
	fs.IntVar(&o.connFlood, "conn-flood", 1500, "idle connections fault 9 opens to each of the standalone proxy (512 open files) and the gateway (1024)")
	fs.DurationVar(&o.healTimeout, "heal-timeout", 90*time.Second, "give up on a service that has not healed after this long")
	fs.DurationVar(&o.leakWait, "leak-wait", 25*time.Second, "how long descriptors and goroutines may take to come back down after a fault (idle upstream connections and fasthttp's idle server workers live 10-20s)")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 30*time.Second, "bound on one request, stream included")
	fs.DurationVar(&o.startupDelay, "sim-startup-delay", time.Second, "replica-sim --startup-delay (503 until loaded)")
	fs.DurationVar(&o.ttft, "sim-ttft", 50*time.Millisecond, "replica-sim --ttft")
	fs.DurationVar(&o.itl, "sim-itl", 20*time.Millisecond, "replica-sim --itl")
	fs.IntVar(&o.plainTokens, "plain-tokens", 8, "max_tokens of non-streamed requests")
	fs.IntVar(&o.streamTokens, "stream-tokens", 24, "max_tokens of streamed requests")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results, logs and FERRY_HOME (default .cache/bench/faults-TIMESTAMP in the repo)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go run ./bench/faults [flags]\n\n%s", fs.FlagUsages())
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
			{"before", func() { o.before = time.Second }},
			{"after", func() { o.after = time.Second }},
			{"hang-for", func() { o.hangFor = 4 * time.Second }},
			{"flap-for", func() { o.flapFor = 6 * time.Second }},
			{"errors-for", func() { o.faultFor = 3 * time.Second }},
			{"disk-full-for", func() { o.diskFullFor = 3 * time.Second }},
			{"flood-ramp", func() { o.floodRamp = 1500 * time.Millisecond }},
			{"flood-hold", func() { o.floodHold = 2 * time.Second }},
			{"body-for", func() { o.bodyFor = 3 * time.Second }},
		}
		for _, d := range shortDefaults {
			if !fs.Changed(d.flag) {
				d.set()
			}
		}
	}
	if o.floodStreams == 0 {
		o.floodStreams = o.replicas*proxyConnsPerReplica + 256
	}
	return o, o.validate()
}

// proxyConnsPerReplica is the proxy's connection pool per replica (upstreamMaxConns in
// proxy/upstream.go): a flood above replicas times this exhausts every pool.
const proxyConnsPerReplica = 1024

func (o options) validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	if o.replicas < 2 || o.replicas > 16 {
		bad("replicas", o.replicas, "must be between 2 and 16 (a fault must leave a healthy replica)")
	}
	if o.workers < 2 || o.workers > 256 {
		bad("workers", o.workers, "must be between 2 and 256 (at least one of each kind)")
	}
	for _, d := range []struct {
		flag     string
		v, limit time.Duration
	}{{"before", o.before, 10 * time.Minute}, {"after", o.after, 10 * time.Minute}, {"hang-for", o.hangFor, 10 * time.Minute},
		{"flap-for", o.flapFor, 10 * time.Minute}, {"flap-period", o.flapPeriod, time.Minute}, {"errors-for", o.faultFor, 10 * time.Minute},
		{"slow-delay", o.slowDelay, time.Minute}, {"disk-full-for", o.diskFullFor, 10 * time.Minute}, {"flood-ramp", o.floodRamp, time.Minute},
		{"flood-hold", o.floodHold, 10 * time.Minute}, {"body-for", o.bodyFor, 10 * time.Minute},
		{"heal-timeout", o.healTimeout, 20 * time.Minute}, {"leak-wait", o.leakWait, 5 * time.Minute},
		{"request-timeout", o.requestTimeout, 5 * time.Minute}} {
		if d.v <= 0 || d.v > d.limit {
			bad(d.flag, d.v, fmt.Sprintf("must be positive and at most %v", d.limit))
		}
	}
	if !(o.errorRate >= 0 && o.slowRate >= 0 && o.errorRate+o.slowRate <= 1) {
		bad("error-rate/--slow-rate", fmt.Sprintf("%v/%v", o.errorRate, o.slowRate), "must not be negative and must add up to at most 1")
	}
	if o.floodStreams < 1 || o.floodStreams > 8000 {
		bad("flood-streams", o.floodStreams, "must be between 1 and 8000")
	}
	if o.bodyClients < 1 || o.bodyClients > 1000 {
		bad("body-clients", o.bodyClients, "must be between 1 and 1000")
	}
	if o.connFlood <= controllerNofile || o.connFlood > 8000 {
		bad("conn-flood", o.connFlood, fmt.Sprintf("must be above the controller's limit of %d open files, and at most 8000", controllerNofile))
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
	known := map[string]bool{}
	for _, k := range scenarioKeys() {
		known[k] = true
	}
	for _, k := range o.only {
		if !known[k] {
			bad("only", k, "is not a scenario ("+strings.Join(scenarioKeys(), ", ")+")")
		}
	}
	return errors.Join(errs...)
}

func run(opts options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer servicekit.OnSignal(cancel)()
	rep, err := execute(ctx, opts, os.Stdout, benchkit.Progress)
	if err != nil {
		return err
	}
	if problems := rep.problems(); len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// execute runs the benchmark: build, mount, bring the service up, the scenarios, teardown,
// report. It returns the report whatever the verdicts; an error means the run itself could not
// be completed.
func execute(ctx context.Context, opts options, stdout io.Writer, progress func(string, ...any)) (rep *report, err error) {
	if opts.out, opts.ferryBin, err = benchkit.Prepare("faults", opts.out, opts.ferryBin); err != nil {
		return nil, err
	}
	rep = &report{
		Started: time.Now(),
		opts:    opts,
		Host:    map[string]any{"cpus": runtime.NumCPU(), "loadavg_start": benchkit.LoadAvg(), "go": runtime.Version()},
	}

	homeDir := filepath.Join(opts.out, "home")
	if ok, why := canMount(); ok {
		if err := mountTmpfs(homeDir, opts.tmpfsSize); err != nil {
			return nil, err
		}
		rep.Tmpfs = fmt.Sprintf("FERRY_HOME %s is a %s tmpfs", homeDir, opts.tmpfsSize)
		defer func() {
			// The tmpfs goes with its logs: keep them.
			if cerr := copyLogs(homeDir, filepath.Join(opts.out, "logs", "home")); cerr != nil {
				rep.Teardown = append(rep.Teardown, "keeping FERRY_HOME's logs: "+cerr.Error())
			}
			if uerr := unmountTmpfs(homeDir); uerr != nil {
				rep.Teardown = append(rep.Teardown, uerr.Error())
				if err == nil {
					err = uerr
				}
			}
		}()
	} else {
		rep.Tmpfs = "no tmpfs: " + why
		progress("no tmpfs for FERRY_HOME: %s; the disk-full scenario cannot run", why)
	}

	group, err := childproc.NewGroup(filepath.Join(opts.out, "logs"))
	if err != nil {
		return nil, err
	}
	defer group.Close()
	metricsAddr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	gatewayAddr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	f, err := newFerry(opts.ferryBin, homeDir, metricsAddr, gatewayAddr, group)
	if err != nil {
		return nil, err
	}
	b := &bench{opts: opts, f: f, home: homeDir, tmpfs: strings.HasPrefix(rep.Tmpfs, "FERRY_HOME"),
		faultsDir: filepath.Join(opts.out, "faults"), taskDir: filepath.Join(opts.out, "tasks"), progress: progress}
	for _, dir := range []string{b.faultsDir, b.taskDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	rep.Settings = opts.settings(homeDir, metricsAddr)
	progress("output and logs under %s; %s", opts.out, rep.Tmpfs)

	setupErr := b.setup(ctx)
	if setupErr == nil {
		rep.Endpoint, rep.Proxy = b.endpoint, b.proxyAddr
		for _, def := range scenarios() {
			if ctx.Err() != nil {
				break
			}
			if !opts.selected(def.Key) {
				continue
			}
			res := b.runScenario(ctx, def)
			rep.Results = append(rep.Results, res)
			progress("scenario %s (%s): %s: %s", res.Key, res.Title, verdict(res), res.summaryLine())
		}
	}
	progress("teardown: ferry serve down, ferry controller stop")
	rep.Teardown = append(rep.Teardown, b.teardown(rep)...)
	if setupErr != nil {
		return rep, fmt.Errorf("setup: %w (logs under %s)", setupErr, filepath.Join(opts.out, "logs"))
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	return rep, rep.write(stdout, opts.out)
}

func (o options) selected(key string) bool {
	if len(o.only) == 0 {
		return true
	}
	for _, k := range o.only {
		if k == key {
			return true
		}
	}
	return false
}

func (o options) settings(home, metricsAddr string) map[string]any {
	return map[string]any{
		"replicas": o.replicas, "workers": o.workers, "before_s": o.before.Seconds(), "after_s": o.after.Seconds(),
		"hang_for_s": o.hangFor.Seconds(), "flap_for_s": o.flapFor.Seconds(), "flap_period_s": o.flapPeriod.Seconds(),
		"errors_for_s": o.faultFor.Seconds(), "error_rate": o.errorRate, "slow_rate": o.slowRate, "slow_delay_s": o.slowDelay.Seconds(),
		"disk_full_for_s": o.diskFullFor.Seconds(), "tmpfs_size": o.tmpfsSize, "flood_streams": o.floodStreams,
		"flood_ramp_s": o.floodRamp.Seconds(), "flood_hold_s": o.floodHold.Seconds(), "startup_delay_s": o.startupDelay.Seconds(),
		"body_clients": o.bodyClients, "body_for_s": o.bodyFor.Seconds(), "conn_flood": o.connFlood,
		"proxy_nofile": proxyNofile, "controller_nofile": controllerNofile,
		"ttft_ms": o.ttft.Seconds() * 1e3, "itl_ms": o.itl.Seconds() * 1e3, "plain_max_tokens": o.plainTokens,
		"stream_max_tokens": o.streamTokens, "short": o.short, "ferry_home": home, "controller_metrics": metricsAddr,
	}
}
