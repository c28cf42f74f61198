// Command kubescale measures the controller at fleet scale on a real Kubernetes API server (issue
// 36): the test cluster (internal/testcluster: etcd, kube-apiserver, kube-scheduler, kwok GPU
// nodes) with the kubelet stand-in serving every replica pod's replica-sim in its own process,
// and two `ferry controller --store kubernetes --leader-elect` processes of the built binary.
//
// It brings up --services services of --replicas replicas each with `ferry serve up --no-wait`
// and measures, against the targets: the time from the last `serve up` until every
// replica is READY (≤ 120 s), the leader's peak RSS (≤ 500 MiB, sampled from /proc throughout),
// the p99 of ferry_reconcile_duration_seconds{loop="replicas"} from the leader's /metrics
// (≤ 1 s), a takeover after kill -9 of the leader under a bounded request loop through attached
// proxies (the new leader has published every service within 5 s of taking the Lease, no pod
// relaunched, no request failed), and `serve down -a` until every pod is gone (≤ 60 s). It
// prints a table of each figure against its target, writes summary.md and results.json under
// .cache/bench/kubescale-TIMESTAMP, and exits non-zero when a target is missed.
//
//	go run ./bench/kubescale                              # 100 services × 10 replicas, minutes
//	go run ./bench/kubescale --services 4 --replicas 3    # what the test runs
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
	services, replicas int
	// gpusPerNode sizes the kwok nodes; there are as many as the replicas need.
	gpusPerNode int
	// upParallel is how many `serve up` run at once.
	upParallel int
	// loadServices is how many services the request loop sends to, one attached proxy each.
	loadServices int
	// maxRequests bounds the request loop's count, loadFor its time after the takeover.
	maxRequests int
	loadFor     time.Duration
	// The targets.
	readyTarget, downTarget, takeoverTarget, reconcileTarget time.Duration
	rssTargetMiB                                             int
	// fence installs the chart's fencing policy in the namespace.
	fence         bool
	ferryBin, out string
}

func main() {
	benchkit.Main("kubescale", os.Args[1:], parseFlags, run)
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := pflag.NewFlagSet("kubescale", pflag.ContinueOnError)
	fs.IntVar(&o.services, "services", 100, "services to bring up")
	fs.IntVar(&o.replicas, "replicas", 10, "replicas of each service")
	fs.IntVar(&o.gpusPerNode, "gpus-per-node", 8, "GPUs of each kwok node (one per replica)")
	fs.IntVar(&o.upParallel, "up-parallel", 8, "`serve up` commands run at once")
	fs.IntVar(&o.loadServices, "load-services", 3, "services the request loop sends to during the takeover, through one attached proxy each")
	fs.IntVar(&o.maxRequests, "max-requests", 50000, "at most this many requests in the loop")
	fs.DurationVar(&o.loadFor, "load-after-takeover", 5*time.Second, "how long the request loop goes on once the new leader has published every service")
	fs.DurationVar(&o.readyTarget, "ready-target", 120*time.Second, "every replica READY within this long of the last serve up")
	fs.DurationVar(&o.downTarget, "down-target", 60*time.Second, "every pod gone within this long of serve down -a")
	fs.DurationVar(&o.takeoverTarget, "takeover-target", 5*time.Second, "the new leader has published every service within this long of taking the Lease")
	fs.DurationVar(&o.reconcileTarget, "reconcile-target", time.Second, "p99 of the replicas reconcile pass")
	fs.IntVar(&o.rssTargetMiB, "rss-target", 500, "the leader's peak RSS in MiB")
	fs.BoolVar(&o.fence, "fence", true, "install the chart's fencing policy, as its default with leader election does (false: measure without it)")
	fs.StringVar(&o.ferryBin, "ferry-bin", "", "ferry binary (default: build ./cmd/ferry into the output directory)")
	fs.StringVar(&o.out, "out", "", "directory for results, logs, the cluster and the FERRY_HOMEs (default .cache/bench/kubescale-TIMESTAMP in the repo)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: go run ./bench/kubescale [flags]\n\n%s", fs.FlagUsages())
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
	for _, n := range []struct {
		flag       string
		v, min, mx int
	}{{"services", o.services, 1, 1000}, {"replicas", o.replicas, 1, 100}, {"gpus-per-node", o.gpusPerNode, 1, 1000},
		{"up-parallel", o.upParallel, 1, 64}, {"load-services", o.loadServices, 1, o.services}, {"max-requests", o.maxRequests, 1, 1_000_000},
		{"rss-target", o.rssTargetMiB, 1, 1 << 20}} {
		if n.v < n.min || n.v > n.mx {
			errs = append(errs, fmt.Errorf("--%s=%d: must be from %d to %d", n.flag, n.v, n.min, n.mx))
		}
	}
	if o.services*o.replicas > 60*250 {
		errs = append(errs, fmt.Errorf("--services=%d --replicas=%d: at most %d pods (the loopback range for pod IPs)", o.services, o.replicas, 60*250))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"load-after-takeover", o.loadFor}, {"ready-target", o.readyTarget}, {"down-target", o.downTarget},
		{"takeover-target", o.takeoverTarget}, {"reconcile-target", o.reconcileTarget}} {
		if d.v <= 0 || d.v > 30*time.Minute {
			errs = append(errs, fmt.Errorf("--%s=%v: must be positive and at most 30m", d.flag, d.v))
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
	if missed := rep.missed(); len(missed) > 0 {
		return errors.New("not met: " + strings.Join(missed, "; "))
	}
	return nil
}

// execute builds ferry, starts the cluster and the controllers, runs the scenario and writes the
// report. It returns the report whatever the verdicts; an error means the run could not be
// completed.
func execute(ctx context.Context, opts options, stdout io.Writer, progress func(string, ...any)) (*report, error) {
	var err error
	if opts.out, opts.ferryBin, err = benchkit.Prepare("kubescale", opts.out, opts.ferryBin); err != nil {
		return nil, err
	}
	rep := &report{Started: time.Now(), Services: opts.services, Replicas: opts.replicas, LoadAvgBefore: benchkit.LoadAvg(), opts: opts}
	e, err := setup(ctx, opts, progress)
	if err != nil {
		return nil, err
	}
	defer e.close()
	s := &scenario{opts: opts, e: e, progress: progress, rep: rep}
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	rep.LoadAvgAfter = benchkit.LoadAvg()
	rep.Took = time.Since(rep.Started).Seconds()
	if err := benchkit.WriteReport(stdout, opts.out, rep.markdown(), rep); err != nil {
		return rep, err
	}
	return rep, nil
}
