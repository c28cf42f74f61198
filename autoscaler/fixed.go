// Package autoscaler decides how many replicas each service needs now. It never launches
// anything itself: the controller hands its answer to the replica manager.
package autoscaler

import "github.com/ferryserve/ferry/configs"

// Fixed is the decision for a service without load-based scaling: `replicas: N`, or a
// replica_policy whose min and max agree. Until the load-based policies land it also serves a
// policy with min < max by holding min (never fewer than one replica, so that a scale-to-zero
// service is still reachable before requests can wake it).
func Fixed(p configs.ReplicaPolicy) int {
	return max(p.MinReplicas, min(1, p.MaxReplicas))
}
