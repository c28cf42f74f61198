// Package replicas owns the replica lifecycle of one service: the state machine, readiness
// probes, reconciliation of desired against actual instances, replacement of failed replicas,
// rollouts of new versions, and publication of the READY set to the proxy the moment it
// changes; and, from the replicas, the service's SkyServe status (status.go) and the relay of
// preemption notices to the service they concern (notices.go).
//
// A replica of several nodes (num_nodes > 1) is a gang launched all or nothing in one location,
// served and probed through its head, and judged, replaced and stopped as a whole
// (plan_gang.go).
//
// A Manager reconciles in passes: plan (plan*.go) decides purely, in named phases, and the
// manager applies the result (reconcile.go), writing records before the launches and
// terminations that follow from them (records.go). One run loop owns its state (loop.go);
// readers load a snapshot (snapshot.go). How many replicas to run is handed in
// (SetDesired); it must not know which infra is behind an instance: it talks to a
// launcher.Provider.
package replicas

import (
	"time"
)

// Status is a replica's state, with SkyServe's names so that its users read them unchanged.
type Status string

// Replica states (SkyServe's).
const (
	StatusPending            Status = "PENDING"
	StatusProvisioning       Status = "PROVISIONING"
	StatusStarting           Status = "STARTING"
	StatusReady              Status = "READY"
	StatusNotReady           Status = "NOT_READY"
	StatusShuttingDown       Status = "SHUTTING_DOWN"
	StatusPreempted          Status = "PREEMPTED"
	StatusFailed             Status = "FAILED"
	StatusFailedInitialDelay Status = "FAILED_INITIAL_DELAY"
	StatusFailedProbing      Status = "FAILED_PROBING"
	StatusFailedProvision    Status = "FAILED_PROVISION"
	StatusFailedCleanup      Status = "FAILED_CLEANUP"
	StatusUnknown            Status = "UNKNOWN"
)

// Terminal reports whether a replica in this state will never serve again.
func (s Status) Terminal() bool {
	switch s {
	case StatusPreempted, StatusFailed, StatusFailedInitialDelay, StatusFailedProbing,
		StatusFailedProvision, StatusFailedCleanup:
		return true
	}
	return false
}

// Record is what the store keeps about one replica, and what `serve status` shows.
type Record struct {
	Service    string  `json:"service"`
	ID         int     `json:"id"`
	Version    int     `json:"version"`
	Status     Status  `json:"status"`
	InstanceID string  `json:"instance_id,omitempty"`
	Endpoint   string  `json:"endpoint,omitempty"`
	Infra      string  `json:"infra,omitempty"`
	Zone       string  `json:"zone,omitempty"`
	Spot       bool    `json:"spot"`
	Price      float64 `json:"price_per_hour"`
	Resources  string  `json:"resources,omitempty"`
	// Nodes are the instances of a multi-node replica (num_nodes > 1), rank order: the head,
	// InstanceID, first. Empty for a replica of one node. The SQLite store does not keep them:
	// a restarted controller finds a gang again by the replica id and rank on its nodes, and
	// the first pass fills them in.
	Nodes []string `json:"nodes,omitempty"`
	// Accelerator is the GPU type the replica was placed with, when the launch said (not
	// persisted: a restarted controller falls back to the task's single accelerator).
	Accelerator string    `json:"accelerator,omitempty"`
	LaunchedAt  time.Time `json:"launched_at"`
	// ReadyAt is the first time the replica passed its readiness probe (zero if never).
	ReadyAt time.Time `json:"ready_at"`
	// Reason explains the latest failure or why the replica waits, for status output.
	Reason string `json:"reason,omitempty"`
}

// Store persists replica records so that a restarted controller keeps replica ids and history.
// The controller's SQLite store implements it.
type Store interface {
	// NextReplicaIDs hands out n ≥ 1 new ids for the service in one write, first to
	// first+n-1, never handed out again (SkyServe semantics).
	NextReplicaIDs(service string, n int) (first int, err error)
	// SaveReplica inserts or updates a record keyed by (service, id).
	SaveReplica(r Record) error
	// DeleteReplica forgets a replica once its instance is gone.
	DeleteReplica(service string, id int) error
	// ListReplicas returns the service's records ordered by id.
	ListReplicas(service string) ([]Record, error)
}

// Endpoint is one READY replica as the proxy needs it.
type Endpoint struct {
	ReplicaID int
	Version   int
	// Addr is host:port.
	Addr string
	// Accelerator is the GPU type, for instance-aware policies ("" when none).
	Accelerator string
}
