package kubestore

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/replicas"
)

const keyReplica = "replica.json"

func replicaObject(service string, id int) string { return fmt.Sprintf("ferry-rep-%s-%d", service, id) }

func errorsIsNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// errBeingDeleted is the error of a write to a service being deleted: for the caller the
// service is gone (store.ErrNotFound).
var errBeingDeleted = fmt.Errorf("being deleted: %w", store.ErrNotFound)

func errDeleting(service string) error { return fmt.Errorf("service %q: %w", service, errBeingDeleted) }

// cachedDeleting reports whether the cache shows service marked by DeleteService. A replica's
// writer asks it on every attempt: once its cache shows the mark it stops writing the record,
// which the delete is about to remove (a writer whose cache lags is retried like any other).
func (s *Store) cachedDeleting(service string) bool {
	cm, err := s.cms.Get(serviceObject(service))
	return err == nil && marked(cm)
}

// NextReplicaIDs implements replicas.Store: the counter in the service's row moves by an
// update conditional on the resourceVersion it read, so an id is handed out once across
// controllers. A service being deleted hands out none. Ids this store reserved when it created
// the service come first, without a write (reservedIDs).
func (s *Store) NextReplicaIDs(service string, n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("next replica ids of %q: asked for %d", service, n)
	}
	if first, ok := s.takeReserved(service, n); ok {
		return first, nil
	}
	var id int
	err := s.updateRow(service, func(_ *corev1.ConfigMap, row *serviceRow) error {
		id = row.NextReplicaID
		row.NextReplicaID += n
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("next replica id of %q: %w", service, err)
	}
	return id, nil
}

// SaveReplica implements replicas.Store: the record is updated where it exists, else created
// (createReplica). Its service must exist: a status write that comes after DeleteService (a
// replica's last transition, racing the delete) fails with store.ErrNotFound and leaves nothing.
func (s *Store) SaveReplica(r replicas.Record) error {
	if err := checkName(r.Service); err != nil {
		return err
	}
	name := replicaObject(r.Service, r.ID)
	create := func() error {
		err := s.createReplica(name, r)
		if apierrors.IsAlreadyExists(err) { // created by another writer: update it
			err = s.updateReplica(name, r)
		}
		return err
	}
	var err error
	if _, cerr := s.cms.Get(name); apierrors.IsNotFound(cerr) {
		// A record the cache has not seen is a new one as a rule (a launch's first save):
		// create it without first asking the API server whether it exists.
		err = create()
	} else {
		err = s.updateReplica(name, r)
	}
	for attempt := 0; apierrors.IsNotFound(err) && attempt < 2; attempt++ {
		err = create()
	}
	if err != nil {
		return fmt.Errorf("save replica %s/%d: %w", r.Service, r.ID, err)
	}
	return nil
}

func (s *Store) updateReplica(name string, r replicas.Record) error {
	_, err := s.configMaps().Update(name, func(cm *corev1.ConfigMap) error {
		if s.cachedDeleting(r.Service) {
			return errDeleting(r.Service)
		}
		return putJSON(cm, keyReplica, r)
	})
	return err
}

// createReplica creates the record of a replica that has none. First the service's id counter
// must be past the id (an adopted instance's), so that a later replica can never get it: the
// counter is moved by a write of the service's row, which also refuses a service that is gone
// or being deleted, unless the cache shows it past the id already (the id was handed out by
// NextReplicaIDs, the usual case: one API call saved on every launch).
// After the create, the service is read again: DeleteService marks the service before it lists
// the replicas to delete, so a record created before the mark is in that list, and one created
// after it is seen here and deleted again. Either way no record outlives its service. The read
// also finds a service deleted and made again under the same name since the cache was read,
// whose counter then still has to move.
// The read is from the API server, unless the store trusts its own view (trustsOwnView): then
// the only DeleteService that can race this create is this store's own, whose mark it reads the
// moment the API server has it. That saves a round trip in series on every launch.
func (s *Store) createReplica(name string, r replicas.Record) error {
	counted := s.cachedCounted(r.Service, r.ID)
	if counted == "" {
		if err := s.countReplicaID(r); err != nil {
			return err
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(name, "replica", r.Service)}
	if err := putJSON(cm, keyReplica, r); err != nil {
		return err
	}
	if s.creating != nil {
		s.creating(name)
	}
	if _, err := s.configMaps().Create(cm); err != nil {
		return err
	}
	svc, err := s.serviceAfterCreate(r.Service)
	switch {
	case err == nil && !marked(svc) && (counted == "" || svc.UID == counted):
		return nil
	case err == nil && !marked(svc):
		// The service was made again since the cache was read: count the id in its row, and
		// keep the record unless that service is going too.
		if err = s.countReplicaID(r); !errors.Is(err, store.ErrNotFound) {
			return err
		}
	case err != nil && !apierrors.IsNotFound(err):
		return err
	}
	if err := s.configMaps().Delete(name); err != nil {
		return fmt.Errorf("remove the record made while the service was deleted: %w", err)
	}
	return errDeleting(r.Service)
}

// serviceAfterCreate is createReplica's read of the service: this store's view when it trusts
// it, the API server's otherwise.
func (s *Store) serviceAfterCreate(service string) (*corev1.ConfigMap, error) {
	if s.trustsOwnView() {
		return s.cms.Get(serviceObject(service))
	}
	ctx, cancel := s.ctx()
	defer cancel()
	return s.client.CoreV1().ConfigMaps(s.ns).Get(ctx, serviceObject(service), metav1.GetOptions{})
}

// countReplicaID moves the service's id counter past r's id.
func (s *Store) countReplicaID(r replicas.Record) error {
	return s.updateRow(r.Service, func(_ *corev1.ConfigMap, row *serviceRow) error {
		row.NextReplicaID = max(row.NextReplicaID, r.ID+1)
		return nil
	})
}

// cachedCounted is the UID of the service's ConfigMap when the cache shows it unmarked with its
// id counter past id, "" otherwise.
func (s *Store) cachedCounted(service string, id int) types.UID {
	cm, err := s.cms.Get(serviceObject(service))
	if err != nil || marked(cm) {
		return ""
	}
	var row serviceRow
	if ok, err := getJSON(cm, keyService, &row); !ok || err != nil || row.NextReplicaID <= id {
		return ""
	}
	return cm.UID
}

// DeleteReplica implements replicas.Store; a record already gone is success.
func (s *Store) DeleteReplica(service string, id int) error {
	return s.configMaps().Delete(replicaObject(service, id))
}

// ListReplicas implements replicas.Store.
func (s *Store) ListReplicas(service string) ([]replicas.Record, error) {
	cms, err := s.cms.List(kindSelector("replica", service))
	if err != nil {
		return nil, err
	}
	out := make([]replicas.Record, 0, len(cms))
	for _, cm := range cms {
		var r replicas.Record
		if _, err := getJSON(cm, keyReplica, &r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b replicas.Record) int { return a.ID - b.ID })
	return out, nil
}
