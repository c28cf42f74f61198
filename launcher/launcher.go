// Package launcher is Ferry's one provisioner, shared by services and jobs. A Provider starts,
// stops and lists instances on one infra; callers never learn which cloud API is behind one.
//
// It must not know about services or requests: a Spec is a program to run with labels on it.
package launcher

import (
	"context"
	"errors"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// Labels every instance Ferry makes carries, so that a restarted controller (or kubectl) can
// tell what an instance is without any other state.
const (
	LabelService   = "ferry.service"
	LabelVersion   = "ferry.version"
	LabelReplicaID = "ferry.replica-id"
	// LabelOwner marks instances made by Ferry at all.
	LabelOwner = "ferry.managed"
)

// Spec is one instance to launch: what to run on it and how to recognise it later.
type Spec struct {
	// Name is unique among live instances, e.g. "chat-3".
	Name   string
	Labels map[string]string
	// Setup runs before Run, in the same shell environment.
	Setup   string
	Run     string
	Workdir string
	// Envs includes secrets; providers must never log values.
	Envs map[string]string
	// Port is the port the program must serve on. A provider that cannot give every instance
	// the same port (local processes share one host) chooses another and reports it in
	// Instance.Endpoint and tells the program through FERRY_PORT.
	Port      int
	Resources configs.Resources
}

// State is an instance's state as its infra reports it.
type State string

// Instance states.
const (
	StatePending    State = "PENDING"
	StateRunning    State = "RUNNING"
	StateTerminated State = "TERMINATED"
	StatePreempted  State = "PREEMPTED"
)

// Instance is one launched machine, pod or process.
type Instance struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	// Endpoint is host:port where the program's service port is reachable from the proxy.
	Endpoint     string    `json:"endpoint"`
	Infra        string    `json:"infra"`
	Region       string    `json:"region,omitempty"`
	Zone         string    `json:"zone,omitempty"`
	Spot         bool      `json:"spot"`
	PricePerHour float64   `json:"price_per_hour"`
	State        State     `json:"state"`
	LaunchedAt   time.Time `json:"launched_at"`
	// Reason says why an instance ended (exit status, preemption notice), when known.
	Reason string `json:"reason,omitempty"`
}

// Provider is the one interface every infra implements. Extra abilities (spot notices, logs,
// queued provisioning) are optional interfaces found by type assertion.
type Provider interface {
	// Launch starts one instance and returns once it exists (not once it is ready).
	Launch(ctx context.Context, spec Spec) (Instance, error)
	// Terminate stops an instance and everything it started. Terminating an instance that is
	// already gone is not an error.
	Terminate(ctx context.Context, id string) error
	// List returns the instances whose labels include every key/value of selector, including
	// ones launched by an earlier controller process. Ended instances may be reported with
	// StateTerminated or StatePreempted until terminated.
	List(ctx context.Context, selector map[string]string) ([]Instance, error)
}

// LogSource is an optional Provider capability: where an instance's output can be read.
type LogSource interface {
	// LogPath returns a local file holding the instance's stdout and stderr.
	LogPath(id string) (string, error)
}

// Typed errors callers act on: capacity and quota fail over to another location, unauthorised
// and invalid stop the launch, preempted is replaced. Wrap them with %w.
var (
	ErrNoCapacity   = errors.New("no capacity")
	ErrQuota        = errors.New("quota exceeded")
	ErrUnauthorized = errors.New("unauthorized")
	ErrInvalid      = errors.New("invalid request")
	ErrPreempted    = errors.New("preempted")
	ErrNotFound     = errors.New("instance not found")
)

// Matches reports whether labels include every key/value of selector.
func Matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}
