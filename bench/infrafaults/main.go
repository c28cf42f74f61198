// Command infrafaults measures what one failing infra does to the rest of Ferry (issue 32): a
// controller with every infra enabled — local, fake EC2 and Compute Engine in this process (their
// VMs are local processes), and a real Kubernetes API server — goes through one infra fault at a
// time: GCP answering 503 everywhere, one GCP zone answering 404, an EC2 endpoint that accepts
// and never answers, EC2 throttling, the Kubernetes API server stopped mid-run, and GCP down for
// a while and then back (with the controller SIGKILLed and restarted during the outage).
//
// For each fault, with a service and a job already running on the failing infra and a service
// serving on local under load, it measures: how long new services on local and on a healthy
// cloud take to be READY (against the same launches before any fault), how long after their last
// node exits new jobs on local and on the healthy cloud are SUCCEEDED, failed requests on the
// local service and on the failing infra's service, how long `ferry serve status` takes,
// whether `serve down` and `jobs cancel` on the failing infra complete or say exactly what they
// left behind, and how long after the infra recovers it holds nothing of them. It exits
// non-zero when a target is missed. See bench/README.md (its table's infrafaults row), and
// docs/placement.md, "When an infra fails", for the results.
//
//	go run ./bench/infrafaults            # about 10 minutes
//	go run ./bench/infrafaults --short    # what the tests run
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/servicekit"
)

// options are the driver's flags.
type options struct {
	short bool
	only  []string
	// outage is how long the recovering scenario's cloud stays down.
	outage time.Duration
	// readyLimit bounds waiting for a service to be READY, jobLimit for a job to end,
	// cleanupLimit for the failing infra to hold nothing after it recovered.
	readyLimit, jobLimit, cleanupLimit time.Duration
	// statusEvery is how often `ferry serve status` is timed during a fault.
	statusEvery time.Duration
	ferryBin    string
	out         string
}

func main() {
	benchkit.Main("infrafaults", os.Args[1:], parseFlags, run)
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("infrafaults", pflag.ContinueOnError)
	fs.BoolVar(&o.short, "short", false, "a 20s outage for the recovering scenario, unless --outage is set: what the tests run")
	fs.StringSliceVar(&o.only, "only", nil, "run only these scenarios, by key ("+strings.Join(scenarioKeys(), ",")+")")
	fs.DurationVar(&o.outage, "outage", 60*time.Second, "how long the recovering scenario's cloud answers 503")
	fs.DurationVar(&o.readyLimit, "ready-limit", 3*time.Minute, "give up on a service that is not READY after this long")
	fs.DurationVar(&o.jobLimit, "job-limit", 3*time.Minute, "give up on a job that has not ended after this long")
	fs.DurationVar(&o.cleanupLimit, "cleanup-limit", 2*time.Minute, "give up on the cleanup after the infra recovered after this long")
	fs.DurationVar(&o.statusEvery, "status-every", 500*time.Millisecond, "how often `ferry serve status` is timed during a fault")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results, logs and FERRY_HOME (default .cache/bench/infrafaults-TIMESTAMP in the repo)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go run ./bench/infrafaults [flags]\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.short && !fs.Changed("outage") {
		o.outage = 20 * time.Second
	}
	return o, o.validate()
}

func (o options) validate() error {
	var errs []error
	for _, d := range []struct {
		flag     string
		v, limit time.Duration
	}{{"outage", o.outage, 30 * time.Minute}, {"ready-limit", o.readyLimit, 30 * time.Minute}, {"job-limit", o.jobLimit, 30 * time.Minute},
		{"cleanup-limit", o.cleanupLimit, 30 * time.Minute}, {"status-every", o.statusEvery, time.Minute}} {
		if d.v <= 0 || d.v > d.limit {
			errs = append(errs, fmt.Errorf("--%s=%v: must be positive and at most %v", d.flag, d.v, d.limit))
		}
	}
	known := map[string]bool{}
	for _, k := range scenarioKeys() {
		known[k] = true
	}
	for _, k := range o.only {
		if !known[k] {
			errs = append(errs, fmt.Errorf("--only=%s: not a scenario (%s)", k, strings.Join(scenarioKeys(), ", ")))
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

// execute builds ferry, starts the infras and the controller, measures the baselines, runs the
// scenarios and writes the report. It returns the report whatever the verdicts; an error means
// the run itself could not be completed.
func execute(ctx context.Context, opts options, stdout io.Writer, progress func(string, ...any)) (*report, error) {
	var err error
	if opts.out, opts.ferryBin, err = benchkit.Prepare("infrafaults", opts.out, opts.ferryBin); err != nil {
		return nil, err
	}
	e, err := setup(ctx, opts, progress)
	if err != nil {
		return nil, err
	}
	defer e.close()
	b := &bench{opts: opts, e: e, progress: progress}
	rep := &report{Started: time.Now(), Short: opts.short, Outage: opts.outage.Seconds(), LoadAvg: benchkit.LoadAvg()}
	if err := b.baseline(ctx, rep); err != nil {
		return nil, fmt.Errorf("before any fault: %w", err)
	}
	for _, def := range scenarios() {
		if len(opts.only) > 0 && !contains(opts.only, def.Key) {
			continue
		}
		progress("scenario %s: %s", def.Key, def.Title)
		rep.Results = append(rep.Results, b.runScenario(ctx, def))
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	rep.Teardown = b.teardown(ctx)
	rep.Took = time.Since(rep.Started).Seconds()
	if err := benchkit.WriteReport(stdout, opts.out, rep.markdown(), rep); err != nil {
		return rep, err
	}
	return rep, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
