package controller

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
	"github.com/ferryserve/ferry/tenants"
)

// timedStore times every write of the store it wraps into ferry_store_write_duration_seconds,
// whichever backend it is: a write is what a replica's launch or status change waits on, and
// on the Kubernetes store what the client-side rate limit delays. Reads pass through untimed
// (embedded). A write method added to store.Store must be added here too; TestTimedStoreTimesEveryWrite
// checks that every method is either timed or listed as a read.
type timedStore struct {
	store.Store
	writes *prometheus.HistogramVec
	kind   string
}

// time starts timing op; call the result when the write returns.
func (s timedStore) time(op string) func() {
	start := time.Now()
	return func() { s.writes.WithLabelValues(s.kind, op).Observe(time.Since(start).Seconds()) }
}

func (s timedStore) CreateService(svc store.Service) error {
	defer s.time("CreateService")()
	return s.Store.CreateService(svc)
}

func (s timedStore) SetServiceStatus(name, status string) error {
	defer s.time("SetServiceStatus")()
	return s.Store.SetServiceStatus(name, status)
}

func (s timedStore) SetTarget(name string, n int) error {
	defer s.time("SetTarget")()
	return s.Store.SetTarget(name, n)
}

func (s timedStore) DeleteService(name string) error {
	defer s.time("DeleteService")()
	return s.Store.DeleteService(name)
}

func (s timedStore) StartUpdate(service string, v replicas.Version, r replicas.Rollout) error {
	defer s.time("StartUpdate")()
	return s.Store.StartUpdate(service, v, r)
}

func (s timedStore) SaveLosses(service string, l replicas.Losses) error {
	defer s.time("SaveLosses")()
	return s.Store.SaveLosses(service, l)
}

func (s timedStore) SaveRollout(service string, r replicas.Rollout) error {
	defer s.time("SaveRollout")()
	return s.Store.SaveRollout(service, r)
}

func (s timedStore) NextReplicaIDs(service string, n int) (int, error) {
	defer s.time("NextReplicaIDs")()
	return s.Store.NextReplicaIDs(service, n)
}

func (s timedStore) SaveReplica(r replicas.Record) error {
	defer s.time("SaveReplica")()
	return s.Store.SaveReplica(r)
}

func (s timedStore) DeleteReplica(service string, id int) error {
	defer s.time("DeleteReplica")()
	return s.Store.DeleteReplica(service, id)
}

func (s timedStore) CreateJob(j jobs.Job) (int64, error) {
	defer s.time("CreateJob")()
	return s.Store.CreateJob(j)
}

func (s timedStore) SaveJob(j jobs.Job) error {
	defer s.time("SaveJob")()
	return s.Store.SaveJob(j)
}

func (s timedStore) PutLeftover(l launcher.Leftover) error {
	defer s.time("PutLeftover")()
	return s.Store.PutLeftover(l)
}

func (s timedStore) DeleteLeftover(key string) error {
	defer s.time("DeleteLeftover")()
	return s.Store.DeleteLeftover(key)
}

func (s timedStore) PutTenants(d tenants.Directory) error {
	defer s.time("PutTenants")()
	return s.Store.PutTenants(d)
}

func (s timedStore) AddUsage(rows []tenants.Row) error {
	defer s.time("AddUsage")()
	return s.Store.AddUsage(rows)
}
