// Package sim is `ferry sim`: it replays a real request trace and real spot-capacity traces
// against Ferry's own autoscaler (package autoscaler) and spot placer (policy.Zones), and scores
// scaling policies on SLO attainment, availability and cost.
//
// Nothing here re-implements a decision: at each decision interval the runner asks an
// autoscaler.Scaler for a target exactly as the controller does, splits it into spot and
// on-demand with policy.Split, and places spot replicas with policy.Zones. What the package
// adds is the world those decisions act on: a fleet of replicas with cold starts, spot zones
// that lose capacity when their trace says so (preempting what runs there), a load balancer
// routing each request to the least loaded READY replica, and per replica a vLLM-like engine
// (engine.go, constants in model.go) that turns routing into time to first token and time per
// output token.
//
// Run it with `ferry sim` (cmd/ferry/sim.go) or `make bench-sim`; bench/README.md explains
// the inputs, the model and the results.
package sim
