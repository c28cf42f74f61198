package catalog

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// What an accelerator does per hour, for the optimizer's cost-per-work objectives, and how
// often spot instances are interrupted. Both are derived from cited public figures (README.md):
// vendor datasheets for compute and memory bandwidth, the spot-traces preemption sets for
// interruptions. They rank placements; they are not benchmarks of any one model.

//go:embed data/throughput.csv
var throughputCSV []byte

//go:embed data/spot_interruptions.csv
var interruptionsCSV []byte

// Throughput is one accelerator's datasheet figures.
type Throughput struct {
	Accelerator string
	// DenseTFLOPS is tensor-core throughput without sparsity, in Precision (bf16, or fp16
	// mixed precision on GPUs without bf16).
	DenseTFLOPS float64
	Precision   string
	// HBMGBps is memory bandwidth in GB/s; MemoryGiB the memory of one device.
	HBMGBps   float64
	MemoryGiB float64
	Source    string
}

// referenceTFLOPS is the A100's dense bf16 figure: relative training throughput 1.
const referenceTFLOPS = 312

// RelativeTraining is training throughput per device relative to an A100 (dense tensor
// TFLOPS over the A100's 312): compute-bound training scales with it.
func (t Throughput) RelativeTraining() float64 { return t.DenseTFLOPS / referenceTFLOPS }

// DecodeTokensPerSecond bounds one replica's decode rate for a model of paramsB billion bf16
// parameters on count devices: each generated token reads every weight once, so a batch-1
// stream gets at most bandwidth / weight bytes (devices sharing the model by tensor parallelism
// add their bandwidth). It is 0 when the weights do not fit in 90 % of the devices' memory.
func (t Throughput) DecodeTokensPerSecond(count, paramsB float64) float64 {
	weightGB := 2 * paramsB
	if count <= 0 || weightGB > 0.9*t.MemoryGiB*count*1.073741824 {
		return 0
	}
	return count * t.HBMGBps / weightGB
}

var throughputs = sync.OnceValue(func() map[string]Throughput {
	recs, err := csv.NewReader(bytes.NewReader(throughputCSV)).ReadAll()
	if err != nil {
		panic("catalog: throughput.csv: " + err.Error())
	}
	out := map[string]Throughput{}
	for i, r := range recs[1:] {
		num := func(s string) float64 {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || v <= 0 {
				panic(fmt.Sprintf("catalog: throughput.csv:%d: %q is not a positive number", i+2, s))
			}
			return v
		}
		out[strings.ToLower(r[0])] = Throughput{Accelerator: r[0], DenseTFLOPS: num(r[1]), Precision: r[2],
			HBMGBps: num(r[3]), MemoryGiB: num(r[4]), Source: r[5]}
	}
	return out
})

// ThroughputOf returns an accelerator's figures, matched ignoring case, and false when the
// table has none (A10G: AWS publishes no tensor figures for it).
func ThroughputOf(accelerator string) (Throughput, bool) {
	t, ok := throughputs()[strings.ToLower(accelerator)]
	return t, ok
}

// interruption is one preemption trace's totals; gpu is the traced accelerator ("V100"),
// empty for a CPU instance type's trace (intel_64, c3-88).
type interruption struct {
	cloud, region string
	gpu           string
	hours         float64
	count         int
}

// EnvSpotInterruptions names a CSV in spot_interruptions.csv's format (README.md) that
// replaces the embedded interruption traces: an operator's own preemption history, which
// ranks spot placements by what their fleet has seen rather than the public traces.
const EnvSpotInterruptions = "FERRY_SPOT_INTERRUPTIONS"

// loadedTraces caches the traces by the file they came from ("" the embedded ones).
var loadedTraces sync.Map // string → tracesOrError

type tracesOrError struct {
	traces []interruption
	err    error
}

// interruptions are the traces in use: EnvSpotInterruptions' file if set, else the embedded.
func interruptions() []interruption { return tracesFor(os.Getenv(EnvSpotInterruptions)).traces }

// CheckInterruptions reports why EnvSpotInterruptions' file cannot be used (the embedded
// traces are used instead), nil when it can or is not set.
func CheckInterruptions() error { return tracesFor(os.Getenv(EnvSpotInterruptions)).err }

// tracesFor reads the traces of path ("": the embedded ones) once; a file that cannot be read
// or parsed gives the embedded traces with the reason.
func tracesFor(path string) tracesOrError {
	if v, ok := loadedTraces.Load(path); ok {
		return v.(tracesOrError)
	}
	var t tracesOrError
	if path == "" {
		var err error
		if t.traces, err = parseTraces(interruptionsCSV, "spot_interruptions.csv"); err != nil {
			panic(err) // compiled in and tested: a build defect
		}
	} else {
		data, err := os.ReadFile(path)
		if err == nil {
			t.traces, err = parseTraces(data, path)
		}
		if err != nil {
			t = tracesOrError{traces: tracesFor("").traces, err: fmt.Errorf("catalog: $%s: %w", EnvSpotInterruptions, err)}
		}
	}
	v, _ := loadedTraces.LoadOrStore(path, t)
	return v.(tracesOrError)
}

// parseTraces reads cloud,region,zone,traced,instance_hours,interruptions[,trace] rows after a
// header.
func parseTraces(data []byte, name string) ([]interruption, error) {
	recs, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(recs) < 2 {
		return nil, fmt.Errorf("%s: no trace after the header", name)
	}
	out := make([]interruption, 0, len(recs)-1)
	for i, r := range recs[1:] {
		if len(r) < 6 {
			return nil, fmt.Errorf("%s:%d: want cloud,region,zone,traced,instance_hours,interruptions", name, i+2)
		}
		h, err1 := strconv.ParseFloat(r[4], 64)
		n, err2 := strconv.Atoi(r[5])
		if err1 != nil || err2 != nil || h <= 0 || n < 0 {
			return nil, fmt.Errorf("%s:%d: bad hours or count", name, i+2)
		}
		out = append(out, interruption{cloud: r[0], region: r[1], gpu: tracedGPU(r[3]), hours: h, count: n})
	}
	return out, nil
}

// tracedGPU is the accelerator a trace's instance carried ("v100_1": V100), or "" for a CPU
// type: a prefix the catalog sells as a GPU.
func tracedGPU(traced string) string {
	name, _, _ := strings.Cut(traced, "_")
	name = strings.ToUpper(name)
	for _, cloud := range []string{"aws", "gcp"} {
		if len(Default().Lookup(cloud, name)) > 0 {
			return name
		}
	}
	return ""
}

// InterruptionRate is how many times per instance-hour a spot instance carrying accelerator
// ("" for a CPU-only type) is interrupted in a cloud's region, from the preemption traces of
// the nearest kind: the same accelerator in the region, then in the cloud; for a GPU, then any
// GPU in the region and in the cloud, then the same accelerator and any GPU in every cloud. A
// GPU never takes a CPU type's rate (GCP's traced c3-88 saw no interruption in 45 hours, which
// says nothing of its GPUs), nor a CPU type a GPU's. basis says which traces it pooled, and
// exact whether they are of this accelerator in this region. ok is false when no trace is of
// its kind.
func InterruptionRate(cloud, region, accelerator string) (perHour float64, basis string, exact bool, ok bool) {
	gpu := strings.ToUpper(accelerator)
	kind := "CPU"
	if gpu != "" {
		kind = "GPU"
	}
	type tier struct {
		where string
		match func(interruption) bool
	}
	tiers := []tier{
		{cloud + " " + region + " " + orKind(gpu, kind), func(t interruption) bool { return t.cloud == cloud && t.region == region && t.gpu == gpu }},
		{cloud + " " + orKind(gpu, kind) + " (other regions)", func(t interruption) bool { return t.cloud == cloud && t.gpu == gpu }},
	}
	if gpu != "" {
		tiers = append(tiers,
			tier{cloud + " " + region + " GPU (not " + gpu + ")", func(t interruption) bool { return t.cloud == cloud && t.region == region && t.gpu != "" }},
			tier{cloud + " GPU (not " + gpu + ")", func(t interruption) bool { return t.cloud == cloud && t.gpu != "" }},
			tier{gpu + " on other clouds", func(t interruption) bool { return t.gpu == gpu }},
			tier{"GPU on other clouds (no " + cloud + " GPU trace)", func(t interruption) bool { return t.gpu != "" }})
	}
	for i, tr := range tiers {
		h, n := 0.0, 0
		for _, t := range interruptions() {
			if tr.match(t) {
				h, n = h+t.hours, n+t.count
			}
		}
		if h > 0 {
			return float64(n) / h, fmt.Sprintf("%s: %d in %.0f instance-hours", tr.where, n, h), i == 0, true
		}
	}
	return 0, "", false, false
}

func orKind(gpu, kind string) string {
	if gpu != "" {
		return gpu
	}
	return kind
}
