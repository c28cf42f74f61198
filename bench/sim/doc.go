// Package sim is `ferry sim`: it replays a real request trace and real spot-capacity traces
// against Ferry's own autoscaler (package autoscaler), spot/on-demand split (policy.Split) and
// zone order (policy.SpotOrder), and scores them against SkyServe+SpotHedge and all on-demand
// on availability, cost and SLO attainment.
//
// Nothing here re-implements a Ferry decision: at each decision interval the runner asks an
// autoscaler.Scaler for a target on what autoscaler.Observe makes of the sample, exactly as the
// controller does, splits it with policy.Split, and tries zones in policy.SpotOrder, skipping
// those blocked as launcher/provision blocks them. SkyServe's own decisions (its request-rate
// autoscaler, its fallback, SpotHedge's zone states) are modelled from its source. What the
// package adds is the world those decisions act on: a fleet of replicas with cold starts, spot
// zones whose capacity follows their trace (spot.go: a launch beyond it is refused, a drop
// reclaims the newest excess after the cloud's notice to those instances only), a load balancer
// routing each request to the least loaded READY replica, and per replica a vLLM-like engine
// (engine.go, constants in model.go) that turns routing into time to first token and time per
// output token.
//
// Run it with `ferry sim` (cmd/ferry/sim.go), or `make bench-sim` for the fleet-size sweep over
// every spot set (sweep.go); bench/README.md explains the inputs, the model and the results.
package sim
