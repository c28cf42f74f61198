package kubestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/replicas"
)

// Keys of a service's ConfigMap and its sealed ConfigMap.
const (
	keyService       = "service.json"
	keyRollout       = "rollout.json"
	keyLosses        = "spot-losses.json"
	keyVersionPrefix = "version-"
	suffixRecord     = ".json"
	suffixTask       = ".task.json" // sealed: the full task of a version
)

// serviceRow is the service's own record, keyService in its ConfigMap.
type serviceRow struct {
	Version       int       `json:"version"`
	Port          int       `json:"port"`
	Status        string    `json:"status"`
	Target        int       `json:"target"`
	NextReplicaID int       `json:"next_replica_id"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// versionRecord is one version, keyVersionPrefix+N+suffixRecord; Task is redacted, the full task
// is sealed (sealed.go).
type versionRecord struct {
	Number     int           `json:"number"`
	LaunchedAs int           `json:"launched_as"`
	Task       *configs.Task `json:"task"`
	CreatedAt  time.Time     `json:"created_at"`
}

func serviceObject(name string) string { return "ferry-svc-" + name }
func versionKey(n int) string          { return keyVersionPrefix + strconv.Itoa(n) + suffixRecord }
func versionTaskKey(n int) string      { return keyVersionPrefix + strconv.Itoa(n) + suffixTask }

func putJSON(cm *corev1.ConfigMap, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[key] = string(b)
	return nil
}

func getJSON(cm *corev1.ConfigMap, key string, v any) (bool, error) {
	s, ok := cm.Data[key]
	if !ok {
		return false, nil
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return true, fmt.Errorf("kubestore: %s %s: %w", cm.Name, key, err)
	}
	return true, nil
}

// CreateService implements store.Store.
func (s *Store) CreateService(svc store.Service) error {
	if err := checkName(svc.Name); err != nil {
		return err
	}
	name := serviceObject(svc.Name)
	if _, err := s.cms.Get(name); err == nil {
		return fmt.Errorf("create service %q: it exists", svc.Name)
	}
	now := time.Now().UTC()
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(name, "service", svc.Name)}
	// The initial replicas' ids are reserved in the create (ids.go).
	initial := initialReplicas(svc.Task)
	row := serviceRow{Version: svc.Version, Port: svc.Port, Status: svc.Status, Target: -1, NextReplicaID: 1 + initial, CreatedAt: now, UpdatedAt: now}
	if err := putJSON(cm, keyService, row); err != nil {
		return err
	}
	if err := putJSON(cm, versionKey(svc.Version), versionRecord{Number: svc.Version, LaunchedAs: svc.Version, Task: svc.Task.Redacted(), CreatedAt: now}); err != nil {
		return err
	}
	created, err := s.configMaps().Create(cm)
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create service %q: it exists", svc.Name)
		}
		return fmt.Errorf("create service %q: %w", svc.Name, err)
	}
	// Sealed values left by a service of the same name whose deletion failed start afresh.
	if err := s.putSecret(name, svc.Name, true, map[string]any{versionTaskKey(svc.Version): svc.Task}); err != nil {
		_ = s.configMaps().Delete(name)
		return fmt.Errorf("create service %q: %w", svc.Name, err)
	}
	if initial > 0 {
		s.reserve(svc.Name, idBlock{uid: created.UID, next: 1, end: 1 + initial})
	}
	return nil
}

// serviceConfigMap is the cached ConfigMap of a service, store.ErrNotFound when there is none.
func (s *Store) serviceConfigMap(service string) (*corev1.ConfigMap, error) {
	cm, err := s.cms.Get(serviceObject(service))
	return cm, wrapNotFound(err, fmt.Sprintf("service %q", service))
}

// GetService implements store.Store.
func (s *Store) GetService(name string) (store.Service, error) {
	cm, err := s.serviceConfigMap(name)
	if err != nil {
		return store.Service{}, err
	}
	return s.readService(name, cm)
}

func (s *Store) readService(name string, cm *corev1.ConfigMap) (store.Service, error) {
	var row serviceRow
	if ok, err := getJSON(cm, keyService, &row); err != nil || !ok {
		return store.Service{}, fmt.Errorf("kubestore: service %q: no row (%v)", name, err)
	}
	task := new(configs.Task)
	if err := s.secretJSON(cm.Name, versionTaskKey(row.Version), task); err != nil {
		return store.Service{}, fmt.Errorf("service %q: %w", name, err)
	}
	return store.Service{Name: name, Version: row.Version, Task: task, Port: row.Port, Status: row.Status, Target: row.Target,
		CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt}, nil
}

// ListServices implements store.Store.
func (s *Store) ListServices() ([]store.Service, error) {
	cms, err := s.cms.List(kindSelector("service", ""))
	if err != nil {
		return nil, err
	}
	out := make([]store.Service, 0, len(cms))
	for _, cm := range cms {
		svc, err := s.readService(cm.Labels[LabelService], cm)
		if err != nil {
			return nil, err
		}
		out = append(out, svc)
	}
	slices.SortFunc(out, func(a, b store.Service) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// updateRow is a read-modify-write of a service's ConfigMap through its row. A service being
// deleted (marked by DeleteService) is written no more: errDeleting.
func (s *Store) updateRow(service string, mutate func(cm *corev1.ConfigMap, row *serviceRow) error) error {
	_, err := s.configMaps().Update(serviceObject(service), func(cm *corev1.ConfigMap) error {
		var row serviceRow
		if _, err := getJSON(cm, keyService, &row); err != nil {
			return err
		}
		if err := mutate(cm, &row); err != nil {
			return err
		}
		row.UpdatedAt = time.Now().UTC()
		return putJSON(cm, keyService, row)
	})
	if errors.Is(err, errBeingDeleted) {
		return errDeleting(service)
	}
	return wrapNotFound(err, fmt.Sprintf("service %q", service))
}

// SetServiceStatus implements store.Store. The status of a service being deleted stays what it
// was when the delete began (SHUTTING_DOWN, when the controller takes it down) and the write is
// dropped: the service is going, and a delete cut short finds that status on the next start.
func (s *Store) SetServiceStatus(name, status string) error {
	err := s.updateRow(name, func(_ *corev1.ConfigMap, row *serviceRow) error { row.Status = status; return nil })
	if errors.Is(err, errBeingDeleted) {
		return nil
	}
	return err
}

// SetTarget implements store.Store. A service that is gone has no target to keep.
func (s *Store) SetTarget(name string, n int) error {
	err := s.updateRow(name, func(_ *corev1.ConfigMap, row *serviceRow) error { row.Target = n; return nil })
	if apierrors.IsNotFound(err) || errorsIsNotFound(err) {
		return nil
	}
	return err
}

// StartUpdate implements replicas.RolloutStore: the version, the rollout and the service's
// current version change in one write of the service's ConfigMap. The new version's full task
// is sealed first: nothing names it until that write.
func (s *Store) StartUpdate(service string, v replicas.Version, r replicas.Rollout) error {
	cm, err := s.serviceConfigMap(service)
	if err != nil {
		return err
	}
	if _, ok := cm.Data[versionKey(v.Number)]; ok {
		return fmt.Errorf("record version %d of %q: it exists", v.Number, service)
	}
	if marked(cm) {
		return errDeleting(service)
	}
	if err := s.updateSecret(cm.Name, map[string]any{versionTaskKey(v.Number): v.Task}); err != nil {
		return wrapNotFound(err, fmt.Sprintf("record version %d of %q", v.Number, service))
	}
	rec := versionRecord{Number: v.Number, LaunchedAs: v.LaunchedAs, Task: v.Task.Redacted(), CreatedAt: time.Now().UTC()}
	return s.updateRow(service, func(cm *corev1.ConfigMap, row *serviceRow) error {
		if _, ok := cm.Data[versionKey(v.Number)]; ok {
			return fmt.Errorf("record version %d of %q: it exists", v.Number, service)
		}
		if err := putJSON(cm, versionKey(v.Number), rec); err != nil {
			return err
		}
		return setRollout(cm, row, service, r)
	})
}

// SaveRollout implements replicas.RolloutStore: it saves the rollout and makes its target the
// service's current version.
func (s *Store) SaveRollout(service string, r replicas.Rollout) error {
	return s.updateRow(service, func(cm *corev1.ConfigMap, row *serviceRow) error { return setRollout(cm, row, service, r) })
}

func setRollout(cm *corev1.ConfigMap, row *serviceRow, service string, r replicas.Rollout) error {
	if _, ok := cm.Data[versionKey(r.Target())]; !ok {
		return fmt.Errorf("save rollout of %q: version %d: %w", service, r.Target(), store.ErrNotFound)
	}
	r.NewHealthy, r.NewReady, r.OldLive, r.Desired = 0, 0, 0, 0 // live counts are not state
	row.Version = r.Target()
	return putJSON(cm, keyRollout, r)
}

// SaveLosses implements replicas.LossStore. A service that is gone, or going, has no losses
// to keep.
func (s *Store) SaveLosses(service string, l replicas.Losses) error {
	err := s.updateRow(service, func(cm *corev1.ConfigMap, _ *serviceRow) error { return putJSON(cm, keyLosses, l) })
	if apierrors.IsNotFound(err) || errorsIsNotFound(err) { // errBeingDeleted too
		return nil
	}
	return err
}

// Losses implements replicas.LossStore: the zero value for a service that saved none.
func (s *Store) Losses(service string) (replicas.Losses, error) {
	var l replicas.Losses
	cm, err := s.cms.Get(serviceObject(service))
	if apierrors.IsNotFound(err) {
		return l, nil
	}
	if err != nil {
		return l, err
	}
	_, err = getJSON(cm, keyLosses, &l)
	return l, err
}

// Versions implements store.Store.
func (s *Store) Versions(service string) ([]replicas.Version, error) {
	cm, err := s.cms.Get(serviceObject(service))
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []replicas.Version
	for key := range cm.Data {
		if !strings.HasPrefix(key, keyVersionPrefix) {
			continue
		}
		var rec versionRecord
		if _, err := getJSON(cm, key, &rec); err != nil {
			return nil, err
		}
		task := new(configs.Task)
		if err := s.secretJSON(cm.Name, versionTaskKey(rec.Number), task); err != nil {
			return nil, fmt.Errorf("version %d of %q: %w", rec.Number, service, err)
		}
		out = append(out, replicas.Version{Number: rec.Number, Task: task, LaunchedAs: rec.LaunchedAs})
	}
	slices.SortFunc(out, func(a, b replicas.Version) int { return a.Number - b.Number })
	return out, nil
}

// Rollout implements store.Store.
func (s *Store) Rollout(service string) (*replicas.Rollout, error) {
	cm, err := s.cms.Get(serviceObject(service))
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r replicas.Rollout
	if ok, err := getJSON(cm, keyRollout, &r); err != nil || !ok {
		return nil, err
	}
	return &r, nil
}

// DeleteService implements store.Store: replicas first, so that a delete cut short leaves a
// service whose replicas a next attempt still finds. The service's ConfigMap is marked
// (AnnotationDeleting) before the replicas are listed, from the API server rather than the
// cache, so that the list is complete: from the mark on, the service's row is written no more
// and no replica record is created for it (a record created after the mark is removed by its
// writer, see createReplica). What is gone already (a delete cut short, or the other
// controller's) is success.
func (s *Store) DeleteService(name string) error {
	ctx, cancel := s.ctx()
	defer cancel()
	if _, err := s.configMaps().mark(ctx, serviceObject(name), true); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete service %q: %w", name, err)
	}
	s.dropReserved(name)
	reps, err := s.client.CoreV1().ConfigMaps(s.ns).List(ctx, metav1.ListOptions{LabelSelector: kindSelector("replica", name).String()})
	if err != nil {
		return fmt.Errorf("delete service %q: list its replicas: %w", name, err)
	}
	for _, cm := range reps.Items {
		if err := s.configMaps().Delete(cm.Name); err != nil {
			return fmt.Errorf("delete service %q: %w", name, err)
		}
	}
	if err := s.configMaps().Delete(serviceObject(name)); err != nil {
		return fmt.Errorf("delete service %q: %w", name, err)
	}
	if err := s.deleteSecrets(serviceObject(name)); err != nil {
		return fmt.Errorf("delete service %q: %w", name, err)
	}
	return nil
}
