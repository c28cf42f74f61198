package autoscaler

import (
	"fmt"
	"time"
)

// requestRate is SkyServe's RequestRateAutoscaler: QPS is the arrivals of the last 60 s over
// 60; the raw target is clip(ceil(qps / target_qps_per_replica), min, max); a change takes
// effect only after upscale_delay (downscale_delay) worth of consecutive decisions agree on
// its direction, except from zero, which jumps at once. Overprovision is added on top.
type requestRate struct {
	spec    Spec
	arrived *window
	// target excludes overprovision, like SkyServe's target_num_replicas.
	target             int
	upCount, downCount int
	upAfter, downAfter int
}

var _ Scaler = (*requestRate)(nil)

func newRequestRate(spec Spec) *requestRate {
	return &requestRate{
		spec:    spec,
		arrived: newWindow(qpsWindow),
		target:  spec.Min,
		// SkyServe: int(delay / decision interval) decisions in a row.
		upAfter:   int(spec.UpscaleDelay / spec.DecisionInterval),
		downAfter: int(spec.DownscaleDelay / spec.DecisionInterval),
	}
}

func (r *requestRate) Decide(now time.Time, obs Observation, st State) Decision {
	r.arrived.record(now, float64(obs.Arrivals))
	sum, _ := r.arrived.total()
	qps := sum / qpsWindow.Seconds()
	raw := r.spec.Min
	switch {
	case len(r.spec.TargetQPSPerAccelerator) > 0:
		raw = clip(instanceAwareTarget(r.spec.TargetQPSPerAccelerator, qps, st), r.spec.Min, r.spec.Max)
	case r.spec.TargetQPS > 0:
		raw = clip(ceilReplicas(qps/r.spec.TargetQPS), r.spec.Min, r.spec.Max)
	}
	reason := fmt.Sprintf("qps %.2f", qps)
	switch {
	case r.target == 0 && raw > 0:
		r.target, r.upCount, r.downCount = raw, 0, 0
		reason += ", from zero"
	case raw > r.target:
		reason += r.lean(raw, &r.upCount, &r.downCount, r.upAfter, "up")
	case raw < r.target:
		reason += r.lean(raw, &r.downCount, &r.upCount, r.downAfter, "down")
	default:
		r.upCount, r.downCount = 0, 0
	}
	return Decision{Target: r.target + r.spec.Overprovision, Overprovision: r.spec.Overprovision, Reason: reason}
}

// lean counts one more decision wanting raw in one direction (count), resets the other
// direction's count, and moves the target once after decisions agree in a row.
func (r *requestRate) lean(raw int, count, other *int, after int, dir string) string {
	*count++
	*other = 0
	if *count < after {
		return fmt.Sprintf(", %s %d/%d", dir, *count, after)
	}
	r.target, *count = raw, 0
	return ", scale " + dir
}
