package sim

import (
	"errors"
	"fmt"
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
	// TracePath, SpotDir and CatalogPath default to the shared data directory (DataDir).
	TracePath   string
	SpotDir     string
	CatalogPath string
	// InstanceType is the catalog row the replicas run on; the spot traces must be of it.
	InstanceType string
	// TimeScale multiplies the trace's arrival rate.
	TimeScale float64
	// Duration is the scored horizon, Warmup the unscored lead-in before it; the trace loops
	// over both.
	Duration, Warmup time.Duration
	// SpotOffset is where in the spot traces the simulation starts (its warm-up included).
	SpotOffset time.Duration
	SLO        SLO
	Model      Model
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
	// Out is the report directory; "" is .cache/bench/sim-TIMESTAMP in the repository.
	Out string
}

// DefaultOptions are the flags' defaults.
func DefaultOptions() Options {
	return Options{
		InstanceType: "p3.2xlarge",
		TimeScale:    1,
		Duration:     24 * time.Hour,
		Warmup:       time.Hour,
		SLO:          SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond},
		Model:        DefaultModel(),
		Policies:     slices.Clone(PolicyNames),
		Seed:         1,
		Parallel:     runtime.GOMAXPROCS(0),
	}
}

// Default data files under DataDir.
const (
	defaultTrace   = "traces/AzureLLMInferenceTrace_conv.csv"
	defaultSpotDir = "spot-traces/availability/1-node/aws-02-15-2023"
	defaultCatalog = "catalog/aws_gpu.csv"
)

// RegisterFlags adds the options to fs, with o's values as defaults.
func (o *Options) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.TracePath, "trace", o.TracePath, "request trace CSV: TIMESTAMP,ContextTokens,GeneratedTokens (default DATA/"+defaultTrace+")")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "multiply the trace's arrival rate by this")
	fs.StringVar(&o.SpotDir, "spot-traces", o.SpotDir, "directory of per-zone spot availability JSON files (default DATA/"+defaultSpotDir+")")
	fs.StringVar(&o.CatalogPath, "catalog", o.CatalogPath, "price catalog CSV (default DATA/"+defaultCatalog+")")
	fs.StringVar(&o.InstanceType, "instance-type", o.InstanceType, "catalog instance type the replicas run on (the spot traces' type)")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "scored simulated horizon; the one-hour trace loops over it")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "unscored simulated time before the horizon, for fleets to settle")
	fs.DurationVar(&o.SpotOffset, "spot-offset", o.SpotOffset, "where in the spot traces the simulation (warm-up included) starts")
	fs.DurationVar(&o.SLO.TTFT, "slo-ttft", o.SLO.TTFT, "time-to-first-token SLO, waiting at the proxy included")
	fs.DurationVar(&o.SLO.TPOT, "slo-tpot", o.SLO.TPOT, "time-per-output-token SLO (mean after the first token)")
	fs.DurationVar(&o.Model.ColdStart, "cold-start", o.Model.ColdStart, "replica launch to READY (provisioning + model load), spot and on-demand")
	fs.Float64Var(&o.TargetQPS, "skyserve-target-qps", o.TargetQPS, "SkyServe's target_qps_per_replica (also sizes fixed-peak); 0 calibrates it on the replica model")
	fs.Float64Var(&o.TargetInflight, "ferry-target-inflight", o.TargetInflight, "ferry policies' target_inflight_per_replica; 0 = learned, the default")
	fs.DurationVar(&o.StableWindow, "ferry-stable-window", o.StableWindow, "ferry policies' stable window; 0 = learned from the cold start, the default")
	fs.IntVar(&o.Overprovision, "ferry-overprovision", o.Overprovision, "ferry policies' num_overprovision; 0 = learned headroom, the default")
	fs.StringSliceVar(&o.Policies, "policies", o.Policies, "policies to simulate: "+fmt.Sprint(PolicyNames))
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of routing ties and calibration arrivals")
	fs.IntVar(&o.Parallel, "parallel", o.Parallel, "policies simulated at once")
	fs.StringVar(&o.Out, "out", o.Out, "directory for summary.md, results.json and sim.svg (default .cache/bench/sim-TIMESTAMP in the repo)")
}

// Validate names every bad option.
func (o Options) Validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	if !(o.TimeScale > 0 && o.TimeScale <= 1000) {
		bad("time-scale", o.TimeScale, "must be in (0, 1000]")
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
	if o.InstanceType == "" {
		bad("instance-type", `""`, "must be set")
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
		return "", fmt.Errorf("finding the default data directory: %w (set $FERRY_DATA or pass --trace, --spot-traces and --catalog)", err)
	}
	return filepath.Join(root, "..", "shared", "data"), nil
}

// resolvePaths fills the input paths left empty with the defaults under DataDir.
func (o *Options) resolvePaths() error {
	if o.TracePath != "" && o.SpotDir != "" && o.CatalogPath != "" {
		return nil
	}
	dir, err := DataDir()
	if err != nil {
		return err
	}
	for _, f := range []struct {
		p   *string
		rel string
	}{{&o.TracePath, defaultTrace}, {&o.SpotDir, defaultSpotDir}, {&o.CatalogPath, defaultCatalog}} {
		if *f.p == "" {
			*f.p = filepath.Join(dir, filepath.FromSlash(f.rel))
		}
	}
	return nil
}
