package kubestore

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/replicas"
)

const keyReplica = "replica.json"

func replicaObject(service string, id int) string { return fmt.Sprintf("ferry-rep-%s-%d", service, id) }

func errorsIsNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// NextReplicaID implements replicas.Store: the counter in the service's row moves by an update
// conditional on the resourceVersion it read, so an id is handed out once across controllers.
func (s *Store) NextReplicaID(service string) (int, error) {
	var id int
	err := s.updateRow(service, func(_ *corev1.ConfigMap, row *serviceRow) error {
		id = row.NextReplicaID
		row.NextReplicaID++
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("next replica id of %q: %w", service, err)
	}
	return id, nil
}

// SaveReplica implements replicas.Store. An id at or past the counter (an adopted instance)
// moves the counter past it first, so a later replica can never collide with it.
func (s *Store) SaveReplica(r replicas.Record) error {
	if err := checkName(r.Service); err != nil {
		return err
	}
	if cm, err := s.cms.Get(serviceObject(r.Service)); err == nil {
		var row serviceRow
		if _, err := getJSON(cm, keyService, &row); err == nil && r.ID >= row.NextReplicaID {
			err := s.updateRow(r.Service, func(_ *corev1.ConfigMap, row *serviceRow) error {
				row.NextReplicaID = max(row.NextReplicaID, r.ID+1)
				return nil
			})
			if err != nil && !errorsIsNotFound(err) {
				return fmt.Errorf("save replica %s/%d: %w", r.Service, r.ID, err)
			}
		}
	}
	name := replicaObject(r.Service, r.ID)
	objs := s.configMaps()
	_, err := objs.Update(name, func(cm *corev1.ConfigMap) error { return putJSON(cm, keyReplica, r) })
	if apierrors.IsNotFound(err) {
		cm := &corev1.ConfigMap{ObjectMeta: objectMeta(name, "replica", r.Service)}
		if err := putJSON(cm, keyReplica, r); err != nil {
			return err
		}
		_, err = objs.Create(cm)
	}
	if err != nil {
		return fmt.Errorf("save replica %s/%d: %w", r.Service, r.ID, err)
	}
	return nil
}

// DeleteReplica implements replicas.Store.
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
