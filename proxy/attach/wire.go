package attach

import (
	"time"

	"github.com/ferryserve/ferry/proxy"
)

// Long-poll bounds for GET /v1/services/{name}/replicaset.
const (
	// DefaultPollWait is how long a poll without wait= is held.
	DefaultPollWait = 30 * time.Second
	// MaxPollWait caps wait=, so a poll never outlives ordinary idle timeouts between the
	// proxy and the controller.
	MaxPollWait = 60 * time.Second
)

// ReplicaSet is what an attached proxy serves: a service's READY replicas and the proxy
// configuration from its YAML. Seq identifies it: it grows with every change of either, and a
// restarted controller starts above any Seq its predecessor handed out. Seq 0 means the
// controller has not published a set for the service yet (it is still probing the replicas it
// adopted); a proxy keeps what it serves until a set with a non-zero Seq arrives.
type ReplicaSet struct {
	Service string `json:"service"`
	Seq     uint64 `json:"seq"`
	// Backends are the READY replicas exactly as the controller hands them to its own proxy.
	Backends []proxy.Backend `json:"backends"`
	// Disaggregated says the service prefills on a pool of its own, and Prefill is that pool's
	// READY replicas (proxy.Service's SetPrefillBackends), possibly none.
	Disaggregated bool            `json:"disaggregated,omitempty"`
	Prefill       []proxy.Backend `json:"prefill,omitempty"`
	Config        ProxyConfig     `json:"config"`
	// Proxies is how many attached proxies share the replicas (those that reported lately,
	// at least 1): each takes that share of a replica's in-flight cap
	// (proxy.ServiceConfig.ReplicaShares). It does not move Seq: a proxy applies a new count
	// from any answer.
	Proxies int `json:"proxies,omitempty"`
}

// LoadReport is what an attached proxy tells the controller about itself, about twice a
// second: enough for the replica manager to know when a leaving replica is idle everywhere and
// for the autoscaler to count the proxy's traffic.
type LoadReport struct {
	// ProxyID is random per proxy process, so a restarted proxy is a new one.
	ProxyID string `json:"proxy_id"`
	// Seq is the ReplicaSet the proxy serves. Until it equals the controller's, the proxy may
	// still send new requests to a replica that has left the set.
	Seq uint64 `json:"seq"`
	// InFlight maps a replica's address to the requests in flight there, streams included,
	// also for replicas that have already left the set.
	InFlight map[string]int64 `json:"in_flight,omitempty"`
	// Arrivals counts the requests the proxy received since it started.
	Arrivals uint64 `json:"arrivals"`
	// Waiting counts the requests waiting in the proxy: held for want of a READY replica, or
	// for a free slot while every replica is at its cap (proxy.Service.Waiting). The hub adds
	// them to the service's concurrency, so that scaling sees the demand held there.
	Waiting int64 `json:"waiting"`
	// PrefillTokens is the prompt tokens the proxy is prefilling now (proxy.Service's
	// PrefillTokens), what a prefill pool scales on.
	PrefillTokens int64 `json:"prefill_tokens,omitempty"`
	// PrefillInFlight maps each prefill replica's address to the prefill steps in flight there,
	// also for replicas that left the pool (proxy.Service's PrefillBusy). It is not the
	// service's load (InFlight is), only what a leaving prefill replica waits for.
	PrefillInFlight map[string]int64 `json:"prefill_in_flight,omitempty"`
}
