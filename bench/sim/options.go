package sim

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// Options are `ferry sim`'s flags.
type Options struct {
	// TracePath, SpotDir and CatalogDir default to the shared data directory (DataDir).
	TracePath string
	// SpotDir is one set of zone traces: a directory, or a pattern naming one traced instance
	// of a directory that holds several.
	SpotDir string
	// CatalogDir holds aws_gpu.csv and gcp_gpu.csv.
	CatalogDir string
	// AWSInstanceType and GCPInstanceType are what a replica runs on in each cloud: catalog
	// rows, GCP's as machine+attachment. The spot traces give only when capacity was there.
	AWSInstanceType, GCPInstanceType string
	// Fleet is the service's min_replicas, the READY count availability is scored against
	// for every policy (SpotHedge's artifact scores its service's minimum), and, unless
	// TimeScale is set, what sizes the load: the trace is scaled so that its busiest minute
	// needs Fleet replicas at target_qps_per_replica.
	Fleet int
	// TimeScale, when positive, multiplies the trace's arrival rate instead.
	TimeScale float64
	// Duration is the scored horizon, Warmup the unscored lead-in before it; the request
	// trace loops over both. A sweep cuts the horizon to what each spot set covers.
	Duration, Warmup time.Duration
	// SpotOffset is where in the spot traces the simulation starts (its warm-up included).
	SpotOffset time.Duration
	// Notice is how long before a reclaim each cloud warns a spot instance it holds: EC2 two
	// minutes, Compute Engine 30 s. 0 reclaims without warning.
	Notice map[Provider]time.Duration
	SLO    SLO
	Model  Model
	// TargetQPS is SkyServe's target_qps_per_replica; 0 calibrates it (Calibrate).
	TargetQPS float64
	// TargetInflight, StableWindow and Overprovision set the ferry policies' knobs as a YAML
	// would (PolicyParams); 0, the default, leaves them to the autoscaler to learn.
	TargetInflight float64
	StableWindow   time.Duration
	Overprovision  int
	Policies       []string
	Seed           uint64
	// Parallel is how many policies run at once.
	Parallel int
	// Sweep runs every spot set under SpotRoot at every fleet of Fleets instead of one run.
	Sweep    bool
	SpotRoot string
	Fleets   []int
	// Sets, when not empty, are the only sets the sweep runs, by the names it reports
	// (availability/16-node/aws-08-27-2023, derived/gcp-04-30-2023-counted).
	Sets []string
	// Out is the report directory; "" is .cache/bench/sim-TIMESTAMP in the repository.
	Out string
}

// DefaultPolicies are the policies a run compares unless --policies says otherwise.
var DefaultPolicies = []string{"ferry", "skyserve-spothedge", "skyserve-spothedge-0", "ondemand"}

// DefaultOptions are the flags' defaults.
func DefaultOptions() Options {
	return Options{
		AWSInstanceType: "p3.2xlarge",
		GCPInstanceType: "n1-standard-8+n1-attach-V100",
		Fleet:           6,
		Duration:        7 * 24 * time.Hour,
		Warmup:          time.Hour,
		Notice:          map[Provider]time.Duration{AWS: 2 * time.Minute, GCP: 30 * time.Second},
		SLO:             SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond},
		Model:           DefaultModel(),
		Policies:        slices.Clone(DefaultPolicies),
		Seed:            1,
		Parallel:        runtime.GOMAXPROCS(0),
		Fleets:          []int{3, 4, 5, 6, 8, 12, 16, 24},
	}
}

// Default data under DataDir.
const (
	defaultTrace    = "traces/AzureLLMInferenceTrace_conv.csv"
	defaultSpotDir  = "spot-traces/preemption/4-node/aws-08-03-2023"
	defaultSpotRoot = "spot-traces"
	defaultCatalog  = "catalog"
)

// RegisterFlags adds the options to fs, with o's values as defaults.
func (o *Options) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.TracePath, "trace", o.TracePath, "request trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens (default DATA/"+defaultTrace+")")
	fs.IntVar(&o.Fleet, "fleet", o.Fleet, "min_replicas of every policy, the READY count availability is scored against, and (unless --time-scale) the load: its busiest minute needs this many replicas")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "multiply the trace's arrival rate by this instead of sizing it to --fleet (0: sized to --fleet)")
	fs.StringVar(&o.SpotDir, "spot-traces", o.SpotDir, "one set of per-zone spot capacity JSON files: a directory, or a pattern such as DIR/*_v100_1.json (default DATA/"+defaultSpotDir+")")
	fs.StringVar(&o.CatalogDir, "catalog", o.CatalogDir, "directory of the price catalog's aws_gpu.csv and gcp_gpu.csv (default DATA/"+defaultCatalog+")")
	fs.StringVar(&o.AWSInstanceType, "aws-instance-type", o.AWSInstanceType, "catalog instance type a replica runs on in AWS zones")
	fs.StringVar(&o.GCPInstanceType, "gcp-instance-type", o.GCPInstanceType, "catalog machine type a replica runs on in GCP zones, with + for an attached GPU (regional prices)")
	awsNotice, gcpNotice := o.Notice[AWS], o.Notice[GCP]
	fs.Var(noticeFlag{o, AWS, &awsNotice}, "aws-notice", "how long before a reclaim EC2 warns a spot instance the policy holds (0: no warning)")
	fs.Var(noticeFlag{o, GCP, &gcpNotice}, "gcp-notice", "how long before a reclaim Compute Engine warns a Spot VM the policy holds (0: no warning)")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "scored simulated horizon, cut to what the spot traces cover; the one-hour request trace loops over it")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "unscored simulated time before the horizon, for fleets to settle")
	fs.DurationVar(&o.SpotOffset, "spot-offset", o.SpotOffset, "where in the spot traces the simulation (warm-up included) starts")
	fs.DurationVar(&o.SLO.TTFT, "slo-ttft", o.SLO.TTFT, "time-to-first-token SLO, waiting at the proxy included")
	fs.DurationVar(&o.SLO.TPOT, "slo-tpot", o.SLO.TPOT, "time-per-output-token SLO (mean after the first token)")
	fs.DurationVar(&o.Model.ColdStart, "cold-start", o.Model.ColdStart, "replica launch to READY (provisioning + model load), spot and on-demand")
	fs.Float64Var(&o.TargetQPS, "skyserve-target-qps", o.TargetQPS, "SkyServe's target_qps_per_replica (also sizes the load to --fleet); 0 calibrates it on the replica model")
	fs.Float64Var(&o.TargetInflight, "ferry-target-inflight", o.TargetInflight, "ferry policies' target_inflight_per_replica; 0 = learned, the default")
	fs.DurationVar(&o.StableWindow, "ferry-stable-window", o.StableWindow, "ferry policies' stable window; 0 = learned from the cold start, the default")
	fs.IntVar(&o.Overprovision, "ferry-overprovision", o.Overprovision, "ferry policies' num_overprovision; 0 = learned headroom, the default")
	fs.StringSliceVar(&o.Policies, "policies", o.Policies, "policies to simulate: "+fmt.Sprint(PolicyNames))
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of routing ties and calibration arrivals")
	fs.IntVar(&o.Parallel, "parallel", o.Parallel, "simulations run at once")
	fs.BoolVar(&o.Sweep, "sweep", o.Sweep, "run every spot set under --spot-root at every fleet of --fleets (one table and plot) instead of one run")
	fs.StringVar(&o.SpotRoot, "spot-root", o.SpotRoot, "with --sweep, the directory whose every set of spot traces is run (default DATA/"+defaultSpotRoot+")")
	fs.IntSliceVar(&o.Fleets, "fleets", o.Fleets, "with --sweep, the fleet sizes (--fleet) to run each set at")
	fs.StringSliceVar(&o.Sets, "sets", o.Sets, "with --sweep, run only these sets, by the names the sweep reports (default: every set under --spot-root, then "+DerivedSets[0].Name+")")
	fs.StringVar(&o.Out, "out", o.Out, "directory for summary.md, results.json and the plot (default .cache/bench/sim-TIMESTAMP in the repo)")
}

// noticeFlag sets one provider's notice in Options.Notice.
type noticeFlag struct {
	o *Options
	p Provider
	d *time.Duration
}

func (f noticeFlag) String() string { return f.d.String() }
func (f noticeFlag) Type() string   { return "duration" }
func (f noticeFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*f.d = d
	f.o.Notice = maps.Clone(f.o.Notice)
	f.o.Notice[f.p] = d
	return nil
}

// Validate names every bad option.
func (o Options) Validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	if !(o.TimeScale >= 0 && o.TimeScale <= 1000) {
		bad("time-scale", o.TimeScale, "must be in [0, 1000] (0 sizes the load to --fleet)")
	}
	if o.Fleet < 1 || o.Fleet > 1000 {
		bad("fleet", o.Fleet, "must be between 1 and 1000")
	}
	for p, d := range o.Notice {
		if d < 0 || d > time.Hour {
			bad(string(p)+"-notice", d, "must be between 0 and 1h")
		}
	}
	if o.Sweep {
		if len(o.Fleets) == 0 {
			bad("fleets", `""`, "name at least one fleet size")
		}
		for _, f := range o.Fleets {
			if f < 1 || f > 1000 {
				bad("fleets", f, "must be between 1 and 1000")
			}
		}
	}
	if o.Duration < time.Minute || o.Duration > 90*24*time.Hour {
		bad("duration", o.Duration, "must be between 1m and 2160h")
	}
	if o.Warmup < 0 || o.Warmup > 24*time.Hour {
		bad("warmup", o.Warmup, "must be between 0 and 24h")
	}
	if o.SpotOffset < 0 {
		bad("spot-offset", o.SpotOffset, "must not be negative")
	}
	if o.SLO.TTFT <= 0 || o.SLO.TPOT <= 0 {
		bad("slo-ttft/--slo-tpot", fmt.Sprintf("%v/%v", o.SLO.TTFT, o.SLO.TPOT), "must be positive")
	}
	if o.Model.ColdStart < 0 || o.Model.ColdStart > 2*time.Hour {
		bad("cold-start", o.Model.ColdStart, "must be between 0 and 2h")
	}
	if o.TargetQPS < 0 {
		bad("skyserve-target-qps", o.TargetQPS, "must not be negative (0 calibrates)")
	}
	if !(o.TargetInflight >= 0) {
		bad("ferry-target-inflight", o.TargetInflight, "must not be negative (0 is learned)")
	}
	if o.StableWindow != 0 && (o.StableWindow < 6*time.Second || o.StableWindow > time.Hour) {
		bad("ferry-stable-window", o.StableWindow, "must be 0 (learned) or between 6s and 1h (replica_policy's bounds)")
	}
	if o.Overprovision < 0 || o.Overprovision > 100 {
		bad("ferry-overprovision", o.Overprovision, "must be between 0 and 100")
	}
	if len(o.Policies) == 0 {
		bad("policies", `""`, "name at least one")
	}
	seen := map[string]bool{}
	for _, p := range o.Policies {
		if !slices.Contains(PolicyNames, p) {
			bad("policies", p, fmt.Sprintf("unknown policy; known are %v", PolicyNames))
		} else if seen[p] {
			bad("policies", p, "listed twice")
		}
		seen[p] = true
	}
	if o.Parallel < 1 {
		bad("parallel", o.Parallel, "must be at least 1")
	}
	if o.AWSInstanceType == "" || o.GCPInstanceType == "" {
		bad("aws-instance-type/--gcp-instance-type", o.AWSInstanceType+"/"+o.GCPInstanceType, "must be set")
	}
	if err := o.Model.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// DataDir is where the default inputs live: $FERRY_DATA, else ../shared/data beside the
// repository root.
func DataDir() (string, error) {
	if d := os.Getenv("FERRY_DATA"); d != "" {
		return d, nil
	}
	root, err := benchkit.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("finding the default data directory: %w (set $FERRY_DATA or pass --trace, --spot-traces, --spot-root and --catalog)", err)
	}
	return filepath.Join(root, "..", "shared", "data"), nil
}

// resolvePaths fills the input paths left empty with the defaults under DataDir.
func (o *Options) resolvePaths() error {
	if o.TracePath != "" && o.SpotDir != "" && o.CatalogDir != "" && o.SpotRoot != "" {
		return nil
	}
	dir, err := DataDir()
	if err != nil {
		return err
	}
	for _, f := range []struct {
		p   *string
		rel string
	}{{&o.TracePath, defaultTrace}, {&o.SpotDir, defaultSpotDir}, {&o.CatalogDir, defaultCatalog}, {&o.SpotRoot, defaultSpotRoot}} {
		if *f.p == "" {
			*f.p = filepath.Join(dir, filepath.FromSlash(f.rel))
		}
	}
	return nil
}
