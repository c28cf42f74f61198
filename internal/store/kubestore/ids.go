package kubestore

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/ferryserve/ferry/configs"
)

// reservedIDs are the replica ids a store reserved for the services it created: CreateService
// writes the service's counter past its initial replicas' ids, in the create itself, and this
// store hands those ids out first. A new service's first pass then makes one round trip in series
// (its records' creates, at once) where it made two (the counter's write, then the records).
//
// The ids are taken from the counter before anyone can use them, so they are unique across
// controllers as every other id is; a controller that dies before it hands them out leaves a gap
// in the service's ids, never a reuse.
type reservedIDs struct {
	mu  sync.Mutex
	svc map[string]idBlock
}

// idBlock is ids next up to end (excluded), reserved in the service whose ConfigMap has uid: a
// service deleted and made again under the same name has another.
type idBlock struct {
	uid       types.UID
	next, end int
}

// initialReplicas is how many replicas a service starts with: the ids its create reserves.
func initialReplicas(task *configs.Task) int {
	if task == nil || task.Service == nil {
		return 0
	}
	return max(task.Service.ReplicaPolicy.MinReplicas, 0)
}

func (s *Store) reserve(service string, b idBlock) {
	s.reserved.mu.Lock()
	defer s.reserved.mu.Unlock()
	s.reserved.svc[service] = b
}

// takeReserved hands out n reserved ids of service, ok false when it has fewer left (they are
// dropped: ids keep growing), or when its ConfigMap is not the one they were reserved in or is
// being deleted.
func (s *Store) takeReserved(service string, n int) (first int, ok bool) {
	s.reserved.mu.Lock()
	defer s.reserved.mu.Unlock()
	b, have := s.reserved.svc[service]
	if !have {
		return 0, false
	}
	if cm, err := s.cms.Get(serviceObject(service)); err != nil || cm.UID != b.uid || marked(cm) || b.end-b.next < n {
		delete(s.reserved.svc, service)
		return 0, false
	}
	first, b.next = b.next, b.next+n
	s.reserved.svc[service] = b
	return first, true
}

// dropReserved forgets the reserved ids of a service being deleted.
func (s *Store) dropReserved(service string) {
	s.reserved.mu.Lock()
	defer s.reserved.mu.Unlock()
	delete(s.reserved.svc, service)
}
