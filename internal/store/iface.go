package store

import (
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// Store is the controller's state: services with their versions, rollout and spot losses,
// replicas, jobs, and the leftovers the provisioner still has to stop on infras that did not
// answer, and the tenants' keys and usage.
// SQLite (this package) is the embedded default for one machine; internal/store/kubestore keeps
// the same state as objects in a Kubernetes API server for controllers that fail over. Both pass
// the same contract tests (internal/store/storetest).
//
// Errors: a missing service is ErrNotFound (wrapped), whatever the backend.
type Store interface {
	replicas.Store
	replicas.RolloutStore
	// LossStore keeps each service's spot losses with the service (they go with it).
	replicas.LossStore
	jobs.Store
	// Ledger keeps the leftovers across restarts and failovers; a PutLeftover without a key
	// is refused.
	launcher.Ledger
	// TenantStore keeps the API keys' directory and their usage (tenants.go).
	TenantStore

	// CreateService records a new service at version 1 (its first version recorded too); it
	// fails if the name exists.
	CreateService(svc Service) error
	GetService(name string) (Service, error)
	// ListServices returns every service ordered by name.
	ListServices() ([]Service, error)
	SetServiceStatus(name, status string) error
	// SetTarget records the replica count last decided.
	SetTarget(name string, n int) error
	// DeleteService forgets the service, its versions, rollout and replicas.
	DeleteService(name string) error
	// Versions returns the service's recorded versions, oldest first.
	Versions(service string) ([]replicas.Version, error)
	// Rollout returns the service's latest rollout, nil if it never had one.
	Rollout(service string) (*replicas.Rollout, error)
	Close() error
}

var _ Store = (*SQLite)(nil)
