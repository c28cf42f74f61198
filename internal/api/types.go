// Package api is the controller's HTTP+JSON API: the types on the wire, the server that puts
// them in front of the controller (on its Unix socket, and on TCP when asked for), and the
// client the CLI and attached proxies use. Every route requires a bearer token, on the socket
// too: the controller token, or for the two attach routes the narrower attach token.
package api

import (
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// Service statuses (SkyServe's names; replicas.Manager.ServiceStatus decides them).
const (
	ServiceControllerInit = replicas.ServiceControllerInit
	ServiceReplicaInit    = replicas.ServiceReplicaInit
	ServiceReady          = replicas.ServiceReady
	ServiceNoReplica      = replicas.ServiceNoReplica
	ServiceShuttingDown   = replicas.ServiceShuttingDown
	ServiceFailed         = replicas.ServiceFailed
	ServiceFailedCleanup  = replicas.ServiceFailedCleanup
)

// CreateServiceRequest launches a new service from a parsed, validated task.
type CreateServiceRequest struct {
	Name string        `json:"name"`
	Task *configs.Task `json:"task"`
}

// UpdateServiceRequest rolls a service out to a new version of its task.
type UpdateServiceRequest struct {
	Task *configs.Task `json:"task"`
	// Mode, when set, overrides the task's service.update.mode: rolling or blue_green.
	Mode string `json:"mode,omitempty"`
}

// ServiceStatus is one service as `serve status` shows it. Task is redacted.
type ServiceStatus struct {
	Name           string    `json:"name"`
	Version        int       `json:"version"`
	Status         string    `json:"status"`
	Endpoint       string    `json:"endpoint"`
	Policy         string    `json:"load_balancing_policy"`
	CreatedAt      time.Time `json:"created_at"`
	TargetReplicas int       `json:"target_replicas"`
	// Autoscaler is the scaling policy ("" for a fixed count) and Scaling its latest reason
	// for TargetReplicas.
	Autoscaler    string            `json:"autoscaler,omitempty"`
	Scaling       string            `json:"scaling,omitempty"`
	ReadyReplicas int               `json:"ready_replicas"`
	Replicas      []replicas.Record `json:"replicas"`
	Task          *configs.Task     `json:"task,omitempty"`
	// Update is the latest rollout (in progress or finished); nil before the first update.
	Update *replicas.Rollout `json:"update,omitempty"`
	// Message explains a FAILED or waiting state.
	Message string `json:"message,omitempty"`
	// Unknown are the parts of the infras the replica manager's last listing could not read:
	// replicas there are kept as last seen, since an infra that does not answer says nothing
	// about whether they still run.
	Unknown []UnknownPart `json:"unknown,omitempty"`
	// Infras are the breakers of the infras (and their zones) the service's replicas are on
	// or that its listing could not read, so that a READY replica on a failing infra is seen
	// for what it is. Read from the controller's memory.
	Infras []launcher.InfraState `json:"infras,omitempty"`
	// SpotLosses are the service's spot losses as its replica manager counts them, and the
	// hold of its on-demand fallback they decide; nil before the first loss.
	SpotLosses *SpotLosses `json:"spot_losses,omitempty"`
	// Prefill is a disaggregated service's prefill pool (service.pools.prefill); nil for a
	// service whose replicas prefill what they decode.
	Prefill *PoolStatus `json:"prefill,omitempty"`
}

// PoolStatus is one pool of a disaggregated service: its replicas and its own scaling.
type PoolStatus struct {
	Name           string            `json:"name"`
	Status         string            `json:"status"`
	TargetReplicas int               `json:"target_replicas"`
	ReadyReplicas  int               `json:"ready_replicas"`
	Scaling        string            `json:"scaling,omitempty"`
	Replicas       []replicas.Record `json:"replicas"`
}

// SpotLosses is replicas.Losses (policy.Losses) with what it decides at the time of the
// status: Hold is how long after the last loss the fallback is kept, learned from RecentGaps
// gaps between losses, and HeldUntil when that ends, zero when nothing is held now.
type SpotLosses struct {
	replicas.Losses
	Hold       time.Duration `json:"hold,omitempty"`
	RecentGaps int           `json:"recent_gaps,omitempty"`
	HeldUntil  time.Time     `json:"held_until,omitzero"`
	// Spare is the spare spot replicas the service runs now beyond its target while a zone
	// sits at its ceiling (policy.Losses.Spare).
	Spare int `json:"spare,omitempty"`
}

// ControllerStatus describes the running controller.
type ControllerStatus struct {
	PID int `json:"pid"`
	// Socket is the API's Unix socket; Addr its TCP address, empty without one.
	Socket    string    `json:"socket,omitempty"`
	Addr      string    `json:"addr,omitempty"`
	Home      string    `json:"home"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	Services  int       `json:"services"`
	// Gateway is the shared endpoint that routes by model; empty when it is off.
	Gateway string `json:"gateway,omitempty"`
	// Metrics is the Prometheus scrape URL of the controller's metrics listener; empty when it
	// is off or its default address was taken.
	Metrics string `json:"metrics,omitempty"`
}
