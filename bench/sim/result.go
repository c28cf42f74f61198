package sim

// Result is one policy's score over the horizon (the warm-up excluded).
type Result struct {
	Policy      string `json:"policy"`
	Description string `json:"description"`

	// Requests arrived in the horizon; MetSLO of them met both the TTFT and the TPOT SLO.
	Requests int `json:"requests"`
	MetSLO   int `json:"met_slo"`
	// Served finished; Failed were lost with a replica (preemption, a drain that timed out);
	// Rejected got 503 (no READY replica at SkyServe, or a hold that expired or overflowed at
	// Ferry); Unservable are longer than the engine's max_model_len (400 everywhere).
	Served     int `json:"served"`
	Failed     int `json:"failed"`
	Rejected   int `json:"rejected"`
	Unservable int `json:"unservable"`
	// SLOAttainment is MetSLO / Requests: failed, rejected and unservable requests are misses.
	SLOAttainment float64 `json:"slo_attainment"`
	// Misses are the requests that missed the SLO (unservable ones aside) by what they found
	// on arrival: no replica READY (held or rejected), fewer READY than World.MinReady, or at
	// least that many. It says whether a policy's misses are spells with nothing standing,
	// a short fleet, or load at full strength.
	Misses [3]int `json:"misses_by_ready"`
	// NoneReadySpells counts the times the service fell to no replica READY, and
	// NoneReadySeconds how long it stayed there in all: the spells a hold or a 503 covers.
	NoneReadySpells  int     `json:"none_ready_spells"`
	NoneReadySeconds float64 `json:"none_ready_seconds"`

	// Availability is AvailableTicks / Ticks: 30 s ticks with at least World.MinReady READY
	// replicas, the same count for every policy (SpotHedge's definition; replicas in cold
	// start are not READY).
	Availability   float64 `json:"availability"`
	AvailableTicks int     `json:"available_ticks"`
	Ticks          int     `json:"ticks"`
	// OwnTargetAvailability is OwnTargetTicks / Ticks: ticks with the policy's own target
	// (without num_overprovision or headroom) READY, the simulator's earlier figure.
	OwnTargetAvailability float64 `json:"own_target_availability"`
	OwnTargetTicks        int     `json:"own_target_ticks"`

	// Replica-hours from launch to termination (provisioning, READY and draining), and their
	// cost at catalog prices.
	SpotHours     float64 `json:"spot_hours"`
	OnDemandHours float64 `json:"ondemand_hours"`
	SpotCost      float64 `json:"spot_cost_usd"`
	OnDemandCost  float64 `json:"ondemand_cost_usd"`
	Cost          float64 `json:"cost_usd"`
	// CostVsOnDemand is Cost over the ondemand policy's (0 when it did not run).
	CostVsOnDemand float64 `json:"cost_vs_ondemand"`
	// NormalizedCost is SpotHedge's: spot hours + 3 × on-demand hours, and
	// NormalizedVsOnDemand its ratio to the ondemand policy's.
	NormalizedCost       float64 `json:"normalized_cost"`
	NormalizedVsOnDemand float64 `json:"normalized_vs_ondemand"`

	Preemptions int `json:"preemptions"`
	// RefusedSpotLaunches counts launch attempts that a zone without capacity refused. The
	// placer then tries another zone, and when none takes the replica the next decision
	// tries again, so a policy deciding every second counts many during an outage.
	RefusedSpotLaunches int `json:"refused_spot_launches"`
	Launches            int `json:"launches"`
	// SpreadMoves counts the spot replicas launched to spread the fleet over zones again
	// (Policy.Spread), each followed by a drain in the crowded zone once READY.
	SpreadMoves int `json:"spread_moves,omitempty"`
	// ScaleUps and ScaleDowns count decisions that raised or lowered the target.
	ScaleUps   int `json:"scale_ups"`
	ScaleDowns int `json:"scale_downs"`

	// Percentiles over served requests, in seconds.
	TTFTp50 float64 `json:"ttft_p50_s"`
	TTFTp99 float64 `json:"ttft_p99_s"`
	TPOTp50 float64 `json:"tpot_p50_s"`
	TPOTp99 float64 `json:"tpot_p99_s"`

	// Elapsed is the wall time the simulation took.
	Elapsed string `json:"elapsed"`

	timeline timeline
}

// timeline is sampled once a simulated minute for the plot.
type timeline struct {
	readySpot, readyOnDemand, target []int
	// preemptions are the times (seconds into the horizon) replicas were preempted.
	preemptions []float64
}

func (t *timeline) add(spot, onDemand, target int) {
	t.readySpot = append(t.readySpot, spot)
	t.readyOnDemand = append(t.readyOnDemand, onDemand)
	t.target = append(t.target, target)
}
