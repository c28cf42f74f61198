package catalog

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"fmt"
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

// interruption is one preemption trace's totals.
type interruption struct {
	cloud, region string
	hours         float64
	count         int
}

var interruptions = sync.OnceValue(func() []interruption {
	recs, err := csv.NewReader(bytes.NewReader(interruptionsCSV)).ReadAll()
	if err != nil {
		panic("catalog: spot_interruptions.csv: " + err.Error())
	}
	out := make([]interruption, 0, len(recs)-1)
	for i, r := range recs[1:] {
		h, err1 := strconv.ParseFloat(r[4], 64)
		n, err2 := strconv.Atoi(r[5])
		if err1 != nil || err2 != nil || h <= 0 || n < 0 {
			panic(fmt.Sprintf("catalog: spot_interruptions.csv:%d: bad hours or count", i+2))
		}
		out = append(out, interruption{cloud: r[0], region: r[1], hours: h, count: n})
	}
	return out
})

// InterruptionRate is how many times per instance-hour a spot instance is interrupted in a
// cloud's region, pooled over that region's preemption traces, else over the cloud's; basis
// says which ("aws us-east-1: 517 in 1000.1 instance-hours"). ok is false for a cloud with no
// trace.
func InterruptionRate(cloud, region string) (perHour float64, basis string, ok bool) {
	pool := func(match func(interruption) bool) (float64, int) {
		h, n := 0.0, 0
		for _, t := range interruptions() {
			if match(t) {
				h, n = h+t.hours, n+t.count
			}
		}
		return h, n
	}
	where := cloud + " " + region
	h, n := pool(func(t interruption) bool { return t.cloud == cloud && t.region == region })
	if h == 0 {
		where = cloud + " (all traced regions)"
		h, n = pool(func(t interruption) bool { return t.cloud == cloud })
	}
	if h == 0 {
		return 0, "", false
	}
	return float64(n) / h, fmt.Sprintf("%s: %d in %.0f instance-hours", where, n, h), true
}
