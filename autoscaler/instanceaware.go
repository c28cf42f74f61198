package autoscaler

import (
	"math"
	"slices"
	"strings"
)

// instanceAwareTarget is SkyServe's InstanceAwareRequestRateAutoscaler (sky/serve/autoscalers.py)
// for a target_qps_per_replica map keyed by accelerator, before clipping to [min, max]:
//
//   - capacity is the sum of the live replicas' own targets;
//   - at or above it, add ceil((qps − capacity) / the largest target): new replicas are
//     assumed to land on the best type, which the optimizer tries first;
//   - below it, keep the fewest READY replicas, largest targets first, whose targets sum
//     above qps (none READY: one replica of the largest target).
//
// Where SkyServe holds min_replicas while no replica is live, this asks for
// ceil(qps / largest target), so that load at zero starts replicas at once.
func instanceAwareTarget(targets map[string]float64, qps float64, st State) int {
	largest := 0.0
	for _, q := range targets {
		largest = max(largest, q)
	}
	capacity := 0.0
	for _, acc := range st.LiveAccelerators {
		capacity += targetFor(targets, acc)
	}
	if capacity == 0 {
		return ceilReplicas(qps / largest)
	}
	if qps >= capacity {
		return len(st.LiveAccelerators) + ceilReplicas((qps-capacity)/largest)
	}
	ready := make([]float64, 0, len(st.ReadyAccelerators))
	for _, acc := range st.ReadyAccelerators {
		ready = append(ready, targetFor(targets, acc))
	}
	if len(ready) == 0 {
		ready = []float64{largest}
	}
	slices.SortFunc(ready, func(a, b float64) int { return -cmpFloat(a, b) })
	n, sum := 0, 0.0
	for _, q := range ready {
		n++
		sum += q
		if sum > qps {
			break
		}
	}
	return n
}

// targetFor is an accelerator's target: its key ignoring case, or a key written with a count
// ("A100:1"); else the smallest target, the conservative guess SkyServe makes too.
func targetFor(targets map[string]float64, accelerator string) float64 {
	smallest := math.Inf(1)
	for key, q := range targets {
		name, _, _ := strings.Cut(key, ":")
		if accelerator != "" && strings.EqualFold(name, accelerator) {
			return q
		}
		smallest = min(smallest, q)
	}
	return smallest
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
