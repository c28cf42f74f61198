package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ferryserve/ferry/autoscaler"
)

// Calibration of SkyServe's target_qps_per_replica. A SkyServe user picks it by load-testing
// one replica: the highest steady request rate at which the replica still meets the SLO. The
// simulator does the same with its own replica model, so the baseline is sized neither to
// fail nor to waste:
//
//   - a fixed fleet of calibrationFleet on-demand replicas, routed least-load;
//   - Poisson arrivals at calibrationFleet × q requests/s, with the trace's token counts in
//     trace order, for calibrationRun after a calibrationWarmup that is not scored;
//   - q is feasible when at least calibrationAttainment of the requests meet the SLO;
//   - bisection over q, and the result rounded down to a hundredth, as a user would write it.
//
// Steady Poisson load is the SLO's best case: the real trace's minute-to-minute swings and the
// autoscaler's delays come on top, which is what the policy runs measure.
const (
	calibrationFleet      = 4
	calibrationWarmup     = 10 * time.Minute
	calibrationRun        = 2 * time.Hour
	calibrationAttainment = 0.99
	calibrationMinQPS     = 0.01
)

// Calibrate returns the target QPS per replica for w's model and SLO on trace's requests, or
// an error when even calibrationMinQPS misses the SLO (an SLO the model cannot meet).
func Calibrate(w World, trace *Trace) (float64, error) {
	w.Zones = nil
	w.Warmup, w.Duration = calibrationWarmup, calibrationRun
	w.Model.ColdStart = 0
	lo, hi := calibrationMinQPS, 20.0
	if !calibrationFeasible(&w, trace, lo) {
		return 0, fmt.Errorf("no request rate meets the SLO (TTFT ≤ %v, TPOT ≤ %v) for %.0f%% of requests on this replica model, not even %g req/s per replica",
			w.SLO.TTFT, w.SLO.TPOT, 100*calibrationAttainment, lo)
	}
	for range 24 {
		mid := (lo + hi) / 2
		if calibrationFeasible(&w, trace, mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return math.Floor(lo*100) / 100, nil
}

func calibrationFeasible(w *World, trace *Trace, q float64) bool {
	p := Policy{
		Name:         "calibration",
		Spec:         autoscaler.Spec{Min: calibrationFleet, Max: calibrationFleet}.WithDefaults(),
		Hold:         true,
		DrainTimeout: time.Minute,
	}
	until := (w.Warmup + w.Duration).Seconds()
	src := &poissonSource{rng: rand.New(rand.NewPCG(w.Seed, 0xca11b)), rate: q * calibrationFleet, until: until, trace: trace}
	res := w.run(p, src)
	return res.SLOAttainment >= calibrationAttainment
}

// poissonSource draws exponential inter-arrival times and takes token counts from the trace in
// order, looping.
type poissonSource struct {
	rng   *rand.Rand
	rate  float64
	until float64
	trace *Trace
	at    float64
	i     int
}

func (p *poissonSource) next() (arrival, bool) {
	p.at += p.rng.ExpFloat64() / p.rate
	if p.at >= p.until {
		return arrival{}, false
	}
	r := p.trace.Records[p.i%len(p.trace.Records)]
	p.i++
	return arrival{at: p.at, ctx: r.ContextTokens, gen: r.GeneratedTokens}, true
}
